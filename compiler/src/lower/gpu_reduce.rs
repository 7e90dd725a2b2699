//! `--target cuda`: reductions along a buffer's innermost axis (a loss's row maximum and sum,
//! an RMS norm's mean, a backward's row sums) as one thread block per row; a whole softmax or
//! layernorm is one kernel of its own (`gpu_norm.rs`).
//!
//! As a loop nest mapped by `gpu_map.rs`, such a reduction was one thread per row: a row of
//! 1–4 K elements walked serially, neighbouring threads a row apart in memory, and a few dozen
//! blocks for a GPU of 132 SMs (the first H200 run: generated kernels took 2.4× the GEMMs'
//! time). Here the block's threads stride along the row together, so that consecutive threads
//! read consecutive elements, and `gpu.all_reduce` combines their partial values
//! (`row_blocks.rs`, which also writes the kernel as CPU loops for the tests).
//!
//! The order of the sum is then a tree, fixed by the row's length: the same bits on every run
//! and on any rank count, but not the interpreter's sequential order. So with the exact
//! numerics sums keep the thread-per-row loop nest; a maximum does not depend on the order and
//! always runs here.
//!
//! ```text
//! sum over axis 1 of x: f32[r, n]  ──▶  gpu.launch blocks(%b) in (r) threads(%t) in (T) {
//!                                         %p = scf.for %j = %t to n step T   (running sum)
//!                                         %s = gpu.all_reduce add %p
//!                                         if %t == 0: acc[%b] = %s }
//! ```

use super::buf::Buf;
use super::emit::Emitter;
use super::fast_math::Numerics;
use super::row_blocks::{fits, Fold, RowBlocks};
use ppc_dialect::DType;

/// Whether [`emit`] computes `acc = reduce(x over axes)`: one f32 reduction along a row that
/// fits a block per row (`row_blocks::fits`); a sum only with the fast numerics.
pub fn applies(
    e: &Emitter,
    numerics: Numerics,
    x: &Buf,
    axes: &[usize],
    acc: &Buf,
    max: bool,
) -> bool {
    matches!(axes, &[axis] if fits(e, x, axis))
        && x.ty.dtype == DType::F32
        && acc.ty.dtype == DType::F32
        && (max || numerics == Numerics::Fast)
}

/// `acc = max or sum of x along its last axis` (see [`applies`]).
pub fn emit(e: &mut Emitter, x: &Buf, acc: &Buf, max: bool) {
    let fold = if max { Fold::Max } else { Fold::Sum };
    let mut k = RowBlocks::open(e, x, acc);
    let value = k.reduce_row(e, fold, |e, at| {
        e.let_(&format!("memref.load {}[{at}] : {}", x.name, x.mty()))
    });
    k.once(e, |e, row| {
        e.op(&format!(
            "memref.store {value}, {}[{row}] : {}",
            acc.name,
            acc.mty()
        ))
    });
    k.close(e);
}
