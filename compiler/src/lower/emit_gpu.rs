//! What the emitter does for `--target cuda` besides writing text: which kernel a loop nest
//! becomes (`gpu_map.rs`) and where host code must wait for the GPU (`residency.rs`).

use super::buf::Buf;
use super::emit::Emitter;
use super::emit::Line;
use super::gpu_map;
use super::residency::{BeforeRead, GpuCode, Residency};
use ppc_runtime::abi;

/// `--target cuda`: integer and boolean nests of at most this many elements from what the host
/// wrote (the stage mask, from the loop counter) are computed by the host, so that it knows
/// them without waiting for the GPU.
const HOST_INTEGERS: u64 = 1024;

impl<'a> Emitter<'a> {
    /// Writes for `--target cuda`; with `kernels_on_cpu`, for a program whose kernels run as
    /// CPU loops (tests).
    pub fn for_gpu(mut self, kernels_on_cpu: bool) -> Emitter<'a> {
        self.gpu = Some(GpuCode {
            kernels_on_cpu,
            ..GpuCode::default()
        });
        self
    }

    /// For `--target cuda` (else `None`): the tag of the kernel this nest becomes, or `None`
    /// when the host computes it: a nest without a parallel loop, or a few integers or
    /// booleans from what the host wrote (the stage mask, from the loop counter).
    pub(super) fn gpu_tag(
        &mut self,
        ins: &[(&Buf, String)],
        out: &(&Buf, String),
        iters: &[&str],
    ) -> Option<Option<String>> {
        let gpu = self.gpu.as_mut()?;
        let small = !out.0.ty.dtype.is_float() && out.0.ty.elements() <= HOST_INTEGERS;
        // Constants (iotas) are the host's only outside loops: inside one, the host would
        // rewrite them every iteration while kernels still read them.
        let from_host = if ins.is_empty() {
            self.nest.loops == 0
        } else {
            ins.iter().all(|(b, _)| gpu.residency.host_wrote_last(b))
        };
        if small && from_host {
            return Some(None);
        }
        let sizes = domain_sizes(ins, out, iters.len());
        Some(gpu_map::tiling(&sizes, iters).map(|t| {
            let k = gpu.tilings.iter().position(|u| *u == t).unwrap_or_else(|| {
                gpu.tilings.push(t);
                gpu.tilings.len() - 1
            });
            gpu_map::tag(k)
        }))
    }

    pub(super) fn gpu_residency(&self) -> Option<&Residency> {
        self.gpu.as_ref().map(|g| &g.residency)
    }

    /// Host code reads `b` next (`--target cuda`): wait for the GPU if it may have written it,
    /// in program order or through a loop's back edge (known once the loop is written).
    pub fn host_reads(&mut self, b: &Buf) {
        let Some(g) = self.gpu.as_mut() else { return };
        match g.residency.host_reads(b) {
            BeforeRead::Nothing => {}
            BeforeRead::Wait => self.wait_for_gpu(),
            BeforeRead::WaitIfRewritten(id) => {
                let text = self.indented(&abi::GPU_SYNC.call(&[]));
                self.body.push(Line::WaitIfRewritten(id, text));
            }
        }
    }

    /// Host code writes `b` next (`--target cuda`): wait for the GPU if it may still use it,
    /// which is known once the whole program is written.
    pub fn host_writes(&mut self, b: &Buf) {
        if let Some(g) = self.gpu.as_mut() {
            g.residency.host_writes(b);
            let text = self.indented(&abi::GPU_SYNC.call(&[]));
            self.body.push(Line::WaitIfTouched(b.base, text));
        }
    }

    /// Host code computes `out` from `reads` (and what [`Emitter::also_reads`] named).
    pub(super) fn host_computes(&mut self, reads: &[&Buf], out: &Buf) {
        let extra = self
            .gpu
            .as_mut()
            .map(|g| std::mem::take(&mut g.also_reads))
            .unwrap_or_default();
        for b in reads.iter().copied().chain(&extra) {
            self.host_reads(b);
        }
        self.host_writes(out);
    }

    /// GPU work (a kernel, a GEMM) reads `reads` and writes `out` (`--target cuda`).
    pub fn device_uses(&mut self, reads: &[&Buf], out: &Buf) {
        if let Some(g) = self.gpu.as_mut() {
            let extra = std::mem::take(&mut g.also_reads);
            let all: Vec<&Buf> = reads.iter().copied().chain(&extra).collect();
            g.residency.device_uses(&all, &[out]);
        }
    }

    /// The next generic's body also reads `b` (a `memref.load` of a captured buffer).
    pub fn also_reads(&mut self, b: &Buf) {
        if let Some(g) = self.gpu.as_mut() {
            g.also_reads.push(b.clone());
        }
    }

    /// Opens a `gpu.launch` of `blocks` blocks of `threads` threads (x only); returns the
    /// block's and the thread's index. Close it with [`Emitter::close_launch`].
    pub fn open_launch(&mut self, blocks: u64, threads: u64) -> (String, String) {
        let (grid, size, one) = (self.index(blocks), self.index(threads), self.index(1));
        let ids: Vec<String> = (0..12).map(|_| self.fresh()).collect();
        let [bx, by, bz, gx, gy, gz, tx, ty, tz, sx, sy, sz] = &ids[..] else {
            unreachable!("twelve names")
        };
        self.open(&format!(
            "gpu.launch blocks({bx}, {by}, {bz}) in ({gx} = {grid}, {gy} = {one}, {gz} = {one}) \
             threads({tx}, {ty}, {tz}) in ({sx} = {size}, {sy} = {one}, {sz} = {one}) {{"
        ));
        (bx.clone(), tx.clone())
    }

    /// Ends the `gpu.launch` [`Emitter::open_launch`] began.
    pub fn close_launch(&mut self) {
        self.op("gpu.terminator");
        self.close();
    }

    fn wait_for_gpu(&mut self) {
        self.declare(&abi::GPU_SYNC);
        self.op(&abi::GPU_SYNC.call(&[]));
    }
}

/// The trip count of each of a generic's `dims` loops, from the operands that index by it.
fn domain_sizes(ins: &[(&Buf, String)], out: &(&Buf, String), dims: usize) -> Vec<u64> {
    let mut sizes = vec![1; dims];
    for (b, map) in ins.iter().chain([out]) {
        let shape = b.ty.shape();
        for (axis, expr) in map.split(", ").enumerate() {
            if let Some(d) = expr.strip_prefix('d').and_then(|d| d.parse::<usize>().ok()) {
                sizes[d] = shape[axis];
            }
        }
    }
    sizes
}
