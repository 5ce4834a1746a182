#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sysprof::fuzzing::uprobe_exports(data));
