//! `embed-head`: the whole model, `@model`: `@embed` on every microbatch, the GPipe loop, then
//! `@head` on every microbatch. Models without `@embed` and `@head` are left as they are
//! (their entry stays `@pipeline`).
//!
//! Preconditions: `gpipe-loop` has run. Postconditions: the module also holds `@embed_all`
//! and `@head_all`, the ends over all microbatches with their weights as arguments, and
//! `@model(%x: [M, ...input]) -> [M, ...output]`, which calls them around the GPipe loop. The
//! ends are vectorized over the microbatch axis by the batching rules of `vmap-stages` (as
//! Praxis and MaxText run them), so a weight of `@head` is one GEMM over all rows of all
//! microbatches and an embedding is one gather. Their parameters are `@model`'s, once per
//! name: a name `@embed` and `@head` both declare is one parameter (a tied embedding), whose
//! gradient is then the sum of both uses.
//!
//! Split over ranks, only rank 0 feeds stage 0 and only the last rank holds the outputs
//! (`gpipe-loop.rs`): `@embed_all` runs on rank 0 only and `@head_all` on the last rank only
//! (`call_if`; elsewhere their results are -0.0), and so do their backward passes. Their
//! parameters' gradients are thus exact on the rank that uses them and -0.0 elsewhere; the
//! runtime sums them across the ranks of a pipeline, so every rank applies the same update to
//! its copy.
//!
//! ```text
//! func @embed_all(%x: i32[#microbatches, b, t], %wte: f32[vocab, d]) -> f32[#microbatches, b, t, d] {
//!   %h = gather %wte, %x, axis = 0 : f32[microbatches, b, t, d]
//!   ...
//! }
//! func @model(%x: i32[#microbatches, b, t]) -> f32[#microbatches, b, t, vocab] {
//!   param %wte: f32[vocab, d] = normal(0.02)
//!   %is_first_rank = eq %rank, %first_rank
//!   %h = call_if @embed_all, %is_first_rank, %x, %wte
//!   ...the GPipe loop of `@pipeline` on %h...
//!   %logits = call_if @head_all, %is_last_rank, %y, %wte
//! }
//! ```

use super::batching::{batch_block, Batched, Ctx, Mask};
use super::options::Options;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Func, FuncId, Item, Module, Setting, ValueId};
use ppc_dialect::op::{CmpPred, Float, OpKind};
use ppc_dialect::{DType, Dim};
use std::collections::HashMap;

pub fn embed_head(m: &mut Module, _opts: &Options) -> Result<(), Diagnostics> {
    if m.func(names::MODEL).is_some() {
        return Err(vec![Diagnostic::plain(
            "the module already has a `@model`: `embed-head` has run",
        )]);
    }
    if m.func(names::EMBED).is_none() && m.func(names::HEAD).is_none() {
        return Ok(());
    }
    let pipeline = m.func_id(names::PIPELINE).ok_or_else(|| {
        vec![Diagnostic::plain(
            "`embed-head` needs `@pipeline`: run `gpipe-loop` first",
        )]
    })?;
    let mbs = Dim::named(Setting::Microbatches.name(), m.pipeline.microbatches);
    // Per end, the function the model file wrote and the one over all microbatches.
    let mut ends = [None, None];
    for (end, name) in ends.iter_mut().zip([names::EMBED, names::HEAD]) {
        if let Some(id) = m.func_id(name) {
            let all = all_microbatches(&m.funcs[id], &mbs).map_err(|d| vec![d])?;
            *end = Some((id, m.funcs.push(all)));
        }
    }
    let model = build(m, pipeline, ends).map_err(|d| vec![d])?;
    m.funcs.push(model);
    Ok(())
}

/// An end: the function the model file wrote, and `@{it}_all`.
type End = (FuncId, FuncId);

fn build(
    m: &Module,
    pipeline: FuncId,
    [embed, head]: [Option<End>; 2],
) -> Result<Func, Diagnostic> {
    let mbs = Dim::named(Setting::Microbatches.name(), m.pipeline.microbatches);
    let mut b = Builder::new(names::MODEL);
    b.span = m.spans.get(&Item::Pipeline);
    // The argument first, as the parser numbers values; then one parameter per name.
    let written: Vec<&Func> = [embed, head]
        .iter()
        .flatten()
        .map(|&(f, _)| &m.funcs[f])
        .collect();
    let x = b.arg_apart("x", m.input.insert(0, mbs.clone()), &written);
    for f in written {
        b.params_of(f)?;
    }
    let (first, last) = match m.pipeline.ranks {
        1 => (None, None),
        ranks => {
            let rank = b.op("rank", OpKind::Rank, None)?;
            (
                Some(is_rank(&mut b, rank, "first", 0)?),
                Some(is_rank(&mut b, rank, "last", ranks - 1)?),
            )
        }
    };
    let h = match embed {
        Some(end) => call_end(&mut b, m, end, x, first)?,
        None => x,
    };
    let y = b.inline(m, &m.funcs[pipeline], &[h])?[0];
    let out = match head {
        Some(end) => call_end(&mut b, m, end, y, last)?,
        None => y,
    };
    Ok(b.finish(vec![out]))
}

/// `%is_{hint}_rank`: whether this process's `rank` is `r`.
pub(super) fn is_rank(
    b: &mut Builder,
    rank: ValueId,
    hint: &str,
    r: u64,
) -> Result<ValueId, Diagnostic> {
    let v = b.op(
        &format!("{hint}_rank"),
        OpKind::Constant {
            value: Float(r as f64),
        },
        Some(ppc_dialect::Type::scalar(DType::I32)),
    )?;
    b.op(
        &format!("is_{hint}_rank"),
        OpKind::Compare {
            pred: CmpPred::Eq,
            lhs: rank,
            rhs: v,
        },
        None,
    )
}

/// `call_if @{end}_all, %on, %x, weights...`: the end on every microbatch of `x`, on the
/// ranks where `on` (every rank without it), with `@model`'s parameters as its weights.
fn call_end(
    b: &mut Builder,
    m: &Module,
    (written, all): End,
    x: ValueId,
    on: Option<ValueId>,
) -> Result<ValueId, Diagnostic> {
    let f = &m.funcs[written];
    let mut args = vec![x];
    for p in &f.params {
        let name = &f.values[p.value].name;
        args.push(
            b.param_named(name)
                .expect("invariant: declared by params_of"),
        );
    }
    Ok(b.call_if(&f.name, m, all, args, on)?[0])
}

/// `@{f}_all`: the end `f` (`@embed` or `@head`) on every microbatch of its argument, its
/// parameters arguments after it.
fn all_microbatches(f: &Func, mbs: &Dim) -> Result<Func, Diagnostic> {
    let mut b = Builder::new(&format!("{}_all", f.name));
    let arg = f.body.args[0];
    b.span = f.value_spans.get(&arg);
    let x = b.arg(&f.values[arg].name, f.ty(arg).insert(0, mbs.clone()));
    let mut env: HashMap<ValueId, Batched> = HashMap::new();
    env.insert(
        arg,
        Batched {
            value: x,
            batched: true,
        },
    );
    for p in &f.params {
        b.span = f.value_spans.get(&p.value);
        let value = b.arg(&f.values[p.value].name, f.ty(p.value).clone());
        env.insert(
            p.value,
            Batched {
                value,
                batched: false,
            },
        );
    }
    let mut cx = Ctx {
        b: &mut b,
        stage: mbs.clone(),
        mask: Mask::Whole,
    };
    let out = batch_block(&mut cx, f, &f.body, &mut env)?;
    Ok(b.finish(vec![out]))
}
