#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sysprof::fuzzing::readout(data));
