//! Where the host must wait for the GPU (`--target cuda`).
//!
//! Kernels and GEMMs are queued on one stream; host code (loop counters, the stage mask, layer
//! indexes: scalars and tiny integer arrays, computed in the host code itself) runs ahead. The
//! host waits (`ppc_gpu_sync`) only where it would otherwise race with queued GPU work:
//!
//! - before it reads a buffer the GPU may have written last (read after write): known in
//!   program order, as the program is written, and, inside a loop the host runs, through the
//!   loop's back edge: a read that no GPU write precedes in the body still meets, from the
//!   second iteration on, the GPU writes that follow it in the body (of that loop or of any
//!   loop around it). Such a wait is written as a
//!   [`Line::WaitIfRewritten`](super::emit::Line), kept once the loop's body is written if GPU
//!   work later in it writes the buffer;
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
    /// Per loop the host runs that is open now (innermost last): the reads in its body so far
    /// that found the host's write last, by wait, which a later GPU write in the body needs.
    open_loops: Vec<Vec<(WaitId, BufId)>>,
    /// Waits that a read needs through a loop's back edge.
    back_edge_waits: HashSet<WaitId>,
    waits: u32,
}

/// A read's wait that only a loop's back edge may need ([`Residency::needs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaitId(u32);

/// What the host must do before it reads a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum BeforeRead {
    /// Nothing: the host wrote it last, and no loop brings a GPU write back round.
    Nothing,
    /// Wait for the GPU: it may have written the buffer last.
    Wait,
    /// Wait if GPU work later in an open loop's body writes the buffer, known once the loop is
    /// written ([`Residency::needs`]).
    WaitIfRewritten(WaitId),
}

impl Residency {
    pub fn host_wrote_last(&self, b: &Buf) -> bool {
        self.host_written.contains(&b.base)
    }

    /// What the host must do before it reads `b`.
    pub fn host_reads(&mut self, b: &Buf) -> BeforeRead {
        if !self.host_wrote_last(b) {
            return BeforeRead::Wait;
        }
        if self.open_loops.is_empty() {
            return BeforeRead::Nothing;
        }
        let id = WaitId(self.waits);
        self.waits += 1;
        for reads in &mut self.open_loops {
            reads.push((id, b.base));
        }
        BeforeRead::WaitIfRewritten(id)
    }

    /// The host enters a loop's body.
    pub fn enter_loop(&mut self) {
        self.open_loops.push(Vec::new());
    }

    /// The host leaves the loop [`Residency::enter_loop`] entered.
    pub fn exit_loop(&mut self) {
        self.open_loops
            .pop()
            .expect("invariant: a loop was entered");
    }

    /// Whether the read that got `id` must wait: GPU work after it in the body of a loop around
    /// it writes its buffer.
    pub fn needs(&self, id: WaitId) -> bool {
        self.back_edge_waits.contains(&id)
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
            for reads in &self.open_loops {
                let earlier = reads.iter().filter(|(_, read)| *read == b.base);
                self.back_edge_waits.extend(earlier.map(|(id, _)| *id));
            }
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
    /// The kernels run as CPU loops (tests): kernels written as a `gpu.launch` are written as
    /// the loops that compute the same (`row_blocks.rs`).
    pub kernels_on_cpu: bool,
}
