#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sysprof::fuzzing::report_json(data));
