//! Where the host must wait for the GPU (`--target cuda`).
//!
//! Kernels and GEMMs are queued on one stream; host code (loop counters, the stage mask, layer
//! indexes: scalars and tiny integer arrays, computed in the host code itself) runs ahead. The
//! host waits (`ppc_gpu_sync`) only where it would otherwise race with queued GPU work:
//!
//! - before it reads a buffer the GPU may have written last (read after write);
//! - before it writes a buffer that GPU work anywhere in the program reads or writes (write
//!   after read): a loop's next iteration would overwrite what a queued kernel still needs.
//!
//! Scalars the host wrote are passed to kernels by value (captured into the `linalg.generic`,
//! so the kernel gets them as parameters), so the GPU never reads them from memory. What the
//! GPU touches is only known once the whole function is written: `lower` writes a CUDA
//! program twice, the second time with the first pass's [`Residency::touched`].
//!
//! Buffers are named by their allocation (`Buf::base`): a view shares its buffer's fate.

use super::buf::Buf;
use super::gpu_map::Tiling;
use std::collections::HashSet;

#[derive(Default)]
pub struct Residency {
    /// Buffers whose last writer (in program order, so far) is host code.
    host_written: HashSet<String>,
    /// Buffers GPU work reads or writes, recorded in this pass.
    pub touched: HashSet<String>,
    /// `touched` of the whole program, from the previous pass.
    known_touched: HashSet<String>,
}

impl Residency {
    /// For a second pass that knows what the first found the GPU touches.
    pub fn knowing(touched: HashSet<String>) -> Residency {
        Residency {
            known_touched: touched,
            ..Residency::default()
        }
    }

    pub fn host_wrote_last(&self, b: &Buf) -> bool {
        self.host_written.contains(&b.base)
    }

    /// Whether the host must wait before reading `b`.
    pub fn host_reads(&self, b: &Buf) -> bool {
        !self.host_wrote_last(b)
    }

    /// Whether the host must wait before writing `b`; from now on the host wrote it last.
    pub fn host_writes(&mut self, b: &Buf) -> bool {
        self.host_written.insert(b.base.clone());
        self.known_touched.contains(&b.base)
    }

    /// GPU work reads `reads` and writes `writes`.
    pub fn device_uses(&mut self, reads: &[&Buf], writes: &[&Buf]) {
        for b in reads.iter().chain(writes) {
            self.touched.insert(b.base.clone());
        }
        for b in writes {
            self.host_written.remove(&b.base);
        }
    }
}

/// What writing for `--target cuda` keeps track of.
pub struct GpuCode {
    /// The tilings of the loop nests so far (`gpu_map.rs`).
    pub tilings: Vec<Tiling>,
    pub residency: Residency,
    /// Buffers the next generic's body reads besides its operands.
    pub also_reads: Vec<Buf>,
}
