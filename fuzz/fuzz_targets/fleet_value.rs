#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline::fuzzing::fleet_value(data));
