//! The backward half of a 1F1B tick (`one_f_one_b.rs`): GPipe's backward loop body L2 on the
//! stages whose parity does not run a forward, and, under `--remat tick`, the recomputation
//! one tick ahead.
//!
//! **Why recompute ahead**: with one stage per rank, neighbouring ranks run a forward and a
//! backward in the same tick and meet in the exchange that ends it, so a tick costs the slower
//! of the two. `@stage_vjp` recomputes the forward inside the backward (`T_F + 2 T_F` against
//! the forward's `T_F`); here a stage recomputes, in the tick of its forward, the residuals
//! of the microbatch it takes back in the next tick (`@stage_recompute`), and the backward
//! tick runs `@stage_bwd` on them: both ticks cost about `2 T_F`, as GPipe's steps do. The
//! residuals of one microbatch per stage are carried for one tick; the same ops compute them,
//! so the bytes are GPipe's.

use super::gpipe_step::{loop_body, mask_of, Kept};
use super::tick::{call_stage, entering, int, stage_call, within, Halves, Held, Step, Tick};
use super::tick_ring::stage_mask;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{Func, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, Float, OpKind};
use std::collections::{HashMap, HashSet};

/// What L2's ops read in one tick in place of GPipe's tapes and items.
struct Backward<'a> {
    /// Each stage's microbatch (`-1` where it runs none), where one runs, and the microbatch
    /// whose outputs' cotangent the last stage reads.
    item: ValueId,
    active: ValueId,
    done: ValueId,
    /// Interleaved order: what L2's reversed iteration reads as, stage 0's item.
    reversed: Option<ValueId>,
    /// The slots each stage reads its rings at.
    slots: ValueId,
    rings: HashMap<OpId, ValueId>,
    same: HashMap<OpId, ValueId>,
    /// The reads of a tape that nothing reads once the rings hold the stage's input.
    unread: Vec<OpId>,
    st: &'a Step<'a>,
}

impl<'a> Backward<'a> {
    /// L2's iteration in tick `h` on the stages that run a backward there: in the parity
    /// order those of the other parity, stage `g` the backward of entering microbatch
    /// `(h - (2S-1-g)) / 2`; else as `tick_interleaved.rs` orders them.
    fn new(
        b: &mut Builder,
        st: &'a Step<'a>,
        tick: &Tick,
        held: &Held,
    ) -> Result<Backward<'a>, Diagnostic> {
        let (parts, ticks) = (st.parts, st.ticks);
        let (item, active, done, reversed, slots) = match ticks.interleaved {
            None => {
                let (item, active, done) = parity(b, st, tick)?;
                let slots = ticks.rings.read_slots(b, tick.pair)?;
                (item, active, done, None, slots)
            }
            Some(il) => {
                let units = il.backward(b, tick.h, ticks.stage_ids)?;
                let all = il.repeats * il.microbatches;
                let active = within(b, units.item, 0, all)?;
                let (t, done) = il.ends(b, tick.h, true)?;
                (units.item, active, done, Some(t), units.slot)
            }
        };
        // Each read of a tape of stage values, in the order of L1's tapes: its ring.
        let staged = parts.tapes.iter().filter(|t| t.kept == Kept::Staged);
        Ok(Backward {
            item,
            active,
            done,
            reversed,
            slots,
            rings: staged
                .map(|t| ticks.stage_in(t).map_or(t.read, |(_, read)| read))
                .zip(held.rings.iter().copied())
                .collect(),
            same: held.same.iter().copied().collect(),
            unread: (parts.tapes.iter())
                .filter(|t| t.kept == Kept::Outputs || ticks.stage_in(t).is_some())
                .map(|t| t.read)
                .collect(),
            st,
        })
    }

    /// Copies L2's op `id`, reading this tick's items, rings and masks for GPipe's.
    fn copy(
        &self,
        b: &mut Builder,
        env: &mut HashMap<ValueId, ValueId>,
        id: OpId,
    ) -> Result<(), Diagnostic> {
        let (f, parts) = (self.st.f, self.st.parts);
        let result = || f.ops[id].results[0];
        let mask = (parts.tapes.iter())
            .find(|t| t.kept == Kept::Mask)
            .map(|t| t.read);
        let value = match id {
            _ if Some(id) == parts.backward_item => self.item,
            _ if id == parts.backward_done => self.done,
            _ if id == parts.reversed && self.reversed.is_some() => self.reversed.expect("checked"),
            _ if Some(id) == mask => self.active,
            _ if self.same.contains_key(&id) => self.same[&id],
            _ if self.rings.contains_key(&id) => {
                self.st.ticks.rings.read(b, self.rings[&id], self.slots)?
            }
            _ if self.unread.contains(&id) => {
                let value = Float(-0.0);
                b.op(
                    "unread",
                    OpKind::Constant { value },
                    Some(f.ty(result()).clone()),
                )?
            }
            _ => return b.copy_ops(self.st.m, f, &[id], env),
        };
        env.insert(result(), value);
        Ok(())
    }
}

/// The parity order's backwards in tick `h`: each stage's microbatch (in GPipe's order,
/// `M - 1 - n`), where one runs, and the microbatch the last stage takes back.
fn parity(
    b: &mut Builder,
    st: &Step,
    tick: &Tick,
) -> Result<(ValueId, ValueId, ValueId), Diagnostic> {
    let ticks = st.ticks;
    let (mbs, stages) = (ticks.microbatches, ticks.stages);
    let here = b.compare("backward_here", CmpPred::Ne, ticks.parity, tick.odd)?;
    let last_mb = int(b, "last_microbatch", mbs - 1)?;
    let turn = int(b, "turn", 2 * stages - 1)?;
    let waited = b.binary("waited", BinaryOp::Sub, turn, ticks.stage_ids)?;
    let n = entering(b, tick, waited, here)?;
    let item = b.binary("backward_mb", BinaryOp::Sub, last_mb, n)?;
    let out_of_order = int(b, "no_microbatch", -1)?;
    let item = b.select("backward_item", here, item, out_of_order)?;
    // Under `--remat none` the stage mask was a tape: here it is where a microbatch runs.
    let active = within(b, item, 0, mbs)?;
    let last_parity = int(b, "last_parity", (stages - 1) % 2)?;
    let last_here = b.compare("last_here", CmpPred::Ne, tick.odd, last_parity)?;
    let at = int(b, "last_turn", stages)?;
    let n = entering(b, tick, at, last_here)?;
    let real = within(b, n, 0, mbs)?;
    let done = b.binary("done_mb", BinaryOp::Sub, last_mb, n)?;
    let done = b.select("done_item", real, done, out_of_order)?;
    Ok((item, active, done))
}

/// L2's body in tick `h`, its cotangent masked to `-0.0` where a stage does not run (there
/// the slot holds another tick's). Under `--remat tick` its recomputation's residuals are
/// `recomputed`, which the previous tick left ([`recompute_ahead`]). Under `--schedule zb-h1`
/// the weight gradients it adds up are those of the previous tick's backwards, from what they
/// `stashed` ([`split_call`]). Returns L2's carried values and this tick's stash.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward_half(
    b: &mut Builder,
    st: &Step,
    env: &mut HashMap<ValueId, ValueId>,
    tick: &Tick,
    held: &Held,
    carried: &[ValueId],
    recomputed: &[ValueId],
    stashed: &[ValueId],
) -> Result<(Vec<ValueId>, Vec<ValueId>), Diagnostic> {
    let (f, parts) = (st.f, st.parts);
    let l2 = loop_body(f, parts.backward);
    // L2's iteration t reads forward iteration M+S-2-t: stage 0's microbatch when it runs.
    env.insert(l2.args[0], tick.pair);
    env.extend(l2.args[1..].iter().copied().zip(carried.iter().copied()));
    let bw = Backward::new(b, st, tick, held)?;
    let OpKind::Call { args, .. } = &f.ops[parts.backward_call].kind else {
        unreachable!("invariant: a stage call")
    };
    let mask = mask_of(f, args).expect("the stage mask");
    let mut stash = Vec::new();
    for &id in &l2.ops {
        if Some(id) == parts.recompute_call {
            env.extend(
                f.ops[id]
                    .results
                    .iter()
                    .copied()
                    .zip(recomputed.iter().copied()),
            );
            // The mask it passes on is where a microbatch runs in this tick.
            if f.ops[id].results.contains(&mask) {
                env.insert(mask, bw.active);
            }
        } else if id == parts.backward_call {
            let cotangent = *args.last().expect("the cotangent");
            let d_y = env[&cotangent];
            let here = stage_mask(b, env[&mask], &b.ty(d_y).clone())?;
            let zero = b.scalar("no_cotangent", -0.0, b.ty(d_y).dtype)?;
            let masked = b.select("cotangent_here", here, d_y, zero)?;
            let saved = env.insert(cotangent, masked);
            match st.ticks.halves {
                None => _ = stage_call(b, st, id, env)?,
                Some(h) => stash = split_call(b, st, h, id, env, stashed)?,
            }
            env.insert(
                cotangent,
                saved.expect("invariant: defined before the call"),
            );
        } else {
            bw.copy(b, env, id)?;
        }
    }
    Ok((l2.results.iter().map(|v| env[v]).collect(), stash))
}

/// The backward call `id` under `--schedule zb-h1`: `B` (`@g_input`) on this tick's
/// microbatches, and `W` (`@g_weight`) on what the previous tick's `B` `stashed`, whose
/// gradients take the place of the call's in L2's accumulations. The stages that ran that
/// `B` run a forward in this tick, so `W` fills the forward half's time (and, once a stage's
/// forwards are done, the slots it would idle in). Returns this tick's stash.
fn split_call(
    b: &mut Builder,
    st: &Step,
    h: Halves,
    id: OpId,
    env: &mut HashMap<ValueId, ValueId>,
    stashed: &[ValueId],
) -> Result<Vec<ValueId>, Diagnostic> {
    let f = st.f;
    let OpKind::Call { args, .. } = &f.ops[id].kind else {
        unreachable!("invariant: a stage call")
    };
    let mask = mask_of(f, args).map(|a| env[&a]);
    let args = args.iter().map(|a| env[a]).collect();
    // `W` first: then nothing reads the carried stash after `B`, which may write the new one
    // over it (`lower/in_place.rs`).
    let weight = weight_call(b, st, h, stashed)?;
    let (mut input, _) = call_stage(b, st, "input_grad", h.input, args, mask)?;
    let stash = input.split_off(h.firsts);
    let results = &f.ops[id].results;
    env.extend(results.iter().copied().zip(input.into_iter().chain(weight)));
    Ok(stash)
}

/// `W` (`@g_weight`) on `stashed`, where the stage mask it stashed says its `B` ran.
pub(super) fn weight_call(
    b: &mut Builder,
    st: &Step,
    h: Halves,
    stashed: &[ValueId],
) -> Result<Vec<ValueId>, Diagnostic> {
    let g = &st.m.funcs[h.weight];
    let mask = (g.body.args.iter().zip(stashed))
        .find(|(&a, _)| g.ty(a).is_stage_mask())
        .map(|(_, &v)| v)
        .ok_or_else(|| {
            super::gpipe_step::unexpected("a weight gradient that reads the stage mask")
        })?;
    Ok(call_stage(b, st, "weight_grad", h.weight, stashed.to_vec(), Some(mask))?.0)
}

/// The residuals of the backwards of tick `h + 1`, computed in tick `h` by L2's recomputation
/// (`@stage_recompute`) and the ops that give it its arguments, as in that tick: the stages
/// that run a forward in tick `h` run their backward in tick `h + 1`. Empty unless L2
/// recomputes (`--remat tick`).
pub(super) fn recompute_ahead(
    b: &mut Builder,
    st: &Step,
    mut env: HashMap<ValueId, ValueId>,
    tick: &Tick,
    held: &Held,
) -> Result<Vec<ValueId>, Diagnostic> {
    let (f, parts) = (st.f, st.parts);
    let Some(call) = parts.recompute_call else {
        return Ok(Vec::new());
    };
    let ahead = int(b, "tick_ahead", 1)?;
    let next = b.binary("next_tick", BinaryOp::Add, tick.h, ahead)?;
    let next = Tick::new(b, next)?;
    let l2 = loop_body(f, parts.backward);
    env.insert(l2.args[0], next.pair);
    let bw = Backward::new(b, st, &next, held)?;
    let carried: HashSet<ValueId> = l2.args[1..].iter().copied().collect();
    for id in feeding(f, &l2.ops, call) {
        if (f.ops[id].kind.operands().iter()).any(|v| carried.contains(v)) {
            return Err(super::gpipe_step::unexpected(
                "a recomputation that reads no cotangent",
            ));
        }
        bw.copy(b, &mut env, id)?;
    }
    stage_call(b, st, call, &mut env)?;
    Ok(f.ops[call].results.iter().map(|r| env[r]).collect())
}

/// The ops of `ops` before `target` whose results it reads, directly or not, in order.
fn feeding(f: &Func, ops: &[OpId], target: OpId) -> Vec<OpId> {
    let at = ops.iter().position(|&o| o == target).expect("in the block");
    let mut needed: HashSet<ValueId> = f.ops[target].kind.operands().into_iter().collect();
    let mut out = Vec::new();
    for &id in ops[..at].iter().rev() {
        if f.ops[id].results.iter().any(|r| needed.contains(r)) {
            needed.extend(f.ops[id].kind.operands());
            out.push(id);
        }
    }
    out.reverse();
    out
}
