//! `1f1b`: the training step under `--schedule 1f1b`, one SPMD loop over ticks in which every
//! stage runs the forward of one microbatch and the backward of another (1F1B, as in
//! PipeDream-Flush and Megatron), so that a stage keeps a few microbatches' inputs, not all M.
//!
//! Preconditions: `autodiff` has run on GPipe's `@train` with `--remat stage` and `R = 1`, and
//! `loss` has built `@microbatch_loss` and `@loss_normalizer`. Postconditions: `@train_vjp`
//! computes the same loss and gradients, bit for bit, in one loop of `M + 2(S-1)` ticks, split
//! into warm-up (forwards only, `S-1` ticks), steady state (`M`) and cool-down (backwards only,
//! `S-1`), so that no tick tests which halves run.
//!
//! How it is made from GPipe's step, whose forward loop L1 runs iteration `t` with stage `s` on
//! microbatch `t - s`, and whose backward loop L2 (L1 reversed) runs iteration `t'` with stage `s`
//! on microbatch `M + S - 2 - t' - s`, so the weight gradients add up from the last microbatch:
//! - **Forward half of tick `τ`**: L1's body with the microbatches entering last first (stage
//!   `s` on microbatch `M - 1 - (τ - s)`). Each microbatch's values are computed by the same
//!   ops, so they are the same bytes in another tick.
//! - **Backward half of tick `τ`**: L2's body at `t' = τ - (S-1)`: stage `s` then runs the
//!   backward of the microbatch whose forward it ran `2(S-1-s)` ticks before (the last stage:
//!   in the same tick). L2's accumulation order, and so every gradient, is unchanged.
//! - **The tape**: L2 read stage inputs from L1's tape of all `M + S - 1` iterations; here
//!   each stage keeps a ring of `K = 2S - 1` inputs (`[K, stages, ...]`), written at slot `τ mod
//!   K` (one slice, in place) and read by stage `s` at `(τ - 2(S-1-s)) mod K` (through a
//!   stage-major view): stage `s` holds at most `2(S-1-s) + 1` live inputs (GPipe: `M + S - 1`).
//! - **The seed**: L2 started from the loss's cotangent of all outputs, computed after L1.
//!   Here, in the tick a microbatch leaves the last stage, `@microbatch_loss_vjp` (its `@head`
//!   and loss; the last rank only) gives that microbatch's cotangent, which is its slice of the
//!   whole one bit for bit (`loss.rs`). The loss itself, `@head`'s weight gradients and the
//!   rest of what ran between L1 and L2 run after the loop on all microbatches, as in GPipe.
//!
//! Alternating the two halves' order by stage parity would bring stage `s` to `S - s` inputs
//! (`pipeline-schedules.md` §5); that, interleaved repeats and ZB-H1 are not built yet.

use super::gpipe_step::{after_forward, loop_body, unexpected, Parts};
use super::options::Options;
use super::remat::Remat;
use crate::timetable::Kind;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Func, FuncId, Module, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, Float, OpKind};
use ppc_dialect::{DType, Dim, Type};
use std::collections::HashMap;

pub fn one_f_one_b(m: &mut Module, opts: &Options) -> Result<(), Diagnostics> {
    let refuse = |what: &str| Err(vec![Diagnostic::plain(what)]);
    match opts.schedule {
        Kind::Gpipe => return Ok(()),
        Kind::ZbH1 => {
            return refuse(
                "`--schedule zb-h1` is drawn by `ppc schedule` but not compiled yet: train with `gpipe` or `1f1b`",
            )
        }
        Kind::OneFOneB => {}
    }
    if m.pipeline.repeats > 1 {
        return refuse("`--schedule 1f1b` with `repeats` > 1 (interleaved 1F1B) is not compiled yet: train circular pipelines with `gpipe`");
    }
    if opts.remat != Remat::Stage {
        return refuse("`--schedule 1f1b` keeps each stage's inputs and recomputes the stage in its backward: use `--remat stage`");
    }
    let train = names::vjp(names::TRAIN);
    let Some(id) = m.func_id(&train) else {
        return refuse("`1f1b` needs `@train_vjp`: run `autodiff` first");
    };
    let f = build(m, id).map_err(|d| vec![d])?;
    m.funcs[id] = f;
    Ok(())
}

/// The tick loop's fixed values: stage indices, the ring's slots, the rank flag.
struct Ticks {
    /// `M`, `S` and the ring's length `K = 2S - 1`.
    microbatches: i64,
    stages: i64,
    ring_len: i64,
    /// `2s + 1` per local stage `s` (global index): the read slot is this plus the write slot.
    read_offset: ValueId,
    /// Where the loss runs: the last rank (`None` on one rank).
    on_last_rank: Option<ValueId>,
    normalizer: ValueId,
    target: ValueId,
    /// The seeds of the VJP: the loss's and the outputs' cotangents.
    d_loss: ValueId,
    d_outputs: ValueId,
    microbatch_loss: FuncId,
}

fn build(m: &Module, id: FuncId) -> Result<Func, Diagnostic> {
    let f = &m.funcs[id];
    let parts = Parts::find(f)?;
    let mut b = Builder::new(&f.name);
    b.span = f.op_spans.get(&parts.forward);
    let mut env = HashMap::new();
    for &a in &f.body.args {
        let v = b.arg(&f.values[a].name, f.ty(a).clone());
        env.insert(a, v);
    }
    b.params_of(f)?;
    for p in &f.params {
        let v = b.param_named(&f.values[p.value].name);
        env.insert(p.value, v.expect("invariant: declared by params_of"));
    }
    let at = |op: OpId| f.body.ops.iter().position(|&o| o == op).expect("top level");
    let (first, last) = (at(parts.forward), at(parts.backward));
    let (early, late) = after_forward(f, &f.body.ops[first + 1..last], parts.forward);
    b.copy_ops(m, f, &f.body.ops[..first], &mut env)?;
    b.copy_ops(m, f, &early, &mut env)?;
    let ticks = ticks(&mut b, m, f, parts.forward, &env)?;
    let results = tick_loops(&mut b, m, f, &parts, &ticks, &env)?;
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

fn int(b: &mut Builder, hint: &str, v: i64) -> Result<ValueId, Diagnostic> {
    b.scalar(hint, v as f64, DType::I32)
}

fn ticks(
    b: &mut Builder,
    m: &Module,
    f: &Func,
    forward: OpId,
    env: &HashMap<ValueId, ValueId>,
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
    let two = int(b, "two", 2)?;
    let one = int(b, "one", 1)?;
    let twice = b.binary("twice_stage", BinaryOp::Mul, stage_ids, two)?;
    let read_offset = b.binary("read_offset", BinaryOp::Add, twice, one)?;
    let stages = p.stages as i64;
    Ok(Ticks {
        microbatches: p.microbatches as i64,
        stages,
        ring_len: 2 * stages - 1,
        read_offset,
        on_last_rank,
        normalizer,
        target,
        d_loss,
        d_outputs,
        microbatch_loss,
    })
}

/// What the tick loops leave: the forward loop's state and outputs, the backward loop's
/// carried values.
struct LoopResults {
    state: ValueId,
    outputs: ValueId,
    backward: Vec<ValueId>,
}

fn tick_loops(
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
    let state_ty = f.ty(l1.args[1]).clone();
    let ring_ty = state_ty.insert(0, Dim::lit(ticks.ring_len as u64));
    let value = Float(-0.0);
    let ring0 = b.op("ring0", OpKind::Constant { value }, Some(ring_ty))?;
    // Each microbatch's slot is written in the tick it leaves the last stage, before it is read.
    let d_outputs_ty = f.ty(l2.args[1 + parts.d_outputs]).clone();
    let d_outputs = b.op("d_outputs0", OpKind::Constant { value }, Some(d_outputs_ty))?;
    let backward = b_inits
        .iter()
        .enumerate()
        .map(|(j, v)| match j == parts.d_outputs {
            true => d_outputs,
            false => env[v],
        });
    let (s, mbs) = (ticks.stages, ticks.microbatches as u64);
    let mut forward = vec![env[&f_inits[0]], env[&f_inits[1]], ring0];
    let warm_up = (s - 1) as u64;
    if warm_up > 0 {
        let hints = [hint(l1.args[1]), hint(l1.args[2]), names::TICK_RING];
        forward = b.loop_op(warm_up, forward, &hints, |b, i, c| {
            let mut env = env.clone();
            let fwd = forward_half(b, m, f, parts, ticks, &mut env, i, c)?;
            Ok(vec![fwd.state, fwd.outputs, fwd.ring])
        })?;
    }
    let mut inits = forward.clone();
    inits.extend(backward);
    let mut hints = vec![hint(l1.args[1]), hint(l1.args[2]), names::TICK_RING];
    hints.extend(l2.args[1..].iter().map(|&a| hint(a)));
    let steady = b.loop_op(mbs, inits, &hints, |b, i, c| {
        let mut env = env.clone();
        let offset = int(b, "warm_up", s - 1)?;
        let tau = b.binary("tick", BinaryOp::Add, i, offset)?;
        let fwd = forward_half(b, m, f, parts, ticks, &mut env, tau, &c[..3])?;
        let mut carried = c[3..].to_vec();
        carried[parts.d_outputs] =
            seed_leaving(b, m, ticks, i, fwd.last, carried[parts.d_outputs])?;
        let mut yields = vec![fwd.state, fwd.outputs, fwd.ring];
        yields.extend(backward_half(
            b, m, f, parts, ticks, &mut env, tau, i, fwd.ring, &carried,
        )?);
        Ok(yields)
    })?;
    let (state, outputs, ring) = (steady[0], steady[1], steady[2]);
    let mut backward = steady[3..].to_vec();
    if warm_up > 0 {
        let mut inits = vec![ring];
        inits.extend(backward);
        let hints: Vec<&str> = std::iter::once(names::TICK_RING)
            .chain(l2.args[1..].iter().map(|&a| hint(a)))
            .collect();
        let cool = b.loop_op(warm_up, inits, &hints, |b, i, c| {
            let mut env = env.clone();
            let offset = int(b, "steady_end", s - 1 + ticks.microbatches)?;
            let tau = b.binary("tick", BinaryOp::Add, i, offset)?;
            let mbs = int(b, "microbatches", ticks.microbatches)?;
            let t_bwd = b.binary("t_bwd", BinaryOp::Add, i, mbs)?;
            let mut yields = vec![c[0]];
            yields.extend(backward_half(
                b,
                m,
                f,
                parts,
                ticks,
                &mut env,
                tau,
                t_bwd,
                c[0],
                &c[1..],
            )?);
            Ok(yields)
        })?;
        backward = cool[1..].to_vec();
    }
    Ok(LoopResults {
        state,
        outputs,
        backward,
    })
}

/// What a forward half leaves: the state and outputs to carry, the ring with this tick's
/// stage inputs, and the value that left the last stage.
struct ForwardHalf {
    state: ValueId,
    outputs: ValueId,
    ring: ValueId,
    last: ValueId,
}

/// `τ mod K`: the ring slot written at tick `τ`.
fn write_slot(b: &mut Builder, ticks: &Ticks, tau: ValueId) -> Result<ValueId, Diagnostic> {
    let k = int(b, "ring_len", ticks.ring_len)?;
    let laps = b.binary("laps", BinaryOp::Div, tau, k)?;
    let lapped = b.binary("lapped", BinaryOp::Mul, laps, k)?;
    b.binary("slot", BinaryOp::Sub, tau, lapped)
}

/// L1's body at tick `τ`, the microbatches entering last first; the stage inputs go to the
/// ring instead of the tape.
#[allow(clippy::too_many_arguments)]
fn forward_half(
    b: &mut Builder,
    m: &Module,
    f: &Func,
    parts: &Parts,
    ticks: &Ticks,
    env: &mut HashMap<ValueId, ValueId>,
    tau: ValueId,
    carried: &[ValueId],
) -> Result<ForwardHalf, Diagnostic> {
    let l1 = loop_body(f, parts.forward);
    let (t, state) = (l1.args[0], l1.args[1]);
    env.insert(t, tau);
    env.insert(state, carried[0]);
    env.insert(l1.args[2], carried[1]);
    // Stage 0 takes microbatch M-1-τ while there is one, then the padding (slot τ).
    let last_mb = int(b, "last_microbatch", ticks.microbatches - 1)?;
    let reversed = b.binary("entering", BinaryOp::Sub, last_mb, tau)?;
    let mbs = int(b, "microbatches", ticks.microbatches)?;
    let real = b.compare("entering_real", CmpPred::Lt, tau, mbs)?;
    let (on_true, on_false) = (reversed, tau);
    let feed_at = b.op(
        "feed_at",
        OpKind::Select {
            cond: real,
            on_true,
            on_false,
        },
        None,
    )?;
    // The last stage finishes microbatch M+S-2-τ (out of range, so clamped and then
    // discarded, before the pipe is full).
    let leaving_k = int(b, "leaving_base", ticks.microbatches + ticks.stages - 2)?;
    let leaving = b.binary("leaving", BinaryOp::Sub, leaving_k, tau)?;
    let mut last = None;
    for &id in &l1.ops {
        match &f.ops[id].kind {
            _ if id == parts.tape_write => {}
            _ if id == parts.feed => copy_with(b, m, f, id, env, t, feed_at)?,
            OpKind::Update { update, index, .. } if id == parts.write => {
                last = Some(env[update]);
                copy_with(b, m, f, id, env, *index, leaving)?
            }
            _ => b.copy_ops(m, f, &[id], env)?,
        }
    }
    let slot = write_slot(b, ticks, tau)?;
    let ring = b.op(
        "ring_written",
        OpKind::Update {
            x: carried[2],
            update: carried[0],
            index: slot,
            axis: 0,
        },
        None,
    )?;
    Ok(ForwardHalf {
        state: env[&l1.results[0]],
        outputs: env[&l1.results[1]],
        ring,
        last: last.expect("invariant: the write is in L1"),
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

/// Writes the cotangent of the microbatch that left the last stage in steady tick `i`
/// (microbatch `M-1-i`, its stage output `y`) into its slot of the outputs' cotangent: the VJP
/// of `@microbatch_loss`, seeded with `d_loss` and its slice of the outputs' seed.
fn seed_leaving(
    b: &mut Builder,
    m: &Module,
    ticks: &Ticks,
    i: ValueId,
    y: ValueId,
    d_outputs: ValueId,
) -> Result<ValueId, Diagnostic> {
    let last_mb = int(b, "last_microbatch", ticks.microbatches - 1)?;
    let mb = b.binary("left", BinaryOp::Sub, last_mb, i)?;
    let axis = 0;
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
    let args = vec![y, target, ticks.normalizer, ticks.d_loss, seed];
    let vjp = b.call_if(
        "microbatch_loss",
        m,
        ticks.microbatch_loss,
        args,
        ticks.on_last_rank,
    )?;
    // The results are the loss, the outputs, then the cotangent of `y`.
    let d_y = vjp[2];
    b.op(
        "d_outputs_seeded",
        OpKind::Update {
            x: d_outputs,
            update: d_y,
            index: mb,
            axis,
        },
        None,
    )
}

/// L2's body at iteration `t_bwd`, in tick `τ`: each stage's input read from the ring.
#[allow(clippy::too_many_arguments)]
fn backward_half(
    b: &mut Builder,
    m: &Module,
    f: &Func,
    parts: &Parts,
    ticks: &Ticks,
    env: &mut HashMap<ValueId, ValueId>,
    tau: ValueId,
    t_bwd: ValueId,
    ring: ValueId,
    carried: &[ValueId],
) -> Result<Vec<ValueId>, Diagnostic> {
    let l2 = loop_body(f, parts.backward);
    env.insert(l2.args[0], t_bwd);
    env.extend(l2.args[1..].iter().copied().zip(carried.iter().copied()));
    for &id in &l2.ops {
        if id != parts.tape_read {
            b.copy_ops(m, f, &[id], env)?;
            continue;
        }
        // Stage s reads slot (τ - 2(S-1-s)) mod K = (τ mod K + 2s + 1) mod K.
        let slot = write_slot(b, ticks, tau)?;
        let read = b.binary("read_slot", BinaryOp::Add, ticks.read_offset, slot)?;
        let k = int(b, "ring_len", ticks.ring_len)?;
        let over = b.compare("lapped_read", CmpPred::Ge, read, k)?;
        let wrapped = b.binary("wrapped_read", BinaryOp::Sub, read, k)?;
        let (on_true, on_false) = (wrapped, read);
        let slots = b.op(
            "read_slots",
            OpKind::Select {
                cond: over,
                on_true,
                on_false,
            },
            None,
        )?;
        // Stage-major, so that each stage reads its own slot.
        let rank = b.ty(ring).rank();
        let perm = [1, 0].into_iter().chain(2..rank).collect();
        let by_stage = b.op("ring_by_stage", OpKind::Transpose { x: ring, perm }, None)?;
        let input = b.op(
            "kept_input",
            OpKind::Index {
                x: by_stage,
                index: slots,
                axis: 1,
            },
            None,
        )?;
        env.insert(f.ops[id].results[0], input);
    }
    Ok(l2.results.iter().map(|v| env[v]).collect())
}
