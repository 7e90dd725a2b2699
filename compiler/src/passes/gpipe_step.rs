//! The parts of GPipe's training step, `@train_vjp` as `autodiff` writes it, that other
//! schedules are built from (`one_f_one_b.rs`): the forward loop L1 and the backward loop L2,
//! and in them where stage 0 is fed, where the outputs are written, where the tape of stage
//! inputs is written and read, and which of L2's carried values is the outputs' cotangent.
//! Anything else is refused as not GPipe's step (a compiler error, not a user's).

use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{names, Block, Func, Module, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, OpKind};
use std::collections::HashSet;

/// The ops of GPipe's `@train_vjp` that the tick loop is made of.
pub(super) struct Parts {
    /// The forward loop L1 (carrying the state, the outputs and the tape) and the backward
    /// loop L2.
    pub(super) forward: OpId,
    pub(super) backward: OpId,
    /// L1's `index %inputs, %t`: what enters stage 0.
    pub(super) feed: OpId,
    /// L1's `update %outputs, %last, %done_item`: the last stage's result written.
    pub(super) write: OpId,
    /// L1's tape write and L2's tape read.
    pub(super) tape_write: OpId,
    pub(super) tape_read: OpId,
    /// Which of L2's carried values is the outputs' cotangent.
    pub(super) d_outputs: usize,
    /// L1's `sub %t, %stage_ids`: the item each stage works on, from which its mask follows.
    pub(super) forward_item: OpId,
    /// L2's `sub %t_fwd, %stage_ids` (each stage's microbatch) and `sub %t_fwd, %last_stage`
    /// (the microbatch whose outputs' cotangent the last stage reads).
    pub(super) backward_item: OpId,
    pub(super) backward_done: OpId,
    /// L2's call of the stage's backward.
    pub(super) backward_call: OpId,
}

pub(super) fn unexpected(what: &str) -> Diagnostic {
    Diagnostic::plain(format!(
        "`1f1b`: `@train_vjp` is not GPipe's training step as `autodiff` writes it ({what})"
    ))
}

pub(super) fn loop_body(f: &Func, id: OpId) -> &Block {
    match &f.ops[id].kind {
        OpKind::Loop { body, .. } => body,
        _ => unreachable!("invariant: a loop"),
    }
}

/// The one op of `block` that `pick` accepts.
fn only(
    f: &Func,
    block: &Block,
    what: &str,
    pick: impl Fn(&OpKind) -> bool,
) -> Result<OpId, Diagnostic> {
    let mut found = block
        .ops
        .iter()
        .copied()
        .filter(|&id| pick(&f.ops[id].kind));
    match (found.next(), found.next()) {
        (Some(id), None) => Ok(id),
        _ => Err(unexpected(what)),
    }
}

impl Parts {
    pub(super) fn find(m: &Module, f: &Func) -> Result<Parts, Diagnostic> {
        let loops: Vec<OpId> = (f.body.ops.iter().copied())
            .filter(|&id| matches!(f.ops[id].kind, OpKind::Loop { .. }))
            .collect();
        let [forward, backward] = loops[..] else {
            return Err(unexpected("two loops"));
        };
        let l1 = loop_body(f, forward);
        let [t, _state, outputs, tape] = l1.args[..] else {
            return Err(unexpected(
                "the forward loop carries the state, the outputs and one tape",
            ));
        };
        let feed = only(
            f,
            l1,
            "one feed of stage 0",
            |k| matches!(k, OpKind::Index { index, axis: 0, .. } if *index == t),
        )?;
        let write = only(
            f,
            l1,
            "one write of the outputs",
            |k| matches!(k, OpKind::Update { x, .. } if *x == outputs),
        )?;
        let tape_write = only(
            f,
            l1,
            "one tape write",
            |k| matches!(k, OpKind::Update { x, .. } if *x == tape),
        )?;
        // `sub %a, %b` with `%b` of rank `rank`.
        let minus = |k: &OpKind, a: ValueId, rank: usize| matches!(k, OpKind::Binary { op: BinaryOp::Sub, lhs, rhs } if *lhs == a && f.ty(*rhs).rank() == rank);
        let forward_item = only(f, l1, "one item per stage", |k| minus(k, t, 1))?;
        let tape_out = f.ops[forward].results[2];
        let l2 = loop_body(f, backward);
        let t_back = l2.args[0];
        let reversed = only(
            f,
            l2,
            "one reversed iteration",
            |k| matches!(k, OpKind::Binary { op: BinaryOp::Sub, rhs, .. } if *rhs == t_back),
        )?;
        let t_fwd = f.ops[reversed].results[0];
        let backward_item = only(f, l2, "one item per stage", |k| minus(k, t_fwd, 1))?;
        let backward_done = only(f, l2, "one microbatch leaving", |k| minus(k, t_fwd, 0))?;
        let vjp = m.func_id(&names::vjp(names::STAGE));
        let backward_call = only(
            f,
            l2,
            "one backward of the stage",
            |k| matches!(k, OpKind::Call { callee, .. } if Some(*callee) == vjp),
        )?;
        let tape_read = only(
            f,
            l2,
            "one tape read",
            |k| matches!(k, OpKind::Index { x, axis: 0, .. } if *x == tape_out),
        )?;
        let OpKind::Loop { inits, .. } = &f.ops[backward].kind else {
            unreachable!("invariant: a loop")
        };
        // The outputs' cotangent: the one the loss (and `@head`) computes after L1.
        let late = after_forward(f, &f.body.ops, forward).1;
        let late: HashSet<ValueId> = late
            .iter()
            .flat_map(|&id| f.ops[id].results.clone())
            .collect();
        let seeded = (inits.iter().enumerate()).filter(|(_, v)| late.contains(v));
        let [(d_outputs, _)] = seeded.collect::<Vec<_>>()[..] else {
            return Err(unexpected("one cotangent computed after the forward loop"));
        };
        Ok(Parts {
            forward,
            backward,
            feed,
            write,
            tape_write,
            tape_read,
            d_outputs,
            forward_item,
            backward_item,
            backward_done,
            backward_call,
        })
    }
}

/// Splits the ops between the two loops into those that do not read the forward loop's
/// results (they may run before the tick loop) and those that do (after it).
pub(super) fn after_forward(f: &Func, between: &[OpId], forward: OpId) -> (Vec<OpId>, Vec<OpId>) {
    let mut late_values: HashSet<ValueId> = f.ops[forward].results.iter().copied().collect();
    let (mut early, mut late) = (Vec::new(), Vec::new());
    for &id in between {
        let op = &f.ops[id];
        if op.kind.operands().iter().any(|v| late_values.contains(v)) {
            late_values.extend(op.results.iter().copied());
            late.push(id);
        } else {
            early.push(id);
        }
    }
    (early, late)
}
