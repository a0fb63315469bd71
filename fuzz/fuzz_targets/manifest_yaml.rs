#![no_main]
//! docs/fuzzing.md; the harness: `ambientd_fuzz::objects::manifest`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ambientd_fuzz::objects::manifest(data, false));
