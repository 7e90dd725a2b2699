//! `loss`: the scalar a training step differentiates, `@train`: the pipelined model (`@model`,
//! else `@pipeline`) on all microbatches, then the model file's loss, averaged over every
//! microbatch at once.
//!
//! Preconditions: `gpipe-loop` has run. Postconditions: the module also holds
//! `@loss(%y: [M, ...output], %target: [M, ...target]) -> f32[]` and
//! `@train(%x: [M, ...input], %target: [M, ...target]) -> (f32[], [M, ...output])`, the loss and
//! the outputs it was computed from (a training run's predictions, e.g. a teacher's targets).
//! Split over ranks, `@train` calls `@loss` on the last rank only (`call_if`). The losses:
//! - `loss mse` (the default; targets then have the input's type): the mean of `(y - target)^2`
//!   over all elements of all microbatches;
//! - `loss softmax_cross_entropy` (targets: one i32 class index per row of the outputs, whose
//!   last axis holds the logits): the mean over rows of `logsumexp(y) - y[target]`, with the
//!   maximum subtracted first so that no logit overflows; with `ignore_index = i`, the rows
//!   whose target is `i` (padding) count in neither the sum nor the mean.
//!
//! `@pipeline`'s loop is inlined into `@train`, so that `autodiff` sees it and runs the forward
//! loop once (a call would be recomputed inside its VJP; `@loss`, called outside every loop,
//! keeps what its backward reads instead). Computed in f32 whatever the model's dtype. The
//! mean over microbatches is one scale at the end, so every microbatch's gradient is scaled
//! once, by `1/M` of the same number.

use super::embed_head::is_rank;
use super::options::Options;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Item, Loss, Module, Setting, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, OpKind, ReduceOp, UnaryOp};
use ppc_dialect::{DType, Dim, Type};

pub fn loss(m: &mut Module, _opts: &Options) -> Result<(), Diagnostics> {
    if m.func(names::TRAIN).is_some() {
        return Err(vec![Diagnostic::plain(
            "the module already has a `@train`: `loss` has run",
        )]);
    }
    // The whole model: `@model` where the model has `@embed` or `@head`.
    let pipeline = m
        .func_id(names::MODEL)
        .or_else(|| m.func_id(names::PIPELINE))
        .ok_or_else(|| {
            vec![Diagnostic::plain(
                "`loss` needs `@pipeline`: run `gpipe-loop` first",
            )]
        })?;
    let loss = loss_of(m, pipeline).map_err(|d| vec![d])?;
    let loss = m.funcs.push(loss);
    let f = build(m, pipeline, loss).map_err(|d| vec![d])?;
    m.funcs.push(f);
    Ok(())
}

fn build(
    m: &Module,
    pipeline: ppc_dialect::ir::FuncId,
    loss: ppc_dialect::ir::FuncId,
) -> Result<ppc_dialect::Func, Diagnostic> {
    let mut b = Builder::new(names::TRAIN);
    b.span = loss_span(m);
    // The arguments first, as the parser numbers values; then the model's parameters.
    let mbs = Dim::named(Setting::Microbatches.name(), m.pipeline.microbatches);
    let model = [&m.funcs[pipeline]];
    let x = b.arg_apart("x", m.input.insert(0, mbs.clone()), &model);
    let target = b.arg_apart("target", m.target_type().insert(0, mbs), &model);
    b.params_of(model[0])?;
    // Inlined, so that the gradient's forward loop runs once and keeps its tapes.
    let out = b.inline(m, &m.funcs[pipeline], &[x])?[0];
    // Split over ranks, only the last rank's output buffer holds the model's outputs
    // (gpipe-loop.rs): the loss, and so its gradient, is the last rank's alone, -0.0
    // elsewhere, where it does not run (a gradient seeded on another rank would flow back
    // through the exchanges into the stages of its neighbours).
    let on = match m.pipeline.ranks {
        1 => None,
        ranks => {
            let rank = b.op("rank", OpKind::Rank, None)?;
            Some(is_rank(&mut b, rank, "last", ranks - 1)?)
        }
    };
    let loss = b.call_if("loss", m, loss, vec![out, target], on)?[0];
    Ok(b.finish(vec![loss, out]))
}

/// Where the loss is written: its `loss` line, else (the default loss) the `pipeline` block.
fn loss_span(m: &Module) -> ppc_dialect::span::Span {
    (m.spans.lookup(&Item::Loss)).unwrap_or_else(|| m.spans.get(&Item::Pipeline))
}

/// `@loss(%y, %target) -> f32[]`: the model file's loss of the outputs `y` of all
/// microbatches.
fn loss_of(m: &Module, pipeline: ppc_dialect::ir::FuncId) -> Result<ppc_dialect::Func, Diagnostic> {
    let mut b = Builder::new(names::LOSS);
    b.span = loss_span(m);
    let mbs = Dim::named(Setting::Microbatches.name(), m.pipeline.microbatches);
    let out = b.arg("y", m.funcs[pipeline].result_types()[0].clone());
    let target = b.arg("target", m.target_type().insert(0, mbs));
    let y = to_f32(&mut b, out)?;
    let loss = match m.loss_or_default() {
        Loss::Mse => {
            let t = to_f32(&mut b, target)?;
            let diff = bin(&mut b, "diff", BinaryOp::Sub, y, t)?;
            let sq = bin(&mut b, "squared", BinaryOp::Mul, diff, diff)?;
            mean_all(&mut b, sq)?
        }
        Loss::SoftmaxCrossEntropy => cross_entropy(&mut b, y, target, m.ignore_index)?,
    };
    Ok(b.finish(vec![loss]))
}

/// Mean over rows of `logsumexp(y) - y[target]`, the classes on `y`'s last axis; with
/// `ignore`, over the rows whose target is not `ignore` (their sum over their count, at least 1).
fn cross_entropy(
    b: &mut Builder,
    y: ValueId,
    target: ValueId,
    ignore: Option<i32>,
) -> Result<ValueId, Diagnostic> {
    let yt = b.ty(y).clone();
    let last = yt.rank() - 1;
    let keep = |b: &mut Builder, v: ValueId| {
        let mut dims = yt.dims.clone();
        dims[last] = Dim::lit(1);
        b.op(
            "k",
            OpKind::Reshape { x: v },
            Some(Type::new(b.ty(v).dtype, dims)),
        )
    };
    let reduce = |b: &mut Builder, hint: &str, op, x| {
        let axes = vec![last];
        b.op(hint, OpKind::Reduce { op, x, axes }, None)
    };
    let max = reduce(b, "max_logit", ReduceOp::Max, y)?;
    let max = keep(b, max)?;
    let z = bin(b, "shifted", BinaryOp::Sub, y, max)?;
    let e = b.op(
        "e",
        OpKind::Unary {
            op: UnaryOp::Exp,
            x: z,
        },
        None,
    )?;
    let sum = reduce(b, "sum_exp", ReduceOp::Sum, e)?;
    let lse = b.op(
        "lse",
        OpKind::Unary {
            op: UnaryOp::Log,
            x: sum,
        },
        None,
    )?;
    // The target's logit, picked by comparing the class axis with the index.
    let classes = b.op(
        "classes",
        OpKind::Iota { axis: last },
        Some(yt.with_dtype(DType::I32)),
    )?;
    let t = keep(b, target)?;
    let hit = b.op(
        "hit",
        OpKind::Compare {
            pred: CmpPred::Eq,
            lhs: classes,
            rhs: t,
        },
        None,
    )?;
    let zero = b.op(
        "zero",
        OpKind::Constant {
            value: ppc_dialect::op::Float(0.0),
        },
        Some(Type::scalar(DType::F32)),
    )?;
    let picked = b.op(
        "picked",
        OpKind::Select {
            cond: hit,
            on_true: z,
            on_false: zero,
        },
        None,
    )?;
    let logit = reduce(b, "target_logit", ReduceOp::Sum, picked)?;
    let per_row = bin(b, "nll", BinaryOp::Sub, lse, logit)?;
    let Some(ignore) = ignore else {
        return mean_all(b, per_row);
    };
    let scalar = |b: &mut Builder, hint: &str, v: f64, dtype| {
        let value = ppc_dialect::op::Float(v);
        b.op(hint, OpKind::Constant { value }, Some(Type::scalar(dtype)))
    };
    let ignored = scalar(b, "ignore_index", f64::from(ignore), DType::I32)?;
    let counted = b.op(
        "counted",
        OpKind::Compare {
            pred: CmpPred::Ne,
            lhs: target,
            rhs: ignored,
        },
        None,
    )?;
    let zero = scalar(b, "zero", 0.0, DType::F32)?;
    let kept = b.op(
        "kept_nll",
        OpKind::Select {
            cond: counted,
            on_true: per_row,
            on_false: zero,
        },
        None,
    )?;
    let ones = b.op(
        "count_each",
        OpKind::Convert { x: counted },
        Some(b.ty(counted).with_dtype(DType::F32)),
    )?;
    let all = |b: &mut Builder, hint: &str, x: ValueId| {
        let axes = (0..b.ty(x).rank()).collect();
        let op = ReduceOp::Sum;
        b.op(hint, OpKind::Reduce { op, x, axes }, None)
    };
    let total = all(b, "total_nll", kept)?;
    let count = all(b, "count", ones)?;
    let one = scalar(b, "one", 1.0, DType::F32)?;
    let count = bin(b, "count_or_one", BinaryOp::Max, count, one)?;
    bin(b, "loss", BinaryOp::Div, total, count)
}

fn mean_all(b: &mut Builder, x: ValueId) -> Result<ValueId, Diagnostic> {
    let axes = (0..b.ty(x).rank()).collect();
    b.op(
        "loss",
        OpKind::Reduce {
            op: ReduceOp::Mean,
            x,
            axes,
        },
        None,
    )
}

fn to_f32(b: &mut Builder, x: ValueId) -> Result<ValueId, Diagnostic> {
    let t = b.ty(x).clone();
    if t.dtype == DType::F32 {
        return Ok(x);
    }
    b.op("f32", OpKind::Convert { x }, Some(t.with_dtype(DType::F32)))
}

fn bin(
    b: &mut Builder,
    hint: &str,
    op: BinaryOp,
    lhs: ValueId,
    rhs: ValueId,
) -> Result<ValueId, Diagnostic> {
    b.op(hint, OpKind::Binary { op, lhs, rhs }, None)
}
