//! [`ppc_runtime::heap::keep_freed_memory`] on the main thread, where a generated step
//! allocates its buffers: a 2.25 GiB block (more than glibc's largest mmap threshold, and than
//! its largest `int` trim threshold) comes from the heap, and freeing it leaves the heap its
//! size, so the next step reuses the pages instead of faulting fresh ones in. The block's
//! pages are never touched.

use std::ffi::c_void;

/// glibc's `struct mallinfo2`: the fields read here, then the rest.
#[repr(C)]
struct MallInfo2 {
    /// Bytes the heaps hold from the system.
    arena: usize,
    _ordblks: usize,
    _smblks: usize,
    /// Blocks mapped by themselves.
    hblks: usize,
    _rest: [usize; 6],
}

extern "C" {
    fn malloc(size: usize) -> *mut c_void;
    fn free(ptr: *mut c_void);
    fn mallinfo2() -> MallInfo2;
}

fn main() {
    ppc_runtime::heap::keep_freed_memory();
    const SIZE: usize = 9 << 28;
    // SAFETY: a plain allocation and its free; nothing is read or written.
    let (before, held, after) = unsafe {
        let before = mallinfo2();
        // `black_box`: LLVM removes a `malloc` whose block nothing uses.
        let p = std::hint::black_box(malloc(SIZE));
        assert!(!p.is_null(), "2.25 GiB of address space");
        let held = mallinfo2();
        free(p);
        (before, held, mallinfo2())
    };
    assert_eq!(held.hblks, before.hblks, "the block was mapped by itself");
    assert!(held.arena >= SIZE, "the heap holds the block");
    assert!(after.arena >= SIZE, "freeing the block trimmed the heap");
    println!("test heap: a freed 2.25 GiB block stays in the heap ... ok");
}
