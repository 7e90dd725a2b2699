//! Where the host must wait for the GPU (`--target cuda`).
//!
//! Kernels and GEMMs are queued on one stream; host code (loop counters, the stage mask, layer
//! indexes: scalars and tiny integer arrays, computed in the host code itself) runs ahead. The
//! host waits (`ppc_gpu_sync`) only where it would otherwise race with queued GPU work:
//!
//! - before it reads a buffer the GPU may have written last (read after write): known in
//!   program order, as the program is written;
//! - before it writes a buffer that GPU work anywhere in the program reads or writes (write
//!   after read): a loop's next iteration would overwrite what a queued kernel still needs.
//!   Which buffers the GPU touches is known only once the whole program is written, so such a
//!   wait is written as a [`Line::WaitIfTouched`](super::emit::Line) and kept or dropped then
//!   ([`Residency::touches`]): the program is lowered once.
//!
//! Scalars the host wrote are passed to kernels by value (captured into the `linalg.generic`,
//! so the kernel gets them as parameters), so the GPU never reads them from memory.
//!
//! Buffers are their allocation ([`BufId`]): a view shares its buffer's fate.

use super::buf::{Buf, BufId};
use super::gpu_map::Tiling;
use std::collections::HashSet;

#[derive(Default)]
pub struct Residency {
    /// Buffers whose last writer (in program order, so far) is host code.
    host_written: HashSet<BufId>,
    /// Buffers GPU work reads or writes, so far.
    touched: HashSet<BufId>,
}

impl Residency {
    pub fn host_wrote_last(&self, b: &Buf) -> bool {
        self.host_written.contains(&b.base)
    }

    /// Whether the host must wait before reading `b`.
    pub fn host_reads(&self, b: &Buf) -> bool {
        !self.host_wrote_last(b)
    }

    /// The host writes `b`: from now on it wrote it last. Whether it must wait first is
    /// [`Residency::touches`] once the program is written.
    pub fn host_writes(&mut self, b: &Buf) {
        self.host_written.insert(b.base);
    }

    /// GPU work reads `reads` and writes `writes`.
    pub fn device_uses(&mut self, reads: &[&Buf], writes: &[&Buf]) {
        for b in reads.iter().chain(writes) {
            self.touched.insert(b.base);
        }
        for b in writes {
            self.host_written.remove(&b.base);
        }
    }

    /// Whether GPU work reads or writes buffer `id` anywhere in what was written so far.
    pub fn touches(&self, id: BufId) -> bool {
        self.touched.contains(&id)
    }
}

/// What writing for `--target cuda` keeps track of.
#[derive(Default)]
pub struct GpuCode {
    /// The tilings of the loop nests so far (`gpu_map.rs`).
    pub tilings: Vec<Tiling>,
    pub residency: Residency,
    /// Buffers the next generic's body reads besides its operands.
    pub also_reads: Vec<Buf>,
}
