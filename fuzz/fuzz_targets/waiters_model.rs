#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline::fuzzing::waiters_match_model(data));
