//! A global allocator that aborts on one allocation over `-malloc_limit_mb` (default: the
//! `-rss_limit_mb`, else 2048, as libFuzzer's own defaults go).
//!
//! libFuzzer checks `-malloc_limit_mb` only through a sanitizer's malloc hooks; without a
//! sanitizer (ours is a stable-toolchain build, docs/fuzzing.md) the flag does nothing. Here
//! the check is in the allocator: a single allocation (or reallocation) past the limit prints
//! its size and aborts, which libFuzzer reports as a crash and saves the input for. Growth by
//! many smaller allocations is caught by libFuzzer's `-rss_limit_mb`, which works without one.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The limit in bytes; `usize::MAX` until [`init_from_args`] ran.
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Reads `-malloc_limit_mb=N` (else `-rss_limit_mb=N`, else 2048) from the fuzzer's command
/// line; `0` means no limit, as for libFuzzer.
pub fn init_from_args() {
    let flag = |name: &str| {
        std::env::args()
            .filter_map(|arg| arg.strip_prefix(name).map(str::to_string))
            .filter_map(|value| value.parse::<usize>().ok())
            .next_back()
    };
    let mb = flag("-malloc_limit_mb=")
        .or_else(|| flag("-rss_limit_mb="))
        .unwrap_or(2048);
    let bytes = if mb == 0 {
        usize::MAX
    } else {
        mb.saturating_mul(1 << 20)
    };
    LIMIT.store(bytes, Ordering::Relaxed);
}

/// The limit now, in bytes.
pub fn limit() -> usize {
    LIMIT.load(Ordering::Relaxed)
}

/// [`System`], with the limit.
pub struct Limited;

#[cold]
fn over_limit(size: usize) -> ! {
    // No allocation from here on: a fixed buffer, formatted by hand.
    let mut line = [0u8; 128];
    let prefix = b"==ambientd-fuzz== out-of-memory (malloc(";
    let suffix = b")): over -malloc_limit_mb\n";
    let mut digits = [0u8; 20];
    let mut n = size;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut at = 0;
    for &b in prefix
        .iter()
        .chain(digits[..len].iter().rev())
        .chain(suffix)
    {
        line[at] = b;
        at += 1;
    }
    let _ = std::io::stderr().write_all(&line[..at]);
    std::process::abort()
}

// SAFETY: every call goes to `System` with the caller's arguments unchanged; the limit only
// aborts before a call.
unsafe impl GlobalAlloc for Limited {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > limit() {
            over_limit(layout.size());
        }
        // SAFETY: as the caller's contract for `alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > limit() {
            over_limit(layout.size());
        }
        // SAFETY: as the caller's contract for `alloc_zeroed`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller's contract for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > limit() {
            over_limit(new_size);
        }
        // SAFETY: as the caller's contract for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Limited = Limited;
