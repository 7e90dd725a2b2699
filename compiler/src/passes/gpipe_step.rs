//! The parts of GPipe's training step, `@train_vjp` as `autodiff` writes it, that other
//! schedules are built from (`one_f_one_b.rs`): the forward loop L1 and the backward loop L2,
//! and in them where stage 0 is fed, where the outputs are written, where each tape (the stage
//! inputs under `--remat stage`; every activation the backward reads, and the stage mask, under
//! `none`) is written and read, which of L2's carried values is the outputs' cotangent, and
//! whether L2 recomputes the stage's residuals before its backward.
//! Anything else is refused as not GPipe's step (a compiler error, not a user's).

use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{names, Block, Func, Module, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, OpKind};
use ppc_dialect::DType;
use std::collections::HashSet;

/// The ops of GPipe's `@train_vjp` that the tick loop is made of.
pub(super) struct Parts {
    /// The forward loop L1 (carrying the state, the outputs and the tapes) and the backward
    /// loop L2.
    pub(super) forward: OpId,
    pub(super) backward: OpId,
    /// L1's `index %inputs, %t`: what enters stage 0.
    pub(super) feed: OpId,
    /// L1's `update %outputs, %last, %done_item`: the last stage's result written.
    pub(super) write: OpId,
    /// L1's tapes, in the order it carries them.
    pub(super) tapes: Vec<Tape>,
    /// L1's `sub %t, %last_stage`: the item the last stage finishes (its result written).
    pub(super) forward_done: OpId,
    /// L2's `sub %last_trip, %t`: the forward iteration it reverses, stage 0's item.
    pub(super) reversed: OpId,
    /// Which of L2's carried values is the outputs' cotangent.
    pub(super) d_outputs: usize,
    /// L1's `sub %t, %stage_ids`: the item each stage works on, from which its mask follows.
    pub(super) forward_item: OpId,
    /// L2's `sub %t_fwd, %stage_ids` (each stage's microbatch; `--remat stage` only, where the
    /// backward recomputes the stage mask) and `sub %t_fwd, %last_stage` (the microbatch whose
    /// outputs' cotangent the last stage reads).
    pub(super) backward_item: Option<OpId>,
    pub(super) backward_done: OpId,
    /// L1's call of the stage (or its forward half), and L2's of its backward.
    pub(super) forward_call: OpId,
    pub(super) backward_call: OpId,
    /// L2's call of `@stage_recompute`, whose residuals its backward reads (`--remat tick`,
    /// see `autodiff`).
    pub(super) recompute_call: Option<OpId>,
}

/// One of L1's tapes: what each iteration keeps for the backward loop.
pub(super) struct Tape {
    /// L1's `update %tape, %value, %t`, and L2's `index %tape_out, %t_fwd`.
    pub(super) write: OpId,
    pub(super) read: OpId,
    pub(super) kept: Kept,
    /// For the tape of the state (`--remat stage`): L1's `select %first, %fed, %state`, what
    /// the stage call reads, and L2's select that rebuilds it from the tape.
    pub(super) stage_in: Option<(OpId, OpId)>,
}

/// What a tape keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// A value of each stage (with the stage axis).
    Staged,
    /// The stage mask the backward call takes (`--remat none`).
    Mask,
    /// A value without the stage axis: the same in every iteration (a causal mask).
    Same,
    /// The outputs buffer (circular pipelines, `--remat stage`): read back only to rebuild
    /// stage 0's input, which a tape of the stage's input (`Tape::stage_in`) holds instead.
    Outputs,
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
    at_most_one(f, block, what, pick)?.ok_or_else(|| unexpected(what))
}

/// The op of `block` that `pick` accepts, if there is one.
fn at_most_one(
    f: &Func,
    block: &Block,
    what: &str,
    pick: impl Fn(&OpKind) -> bool,
) -> Result<Option<OpId>, Diagnostic> {
    let mut found = block
        .ops
        .iter()
        .copied()
        .filter(|&id| pick(&f.ops[id].kind));
    match (found.next(), found.next()) {
        (found, None) => Ok(found),
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
        let [t, state, outputs, ref tapes @ ..] = l1.args[..] else {
            return Err(unexpected(
                "the forward loop carries the state, the outputs and the tapes",
            ));
        };
        if tapes.is_empty() {
            return Err(unexpected("the forward loop carries a tape"));
        }
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
        // `sub %a, %b` with `%b` of rank `rank`.
        let minus = |k: &OpKind, a: ValueId, rank: usize| matches!(k, OpKind::Binary { op: BinaryOp::Sub, lhs, rhs } if *lhs == a && f.ty(*rhs).rank() == rank);
        let forward_item = only(f, l1, "one item per stage", |k| minus(k, t, 1))?;
        // `sub %a, %c` with `%c` a constant of the function's body.
        let constants: HashSet<ValueId> = (f.body.ops.iter())
            .filter(|&&id| matches!(f.ops[id].kind, OpKind::Constant { .. }))
            .flat_map(|&id| f.ops[id].results.clone())
            .collect();
        let less_constant = |k: &OpKind, a: ValueId| matches!(k, OpKind::Binary { op: BinaryOp::Sub, lhs, rhs } if *lhs == a && constants.contains(rhs));
        let forward_done = only(f, l1, "one item leaving", |k| less_constant(k, t))?;
        let forwards = [names::STAGE.to_string(), names::fwd(names::STAGE)].map(|n| m.func_id(&n));
        let forward_call = only(
            f,
            l1,
            "one forward of the stage",
            |k| matches!(k, OpKind::Call { callee, .. } if forwards.contains(&Some(*callee))),
        )?;
        let l2 = loop_body(f, backward);
        let t_back = l2.args[0];
        let reversed = only(
            f,
            l2,
            "one reversed iteration",
            |k| matches!(k, OpKind::Binary { op: BinaryOp::Sub, rhs, .. } if *rhs == t_back),
        )?;
        let t_fwd = f.ops[reversed].results[0];
        let backward_item = at_most_one(f, l2, "one item per stage", |k| minus(k, t_fwd, 1))?;
        let backward_done = only(f, l2, "one microbatch leaving", |k| less_constant(k, t_fwd))?;
        let backwards = names::stage_backwards().map(|n| m.func_id(&n));
        let backward_call = only(
            f,
            l2,
            "one backward of the stage",
            |k| matches!(k, OpKind::Call { callee, .. } if backwards.contains(&Some(*callee))),
        )?;
        let recompute = m.func_id(&names::recompute(names::STAGE));
        let recompute_call = at_most_one(
            f,
            l2,
            "one recomputation of the stage",
            |k| matches!(k, OpKind::Call { callee, .. } if Some(*callee) == recompute),
        )?;
        let tapes = (tapes.iter().zip(&f.ops[forward].results[2..]))
            .map(|(&tape, &out)| {
                let write = only(
                    f,
                    l1,
                    "one write of each tape",
                    |k| matches!(k, OpKind::Update { x, .. } if *x == tape),
                )?;
                let read = only(
                    f,
                    l2,
                    "one read of each tape",
                    |k| matches!(k, OpKind::Index { x, axis: 0, .. } if *x == out),
                )?;
                let value = f.ops[read].results[0];
                let OpKind::Update { update: taped, .. } = f.ops[write].kind else {
                    unreachable!("invariant: an update")
                };
                let kept = match &f.ops[backward_call].kind {
                    OpKind::Call { args, .. } if mask_of(f, args) == Some(value) => Kept::Mask,
                    _ if taped == outputs => Kept::Outputs,
                    _ if f.ty(value).stage_axis().is_none() => Kept::Same,
                    _ => Kept::Staged,
                };
                let stage_in = match taped == state {
                    true => Some((fed(f, l1, state)?, fed(f, l2, value)?)),
                    false => None,
                };
                Ok(Tape {
                    write,
                    read,
                    kept,
                    stage_in,
                })
            })
            .collect::<Result<_, Diagnostic>>()?;
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
            tapes,
            forward_done,
            reversed,
            d_outputs,
            forward_item,
            backward_item,
            backward_done,
            forward_call,
            backward_call,
            recompute_call,
        })
    }
}

/// The op of `block` that makes a stage's input from `state`: `select %first, %fed, %state`.
fn fed(f: &Func, block: &Block, state: ValueId) -> Result<OpId, Diagnostic> {
    only(
        f,
        block,
        "one input of the stage from the state",
        |k| matches!(k, OpKind::Select { on_false, .. } if *on_false == state),
    )
}

/// The stage mask among a stage call's arguments: its one `i1` argument.
pub(super) fn mask_of(f: &Func, args: &[ValueId]) -> Option<ValueId> {
    args.iter().copied().find(|&a| f.ty(a).dtype == DType::I1)
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

/// The ops of `ops` that run an exchange or read what one received, directly or not: in a
/// tick, they wait for the neighbouring rank, so the tick computes everything else first.
pub(super) fn exchanging(f: &Func, ops: &[OpId]) -> HashSet<OpId> {
    let mut received: HashSet<ValueId> = HashSet::new();
    let mut out = HashSet::new();
    for &id in ops {
        let op = &f.ops[id];
        let reads = op.kind.operands().iter().any(|v| received.contains(v));
        if reads || matches!(op.kind, OpKind::Exchange { .. }) {
            received.extend(op.results.iter().copied());
            out.insert(id);
        }
    }
    out
}
