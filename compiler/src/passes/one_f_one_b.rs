//! `1f1b`: the training step under `--schedule 1f1b` (and `zb-h1`, below), one SPMD loop in
//! which every stage runs the forward of one microbatch and the backward of another in each
//! tick (1F1B, as in PipeDream-Flush and Megatron), so that stage `s` keeps `S - s`
//! microbatches' inputs, not M.
//!
//! Preconditions: `autodiff` has run on GPipe's `@train` (any `--remat`; with `R > 1`, not
//! `tick`), and `loss` has built `@microbatch_loss` and `@loss_normalizer`. Postconditions:
//! `@train_vjp` computes the same loss and gradients, bit for bit, in one loop of `2(M+S-1)`
//! ticks (`R = 1`) or of the interleaved order's (`R > 1`, below).
//!
//! **The order** (`pipeline-schedules.md` §5): in tick `h`, the stages of parity `h mod 2` run
//! a forward and the others a backward, so a tick is one forward call and one backward call
//! over complementary stage masks, and a microbatch moves one stage per tick each way:
//! - stage `g` runs the forward of entering microbatch `n` (the last microbatch first) in tick
//!   `g + 2n`, and its backward in tick `2S - 1 - g + 2n`; the last stage's backward of a
//!   microbatch follows its forward;
//! - so in each pair of ticks `τ = ⌊h/2⌋` even stages run F then B, odd stages B then F, and
//!   stage `g` holds at most `S - g` inputs (the same order on every stage would hold
//!   `2(S-1-g) + 1`); the bubble is GPipe's `(S-1)/(M+S-1)`.
//!
//! How it is made from GPipe's step, whose forward loop L1 runs stage `s` on item `t - s` and
//! whose backward loop L2 (L1 reversed) runs it on microbatch `t_fwd - s`:
//! - **Forward half** of a tick: L1's body with each stage's item replaced by its entering microbatch in
//!   the stages of this parity (`-1`, no work, elsewhere), stage 0 fed microbatch `M-1-τ`, and
//!   the outputs written where the last stage finished one. Each microbatch's values are
//!   computed by the same ops, so they are the same bytes in another tick. With several
//!   stages on a rank, the forward is called with its results masked (`@stage_masked`,
//!   `stage_mask::masked_twin`): a stage runs a forward in one tick of two, and a loop over
//!   the stages skips it in the other (with one, the call is skipped there, `call_if`).
//! - **Backward half**: L2's body with each stage's microbatch replaced likewise, and the
//!   cotangent masked to `-0.0` where a stage does not run, as GPipe's bubbles see it (there
//!   the slot holds a cotangent of another tick). Every stage still meets its microbatches in
//!   GPipe's backward order, so every gradient adds up in the same order. Under `--remat
//!   tick` its recomputation (`@stage_recompute`) runs a tick earlier, in the stage's forward
//!   tick, so that a forward tick and a backward tick cost about the same (`tick_backward.rs`).
//! - **Within a tick**, the backward half comes first: it starts with the exchange that brings
//!   its cotangents, and the forward half ends with the one that sends its activations, so
//!   every stage call runs between the two and neighbouring ranks wait for each other once per
//!   tick, not once per half.
//! - **The rings**: each stage keeps what GPipe's tapes keep (its inputs under `--remat stage`
//!   and `tick`, every activation its backward reads under `none`) in rings of `S` slots
//!   (`[S, stages, ...]`): in the tick it runs a forward, at slot `τ mod S` (the other
//!   parity's entries kept, one slice written in place); it reads them back `d = S-1-g` (even
//!   `g`) or `S-g` (odd) pairs of ticks later, through a stage-major view. GPipe's tapes hold
//!   `M + S - 1`. Its tape of stage masks (`none`) has no ring: the backward's mask is where a
//!   microbatch runs in the tick.
//! - **The seed**: L2 started from the loss's cotangent of all outputs, computed after L1.
//!   Here, in the tick a microbatch leaves the last stage, `@microbatch_loss_vjp` (its `@head`
//!   and loss; the last rank only) gives that microbatch's cotangent, which is its slice of the
//!   whole one bit for bit (`loss.rs`). The loss itself, `@head`'s weight gradients and the
//!   rest of what ran between L1 and L2 run after the loop on all microbatches, as in GPipe.
//!
//! **ZB-H1** (`--schedule zb-h1`) is this loop with the stage's backward cut into its input
//! gradient `B` and its weight gradient `W` (`bw_split.rs`): `B` runs where the whole backward
//! ran, `W` in the next tick, the stage's forward tick, on what `B` stashed (a carried value,
//! `names::STASHED`), and the last tick's `W` after the loop. Each `W` adds its gradients where
//! the whole backward did, so the bytes are still GPipe's.
//!
//! **Interleaved 1F1B** (`repeats` > 1): the same loop in the order of `tick_interleaved.rs`,
//! where a stage may run a forward and a backward in the same tick; each stage works on GPipe's
//! items (`r·M + m`), from which the copied ops derive the mask, the repeat, the output slot
//! and the circular back edge, and the rings keep the stage's input (stage 0's may come from
//! the back edge, which the outputs buffer no longer holds when its backward runs). ZB-H1 and
//! `--remat tick` keep to the parity order and refuse repeats.

use super::autodiff::trainables;
use super::bw_split::split;
use super::gpipe_step::{after_forward, exchanging, loop_body, unexpected, Kept, Parts};
use super::options::Options;
use super::remat::Remat;
use super::stage_mask::masked_twin;
use super::tick::{and, entering, int, stage_call, within, Halves, Held, Step, Tick, Ticks};
use super::tick_backward::{backward_half, recompute_ahead, weight_call};
use super::tick_interleaved::Interleaved;
use super::tick_ring::Rings;
use crate::timetable::Kind;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Func, FuncId, Module, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, Float, OpKind};
use ppc_dialect::{DType, Dim, Type};
use std::cell::Cell;
use std::collections::HashMap;

pub fn one_f_one_b(m: &mut Module, opts: &Options) -> Result<(), Diagnostics> {
    let refuse = |what: &str| Err(vec![Diagnostic::plain(what)]);
    match opts.schedule {
        Kind::Gpipe if opts.remat == Remat::Tick => {
            return refuse("`--remat tick` recomputes a stage's forward in the tick before its backward, which only `--schedule 1f1b` has: train GPipe with `--remat stage`")
        }
        Kind::Gpipe => return Ok(()),
        Kind::ZbH1 if opts.remat == Remat::Tick => {
            return refuse("`--schedule zb-h1` runs a stage's weight gradient in its forward tick, and `--remat tick` its recomputation there too, which would make that tick the slower one: train zb-h1 with `--remat stage` or `none`")
        }
        Kind::ZbH1 | Kind::OneFOneB => {}
    }
    if m.pipeline.repeats > 1 {
        if opts.schedule == Kind::ZbH1 {
            return refuse("`--schedule zb-h1` with `repeats` > 1 is not built: its `W`s fill the parity order's idle half-ticks, which the interleaved order has not; train circular pipelines with `1f1b` (interleaved) or `gpipe`");
        }
        if opts.remat == Remat::Tick {
            return refuse("`--remat tick` recomputes in a stage's forward tick of the parity order; the interleaved order (`repeats` > 1) runs forwards and backwards in the same ticks: train it with `--remat stage` or `none`");
        }
    }
    let train = names::vjp(names::TRAIN);
    let Some(id) = m.func_id(&train) else {
        return refuse("`1f1b` needs `@train_vjp`: run `autodiff` first");
    };
    let halves = match opts.schedule {
        Kind::ZbH1 => Some(split_backward(m, id).map_err(|d| vec![d])?),
        _ => None,
    };
    let masked = masked_forward(m, id).map_err(|d| vec![d])?;
    let f = build(m, id, halves, masked).map_err(|d| vec![d])?;
    let added = halves.iter().flat_map(|h| [h.input, h.weight]);
    replace_step(
        m,
        id,
        added.chain(masked.map(|(_, twin)| twin)).collect(),
        f,
    );
    Ok(())
}

/// Puts `step` in place of the step `id`, which is last in `m`, with the functions `added` to
/// `m` for it: callees come before their callers, so the first added function takes the
/// step's place, each other the place of the one before, and the step goes last.
fn replace_step(m: &mut Module, id: FuncId, added: Vec<FuncId>, step: Func) {
    let slots: Vec<FuncId> = std::iter::once(id).chain(added.iter().copied()).collect();
    let moved: HashMap<FuncId, FuncId> = added.iter().copied().zip(slots.iter().copied()).collect();
    let mut funcs: Vec<Func> = (added.iter())
        .map(|&a| std::mem::replace(&mut m.funcs[a], Func::new("")))
        .collect();
    funcs.push(step);
    for (mut f, slot) in funcs.into_iter().zip(slots) {
        for op in f.ops.values_mut() {
            if let OpKind::Call { callee, .. } = &mut op.kind {
                *callee = moved.get(callee).copied().unwrap_or(*callee);
            }
        }
        m.funcs[slot] = f;
    }
}

/// With several stages on a rank, the forward the tick loop calls with its results masked
/// by the stage mask (`stage_mask::masked_twin`), added to `m`: the forward and its twin. (With
/// one stage a rank, the loop calls the forward only where the stage runs, `call_if`.)
fn masked_forward(m: &mut Module, id: FuncId) -> Result<Option<(FuncId, FuncId)>, Diagnostic> {
    if m.pipeline.stages_per_rank() == 1 {
        return Ok(None);
    }
    let f = &m.funcs[id];
    let parts = Parts::find(m, f)?;
    let OpKind::Call { callee, .. } = f.ops[parts.forward_call].kind else {
        unreachable!("invariant: a stage call")
    };
    Ok(masked_twin(m, &m.funcs[callee])?.map(|twin| (callee, m.funcs.push(twin))))
}

/// Cuts the stage's backward that GPipe's step calls into `B` and `W` (`bw_split.rs`) and
/// adds the two to `m`.
fn split_backward(m: &mut Module, id: FuncId) -> Result<Halves, Diagnostic> {
    let f = &m.funcs[id];
    let parts = Parts::find(m, f)?;
    let OpKind::Call { callee, .. } = &f.ops[parts.backward_call].kind else {
        unreachable!("invariant: a stage call")
    };
    let stage = (m.func_id(names::STAGE)).ok_or_else(|| unexpected("a `@stage`"))?;
    let weights = trainables(m, stage).len();
    let g = &m.funcs[*callee];
    let firsts = g.body.results.len() - weights.min(g.body.results.len());
    let (input, weight) = split(m, g, weights)?;
    Ok(Halves {
        input: m.funcs.push(input),
        weight: m.funcs.push(weight),
        firsts,
    })
}

fn build(
    m: &Module,
    id: FuncId,
    halves: Option<Halves>,
    masked_forward: Option<(FuncId, FuncId)>,
) -> Result<Func, Diagnostic> {
    let f = &m.funcs[id];
    let parts = Parts::find(m, f)?;
    let mut b = Builder::new(&f.name);
    b.span = f.op_spans.get(&parts.forward);
    let mut env = HashMap::new();
    for &a in &f.body.args {
        let v = b.arg(&f.values[a].name, f.ty(a).clone());
        env.insert(a, v);
    }
    b.bind_params_of(f, &mut env)?;
    let at = |op: OpId| f.body.ops.iter().position(|&o| o == op).expect("top level");
    let (first, last) = (at(parts.forward), at(parts.backward));
    let (early, late) = after_forward(f, &f.body.ops[first + 1..last], parts.forward);
    b.copy_ops(m, f, &f.body.ops[..first], &mut env)?;
    b.copy_ops(m, f, &early, &mut env)?;
    let ticks = ticks(&mut b, m, f, parts.forward, &env, (halves, masked_forward))?;
    let results = tick_loop(&mut b, m, f, &parts, &ticks, &env)?;
    let l1 = &f.ops[parts.forward].results;
    env.insert(l1[0], results.state);
    env.insert(l1[1], results.outputs);
    let l2 = &f.ops[parts.backward].results;
    env.extend(l2.iter().copied().zip(results.backward));
    b.copy_ops(m, f, &late, &mut env)?;
    b.copy_ops(m, f, &f.body.ops[last + 1..], &mut env)?;
    let returned = f.body.results.iter().map(|v| env[v]).collect();
    let mut out = b.finish(returned);
    out.remove_dead_ops();
    Ok(out)
}

fn ticks(
    b: &mut Builder,
    m: &Module,
    f: &Func,
    forward: OpId,
    env: &HashMap<ValueId, ValueId>,
    (halves, masked_forward): (Option<Halves>, Option<(FuncId, FuncId)>),
) -> Result<Ticks, Diagnostic> {
    let p = m.pipeline;
    let find = |name: &str| {
        m.func_id(name)
            .ok_or_else(|| unexpected(&format!("`@{name}` exists")))
    };
    let microbatch_loss = find(&names::vjp(names::MICROBATCH_LOSS))?;
    let normalize = find(names::LOSS_NORMALIZER)?;
    let [_, target, d_loss, d_outputs] = f.body.args[..] else {
        return Err(unexpected("the arguments x, target, d_loss, d_outputs"));
    };
    let (target, d_loss, d_outputs) = (env[&target], env[&d_loss], env[&d_outputs]);
    let normalizer = b.call("normalizer", m, normalize, vec![target])?;
    let l1 = loop_body(f, forward);
    let stage_dim = f.ty(l1.args[1]).dims[0].clone();
    let stage_ty = Type::new(DType::I32, vec![stage_dim]);
    let local = b.op(
        "tick_stage_ids",
        OpKind::Iota { axis: 0 },
        Some(stage_ty.clone()),
    )?;
    let (stage_ids, on_last_rank) = match p.ranks {
        1 => (local, None),
        ranks => {
            let rank = b.op("tick_rank", OpKind::Rank, None)?;
            let per_rank = int(b, "tick_stages_per_rank", p.stages_per_rank() as i64)?;
            let first = b.binary("tick_first_stage", BinaryOp::Mul, rank, per_rank)?;
            let ids = b.binary("tick_global_stage_ids", BinaryOp::Add, local, first)?;
            let last = int(b, "tick_last_rank", ranks as i64 - 1)?;
            let on = b.compare("tick_on_last_rank", CmpPred::Eq, rank, last)?;
            (ids, Some(on))
        }
    };
    let interleaved = (p.repeats > 1).then_some(Interleaved {
        repeats: p.repeats as i64,
        stages: p.stages as i64,
        microbatches: p.microbatches as i64,
    });
    let (one, two) = (int(b, "one", 1)?, int(b, "two", 2)?);
    let pair = b.binary("stage_pair", BinaryOp::Div, stage_ids, two)?;
    let evens = b.binary("even_below", BinaryOp::Mul, pair, two)?;
    let parity = b.binary("stage_parity", BinaryOp::Sub, stage_ids, evens)?;
    let read_offset = b.binary("read_offset", BinaryOp::Add, evens, one)?;
    Ok(Ticks {
        microbatches: p.microbatches as i64,
        stages: p.stages as i64,
        stage_ids,
        parity,
        rings: Rings {
            slots: interleaved.map_or(p.stages as i64, |il| il.ring_len()),
            read_offset,
        },
        on_last_rank,
        one_stage_per_rank: p.stages_per_rank() == 1,
        normalizer,
        target,
        d_loss,
        d_outputs,
        microbatch_loss,
        halves,
        masked_forward,
        interleaved,
    })
}

/// What the tick loop leaves: the forward loop's state and outputs, the backward loop's
/// carried values.
struct LoopResults {
    state: ValueId,
    outputs: ValueId,
    backward: Vec<ValueId>,
}

fn tick_loop(
    b: &mut Builder,
    m: &Module,
    f: &Func,
    parts: &Parts,
    ticks: &Ticks,
    env: &HashMap<ValueId, ValueId>,
) -> Result<LoopResults, Diagnostic> {
    let OpKind::Loop { inits: f_inits, .. } = &f.ops[parts.forward].kind else {
        unreachable!("invariant: a loop")
    };
    let OpKind::Loop { inits: b_inits, .. } = &f.ops[parts.backward].kind else {
        unreachable!("invariant: a loop")
    };
    let l1 = loop_body(f, parts.forward);
    let l2 = loop_body(f, parts.backward);
    let hint = |v: ValueId| f.values[v].name.as_str();
    let value = Float(-0.0);
    // A ring of `S` slots in place of each tape of `M + S - 1` of stage values, then one slot
    // for each value the same in every tick (the tape of stage masks, under `--remat none`,
    // has none: the backward's mask follows from the tick).
    let mut inits = vec![env[&f_inits[0]], env[&f_inits[1]]];
    let mut hints = vec![hint(l1.args[1]), hint(l1.args[2])];
    for kept in [Kept::Staged, Kept::Same] {
        for (&tape, t) in l1.args[3..].iter().zip(&parts.tapes) {
            let mut ty = f.ty(tape).clone();
            match t.kept {
                Kept::Staged if kept == Kept::Staged => {
                    ty.dims[0] = Dim::lit(ticks.rings.slots as u64);
                    hints.push(names::TICK_RING);
                }
                Kept::Same if kept == Kept::Same => {
                    ty = ty.remove(0);
                    hints.push(hint(tape));
                }
                _ => continue,
            }
            inits.push(b.op("kept0", OpKind::Constant { value }, Some(ty))?);
        }
    }
    let kept = inits.len() - 2;
    let fwd_rings = hints.iter().filter(|&&h| h == names::TICK_RING).count();
    // Under `--remat tick`, the residuals one tick recomputes for the next tick's backwards.
    let recomputed = parts
        .recompute_call
        .map_or(&[][..], |id| &f.ops[id].results[..]);
    for &r in recomputed {
        let ty = f.ty(r).clone();
        let value = Float(if ty.dtype.is_float() { -0.0 } else { 0.0 });
        inits.push(b.op("recomputed0", OpKind::Constant { value }, Some(ty))?);
        hints.push(names::RECOMPUTED);
    }
    // Under `--schedule zb-h1`, what a tick's `B`s stash for the next tick's `W`s.
    let stashed = match ticks.halves {
        Some(h) => m.funcs[h.weight].arg_types(),
        None => Vec::new(),
    };
    for ty in &stashed {
        let value = Float(if ty.dtype.is_float() { -0.0 } else { 0.0 });
        inits.push(b.op("stashed0", OpKind::Constant { value }, Some(ty.clone()))?);
        hints.push(names::STASHED);
    }
    let carries = kept + recomputed.len() + stashed.len();
    // Each microbatch's slot is written in the tick it leaves the last stage, before it is read.
    let d_outputs_ty = f.ty(l2.args[1 + parts.d_outputs]).clone();
    let d_outputs = b.op("d_outputs0", OpKind::Constant { value }, Some(d_outputs_ty))?;
    inits.extend(
        b_inits
            .iter()
            .enumerate()
            .map(|(j, v)| match j == parts.d_outputs {
                true => d_outputs,
                false => env[v],
            }),
    );
    hints.extend(l2.args[1..].iter().map(|&a| hint(a)));
    let trips = match ticks.interleaved {
        Some(il) => il.ticks(),
        None => 2 * (ticks.microbatches + ticks.stages - 1) as u64,
    };
    let st = Step { m, f, parts, ticks };
    let out = b.loop_op(trips, inits, &hints, |b, h, c| {
        let mut env = env.clone();
        let tick = Tick::new(b, h)?;
        // The backward half first: it starts with the exchange that brings this tick's
        // cotangents, and the forward half ends with the one that sends its activations, so
        // that every stage call of the tick runs between the two.
        let (rings, same) = c[2..2 + kept].split_at(fwd_rings);
        let same_reads = parts.tapes.iter().filter(|t| t.kept == Kept::Same);
        let held = Held {
            rings: rings.to_vec(),
            same: same_reads
                .map(|t| t.read)
                .zip(same.iter().copied())
                .collect(),
        };
        let (recomputed, stashed) = c[2 + kept..2 + carries].split_at(recomputed.len());
        let carried = &c[2 + carries..];
        let base = env.clone();
        let (mut backward, stash) =
            backward_half(b, &st, &mut env, &tick, &held, carried, recomputed, stashed)?;
        let ahead = |b: &mut Builder, held: &Held| recompute_ahead(b, &st, base, &tick, held);
        let fwd = forward_half(b, &st, &mut env, &tick, &c[..2 + kept], ahead)?;
        // A microbatch's backward starts in the tick after it left the last stage.
        let d_outputs = &mut backward[parts.d_outputs];
        *d_outputs = seed_leaving(b, m, ticks, &fwd, *d_outputs)?;
        let mut yields = vec![fwd.state, fwd.outputs];
        yields.extend(&fwd.held.rings);
        yields.extend(fwd.held.same.iter().map(|&(_, v)| v));
        yields.extend(fwd.recomputed);
        yields.extend(stash);
        yields.extend(backward);
        Ok(yields)
    })?;
    let mut backward = out[2 + carries..].to_vec();
    if let Some(h) = ticks.halves {
        // The last tick's `B`s (stage 0's of the last microbatch) have their `W` after it.
        let st = Step { m, f, parts, ticks };
        let weights = weight_call(b, &st, h, &out[2 + carries - stashed.len()..2 + carries])?;
        add_last_weights(b, f, parts, h, &weights, &mut backward)?;
    }
    Ok(LoopResults {
        state: out[0],
        outputs: out[1],
        backward,
    })
}

/// Adds `weights`, the gradients of the last `W`, to L2's accumulators in `backward`, as L2's
/// body adds the backward call's (`add %d_w, %grad`, yielded).
fn add_last_weights(
    b: &mut Builder,
    f: &Func,
    parts: &Parts,
    h: Halves,
    weights: &[ValueId],
    backward: &mut [ValueId],
) -> Result<(), Diagnostic> {
    let l2 = loop_body(f, parts.backward);
    let grads = &f.ops[parts.backward_call].results[h.firsts..];
    for (&grad, &w) in grads.iter().zip(weights) {
        let j = (l2.ops.iter())
            .find_map(|&id| match &f.ops[id].kind {
                OpKind::Binary {
                    op: BinaryOp::Add,
                    lhs,
                    rhs,
                } if *rhs == grad => {
                    let j = l2.args[1..].iter().position(|a| a == lhs)?;
                    (l2.results[j] == f.ops[id].results[0]).then_some(j)
                }
                _ => None,
            })
            .ok_or_else(|| unexpected("each weight gradient added to its accumulator"))?;
        backward[j] = b.binary(
            &f.values[l2.args[1 + j]].name,
            BinaryOp::Add,
            backward[j],
            w,
        )?;
    }
    Ok(())
}

/// What a forward half leaves: the state and outputs to carry, the rings with what this
/// tick's forwards keep, and the microbatch that left the last stage (`leaving`, valid where
/// `left`).
struct ForwardHalf {
    state: ValueId,
    outputs: ValueId,
    held: Held,
    /// What the recomputation for the next tick's backwards left.
    recomputed: Vec<ValueId>,
    last: ValueId,
    leaving: ValueId,
    left: ValueId,
}

/// Which forwards a tick runs, and what GPipe's L1 reads for its iteration there.
struct Forwards {
    /// Per stage: where one runs, and its item (GPipe's, or in the parity order the entering
    /// number: either gives the mask).
    here: ValueId,
    item: ValueId,
    /// What L1's iteration reads as: the pair (parity order), or stage 0's item.
    t: ValueId,
    /// Parity order: the input microbatch stage 0 is fed, and the output slot written.
    feed_at: Option<ValueId>,
    write_at: Option<ValueId>,
    /// Interleaved order: the item the last stage finishes (L1's `done_item`).
    done: Option<ValueId>,
    /// Where the last stage's result is written to the outputs, and the microbatch that left
    /// the last stage for good (`leaving`, valid where `left`).
    wrote: ValueId,
    leaving: ValueId,
    left: ValueId,
    /// The ring slot the stages write.
    slot: ValueId,
}

impl Forwards {
    /// The parity order: in tick `h` the stages of parity `h mod 2` run; stage `g` the forward
    /// of entering microbatch `(h - g) / 2`, stage 0 fed microbatch `M-1-τ`.
    fn parity(b: &mut Builder, ticks: &Ticks, tick: &Tick) -> Result<Forwards, Diagnostic> {
        let (mbs, stages) = (ticks.microbatches, ticks.stages);
        let here = b.compare("forward_here", CmpPred::Eq, ticks.parity, tick.odd)?;
        let item = entering(b, tick, ticks.stage_ids, here)?;
        // Stage 0 takes microbatch M-1-τ while there is one, then the padding (slot τ).
        let last_mb = int(b, "last_microbatch", mbs - 1)?;
        let reversed = b.binary("entering_mb", BinaryOp::Sub, last_mb, tick.pair)?;
        let real = within(b, tick.pair, 0, mbs)?;
        let feed_at = b.select("feed_at", real, reversed, tick.pair)?;
        // The last stage finishes its microbatch in the ticks of its parity.
        let last_stage = int(b, "last_stage", stages - 1)?;
        let last_parity = int(b, "last_parity", (stages - 1) % 2)?;
        let last_here = b.compare("last_here", CmpPred::Eq, tick.odd, last_parity)?;
        let n = entering(b, tick, last_stage, last_here)?;
        let leaving = b.binary("leaving", BinaryOp::Sub, last_mb, n)?;
        let real = within(b, n, 0, mbs)?;
        let left = and(b, "left", last_here, real)?;
        Ok(Forwards {
            here,
            item,
            t: tick.pair,
            feed_at: Some(feed_at),
            write_at: Some(leaving),
            done: None,
            wrote: left,
            leaving,
            left,
            slot: ticks.rings.write_slot(b, tick.pair)?,
        })
    }

    /// The interleaved order (`tick_interleaved.rs`): GPipe's items, L1's iteration read as
    /// stage 0's item (or, where it runs none, the padding's last, which feeds nothing).
    fn interleaved(
        b: &mut Builder,
        ticks: &Ticks,
        il: Interleaved,
        tick: &Tick,
    ) -> Result<Forwards, Diagnostic> {
        let units = il.forward(b, tick.h, ticks.stage_ids)?;
        let (t, done) = il.ends(b, tick.h, false)?;
        let zero = int(b, "zero", 0)?;
        let wrote = b.compare("wrote", CmpPred::Ge, done, zero)?;
        let final_items = int(b, "final_items", (il.repeats - 1) * il.microbatches)?;
        let left = b.compare("left", CmpPred::Ge, done, final_items)?;
        let leaving = b.binary("leaving", BinaryOp::Sub, done, final_items)?;
        Ok(Forwards {
            here: units.here,
            item: units.item,
            t,
            feed_at: None,
            write_at: None,
            done: Some(done),
            wrote,
            leaving,
            left,
            slot: units.slot,
        })
    }
}

/// L1's body in tick `h` on the stages that run a forward there ([`Forwards`]); what they
/// keep goes to the rings instead of the tapes.
fn forward_half(
    b: &mut Builder,
    st: &Step,
    env: &mut HashMap<ValueId, ValueId>,
    tick: &Tick,
    carried: &[ValueId],
    recompute: impl FnOnce(&mut Builder, &Held) -> Result<Vec<ValueId>, Diagnostic>,
) -> Result<ForwardHalf, Diagnostic> {
    let (m, f, parts, ticks) = (st.m, st.f, st.parts, st.ticks);
    let l1 = loop_body(f, parts.forward);
    let fw = match ticks.interleaved {
        Some(il) => Forwards::interleaved(b, ticks, il, tick)?,
        None => Forwards::parity(b, ticks, tick)?,
    };
    let (t, state) = (l1.args[0], l1.args[1]);
    env.insert(t, fw.t);
    env.insert(state, carried[0]);
    env.insert(l1.args[2], carried[1]);
    // Set by `copy`, which runs in two passes: `Cell`s, read between them.
    let (last, written, ran) = (Cell::new(None), Cell::new(None), Cell::new(None));
    let tape_writes: Vec<OpId> = parts.tapes.iter().map(|t| t.write).collect();
    let copy = |b: &mut Builder, env: &mut HashMap<ValueId, ValueId>, id: OpId| {
        match &f.ops[id].kind {
            _ if tape_writes.contains(&id) => {}
            _ if id == parts.forward_item => {
                env.insert(f.ops[id].results[0], fw.item);
            }
            _ if id == parts.forward_done && fw.done.is_some() => {
                env.insert(f.ops[id].results[0], fw.done.expect("checked"));
            }
            _ if id == parts.feed && fw.feed_at.is_some() => {
                copy_with(b, m, f, id, env, t, fw.feed_at.expect("checked"))?
            }
            _ if id == parts.forward_call => ran.set(stage_call(b, st, id, env)?),
            OpKind::Update { update, index, .. } if id == parts.write => {
                last.set(Some(env[update]));
                match fw.write_at {
                    Some(at) => copy_with(b, m, f, id, env, *index, at)?,
                    None => b.copy_ops(m, f, &[id], env)?,
                }
                written.set(Some(env[&f.ops[id].results[0]]));
            }
            _ => b.copy_ops(m, f, &[id], env)?,
        }
        Ok::<_, Diagnostic>(())
    };
    // What waits for the neighbour (the state's exchange) goes last, after the recomputation.
    let late = exchanging(f, &l1.ops);
    for &id in l1.ops.iter().filter(|id| !late.contains(id)) {
        copy(b, env, id)?;
    }
    if tape_writes.iter().any(|w| late.contains(w)) {
        return Err(unexpected("tapes that keep nothing received"));
    }
    // The stages that ran keep what the tapes kept in their slot of the rings; in the
    // interleaved order, the stage's input for the state's tape (`Tape::stage_in`).
    let kept = |kind: Kept| {
        (parts.tapes.iter().filter(move |t| t.kept == kind)).map(|t| {
            let value = match (&f.ops[t.write].kind, ticks.stage_in(t)) {
                (_, Some((fed, _))) => env[&f.ops[fed].results[0]],
                (OpKind::Update { update, .. }, None) => env[update],
                _ => unreachable!("invariant: a tape write"),
            };
            (t.read, value)
        })
    };
    let staged: Vec<_> = kept(Kept::Staged).map(|(_, v)| v).collect();
    let same: Vec<_> = kept(Kept::Same).collect();
    let (carried_rings, carried_same) = carried[2..].split_at(staged.len());
    let mut rings = Vec::new();
    for (value, &ring) in staged.into_iter().zip(carried_rings) {
        rings.push(ticks.rings.write(b, ring, value, fw.here, fw.slot)?);
    }
    let same = (same.into_iter().zip(carried_same))
        .map(|((read, value), &before)| match ran.get() {
            Some(ran) => Ok((read, b.select("same_kept", ran, value, before)?)),
            None => Ok((read, value)),
        })
        .collect::<Result<_, Diagnostic>>()?;
    let held = Held { rings, same };
    let recomputed = recompute(b, &held)?;
    for &id in l1.ops.iter().filter(|id| late.contains(id)) {
        copy(b, env, id)?;
    }
    let written = written.get().expect("invariant: the write is in L1");
    let outputs = b.select("outputs_left", fw.wrote, written, carried[1])?;
    Ok(ForwardHalf {
        state: env[&l1.results[0]],
        outputs,
        held,
        recomputed,
        last: last.get().expect("invariant: the write is in L1"),
        leaving: fw.leaving,
        left: fw.left,
    })
}

/// Copies op `id` with `from` read as `to`.
fn copy_with(
    b: &mut Builder,
    m: &Module,
    f: &Func,
    id: OpId,
    env: &mut HashMap<ValueId, ValueId>,
    from: ValueId,
    to: ValueId,
) -> Result<(), Diagnostic> {
    let saved = env.insert(from, to);
    b.copy_ops(m, f, &[id], env)?;
    match saved {
        Some(v) => env.insert(from, v),
        None => env.remove(&from),
    };
    Ok(())
}

/// Writes the cotangent of the microbatch that left the last stage in this tick (if one did)
/// into its slot of the outputs' cotangent: the VJP of `@microbatch_loss` (on the last rank),
/// seeded with `d_loss` and its slice of the outputs' seed.
fn seed_leaving(
    b: &mut Builder,
    m: &Module,
    ticks: &Ticks,
    fwd: &ForwardHalf,
    d_outputs: ValueId,
) -> Result<ValueId, Diagnostic> {
    let (mb, axis) = (fwd.leaving, 0);
    let target = b.op(
        "target_left",
        OpKind::Index {
            x: ticks.target,
            index: mb,
            axis,
        },
        None,
    )?;
    let seed = b.op(
        "seed_left",
        OpKind::Index {
            x: ticks.d_outputs,
            index: mb,
            axis,
        },
        None,
    )?;
    let on = match ticks.on_last_rank {
        Some(rank) => and(b, "seed_here", rank, fwd.left)?,
        None => fwd.left,
    };
    let args = vec![fwd.last, target, ticks.normalizer, ticks.d_loss, seed];
    let vjp = b.call_if("microbatch_loss", m, ticks.microbatch_loss, args, Some(on))?;
    // The results are the loss, the outputs, then the cotangent of `y`.
    let d_y = vjp[2];
    let seeded = b.op(
        "d_outputs_seeded",
        OpKind::Update {
            x: d_outputs,
            update: d_y,
            index: mb,
            axis,
        },
        None,
    )?;
    b.select("d_outputs_left", fwd.left, seeded, d_outputs)
}
