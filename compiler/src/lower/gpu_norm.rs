//! `--target cuda`: a softmax or a layernorm along the innermost axis as one kernel, a block of
//! threads per row (`row_blocks.rs`).
//!
//! Written op by op, a softmax is four kernels (the row maximum, the exponentials into an f32
//! buffer of the whole input's size, their sum, the division) and a layernorm six; each reads
//! or writes the whole tensor, and a bf16 input is first widened into an f32 copy. Here each
//! row is read three times by one kernel and its result written once, in the output's type:
//!
//! ```text
//! softmax:   m = max_j x_j          s = Σ_j exp(x_j - m)      y_j = exp(x_j - m) / s
//! layernorm: μ = (Σ_j x_j) / n      σ² = (Σ_j (x_j - μ)²) / n  y_j = (x_j - μ) · (1 / √(σ² + ε))
//! ```
//!
//! Each value is computed by the ops and in the types of `ops.rs`'s version (the exponential
//! computed again where it is written gives the same bits), so only the sums' order differs:
//! a tree over the block's threads, fixed by the row's length, as in `gpu_reduce.rs`. So this
//! is for the fast numerics only.

use super::buf::Buf;
use super::emit::Emitter;
use super::fast_math::{self, Numerics};
use super::row_blocks::{fits, Fold, RowBlocks};
use super::widen::{convert_value, ext};
use ppc_dialect::DType;

/// Whether [`softmax`] and [`layernorm`] compute the op along `axis` of `x`: a row that fits a
/// block per row (`row_blocks::fits`), with the fast numerics.
pub fn applies(e: &Emitter, numerics: Numerics, x: &Buf, axis: usize) -> bool {
    numerics == Numerics::Fast && fits(e, x, axis)
}

/// `out = softmax(x)` along the last axis (see [`applies`]).
pub fn softmax(e: &mut Emitter, x: &Buf, out: &Buf) {
    let mut k = RowBlocks::open(e, x, out);
    let load = |e: &mut Emitter, at: &str| load_f32(e, x, at);
    let max = k.reduce_row(e, Fold::Max, load);
    let exp = |e: &mut Emitter, at: &str| {
        let v = load(e, at);
        let s = e.let_(&format!("arith.subf {v}, {max} : f32"));
        fast_math::exp_flushed(e, &s)
    };
    let sum = k.reduce_row(e, Fold::Sum, exp);
    k.for_row(e, |e, at| {
        let y = exp(e, at);
        let y = e.let_(&format!("arith.divf {y}, {sum} : f32"));
        store(e, &y, out, at);
    });
    k.close(e);
}

/// `out = layernorm(x)` along the last axis, with `eps` (see [`applies`]).
pub fn layernorm(e: &mut Emitter, x: &Buf, eps: f64, out: &Buf) {
    let mut k = RowBlocks::open(e, x, out);
    let n = *x.ty.shape().last().expect("invariant: rank >= 2");
    let size = e.constant(n as f64, DType::F32);
    let load = |e: &mut Emitter, at: &str| load_f32(e, x, at);
    let sum = k.reduce_row(e, Fold::Sum, load);
    let mean = e.let_(&format!("arith.divf {sum}, {size} : f32"));
    let centered = |e: &mut Emitter, at: &str| {
        let v = load(e, at);
        e.let_(&format!("arith.subf {v}, {mean} : f32"))
    };
    let squares = k.reduce_row(e, Fold::Sum, |e, at| {
        let c = centered(e, at);
        e.let_(&format!("arith.mulf {c}, {c} : f32"))
    });
    let var = e.let_(&format!("arith.divf {squares}, {size} : f32"));
    let eps = e.constant(f64::from(eps as f32), DType::F32);
    let one = e.constant(1.0, DType::F32);
    let ve = e.let_(&format!("arith.addf {var}, {eps} : f32"));
    let root = e.let_(&format!("math.sqrt {ve} : f32"));
    let inv = e.let_(&format!("arith.divf {one}, {root} : f32"));
    k.for_row(e, |e, at| {
        let c = centered(e, at);
        let y = e.let_(&format!("arith.mulf {c}, {inv} : f32"));
        store(e, &y, out, at);
    });
    k.close(e);
}

/// The element of `x` at `at`, as f32.
fn load_f32(e: &mut Emitter, x: &Buf, at: &str) -> String {
    let v = e.let_(&format!("memref.load {}[{at}] : {}", x.name, x.mty()));
    ext(e, &v, x.ty.dtype)
}

/// Stores the f32 `y` as the element of `out` at `at`, rounded to its type.
fn store(e: &mut Emitter, y: &str, out: &Buf, at: &str) {
    let y = convert_value(e, y, DType::F32, out.ty.dtype);
    e.op(&format!(
        "memref.store {y}, {}[{at}] : {}",
        out.name,
        out.mty()
    ));
}
