#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| pacer::fuzzing::forwarding_headers(data));
