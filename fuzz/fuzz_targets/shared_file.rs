#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline::fuzzing::shared_file(data));
