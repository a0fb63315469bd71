//! The fuzz targets' shared harness (docs/fuzzing.md).
//!
//! Each target (`fuzz_targets/<name>.rs`) hands its input to one function here, which runs it
//! through the code the server runs on those bytes, against fixed material built once per
//! process: the CA and keys under `fixtures/` ([`ca`]), the ADS servers over the bookinfo
//! example's snapshot ([`xds`]), and the index that decoded objects go into ([`objects`]).
//!
//! Allocation is bounded here too: libFuzzer's `-malloc_limit_mb` needs a sanitizer's
//! allocator hooks, which a build without a sanitizer lacks, so [`alloc`] enforces it itself.

pub mod alloc;
pub mod ca;
pub mod objects;
pub mod xds;

use std::path::PathBuf;
use std::sync::LazyLock;

/// The committed test material: `fixtures/ca` (a self-signed test root and its key),
/// `fixtures/token-key.pem` (the local token key) and `fixtures/jwks*` (a second issuer's key).
/// Test-only keys, never used outside the fuzz targets.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// One single-threaded runtime per process: a target's async work runs on it, to completion,
/// inside the call for one input.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
        alloc::init_from_args();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    });
    &RUNTIME
}
