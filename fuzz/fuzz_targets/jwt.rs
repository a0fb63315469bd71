#![no_main]
//! docs/fuzzing.md; the harness: `ambientd_fuzz::ca::jwt`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ambientd_fuzz::ca::jwt(data));
