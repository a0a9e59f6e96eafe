#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| quicsdn_fuzz_targets::sdudp_engine::sdudp_frame(data));
