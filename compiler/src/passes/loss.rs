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
use ppc_dialect::ir::{names, FuncId, Item, Loss, Module, Setting, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, OpKind, ReduceOp, UnaryOp};
use ppc_dialect::{DType, Dim, Type};

pub fn loss(m: &mut Module, opts: &Options) -> Result<(), Diagnostics> {
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
    // The tick loop of `--schedule 1f1b` and `zb-h1` (`one_f_one_b.rs`) seeds each
    // microbatch's backward as soon as it leaves the last stage; callees come before their
    // callers.
    if opts.schedule.ticked() {
        let each = microbatch_loss_of(m).map_err(|d| vec![d])?;
        let normalizer = normalizer_of(m).map_err(|d| vec![d])?;
        m.funcs.push(each);
        m.funcs.push(normalizer);
    }
    let f = build(m, pipeline, loss).map_err(|d| vec![d])?;
    m.funcs.push(f);
    Ok(())
}

fn build(m: &Module, pipeline: FuncId, loss: FuncId) -> Result<ppc_dialect::Func, Diagnostic> {
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
fn loss_of(m: &Module, pipeline: FuncId) -> Result<ppc_dialect::Func, Diagnostic> {
    let mut b = Builder::new(names::LOSS);
    b.span = loss_span(m);
    let mbs = Dim::named(Setting::Microbatches.name(), m.pipeline.microbatches);
    let out = b.arg("y", m.funcs[pipeline].result_types()[0].clone());
    let target = b.arg("target", m.target_type().insert(0, mbs));
    let terms = terms(&mut b, m, out, target)?;
    let loss = match terms.counted {
        None => mean_all(&mut b, terms.each)?,
        Some(ones) => {
            let total = sum_all(&mut b, "total_nll", terms.each)?;
            let count = at_least_one(&mut b, ones)?;
            b.binary("loss", BinaryOp::Div, total, count)?
        }
    };
    Ok(b.finish(vec![loss]))
}

/// `@microbatch_loss(%y, %target, %normalizer) -> (f32[], out)`: `@head` (where the model has
/// one) and the loss of one microbatch, its terms summed and divided by `normalizer`
/// ([`normalizer_of`]); `out` is what `@train` returns for it (the logits, else `y`), so that
/// the VJP takes its cotangent too. The cotangent the VJP gives `y` is, bit for bit, that
/// microbatch's slice of the one `@loss`'s VJP gives all outputs: both divide the seed by the
/// same number and then run the same per-element and per-row rules (a mean's VJP divides by
/// the element count too), and add `out`'s cotangent once.
fn microbatch_loss_of(m: &Module) -> Result<ppc_dialect::Func, Diagnostic> {
    let mut b = Builder::new(names::MICROBATCH_LOSS);
    b.span = loss_span(m);
    let y = b.arg("y", m.stage_type());
    let target = b.arg("target", m.target_type());
    let normalizer = b.arg("normalizer", Type::scalar(DType::F32));
    let out = match m.func_id(names::HEAD) {
        Some(head) => b.call("logits", m, head, vec![y])?,
        None => y,
    };
    let terms = terms(&mut b, m, out, target)?;
    let total = sum_all(&mut b, "total", terms.each)?;
    let loss = b.binary("loss", BinaryOp::Div, total, normalizer)?;
    Ok(b.finish(vec![loss, out]))
}

/// `@loss_normalizer(%target) -> f32[]`: what `@loss` divides the sum of its terms by, the
/// number of terms over all microbatches, or with `ignore_index` the number of rows counted
/// (at least 1), computed as `@loss` computes it.
fn normalizer_of(m: &Module) -> Result<ppc_dialect::Func, Diagnostic> {
    let mut b = Builder::new(names::LOSS_NORMALIZER);
    b.span = loss_span(m);
    let mbs = Dim::named(Setting::Microbatches.name(), m.pipeline.microbatches);
    let target = b.arg("target", m.target_type().insert(0, mbs));
    let normalizer = match (m.loss_or_default(), m.ignore_index) {
        (Loss::SoftmaxCrossEntropy, Some(ignore)) => {
            let (_, ones) = counted_rows(&mut b, target, ignore)?;
            at_least_one(&mut b, ones)?
        }
        (loss, _) => {
            let out = m.output_type();
            let per_term = match loss {
                Loss::Mse => 1,
                Loss::SoftmaxCrossEntropy => out.shape()[out.rank() - 1],
            };
            let terms = m.pipeline.microbatches * out.elements() / per_term;
            let value = ppc_dialect::op::Float(terms as f64);
            b.op(
                "terms",
                OpKind::Constant { value },
                Some(Type::scalar(DType::F32)),
            )?
        }
    };
    Ok(b.finish(vec![normalizer]))
}

/// What a loss averages: one term per element (`mse`) or per row (cross entropy), and with
/// `ignore_index` the rows that count (1.0 each, else 0.0; their terms are 0.0).
struct Terms {
    each: ValueId,
    counted: Option<ValueId>,
}

fn terms(b: &mut Builder, m: &Module, out: ValueId, target: ValueId) -> Result<Terms, Diagnostic> {
    let y = to_f32(b, out)?;
    Ok(match m.loss_or_default() {
        Loss::Mse => {
            let t = to_f32(b, target)?;
            let diff = b.binary("diff", BinaryOp::Sub, y, t)?;
            let squared = b.binary("squared", BinaryOp::Mul, diff, diff)?;
            Terms {
                each: squared,
                counted: None,
            }
        }
        Loss::SoftmaxCrossEntropy => cross_entropy(b, y, target, m.ignore_index)?,
    })
}

/// Per row, `logsumexp(y) - y[target]`, the classes on `y`'s last axis; with `ignore`, 0.0
/// where the target is `ignore`, and which rows count.
fn cross_entropy(
    b: &mut Builder,
    y: ValueId,
    target: ValueId,
    ignore: Option<i32>,
) -> Result<Terms, Diagnostic> {
    let last = b.ty(y).rank() - 1;
    // Log-probabilities, the maximum subtracted first so that no logit overflows; their VJP
    // is `d − softmax · Σ d`, which differentiates no maximum and keeps only them.
    let log_probs = b.op(
        "log_probs",
        OpKind::Softmax {
            x: y,
            axis: last,
            log: true,
        },
        None,
    )?;
    // The target's, read at the target's index along the class axis (clamped into it as
    // `index` clamps; targets are checked before a run): no `[rows, classes]` one-hot.
    let picked = b.op(
        "target_log_prob",
        OpKind::Index {
            x: log_probs,
            index: target,
            axis: last,
        },
        None,
    )?;
    let per_row = b.op(
        "nll",
        OpKind::Unary {
            op: UnaryOp::Neg,
            x: picked,
        },
        None,
    )?;
    let Some(ignore) = ignore else {
        return Ok(Terms {
            each: per_row,
            counted: None,
        });
    };
    let (counted, ones) = counted_rows(b, target, ignore)?;
    let zero = b.scalar("zero", 0.0, DType::F32)?;
    let kept = b.op(
        "kept_nll",
        OpKind::Select {
            cond: counted,
            on_true: per_row,
            on_false: zero,
        },
        None,
    )?;
    Ok(Terms {
        each: kept,
        counted: Some(ones),
    })
}

/// Which rows of `target` are not `ignore`: as `i1` and as 1.0 or 0.0 each.
fn counted_rows(
    b: &mut Builder,
    target: ValueId,
    ignore: i32,
) -> Result<(ValueId, ValueId), Diagnostic> {
    let ignored = b.scalar("ignore_index", f64::from(ignore), DType::I32)?;
    let counted = b.op(
        "counted",
        OpKind::Compare {
            pred: CmpPred::Ne,
            lhs: target,
            rhs: ignored,
        },
        None,
    )?;
    let ones = b.op(
        "count_each",
        OpKind::Convert { x: counted },
        Some(b.ty(counted).with_dtype(DType::F32)),
    )?;
    Ok((counted, ones))
}

/// The sum of `ones`, at least 1.
fn at_least_one(b: &mut Builder, ones: ValueId) -> Result<ValueId, Diagnostic> {
    let count = sum_all(b, "count", ones)?;
    let one = b.scalar("one", 1.0, DType::F32)?;
    b.binary("count_or_one", BinaryOp::Max, count, one)
}

fn sum_all(b: &mut Builder, hint: &str, x: ValueId) -> Result<ValueId, Diagnostic> {
    let axes = (0..b.ty(x).rank()).collect();
    let op = ReduceOp::Sum;
    b.op(hint, OpKind::Reduce { op, x, axes }, None)
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
