#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sysprof::fuzzing::python_code(data));
