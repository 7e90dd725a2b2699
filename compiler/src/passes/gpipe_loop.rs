//! `gpipe-loop`: wraps the stage program `@stage` in the GSPMD GPipe loop, `@pipeline`.
//!
//! Preconditions: `vmap-stages` has run. With `R = 1` any `M, S` work; circular pipelines
//! (`R > 1`) need `M >= S`, because microbatch `m` re-enters stage 0 for repeat `r` at
//! iteration `r*M + m`, and leaves the last stage `S-1` iterations after it entered.
//!
//! Postconditions: `@pipeline(%x: [M, ...input]) -> [M, ...input]` computes what the sequential
//! model computes, bit for bit, in `T = R*M + S - 1` iterations of one loop whose body:
//!
//! 1. feeds stage 0 by an elementwise select on the stage index: the next input microbatch (the
//!    input is padded with `T - M` filler microbatches), or, for repeats `r >= 1`, the finished
//!    output of repeat `r-1`, read back from the output buffer (the circular back edge);
//! 2. runs `@stage` on the state buffer `[S, ...]`, each stage on its own weights (for `R > 1`,
//!    stage `s` picks repeat `clamp(t - s, 0, R*M - 1) / M`);
//! 3. writes the last stage's result to output slot `(t - S + 1) mod M` once the pipe is full;
//! 4. shifts the state by one stage (stage `s` feeds `s+1`), filling stage 0.
//!
//! The back edge goes through the output buffer, indexed by microbatch, so it is correct for every
//! `M >= S`: the slot read at iteration `t` was written at `t - M + S - 1 < t` and is not
//! overwritten before `t + S - 1`. This avoids the single-iteration rotation that is only right
//! when `M == S` (gspmd-pipeline.md §2.6). Filler values (padding, initial state, shift fill) are
//! zeros, or NaN with `--poison-bubbles`, which proves that no bubble reaches an output.
//!
//! After `shard-stages` (`ranks > 1`) the loop is this rank's part of the same program: the state
//! holds `#stages_per_rank` stages, whose global indices are `rank * S/R + iota`; step 4 moves
//! stages inside the rank and `exchange`s the rank's last stage around the ring, so the first
//! local stage receives the previous rank's boundary (rank 0 keeps the fill, as stage 0 does
//! in one process). The same exchange brings the last stage's result to rank 0, which needs it
//! for the circular back edge; the last rank uses its own. Each rank's output buffer is thus
//! exact on rank 0 and the last rank, which is the one whose output is the result.
//!
//! ```text
//! %o_out... = loop %state0, %outputs0, trips = 11 {
//! ^body(%t, %state, %outputs):
//!   %next = index %inputs, %t, axis = 0             // microbatch entering stage 0
//!   %stage_in = select %first, %next, %state          // elementwise select on the stage index
//!   %out = call @stage, %stage_in
//!   ...update %outputs with %out[S-1] when t >= S-1...
//!   %shifted = shift %out, axis = 0, fill = 0.0
//!   yield %shifted, %outputs.1
//! }
//! ```

use super::options::Options;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::interp::POISON;
use ppc_dialect::ir::{names, FuncId, Item, Module, Setting, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, Float, OpKind};
use ppc_dialect::{Axis, DType, Dim, Type};

pub fn gpipe_loop(m: &mut Module, opts: &Options) -> Result<(), Diagnostics> {
    if m.func(names::PIPELINE).is_some() {
        return Err(vec![Diagnostic::plain(
            "the module already has a `@pipeline`: `gpipe-loop` has run",
        )]);
    }
    ppc_dialect::model_rules::circular_fits(m).map_err(|d| vec![d])?;
    let stage = m.func_id(names::STAGE).ok_or_else(|| {
        vec![Diagnostic::plain(
            "`gpipe-loop` needs `@stage`: run `vmap-stages` first",
        )]
    })?;
    let pipeline = build(m, stage, opts).map_err(|d| vec![d])?;
    m.funcs.push(pipeline);
    Ok(())
}

fn build(m: &Module, stage_id: FuncId, opts: &Options) -> Result<ppc_dialect::Func, Diagnostic> {
    let stage = &m.funcs[stage_id];
    let p = m.pipeline;
    let (s, mb, r) = (p.stages, p.microbatches, p.repeats);
    let trips = p.iterations();
    let fill = Float(if opts.poison_bubbles { POISON } else { 0.0 });
    let x_ty = m.stage_type();
    let stacked = |lead: Dim| x_ty.insert(0, lead);
    let scalar_i32 = Type::scalar(DType::I32);
    // The state has `@stage`'s stage axis: all stages, or this rank's after `shard-stages`.
    let state_ty = stage.arg_types()[0].clone();
    let (pos, axis) = state_ty.stage_axis().ok_or_else(|| {
        Diagnostic::plain("`@stage` takes no stage axis: `vmap-stages` builds it with `#stages`")
    })?;
    let sharded = axis == Axis::RankStages;
    if pos != 0 || sharded != (p.ranks > 1) {
        return Err(Diagnostic::plain(format!(
            "`@stage`'s state is {state_ty} for {} rank(s): run `shard-stages` exactly when ranks > 1, after `vmap-stages`",
            p.ranks
        )));
    }
    let stage_dim = state_ty.dims[0].clone();
    let s_ty = Type::new(DType::I32, vec![stage_dim.clone()]);

    let mut b = Builder::new(names::PIPELINE);
    b.span = m.spans.get(&Item::Pipeline);
    let x = b.arg("x", stacked(Dim::named(Setting::Microbatches.name(), mb)));
    let int = |b: &mut Builder, hint: &str, v: u64| {
        b.op(
            hint,
            OpKind::Constant {
                value: Float(v as f64),
            },
            Some(scalar_i32.clone()),
        )
    };

    // Loop-invariant set-up: padded inputs, zero (or NaN) state, the stage-0 mask.
    let inputs = b.op(
        "inputs",
        OpKind::Pad {
            x,
            axis: 0,
            low: 0,
            high: trips - mb,
            fill,
        },
        None,
    )?;
    let state0 = b.op(
        "state0",
        OpKind::Constant { value: fill },
        Some(stacked(stage_dim.clone())),
    )?;
    let outputs0 = b.op(
        "outputs0",
        OpKind::Constant { value: fill },
        Some(stacked(Dim::named(Setting::Microbatches.name(), mb))),
    )?;
    let mut stage_ids = b.op("stage_ids", OpKind::Iota { axis: 0 }, Some(s_ty.clone()))?;
    let zero = int(&mut b, "zero", 0)?;
    // This rank, whether it is the first or the last, and the global stage indices it holds.
    let ranks = sharded
        .then(|| -> Result<Ranks, Diagnostic> {
            let rank = b.op("rank", OpKind::Rank, None)?;
            let per_rank = int(&mut b, "stages_per_rank", p.stages_per_rank())?;
            let offset = b.binary("first_stage", BinaryOp::Mul, rank, per_rank)?;
            stage_ids = b.binary("global_stage_ids", BinaryOp::Add, stage_ids, offset)?;
            let last_rank = int(&mut b, "last_rank", p.ranks - 1)?;
            Ok(Ranks {
                is_first: b.compare("is_first_rank", CmpPred::Eq, rank, zero)?,
                is_last: b.compare("is_last_rank", CmpPred::Eq, rank, last_rank)?,
                last_local: int(&mut b, "last_local_stage", p.stages_per_rank() - 1)?,
                zero,
            })
        })
        .transpose()?;
    let is_first = b.op(
        "is_first",
        OpKind::Compare {
            pred: CmpPred::Eq,
            lhs: stage_ids,
            rhs: zero,
        },
        None,
    )?;
    let mut mask_dims = vec![stage_dim];
    mask_dims.extend((0..x_ty.rank()).map(|_| Dim::lit(1)));
    let first = b.op(
        "first",
        OpKind::Reshape { x: is_first },
        Some(Type::new(DType::I1, mask_dims)),
    )?;
    let last_stage = int(&mut b, "last_stage", s - 1)?;
    // Work items (microbatch m in repeat r is item r*M + m) number R*M.
    let all_items = int(&mut b, "all_items", r * mb)?;
    // Circular pipelines: M, the number of work items R*M, and the last item R*M - 1.
    let circular = (r > 1).then(|| -> Result<[ValueId; 3], Diagnostic> {
        Ok([
            int(&mut b, "num_microbatches", mb)?,
            all_items,
            int(&mut b, "last_item", r * mb - 1)?,
        ])
    });
    let circular = circular.transpose()?;

    let inv = Invariants {
        inputs,
        first,
        stage_ids,
        zero,
        last_stage,
        all_items,
        circular,
        ranks,
        fill,
    };
    let outs = b.loop_op(
        trips,
        vec![state0, outputs0],
        &["state", "outputs"],
        |b, t, carried| iteration(b, m, stage_id, &inv, t, carried),
    )?;
    Ok(b.finish(vec![outs[1]]))
}

/// Uneven depth: how many of its `k` layer slots each stage runs in its current repeat, the
/// rest being empty. Slot `j` of stage `s` in repeat `r` is layer `(r·S + s)·k + j`, so the
/// stage holds `clamp(L − (r·S + s)·k, 0, k)` layers.
fn layers_held(
    b: &mut Builder,
    m: &Module,
    stage_ids: ValueId,
    repeat: Option<ValueId>,
    zero: ValueId,
) -> Result<ValueId, Diagnostic> {
    let p = m.pipeline;
    let k = p.layers_per_stage();
    let int = |b: &mut Builder, hint: &str, v: u64| {
        let value = Float(v as f64);
        b.op(
            hint,
            OpKind::Constant { value },
            Some(Type::scalar(DType::I32)),
        )
    };
    let virtual_stage = match repeat {
        Some(r) => {
            let stages = int(b, "num_stages", p.stages)?;
            let before = b.binary("stages_before", BinaryOp::Mul, r, stages)?;
            b.binary("virtual_stage", BinaryOp::Add, before, stage_ids)?
        }
        None => stage_ids,
    };
    let (per_stage, layers) = (int(b, "slots", k)?, int(b, "layers", p.layers)?);
    let first = b.binary("first_slot", BinaryOp::Mul, virtual_stage, per_stage)?;
    let left = b.binary("layers_left", BinaryOp::Sub, layers, first)?;
    let some = b.binary("layers_here", BinaryOp::Max, left, zero)?;
    b.binary("depth", BinaryOp::Min, some, per_stage)
}

/// What the GPipe loop's body reads from before the loop.
struct Invariants {
    /// The input microbatches, padded to one per iteration.
    inputs: ValueId,
    /// Stage 0's mask, shaped to select between stage inputs.
    first: ValueId,
    /// The global stage index of each stage of the state.
    stage_ids: ValueId,
    zero: ValueId,
    last_stage: ValueId,
    /// Work items: R·M.
    all_items: ValueId,
    /// Circular pipelines: M, R·M and the last item R·M - 1.
    circular: Option<[ValueId; 3]>,
    ranks: Option<Ranks>,
    fill: Float,
}

/// One iteration `t` of the GPipe loop over the carried (state, outputs): what enters stage 0,
/// every stage's work, the last stage's result written out, the shift to the next stage.
fn iteration(
    b: &mut Builder,
    m: &Module,
    stage_id: FuncId,
    inv: &Invariants,
    t: ValueId,
    carried: &[ValueId],
) -> Result<Vec<ValueId>, Diagnostic> {
    let Invariants {
        inputs,
        first,
        stage_ids,
        zero,
        last_stage,
        all_items,
        circular,
        ref ranks,
        fill,
    } = *inv;
    let (state, outputs) = (carried[0], carried[1]);
    // 1. What enters stage 0.
    let mut next = b.op(
        "next",
        OpKind::Index {
            x: inputs,
            index: t,
            axis: 0,
        },
        None,
    )?;
    if let Some([num_mb, all_items, _]) = circular {
        // Items t in M..R*M are microbatch t mod M coming back for another repeat.
        let slot = modulo(b, t, num_mb)?;
        let back = b.op(
            "back_edge",
            OpKind::Index {
                x: outputs,
                index: slot,
                axis: 0,
            },
            None,
        )?;
        let not_first = b.compare("not_first_pass", CmpPred::Ge, t, num_mb)?;
        let in_range = b.compare("not_drained", CmpPred::Lt, t, all_items)?;
        let both = and(b, "again", not_first, in_range)?;
        next = b.op(
            "next_in",
            OpKind::Select {
                cond: both,
                on_true: back,
                on_false: next,
            },
            None,
        )?;
    }
    let stage_in = b.op(
        "stage_in",
        OpKind::Select {
            cond: first,
            on_true: next,
            on_false: state,
        },
        None,
    )?;
    // 2. Every stage computes.
    // Stage s works on item t - s; outside 0..R*M it is in a bubble and skips its work.
    let item = b.binary("item", BinaryOp::Sub, t, stage_ids)?;
    let started = b.compare("started", CmpPred::Ge, item, zero)?;
    let unfinished = b.compare("unfinished", CmpPred::Lt, item, all_items)?;
    let active = and(b, "active", started, unfinished)?;
    let mut args = vec![stage_in, active];
    let mut repeat = None;
    if let Some([num_mb, _, last_item]) = circular {
        let lo = b.binary("item_lo", BinaryOp::Max, item, zero)?;
        let clamped = b.binary("item_clamped", BinaryOp::Min, lo, last_item)?;
        let r = b.binary("repeat", BinaryOp::Div, clamped, num_mb)?;
        args.push(r);
        repeat = Some(r);
    }
    if m.pipeline.uneven() {
        args.push(layers_held(b, m, stage_ids, repeat, zero)?);
    }
    let out = b.call("out", m, stage_id, args)?;
    // 3. The last stage finishes item t - (S-1) once the pipe is full.
    let (last, from_prev) = match &ranks {
        Some(ranks) => {
            let (last, from_prev) = ranks.last_stage(b, out)?;
            (last, Some(from_prev))
        }
        None => (index(b, "last", out, last_stage)?, None),
    };
    let done = b.binary("done_item", BinaryOp::Sub, t, last_stage)?;
    let slot = match circular {
        Some([num_mb, _, _]) => modulo(b, done, num_mb)?,
        None => done,
    };
    let written = b.op(
        "written",
        OpKind::Update {
            x: outputs,
            update: last,
            index: slot,
            axis: 0,
        },
        None,
    )?;
    let full = b.compare("full", CmpPred::Ge, done, zero)?;
    let outputs = b.op(
        "outputs_next",
        OpKind::Select {
            cond: full,
            on_true: written,
            on_false: outputs,
        },
        None,
    )?;
    // 4. Shift: stage s feeds stage s+1.
    let shift = OpKind::Shift {
        x: out,
        axis: 0,
        fill,
    };
    let shifted = match (&ranks, from_prev) {
        (Some(ranks), Some(from_prev)) => {
            let moved = b.op("moved", shift, None)?;
            ranks.receive(b, moved, from_prev)?
        }
        _ => b.op("shifted", shift, None)?,
    };
    Ok(vec![shifted, outputs])
}

/// What the loop of one rank of a sharded pipeline knows about its place in the ring.
struct Ranks {
    is_first: ValueId,
    is_last: ValueId,
    /// The index of this rank's last stage in its state.
    last_local: ValueId,
    zero: ValueId,
}

impl Ranks {
    /// The global last stage's result, and the previous rank's boundary stage: this rank sends
    /// its last stage around the ring. The last rank has the global last stage itself; rank 0
    /// receives it from the last rank.
    fn last_stage(&self, b: &mut Builder, out: ValueId) -> Result<(ValueId, ValueId), Diagnostic> {
        let boundary = index(b, "boundary", out, self.last_local)?;
        let from_prev = b.op(
            "from_prev",
            OpKind::Exchange {
                x: boundary,
                reverse: false,
            },
            None,
        )?;
        let last = b.op(
            "last",
            OpKind::Select {
                cond: self.is_last,
                on_true: boundary,
                on_false: from_prev,
            },
            None,
        )?;
        Ok((last, from_prev))
    }

    /// The shift across ranks: the first local stage of `moved` takes the previous rank's
    /// boundary, except on rank 0, which keeps the fill as stage 0 does in one process.
    fn receive(
        &self,
        b: &mut Builder,
        moved: ValueId,
        from_prev: ValueId,
    ) -> Result<ValueId, Diagnostic> {
        let received = b.op(
            "received",
            OpKind::Update {
                x: moved,
                update: from_prev,
                index: self.zero,
                axis: 0,
            },
            None,
        )?;
        b.op(
            "shifted",
            OpKind::Select {
                cond: self.is_first,
                on_true: moved,
                on_false: received,
            },
            None,
        )
    }
}

/// Slice `i` of the stage axis of `x`.
fn index(b: &mut Builder, hint: &str, x: ValueId, i: ValueId) -> Result<ValueId, Diagnostic> {
    b.op(
        hint,
        OpKind::Index {
            x,
            index: i,
            axis: 0,
        },
        None,
    )
}

/// `a && b` on i1 values, which have no `and` op: `select(a, b, a)`.
fn and(b: &mut Builder, hint: &str, x: ValueId, y: ValueId) -> Result<ValueId, Diagnostic> {
    b.op(
        hint,
        OpKind::Select {
            cond: x,
            on_true: y,
            on_false: x,
        },
        None,
    )
}

/// `a mod n` for `a >= -n` with a non-negative result: `a - floor(a / n) * n`.
fn modulo(b: &mut Builder, a: ValueId, n: ValueId) -> Result<ValueId, Diagnostic> {
    let q = b.op(
        "q",
        OpKind::Binary {
            op: BinaryOp::Div,
            lhs: a,
            rhs: n,
        },
        None,
    )?;
    let qn = b.op(
        "qn",
        OpKind::Binary {
            op: BinaryOp::Mul,
            lhs: q,
            rhs: n,
        },
        None,
    )?;
    b.op(
        "slot",
        OpKind::Binary {
            op: BinaryOp::Sub,
            lhs: a,
            rhs: qn,
        },
        None,
    )
}
