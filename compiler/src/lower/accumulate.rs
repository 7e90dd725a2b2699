//! Gradient accumulation folded into the call that computes the gradient: `acc_next = add %acc,
//! %d` where `%d` is a result of a call. In a training step's backward loop this is every
//! weight gradient of every iteration.
//!
//! - When the callee returns a matmul there, one GEMM `C += A·B` into `%acc`'s buffer (BLAS's
//!   `beta = 1`) instead of the GEMM writing a temporary that an elementwise pass then adds in
//!   (for the MLP, 6% of the step went into those adds; BENCHMARKS.md). Fast numerics only: the
//!   sum is rounded in another order than the interpreter's.
//! - When the call runs as one parallel loop over its stages (`stage_split.rs`), each stage
//!   adds its slice of `%d` into its slice of `%acc` where its body ends, while both are in
//!   cache, instead of one pass over all stages on one thread after the loop (the transformer
//!   example's 13 weight gradients: 1 ms of a 10 ms training step). The same additions, so the
//!   same bits.
//! - When the result is a layer loop's carried value that each iteration writes one slice of
//!   (a stage's weight gradients, one layer each), each slice is added into the accumulator
//!   where the loop writes it, while it is in cache ([`summed_by_slices`]; `Walker::for_loop`),
//!   instead of one pass over the whole gradient after the call; when it is one slice over
//!   `-0.0`s (a circular stage's repeat), that slice alone. The same additions, so the same
//!   bits.

use super::{fuse, in_place, views};
use ppc_dialect::ir::{Block, Func, Module, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, OpKind};
use ppc_dialect::DType;
use std::collections::HashSet;

/// One accumulation: result `result` of call `call` is added to `acc` by `add`.
pub struct Accumulation {
    pub call: OpId,
    pub result: usize,
    pub add: OpId,
    pub acc: ValueId,
}

/// Where an accumulation folds, which decides what the call must return.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fold {
    /// A matmul of the callee's body (folded into the GEMM).
    Gemm,
    /// Any f32 value (added where a stage-parallel call's stage ends).
    StageEnd,
}

/// The accumulations of `block` of `f` that fold as `fold` says; `deferred` values (computed
/// inside their consumer's loop nest) are not candidates.
pub fn find(
    m: &Module,
    f: &Func,
    block: &Block,
    deferred: &HashSet<ValueId>,
    fold: Fold,
) -> Vec<Accumulation> {
    let position = |v: ValueId| {
        block
            .ops
            .iter()
            .position(|&id| f.ops[id].results.contains(&v))
    };
    let mut found = Vec::new();
    for (at, &add) in block.ops.iter().enumerate() {
        let op = &f.ops[add];
        let OpKind::Binary {
            op: BinaryOp::Add,
            lhs,
            rhs,
        } = op.kind
        else {
            continue;
        };
        let r = op.results[0];
        let ty = f.ty(r);
        if ty.dtype != DType::F32 || f.ty(lhs) != ty || f.ty(rhs) != ty || deferred.contains(&r) {
            continue;
        }
        for (acc, d) in [(lhs, rhs), (rhs, lhs)] {
            let Some(call_at) = position(d) else { continue };
            let call = block.ops[call_at];
            // A `call_if` folds too: the walk copies the accumulator before its test, so where
            // the call is skipped the sum is the accumulator (its result would be -0.0).
            let OpKind::Call { callee, .. } = &f.ops[call].kind else {
                continue;
            };
            let g = &m.funcs[*callee];
            let result = f.ops[call].results.iter().position(|&v| v == d);
            let returns_matmul = result.is_some_and(|i| match fold {
                Fold::Gemm => returned_matmul(g, g.body.results[i]),
                Fold::StageEnd => true,
            });
            // `acc` is read by this add alone and is there before the call: the GEMM may
            // write into its buffer at the call.
            let before = position(acc).is_none_or(|p| p < call_at);
            if returns_matmul
                && f.uses(&f.body, d) == 1
                && f.uses(&f.body, acc) == 1
                && before
                && call_at < at
                && !deferred.contains(&acc)
            {
                found.push(Accumulation {
                    call,
                    result: result.expect("checked"),
                    add,
                    acc,
                });
                break;
            }
        }
    }
    found
}

/// Whether `v`, returned by `g`, is a matmul of `g`'s body that nothing else reads.
fn returned_matmul(g: &Func, v: ValueId) -> bool {
    let matmul = g.body.ops.iter().any(|&id| {
        g.ops[id].results.contains(&v) && matches!(g.ops[id].kind, OpKind::MatMul { .. })
    });
    matmul && g.uses(&g.body, v) == 1 && g.ty(v).dtype == DType::F32
}

/// Whether result `i` of `g`, added into an accumulator, can be added slice by slice: read
/// by nothing else, it is made, through selects on masks of `true_masks` (which hold only
/// `true` where the body runs, so a select is its operand) and transposes (views), from
/// - an f32 carried value of a loop of `g`'s body whose every iteration writes a slice of its
///   own (`in_place::overwritten`, at a position the same for every stage): a stage's weight
///   gradients, one layer each; or
/// - an `update` of a `-0.0` constant at such a position: a circular stage's gradient of the
///   repeat it ran, spread over all repeats. Adding `-0.0` elsewhere changes no bit, so only
///   the slice is added.
pub fn summed_by_slices(g: &Func, i: usize, true_masks: &HashSet<ValueId>, in_split: bool) -> bool {
    let block = &g.body;
    let once = |v: ValueId| g.uses(block, v) == 1;
    let made = |v: ValueId| (block.ops.iter().copied()).find(|&o| g.ops[o].results.contains(&v));
    let minus_zero = |v: ValueId| {
        made(v).is_some_and(|c| {
            matches!(g.ops[c].kind, OpKind::Constant { value }
                if value.0.to_bits() == (-0.0f64).to_bits())
        })
    };
    let mut v = block.results[i];
    if g.ty(v).dtype != DType::F32 {
        return false;
    }
    loop {
        let Some(at) = made(v).filter(|_| once(v)) else {
            return false;
        };
        match &g.ops[at].kind {
            // The select's value is its operand only where that is not broadcast to its shape.
            OpKind::Select { cond, on_true, .. }
                if true_masks.contains(cond) && g.ty(*on_true).shape() == g.ty(v).shape() =>
            {
                v = *on_true
            }
            OpKind::Transpose { x, .. } => v = *x,
            OpKind::Update { x, index, .. } => {
                return minus_zero(*x) && once(*x) && views::uniform(g, *index, in_split).is_some();
            }
            OpKind::Loop { trips, body, .. } => {
                let j = g.ops[at].results.iter().position(|&r| r == v);
                let Some(j) = j else { return false };
                let writer = fuse::producer(g, body, body.results[j]).map(|u| &g.ops[u].kind);
                let uniform = matches!(writer, Some(OpKind::Update { index, .. })
                    if views::uniform(g, *index, in_split).is_some());
                return uniform && in_place::overwritten(g, body, *trips).contains(&j);
            }
            _ => return false,
        }
    }
}
