//! `vmap-stages`: the one-stage compute `@layer`, vectorized over a leading stage axis into
//! `@stage`.
//!
//! Preconditions: a checked model (`@layer` maps the input type to itself, has no `#` axis).
//! The stage axis is typed `#stages` ([`Axis::Stages`]), so later passes find it whatever
//! dimension names `@layer` uses (`stages` included).
//! Postconditions: the module also holds `@stage(%x: [S, ...input], %active: i1[S]) -> [S, ...input]`
//! (with an extra `%repeat: i32[S]` argument when `repeats > 1`). Stage `s` computes only where
//! `%active[s]`: batched matmuls take it as their mask, so bubble slots skip the expensive work
//! (their results are never read). Each parameter of `@layer` becomes one of
//! `@stage` with leading axes `[R, S, k]` (`R` only when `repeats > 1`, `k` only when more than
//! one layer runs per stage) that enumerate layers: element `(r, s, j)` holds the weights of layer
//! `(r*S + s)*k + j`. With `k > 1` the layers of a stage are a `loop` of `k` trips over one copy of
//! the layer, each trip indexing the stacked weights at its layer, so the program (and its
//! compile time) does not grow with `k`. Every op is rewritten by its batching rule
//! (`batching.rs`).
//!
//! ```text
//! func @layer(%x: f32[b, d]) -> f32[b, d] {         func @stage(%x: f32[#stages, b, d]) -> f32[#stages, b, d] {
//!   param %w: f32[d, d] = normal(0.5)          ──▶    param %w: f32[#stages, d, d] = normal(0.5), layer_axes = 1
//!   %y = matmul %x, %w : f32[b, d]                    %y = matmul %x, %w : f32[#stages, b, d]
//!   return %y                                         return %y
//! }                                                 }
//! ```

use super::batching::{batch_block, Batched, Ctx, Mask};
use super::options::Options;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Func, Module, Setting, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::{Axis, DType, Dim, Type};
use std::collections::HashMap;

pub fn vmap_stages(m: &mut Module, _opts: &Options) -> Result<(), Diagnostics> {
    if m.func(names::STAGE).is_some() {
        return Err(vec![Diagnostic::plain(
            "the module already has a `@stage`: `vmap-stages` has run",
        )]);
    }
    let layer = m
        .func(names::LAYER)
        .ok_or_else(|| vec![Diagnostic::plain("`vmap-stages` needs a `@layer`")])?;
    // The stage axis this pass adds must be the only one.
    if let Some(d) = ppc_dialect::model_rules::pipeline_axis(layer) {
        return Err(vec![d]);
    }
    let stage = build_stage(m, layer).map_err(|d| vec![d])?;
    m.funcs.push(stage);
    Ok(())
}

fn build_stage(m: &Module, layer: &Func) -> Result<Func, Diagnostic> {
    let p = m.pipeline;
    let (s_dim, k) = (Dim::axis(Axis::Stages, p.stages), p.layers_per_stage());
    let mut b = Builder::new(names::STAGE);
    let x_arg = layer.body.args[0];
    b.span = layer.value_spans.get(&x_arg);
    let x = b.arg(
        &layer.values[x_arg].name,
        layer.ty(x_arg).insert(0, s_dim.clone()),
    );
    let active = b.arg("active", Type::new(DType::I1, vec![s_dim.clone()]));
    let repeat =
        (p.repeats > 1).then(|| b.arg(names::REPEAT, Type::new(DType::I32, vec![s_dim.clone()])));
    let depth = p
        .uneven()
        .then(|| b.arg("depth", Type::new(DType::I32, vec![s_dim.clone()])));

    // Stacked parameters: [R?, S, k?, ...].
    let mut lead = Vec::new();
    if p.repeats > 1 {
        lead.push(Dim::named(Setting::Repeats.name(), p.repeats));
    }
    lead.push(s_dim.clone());
    if k > 1 {
        lead.push(Dim::named(Setting::LayersPerStage.name(), k));
    }
    let mut stacked = Vec::new();
    for prm in &layer.params {
        b.span = layer.value_spans.get(&prm.value);
        let t = layer.ty(prm.value);
        let mut dims = lead.clone();
        dims.extend(t.dims.iter().cloned());
        let v = b.param(
            &layer.values[prm.value].name,
            Type::new(t.dtype, dims),
            prm.init,
            lead.len(),
        );
        stacked.push(v);
    }

    // This stage's weights for the current repeat: [S, k?, ...].
    let mut per_stage = Vec::new();
    for (prm, &w) in layer.params.iter().zip(&stacked) {
        b.span = layer.value_spans.get(&prm.value);
        let name = layer.values[prm.value].name.clone();
        per_stage.push(match repeat {
            None => w,
            Some(r) => {
                let t = b.ty(w).clone();
                let mut perm: Vec<usize> = (0..t.rank()).collect();
                perm.swap(0, 1);
                let wt = b.op(
                    &format!("{name}_by_stage"),
                    OpKind::Transpose { x: w, perm },
                    None,
                )?;
                b.op(
                    &format!("{name}_r"),
                    OpKind::Index {
                        x: wt,
                        index: r,
                        axis: 1,
                    },
                    None,
                )?
            }
        });
    }

    // The k layers of a stage: one copy of the layer, in a loop over the stacked weights when
    // k > 1, so that code size and compile time do not grow with k.
    if k == 1 {
        let out = layer_in_slot(&mut b, layer, x, &per_stage, None, &s_dim, active, depth)?;
        return Ok(b.finish(vec![out]));
    }
    let outs = b.loop_op(k, vec![x], &["act"], |b, j, carried| {
        b.span = layer.value_spans.get(&x_arg);
        let t = Type::new(DType::I32, vec![s_dim.clone()]);
        let index = b.op("layer", OpKind::Broadcast { x: j }, Some(t))?;
        let out = layer_in_slot(
            b,
            layer,
            carried[0],
            &per_stage,
            Some(index),
            &s_dim,
            active,
            depth,
        )?;
        Ok(vec![out])
    })?;
    Ok(b.finish(outs))
}

/// One layer slot of the stage on `x` ([`layer_once`]). With uneven depth (`depth` [S]: the
/// layers each stage holds), only where slot `index` (0 without) holds a layer: elsewhere the
/// slot's matmuls are masked and it passes `x` on unchanged.
#[allow(clippy::too_many_arguments)]
fn layer_in_slot(
    b: &mut Builder,
    layer: &Func,
    x: ValueId,
    per_stage: &[ValueId],
    index: Option<ValueId>,
    s_dim: &Dim,
    active: ValueId,
    depth: Option<ValueId>,
) -> Result<ValueId, Diagnostic> {
    let Some(depth) = depth else {
        return layer_once(b, layer, x, per_stage, index, s_dim, active);
    };
    let j = match index {
        Some(j) => j,
        None => b.op(
            "slot",
            OpKind::Constant {
                value: ppc_dialect::op::Float(0.0),
            },
            Some(Type::scalar(DType::I32)),
        )?,
    };
    let holds = b.op(
        "holds_layer",
        OpKind::Compare {
            pred: ppc_dialect::op::CmpPred::Lt,
            lhs: j,
            rhs: depth,
        },
        None,
    )?;
    let runs = b.op(
        "runs",
        OpKind::Select {
            cond: holds,
            on_true: active,
            on_false: holds,
        },
        None,
    )?;
    let y = layer_once(b, layer, x, per_stage, index, s_dim, runs)?;
    let mut dims = vec![s_dim.clone()];
    dims.extend((1..b.ty(x).rank()).map(|_| Dim::lit(1)));
    let holds = b.op(
        "holds",
        OpKind::Reshape { x: holds },
        Some(Type::new(DType::I1, dims)),
    )?;
    b.op(
        "slot_out",
        OpKind::Select {
            cond: holds,
            on_true: y,
            on_false: x,
        },
        None,
    )
}

/// One layer of the stage on `x`: with `index` ([S], the layer within the stage), each stacked
/// weight's slice for it, else the weights as they are.
fn layer_once(
    b: &mut Builder,
    layer: &Func,
    x: ValueId,
    per_stage: &[ValueId],
    index: Option<ValueId>,
    s_dim: &Dim,
    active: ValueId,
) -> Result<ValueId, Diagnostic> {
    let mut env: HashMap<ValueId, Batched> = HashMap::new();
    env.insert(
        layer.body.args[0],
        Batched {
            value: x,
            batched: true,
        },
    );
    for (prm, &w) in layer.params.iter().zip(per_stage) {
        b.span = layer.value_spans.get(&prm.value);
        let value = match index {
            Some(index) => {
                let name = &layer.values[prm.value].name;
                b.op(
                    &format!("{name}_j"),
                    OpKind::Index {
                        x: w,
                        index,
                        axis: 1,
                    },
                    None,
                )?
            }
            None => w,
        };
        env.insert(
            prm.value,
            Batched {
                value,
                batched: true,
            },
        );
    }
    let mut cx = Ctx {
        b,
        stage: s_dim.clone(),
        mask: Mask::PerEntry(active),
    };
    batch_block(&mut cx, layer, &layer.body, &mut env)
}
