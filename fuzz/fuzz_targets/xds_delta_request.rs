#![no_main]
//! docs/fuzzing.md; the harness: `ambientd_fuzz::xds::delta`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ambientd_fuzz::xds::delta(data));
