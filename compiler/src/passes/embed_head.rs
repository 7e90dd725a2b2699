//! `embed-head`: the whole model, `@model`: `@embed` on every microbatch, the GPipe loop, then
//! `@head` on every microbatch. Models without `@embed` and `@head` are left as they are
//! (their entry stays `@pipeline`).
//!
//! Preconditions: `gpipe-loop` has run. Postconditions: the module also holds
//! `@model(%x: [M, ...input]) -> [M, ...output]`. `@embed` and `@head` run outside the loop,
//! vectorized over the microbatch axis by the batching rules of `vmap-stages` (as Praxis and
//! MaxText run them), so a weight of `@head` is one GEMM over all rows of all microbatches and an
//! embedding is one gather. Their parameters are `@model`'s, once per name: a name `@embed` and
//! `@head` both declare is one parameter (a tied embedding), whose gradient is then the sum of
//! both uses.
//!
//! Split over ranks, every rank runs `@model`, but only rank 0 feeds stage 0 and only the last
//! rank holds the outputs (`gpipe-loop.rs`): `@embed`'s matmuls run on rank 0 only and
//! `@head`'s on the last rank only (masked elsewhere, as bubbles are), and `@head` reads zeros
//! on the other ranks, whose output buffers hold bubbles. Their parameters' gradients are thus
//! exact on the rank that uses them and zero elsewhere; the runtime sums them across the ranks
//! of a pipeline, so every rank applies the same update to its copy.
//!
//! ```text
//! func @model(%x: i32[#microbatches, b, t]) -> f32[#microbatches, b, t, vocab] {
//!   param %wte: f32[vocab, d] = normal(0.02)
//!   %h = gather %wte, %x, axis = 0 : f32[microbatches, b, t, d]
//!   ...the GPipe loop of `@pipeline` on %h...
//!   %rows = reshape %y : f32[1024, d]
//!   %logits = matmul %rows, %wte_t : f32[1024, vocab]
//!   ...
//! }
//! ```

use super::batching::{batch_block, Batched, Ctx, Mask};
use super::options::Options;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Func, FuncId, Item, Module, Setting, ValueId};
use ppc_dialect::op::{CmpPred, Float, OpKind};
use ppc_dialect::{DType, Dim, Type};
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
    let model = build(m, pipeline).map_err(|d| vec![d])?;
    m.funcs.push(model);
    Ok(())
}

fn build(m: &Module, pipeline: FuncId) -> Result<Func, Diagnostic> {
    let (embed, head) = (m.func(names::EMBED), m.func(names::HEAD));
    let mbs = Dim::named(Setting::Microbatches.name(), m.pipeline.microbatches);
    let mut b = Builder::new(names::MODEL);
    b.span = m.spans.get(&Item::Pipeline);
    // One parameter per name, declared first so that it keeps its name.
    for f in embed.iter().chain(&head) {
        b.params_of(f)?;
    }
    b.span = m.spans.get(&Item::Pipeline);
    let x = b.arg("x", m.input.insert(0, mbs.clone()));
    let ranks = ranks(&mut b, m.pipeline.ranks)?;
    let h = match embed {
        Some(f) => vectorize(&mut b, f, x, &mbs, ranks.map(|r| r.first))?,
        None => x,
    };
    b.span = m.spans.get(&Item::Pipeline);
    let y = b.inline(m, &m.funcs[pipeline], &[h])?[0];
    let out = match head {
        Some(f) => {
            // Other ranks' output buffers hold bubbles (NaN with `--poison-bubbles`).
            let y = match ranks {
                Some(r) => {
                    let zero = b.op(
                        "no_outputs",
                        OpKind::Constant { value: Float(0.0) },
                        Some(Type::scalar(b.ty(y).dtype)),
                    )?;
                    b.op(
                        "outputs_here",
                        OpKind::Select {
                            cond: r.last,
                            on_true: y,
                            on_false: zero,
                        },
                        None,
                    )?
                }
                None => y,
            };
            vectorize(&mut b, f, y, &mbs, ranks.map(|r| r.last))?
        }
        None => y,
    };
    Ok(b.finish(vec![out]))
}

/// Whether this rank is the first and the last of the pipeline.
#[derive(Clone, Copy)]
struct Ranks {
    first: ValueId,
    last: ValueId,
}

fn ranks(b: &mut Builder, ranks: u64) -> Result<Option<Ranks>, Diagnostic> {
    if ranks == 1 {
        return Ok(None);
    }
    let rank = b.op("rank", OpKind::Rank, None)?;
    let mut is = |hint: &str, r: u64| -> Result<ValueId, Diagnostic> {
        let v = b.op(
            &format!("{hint}_rank"),
            OpKind::Constant {
                value: Float(r as f64),
            },
            Some(Type::scalar(DType::I32)),
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
    };
    Ok(Some(Ranks {
        first: is("first", 0)?,
        last: is("last", ranks - 1)?,
    }))
}

/// `f` (`@embed` or `@head`) on every microbatch of `x`, its matmuls under `runs`.
fn vectorize(
    b: &mut Builder,
    f: &Func,
    x: ValueId,
    mbs: &Dim,
    runs: Option<ValueId>,
) -> Result<ValueId, Diagnostic> {
    let mut env: HashMap<ValueId, Batched> = HashMap::new();
    env.insert(
        f.body.args[0],
        Batched {
            value: x,
            batched: true,
        },
    );
    for p in &f.params {
        let value = b
            .param_named(&f.values[p.value].name)
            .expect("invariant: declared by params_of");
        env.insert(
            p.value,
            Batched {
                value,
                batched: false,
            },
        );
    }
    let mut cx = Ctx {
        b,
        stage: mbs.clone(),
        mask: Mask::Whole(runs),
    };
    batch_block(&mut cx, f, &f.body, &mut env)
}
