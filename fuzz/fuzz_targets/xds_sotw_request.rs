#![no_main]
//! docs/fuzzing.md; the harness: `ambientd_fuzz::xds::sotw`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ambientd_fuzz::xds::sotw(data));
