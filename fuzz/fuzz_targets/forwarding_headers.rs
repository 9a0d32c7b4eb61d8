#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline::fuzzing::forwarding_headers(data));
