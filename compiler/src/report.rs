//! The compile-time report (`ppc compile --report=json`): the pipeline's shape, the bubble
//! counted from the generated loop, the memory each buffer takes (with `--train`, also what
//! the training step keeps for its backward loop), and the work of a step, `@embed`'s and
//! `@head`'s apart.

use crate::passes::Remat;
use crate::schedule::{Schedule, ScheduleError};
use crate::timetable::{Kind, Timetable};
use ppc_dialect::ir::{names, Block, Func, Module, Pipeline, Setting, ValueId};
use ppc_dialect::op::OpKind;
use serde_json::{json, Value};
use std::collections::HashSet;

/// Bytes of every op result in `block` and its nested loop bodies.
fn result_bytes(f: &Func, block: &Block) -> u64 {
    block
        .ops
        .iter()
        .map(|&id| {
            let op = &f.ops[id];
            let own: u64 = op.results.iter().map(|&v| f.ty(v).bytes()).sum();
            let nested = match &op.kind {
                OpKind::Loop { body, .. } => result_bytes(f, body),
                _ => 0,
            };
            own + nested
        })
        .sum()
}

/// How many stages `@stage` holds: the size of its stage axis (`#stages`, or `#stages_per_rank`
/// in a program split over ranks).
pub fn stages_held(stage: &Func) -> Result<u64, ScheduleError> {
    let state = &stage.arg_types()[0];
    let (axis, _) = state
        .stage_axis()
        .ok_or_else(|| ScheduleError::NoStageAxis(state.clone()))?;
    Ok(state.dims[axis].size)
}

/// Bytes the forward loops of `f` keep for the backward (their `tape_*` carried values, which
/// `autodiff` adds, or the ring of `--schedule 1f1b`), nested loops included; a tape that a
/// loop carries on from another loop is counted once.
fn tape_bytes(f: &Func, block: &Block) -> u64 {
    let from_loops: HashSet<ValueId> = (block.ops.iter())
        .filter(|&&id| matches!(f.ops[id].kind, OpKind::Loop { .. }))
        .flat_map(|&id| f.ops[id].results.iter().copied())
        .collect();
    block
        .ops
        .iter()
        .map(|&id| match &f.ops[id].kind {
            OpKind::Loop { body, inits, .. } => {
                let kept: u64 = (body.args[1..].iter().zip(inits))
                    .filter(|(&a, init)| {
                        f.values[a].name.starts_with("tape_") && !from_loops.contains(init)
                    })
                    .map(|(&a, _)| f.ty(a).bytes())
                    .sum();
                kept + tape_bytes(f, body)
            }
            _ => 0,
        })
        .sum()
}

/// What the training step `m` keeps between its forward and its backward loop, per rank
/// (`--remat=stage`: each iteration's stage input; `none`: every activation its backward reads).
pub fn kept_activation_bytes(m: &Module) -> Option<u64> {
    let step = m.func(&names::vjp(names::TRAIN))?;
    Some(tape_bytes(step, &step.body))
}

/// The training step's memory (after `autodiff`): what it keeps between the forward and the
/// backward loop, per rank, and the sizes of all values of one stage's backward (a bound on
/// what it holds at once).
fn training(m: &Module, local: u64) -> Option<Value> {
    // `--remat none` keeps the residuals of `@stage_fwd`; `tick` calls `@stage_recompute`
    // before `@stage_bwd`; `stage` recomputes inside `@stage_vjp`.
    let remat = match () {
        _ if m.func(&names::fwd(names::STAGE)).is_some() => Remat::None,
        _ if m.func(&names::recompute(names::STAGE)).is_some() => Remat::Tick,
        _ => Remat::Stage,
    };
    let split = m.func(&names::bwd(names::STAGE));
    let stage_vjp = split.or(m.func(&names::vjp(names::STAGE)))?;
    let stage = m.func(names::STAGE)?;
    let grads: u64 = stage
        .params
        .iter()
        .map(|q| 4 * stage.ty(q.value).elements())
        .sum();
    let step = m.func(&names::vjp(names::TRAIN))?;
    let tick_loop = tick_loop(step, &m.pipeline);
    Some(json!({
        "schedule": schedule_of(m, tick_loop.is_some()).name(),
        "tick_loop": tick_loop,
        "remat": remat.name(),
        "kept_activation_bytes_per_rank": kept_activation_bytes(m)?,
        "stage_backward_value_bytes_per_stage": result_bytes(stage_vjp, &stage_vjp.body) / local,
        "gradient_bytes_per_stage": grads / local,
    }))
}

/// The schedule the training step `m` was compiled for: GPipe's two loops, or a loop over
/// ticks whose backward is whole (1F1B) or cut in two (ZB-H1, `@stage_vjp_weight`).
fn schedule_of(m: &Module, ticks: bool) -> Kind {
    let cut = m
        .funcs
        .values()
        .any(|g| names::is_stage_weight_grad(&g.name));
    match (ticks, cut) {
        (false, _) => Kind::Gpipe,
        (true, false) => Kind::OneFOneB,
        (true, true) => Kind::ZbH1,
    }
}

/// The loop over ticks of `--schedule 1f1b` (`one_f_one_b.rs`), read off the training step
/// `f`: the one carrying the ring of stage inputs. Every stage runs `2·R·M` forwards and
/// backwards; a tick of the parity order has one slot per stage for them, one of the
/// interleaved order (`R > 1`) two, a forward's and a backward's, so the bubble here is the
/// share of idle slots. `schedule_check`'s bubble weighs a tick by its busiest stage's work
/// instead (a tick of forwards alone is half as long), which is the time the stages idle.
fn tick_loop(f: &Func, p: &ppc_dialect::ir::Pipeline) -> Option<Value> {
    let (ticks, ring) = f.tick_loop()?;
    let slots = ticks * if p.repeats > 1 { 2 } else { 1 };
    Some(json!({
        "ticks": ticks,
        "bubble_fraction": 1.0 - (2 * p.repeats * p.microbatches) as f64 / slots as f64,
        "ring_slots_per_stage": f.ty(ring).shape()[0],
    }))
}

/// The report of a module that went through `gpipe-loop` (and, for training, `autodiff`).
/// Its errors are [`Schedule::of`]'s, which checks what the report reads.
pub fn report(m: &Module) -> Result<Value, ScheduleError> {
    let sched = Schedule::of(m)?;
    let p = m.pipeline;
    let stage = m.func(names::STAGE).ok_or(ScheduleError::NoStage)?;
    let s = p.stages;
    let local = stages_held(stage)?;
    let param_bytes: u64 = stage.params.iter().map(|q| stage.ty(q.value).bytes()).sum();
    let x = m.stage_type().bytes();
    let formula = (s - 1) as f64 / p.iterations() as f64;
    let mut r = json!({
        "iterations": sched.iterations(),
        "bubble_slots": sched.bubble_slots(),
        "total_slots": sched.total_slots(),
        "bubble_fraction": sched.bubble_fraction(),
        "bubble_fraction_formula": formula,
        "param_bytes_per_stage": param_bytes / local,
        "microbatch_bytes": x,
        "state_buffer_bytes_per_rank": local * x,
        "input_buffer_bytes": sched.iterations() * x,
        "output_buffer_bytes": p.microbatches * x,
        "stage_activation_bytes_per_stage": result_bytes(stage, &stage.body) / local,
        "flops_per_step": m.flops(),
    });
    for (name, rank) in [(names::EMBED, "first"), (names::HEAD, "last")] {
        if let Some(f) = m.func(name) {
            r[name] = ends(f, p.microbatches, rank);
        }
    }
    with_settings(&mut r, &p, &Setting::ALL);
    if let Ok(Some(proof)) = ppc_dialect::schedule_check::check(m) {
        r["schedule_check"] = json!({
            "function": proof.func,
            "forwards_once": proof.forwards,
            "backwards_once": proof.backwards,
            "exchanges_per_rank": proof.exchanges,
            "ticks": proof.ticks,
            "bubble_fraction": proof.bubble_fraction(p.stages),
            "work_bubble_fraction": proof.work_bubble,
        });
        if !proof.inputs_held.is_empty() {
            r["schedule_check"]["stage_inputs_held_per_stage"] = json!(proof.inputs_held);
        }
    }
    if let Some(mut t) = training(m, local) {
        if p.repeats == 1 {
            t["timetables"] = timetables(p.stages, p.microbatches, p.ranks, x);
        }
        r["training"] = t;
    }
    Ok(r)
}

/// Per training schedule, its timetable's figures (`timetable.rs`): ticks, bubble beside the
/// formula, and the stage inputs (of `input_bytes` each) it keeps per rank. The compiled
/// programs are GPipe's and a lockstep loop over ticks (`1f1b`; `zb-h1`, the same loop with
/// each weight gradient a tick after its input gradient), whose figures are
/// `training.tick_loop`'s and `schedule_check`'s.
fn timetables(stages: u64, microbatches: u64, ranks: u64, input_bytes: u64) -> Value {
    let mut out = json!({});
    for kind in Kind::ALL {
        let t = Timetable::build(kind, stages, microbatches);
        out[kind.name()] = json!({
            "ticks": t.ticks(),
            "bubble_fraction": t.bubble_fraction(),
            "bubble_fraction_formula": kind.bubble_formula(stages, microbatches),
            "stage_inputs_kept_per_stage": t.kept_inputs(),
            "stage_input_bytes_per_rank": t
                .kept_inputs_per_rank(ranks)
                .iter()
                .map(|k| k * input_bytes)
                .collect::<Vec<_>>(),
            "weight_gradients_pending_per_stage": t.pending_weight_grads(),
        });
    }
    out
}

/// `@embed` or `@head`, which run once per microbatch outside the loop, on rank `rank`: their
/// parameters, their work and every value they make, over all microbatches.
fn ends(f: &Func, microbatches: u64, rank: &str) -> Value {
    json!({
        "runs_on_rank": rank,
        "param_bytes": f.params.iter().map(|q| f.ty(q.value).bytes()).sum::<u64>(),
        "flops_per_step": f.matmul_flops() * microbatches,
        "value_bytes_per_step": result_bytes(f, &f.body) * microbatches,
    })
}

/// Adds these pipeline settings in effect to a JSON object, keyed as the model file names them.
pub fn with_settings(object: &mut Value, p: &Pipeline, which: &[Setting]) {
    for &s in which {
        object[s.name()] = p.get(s).into();
    }
}
