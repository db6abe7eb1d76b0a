#![no_main]
libfuzzer_sys::fuzz_target!(init: ferry_fuzz::util::init(), |data: &[u8]| ferry_fuzz::stripe::run(data));
