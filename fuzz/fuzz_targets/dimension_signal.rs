#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline::fuzzing::dimension_signal(data));
