#![no_main]
//! docs/fuzzing.md; the harness: `ambientd_fuzz::ca::csr_der`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ambientd_fuzz::ca::csr_der(data));
