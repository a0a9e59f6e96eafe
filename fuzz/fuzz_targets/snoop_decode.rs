#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| quicsdn_fuzz_targets::snoop::snoop_decode(data));
