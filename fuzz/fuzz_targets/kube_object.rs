#![no_main]
//! docs/fuzzing.md; the harness: `ambientd_fuzz::objects::kube_object`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ambientd_fuzz::objects::kube_object(data));
