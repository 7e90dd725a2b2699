//! Rematerialization: what a reverse loop (or a function's backward) recomputes and what the
//! forward keeps for it.
//!
//! - `--remat=stage` (the default, GPipe's choice): a loop keeps only the carried values its
//!   backward reads (for the GPipe loop: each iteration's stage input) and the backward
//!   recomputes the rest, each stage's forward included (`@g_vjp` recomputes `@g`), once: the
//!   stage's own loops (its layers) keep their activations while its backward runs.
//! - `--remat=tick` (`--schedule 1f1b` only): as `stage`, but a stage recomputes its forward
//!   one tick before its backward, in the tick of its own forward (`one_f_one_b.rs`), and holds
//!   what the backward reads (one microbatch's activations) for that tick: with one stage per
//!   rank a forward tick and a backward tick then cost about the same.
//! - `--remat=none`: the forward keeps every value the backward reads (JAX's default for a
//!   scan): each loop a tape per value, each call the residuals of `@g_fwd` for `@g_bwd`. No
//!   matmul runs twice, at the cost of the activations of every iteration. Values that cost
//!   nothing to recompute ([`recomputable`]: constants, views and integer or mask arithmetic of
//!   what the backward has anyway, such as a layer's slice of the stacked weights) are still
//!   recomputed, not kept.

use super::vjp;
use ppc_dialect::ir::{Block, Func, OpId, ValueId};
use ppc_dialect::op::OpKind;
use std::collections::HashSet;

/// What the backward pass recomputes (`autodiff`; `--remat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Remat {
    /// Keep each loop iteration's carried inputs (each stage's input) and recompute the rest.
    #[default]
    Stage,
    /// As `stage`, recomputing a tick before the backward (`--schedule 1f1b`), which holds one
    /// microbatch's activations per stage for that tick.
    Tick,
    /// Keep everything the backward reads; recompute nothing that costs a pass over memory.
    None,
}

impl Remat {
    pub fn name(self) -> &'static str {
        match self {
            Remat::Stage => "stage",
            Remat::Tick => "tick",
            Remat::None => "none",
        }
    }
}

/// The ops of `block` that the backward recomputes under `--remat=none` rather than keeping
/// their results: constants, views and non-float arithmetic whose operands are all defined
/// outside `block`, in `available`, or by other such ops.
pub fn recomputable(f: &Func, block: &Block, available: &[ValueId]) -> HashSet<OpId> {
    let mut inside: HashSet<ValueId> = block.args.iter().copied().collect();
    for &id in &block.ops {
        inside.extend(&f.ops[id].results);
    }
    let mut known: HashSet<ValueId> = available.iter().copied().collect();
    let mut ops = HashSet::new();
    for &id in &block.ops {
        let op = &f.ops[id];
        let cheap = match &op.kind {
            OpKind::Loop { .. } | OpKind::Call { .. } | OpKind::Exchange { .. } => false,
            OpKind::Constant { .. }
            | OpKind::Iota { .. }
            | OpKind::Index { .. }
            | OpKind::Slice { .. }
            | OpKind::Reshape { .. }
            | OpKind::Transpose { .. }
            | OpKind::Broadcast { .. } => true,
            _ => !f.ty(op.results[0]).dtype.is_float(),
        };
        let ready = op
            .kind
            .operands()
            .iter()
            .all(|v| !inside.contains(v) || known.contains(v));
        if cheap && ready {
            ops.insert(id);
            known.extend(&op.results);
        }
    }
    ops
}

/// The source values the backward of `block` reads (`--remat=none`), wherever defined: what
/// the rules read, what recomputed ops read, and what nested loops' backwards read. A call's
/// backward reads only the residuals its `@g_fwd` returned; `fixed`: [`vjp::fixed_values`].
pub fn backward_reads(
    f: &Func,
    fixed: &HashSet<ValueId>,
    block: &Block,
    recomputed: &HashSet<OpId>,
) -> HashSet<ValueId> {
    let mut out = HashSet::new();
    for &id in &block.ops {
        let op = &f.ops[id];
        match &op.kind {
            OpKind::Loop { body, .. } => {
                let inner = recomputable(f, body, &body.args[..1]);
                out.extend(backward_reads(f, fixed, body, &inner));
            }
            OpKind::Call { .. } => {}
            kind if recomputed.contains(&id) => out.extend(kind.operands()),
            _ => out.extend(vjp::reads(f, fixed, op)),
        }
    }
    out
}
