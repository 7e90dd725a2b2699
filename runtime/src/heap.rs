//! The C heap's settings for generated code, which `malloc`s every temporary buffer of a step
//! at its start and frees it at its end.
//!
//! With glibc's defaults, freeing a large buffer gives its pages back to the kernel (the top of
//! the heap is trimmed past 2× the mmap threshold, and blocks above the threshold are unmapped),
//! so the next step faults every page in again, zeroed. Kept instead, the same sizes are reused
//! step after step: the MLP's training step 1.28–1.33× faster, the transformer's 1.0–1.29×
//! (three interleaved rounds; BENCHMARKS.md). glibc maps a block above 32 MiB (its largest mmap
//! threshold) by itself whatever the setting, and trimmed a free top of 2 GiB (the largest
//! `int` threshold): at d = 1024 a transformer's step has blocks of 32–256 MiB and frees
//! gigabytes at once, and faulted its pages in again every step. So no block is mapped by
//! itself, and the heap is never trimmed.

use std::ffi::c_int;

extern "C" {
    fn mallopt(param: c_int, value: c_int) -> c_int;
}

/// glibc's `M_TRIM_THRESHOLD` and `M_MMAP_MAX`.
const M_TRIM_THRESHOLD: c_int = -1;
const M_MMAP_MAX: c_int = -4;

/// Keeps freed memory in the heap: every block comes from the heap (none is mapped by itself,
/// whatever its size), and the heap is never trimmed. Call before the first step.
pub fn keep_freed_memory() {
    // SAFETY: `mallopt` only changes allocator settings; both values are in glibc's ranges.
    unsafe {
        mallopt(M_MMAP_MAX, 0);
        // -1 (mallopt(3)): never trim; `c_int::MAX` still trims a free top of 2 GiB.
        mallopt(M_TRIM_THRESHOLD, -1);
    }
}
