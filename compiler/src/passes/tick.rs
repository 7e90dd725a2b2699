//! The tick loop of `--schedule 1f1b` (`one_f_one_b.rs`): its fixed values, the scalars of
//! each tick, which microbatch a stage meets in it, and how a tick calls a stage function;
//! what the forward half (`one_f_one_b.rs`) and the backward half (`tick_backward.rs`) share.

use super::gpipe_step::{mask_of, Parts, Tape};
use super::tick_interleaved::Interleaved;
use super::tick_ring::Rings;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{Func, FuncId, Module, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, OpKind};
use ppc_dialect::{DType, Type};
use std::collections::HashMap;

/// The tick loop's fixed values: the stages' indices and parities, the rings, where the loss
/// runs, and what seeds the backward.
pub(super) struct Ticks {
    /// `M` and `S`.
    pub(super) microbatches: i64,
    pub(super) stages: i64,
    /// Per local stage: its global index `g` and `g mod 2`.
    pub(super) stage_ids: ValueId,
    pub(super) parity: ValueId,
    pub(super) rings: Rings,
    /// Where the loss runs: the last rank (`None` on one rank).
    pub(super) on_last_rank: Option<ValueId>,
    /// One stage per rank: a stage call whose stage does not run is skipped (`call_if`), so a
    /// rank runs one body per tick, not the forward's and the backward's.
    pub(super) one_stage_per_rank: bool,
    pub(super) normalizer: ValueId,
    pub(super) target: ValueId,
    /// The seeds of the VJP: the loss's and the outputs' cotangents.
    pub(super) d_loss: ValueId,
    pub(super) d_outputs: ValueId,
    pub(super) microbatch_loss: FuncId,
    /// Under `--schedule zb-h1`, the stage's backward cut in two (`bw_split.rs`).
    pub(super) halves: Option<Halves>,
    /// With several stages on a rank: the forward, and its twin with its results `-0.0` where
    /// the stage does not run (`stage_mask::masked_twin`), which the loop calls instead, so
    /// that a loop over the stages skips those that run no forward in the tick.
    pub(super) masked_forward: Option<(FuncId, FuncId)>,
    /// On a circular pipeline, the interleaved order (`tick_interleaved.rs`); else the parity
    /// order.
    pub(super) interleaved: Option<Interleaved>,
}

/// The stage's backward as `B` and `W` (`--schedule zb-h1`): `@g_input` gives the call's
/// first `firsts` results and the stash that `@g_weight` reads a tick later, where the stage
/// runs a forward, for the rest.
#[derive(Clone, Copy)]
pub(super) struct Halves {
    pub(super) input: FuncId,
    pub(super) weight: FuncId,
    pub(super) firsts: usize,
}

impl Ticks {
    /// The ops by which a ring keeps the stage's input instead of the state `tape` holds: in
    /// the interleaved order, where stage 0's input may come from the back edge, which the
    /// outputs buffer no longer holds when its backward runs. (In the parity order stage 0's
    /// backward reads the step's input, as GPipe's does.)
    pub(super) fn stage_in(&self, tape: &Tape) -> Option<(OpId, OpId)> {
        tape.stage_in.filter(|_| self.interleaved.is_some())
    }
}

pub(super) fn int(b: &mut Builder, hint: &str, v: i64) -> Result<ValueId, Diagnostic> {
    b.scalar(hint, v as f64, DType::I32)
}

/// The scalars of tick `h`: its pair `τ = ⌊h/2⌋` and which of the two it is, `h mod 2`.
pub(super) struct Tick {
    pub(super) h: ValueId,
    pub(super) pair: ValueId,
    pub(super) odd: ValueId,
}

impl Tick {
    pub(super) fn new(b: &mut Builder, h: ValueId) -> Result<Tick, Diagnostic> {
        let two = int(b, "two", 2)?;
        let pair = b.binary("pair", BinaryOp::Div, h, two)?;
        let even = b.binary("even_tick", BinaryOp::Mul, pair, two)?;
        let odd = b.binary("odd_tick", BinaryOp::Sub, h, even)?;
        Ok(Tick { h, pair, odd })
    }
}

/// `lo <= x < hi`, for a scalar or a vector `x`.
pub(super) fn within(b: &mut Builder, x: ValueId, lo: i64, hi: i64) -> Result<ValueId, Diagnostic> {
    let (lo, hi) = (int(b, "lo", lo)?, int(b, "hi", hi)?);
    let above = b.compare("from_lo", CmpPred::Ge, x, lo)?;
    let below = b.compare("below_hi", CmpPred::Lt, x, hi)?;
    and(b, "within", above, below)
}

pub(super) fn and(
    b: &mut Builder,
    hint: &str,
    x: ValueId,
    y: ValueId,
) -> Result<ValueId, Diagnostic> {
    b.select(hint, x, y, x)
}

/// The microbatch (in entering order, the last microbatch first) that a stage reaching it `at`
/// ticks after it entered works on in tick `h`: `(h - at) / 2`, where `here` (the stages whose
/// parity runs this half), and `-1` (no microbatch) elsewhere.
pub(super) fn entering(
    b: &mut Builder,
    tick: &Tick,
    at: ValueId,
    here: ValueId,
) -> Result<ValueId, Diagnostic> {
    let since = b.binary("since", BinaryOp::Sub, tick.h, at)?;
    let two = int(b, "two", 2)?;
    let n = b.binary("entered", BinaryOp::Div, since, two)?;
    let none = int(b, "none", -1)?;
    b.select("entering", here, n, none)
}

/// GPipe's step that the tick loop is written from: its module, `@train_vjp`, the parts the
/// loop is made of, and the loop's fixed values.
pub(super) struct Step<'a> {
    pub(super) m: &'a Module,
    pub(super) f: &'a Func,
    pub(super) parts: &'a Parts,
    pub(super) ticks: &'a Ticks,
}

/// Copies the stage call `id`; with one stage per rank, as a `call_if` on its stage's mask (the
/// flag it returns):
/// where the stage does not run it computes nothing, and its results are `-0.0`, as a stage
/// function's where its mask is false (a forward's feed only stages that do not run either).
pub(super) fn stage_call(
    b: &mut Builder,
    st: &Step,
    id: OpId,
    env: &mut HashMap<ValueId, ValueId>,
) -> Result<Option<ValueId>, Diagnostic> {
    let f = st.f;
    let OpKind::Call { callee, args, .. } = &f.ops[id].kind else {
        unreachable!("invariant: a stage call")
    };
    let mask = mask_of(f, args).map(|a| env[&a]);
    let hint = &f.values[f.ops[id].results[0]].name;
    let args = args.iter().map(|a| env[a]).collect();
    let callee = match st.ticks.masked_forward {
        Some((forward, twin)) if forward == *callee => twin,
        _ => *callee,
    };
    let (results, on) = call_stage(b, st, hint, callee, args, mask)?;
    env.extend(f.ops[id].results.iter().copied().zip(results));
    Ok(on)
}

/// Calls the stage function `callee` on `args`; with one stage per rank, as a `call_if` on
/// its stage `mask`. Returns the results and the flag.
pub(super) fn call_stage(
    b: &mut Builder,
    st: &Step,
    hint: &str,
    callee: FuncId,
    args: Vec<ValueId>,
    mask: Option<ValueId>,
) -> Result<(Vec<ValueId>, Option<ValueId>), Diagnostic> {
    let on = match (st.ticks.one_stage_per_rank, mask) {
        (true, Some(mask)) => {
            let flag = Type::new(DType::I1, vec![]);
            Some(b.op("stage_runs", OpKind::Reshape { x: mask }, Some(flag))?)
        }
        _ => None,
    };
    let results = b.call_if(hint, st.m, callee, args, on)?;
    Ok((results, on))
}

/// What a stage keeps for its backward after a tick's forwards: the rings, and the values the
/// same in every tick (as the last forward on the rank computed them, with the op of L2 that
/// reads them).
pub(super) struct Held {
    pub(super) rings: Vec<ValueId>,
    pub(super) same: Vec<(OpId, ValueId)>,
}
