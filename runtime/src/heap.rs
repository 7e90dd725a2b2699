//! The C heap's settings for generated code, which `malloc`s every temporary buffer of a step
//! at its start and frees it at its end.
//!
//! With glibc's defaults, freeing a large buffer gives its pages back to the kernel (the top of
//! the heap is trimmed past 2× the mmap threshold, and blocks above the threshold are unmapped),
//! so the next step faults every page in again, zeroed. Kept instead, the same sizes are reused
//! step after step: the MLP's training step 1.28–1.33× faster, the transformer's 1.0–1.29×
//! (three interleaved rounds; BENCHMARKS.md).

use std::ffi::c_int;

extern "C" {
    fn mallopt(param: c_int, value: c_int) -> c_int;
}

/// glibc's `M_TRIM_THRESHOLD` and `M_MMAP_THRESHOLD`.
const M_TRIM_THRESHOLD: c_int = -1;
const M_MMAP_THRESHOLD: c_int = -3;

/// Keeps freed memory in the heap: blocks up to 32 MiB (glibc's largest mmap threshold) come
/// from the heap, and the heap is never trimmed. Call before the first step.
pub fn keep_freed_memory() {
    // SAFETY: `mallopt` only changes allocator settings; both values are in glibc's ranges.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, c_int::MAX);
    }
}
