//! The verifier: the invariants every pass may rely on, re-checked after every pass.
//!
//! [`verify`] checks that values are defined once and before use (loop-body values stay inside
//! their loop), that every op's recorded result types are what shape inference says, that calls
//! refer to earlier functions with matching types, that loops yield what they carry, and that
//! no function `call_if` runs on some ranks only exchanges with other ranks. After `Ok`,
//! the interpreter and passes may index and unwrap without further checks.
//!
//! [`check_model`] adds the rules of a model file: a `@layer` whose input and output are both
//! the declared microbatch input type, so that layers can be chained stage after stage.

use crate::diag::{Diagnostic, Diagnostics};
use crate::infer::infer;
use crate::ir::{names, Block, Func, FuncId, Item, Module, ValueId};
use crate::op::OpKind;
use crate::types::{sizes, Type};
use std::collections::HashSet;

/// Checks the structural and type invariants of every function.
pub fn verify(m: &Module) -> Result<(), Diagnostics> {
    let mut diags = Vec::new();
    for (id, f) in m.funcs.iter() {
        if m.funcs
            .iter()
            .any(|(g_id, g)| g_id < id && g.name == f.name)
        {
            diags.push(Diagnostic::plain(format!(
                "function `@{}` is defined twice",
                f.name
            )));
        }
        verify_func(m, id, f, &mut diags);
    }
    if diags.is_empty() {
        exchanges_on_every_rank(m, &mut diags);
    }
    if diags.is_empty() {
        Ok(())
    } else {
        Err(diags)
    }
}

/// Every rank runs every `exchange`, in the same order: one that some ranks skip would wait
/// forever for a neighbour that never answers. So no function that `call_if` runs (on some
/// ranks only) may exchange, directly or through its callees.
fn exchanges_on_every_rank(m: &Module, diags: &mut Diagnostics) {
    fn exchanges(m: &Module, f: &Func, block: &Block) -> bool {
        block.ops.iter().any(|&id| match &f.ops[id].kind {
            OpKind::Exchange { .. } => true,
            OpKind::Call { callee, .. } => {
                let g = &m.funcs[*callee];
                exchanges(m, g, &g.body)
            }
            OpKind::Loop { body, .. } => exchanges(m, f, body),
            _ => false,
        })
    }
    for f in m.funcs.values() {
        for (id, op) in f.ops.iter() {
            let OpKind::Call {
                callee,
                on: Some(_),
                ..
            } = &op.kind
            else {
                continue;
            };
            let g = &m.funcs[*callee];
            if exchanges(m, g, &g.body) {
                diags.push(Diagnostic::error(
                    format!(
                        "`@{}` exchanges with the neighbouring ranks, but `call_if` runs it on some ranks only: their neighbours would wait for them forever",
                        g.name
                    ),
                    f.op_spans.get(&id),
                    "run on some ranks only",
                ));
            }
        }
    }
}

fn verify_func(m: &Module, this: FuncId, f: &Func, diags: &mut Diagnostics) {
    let mut names = HashSet::new();
    for (_, v) in f.values.iter() {
        if !names.insert(v.name.as_str()) {
            diags.push(Diagnostic::plain(format!(
                "`@{}`: value `%{}` is defined twice",
                f.name, v.name
            )));
        }
    }
    let mut defined: HashSet<ValueId> = f.body.args.iter().copied().collect();
    for p in &f.params {
        defined.insert(p.value);
        if p.layer_axes > f.ty(p.value).rank() {
            diags.push(Diagnostic::plain(format!(
                "`@{}`: parameter `%{}` has more layer axes than dimensions",
                f.name, f.values[p.value].name
            )));
        }
    }
    verify_block(m, this, f, &f.body, &mut defined, diags);
}

fn verify_block(
    m: &Module,
    this: FuncId,
    f: &Func,
    block: &Block,
    defined: &mut HashSet<ValueId>,
    diags: &mut Diagnostics,
) {
    let here = |id| f.op_spans.get(&id);
    for &id in &block.ops {
        let op = &f.ops[id];
        let operands = op.kind.operands();
        if let Some(&v) = operands.iter().find(|v| !defined.contains(v)) {
            diags.push(Diagnostic::error(
                format!(
                    "`{}` uses `%{}` before its definition",
                    op.kind.name(),
                    f.values[v].name
                ),
                here(id),
                "here",
            ));
            continue;
        }
        // Only functions defined earlier may be called: no recursion, no cycles.
        let callee = match &op.kind {
            OpKind::Call { callee, .. } if *callee < this => Some(&m.funcs[*callee]),
            _ => None,
        };
        let types: Vec<_> = operands.iter().map(|&v| f.ty(v)).collect();
        let recorded: Vec<_> = op.results.iter().map(|&v| f.ty(v).clone()).collect();
        match infer(&op.kind, &types, &recorded, callee) {
            Ok(inferred) => {
                let same = inferred.len() == recorded.len()
                    && inferred.iter().zip(&recorded).all(|(a, b)| a.same_as(b));
                if !same {
                    let show = |ts: &[crate::types::Type]| {
                        ts.iter().map(sizes).collect::<Vec<_>>().join(", ")
                    };
                    diags.push(Diagnostic::error(
                        format!(
                            "`{}` records result types {} but produces {}",
                            op.kind.name(),
                            show(&recorded),
                            show(&inferred)
                        ),
                        here(id),
                        "here",
                    ));
                }
            }
            Err(e) => diags.push(Diagnostic::error(e.message, here(id), "here")),
        }
        if let OpKind::Loop { body, inits, .. } = &op.kind {
            let mut inner = defined.clone();
            inner.extend(body.args.iter().copied());
            let arg_ok = body.args.len() == inits.len() + 1
                && body.args.first().is_some_and(|&t| {
                    f.ty(t)
                        .same_as(&crate::types::Type::scalar(crate::types::DType::I32))
                })
                && body.args[1..]
                    .iter()
                    .zip(inits)
                    .all(|(&a, &i)| f.ty(a).same_as(f.ty(i)));
            if !arg_ok {
                diags.push(Diagnostic::error(
                    "loop body arguments must be an i32 iteration number and the carried values",
                    here(id),
                    "here",
                ));
            }
            verify_block(m, this, f, body, &mut inner, diags);
            let yields_ok = body.results.len() == inits.len()
                && body
                    .results
                    .iter()
                    .zip(inits)
                    .all(|(&y, &i)| inner.contains(&y) && f.ty(y).same_as(f.ty(i)));
            if !yields_ok {
                diags.push(Diagnostic::error(
                    "loop body must yield defined values of the carried types",
                    here(id),
                    "here",
                ));
            }
        }
        defined.extend(op.results.iter().copied());
    }
    if let Some(&v) = block.results.iter().find(|v| !defined.contains(v)) {
        diags.push(Diagnostic::plain(format!(
            "`@{}` returns `%{}`, which is not defined there",
            f.name, f.values[v].name
        )));
    }
}

/// The model-file rules on top of [`verify`]: a `@layer` from the input type to itself.
pub fn check_model(m: &Module) -> Result<(), Diagnostics> {
    verify(m)?;
    crate::model_rules::check_user_code(m)?;
    let input_span = m.spans.get(&Item::Input);
    let Some(layer) = m.func(names::LAYER) else {
        return Err(vec![Diagnostic::error("the model has no `func @layer`", input_span, "the layer's input is declared here")
            .with_note("`@layer` is the one-stage compute: it maps one microbatch (the `input` type) to the next stage's input")]);
    };
    let stage_ty = m.stage_type();
    let (args, results) = (layer.arg_types(), layer.result_types());
    let fits = args.len() == 1
        && results.len() == 1
        && args[0].same_as(&stage_ty)
        && results[0].same_as(&stage_ty);
    if !fits {
        let show = |ts: &[crate::types::Type]| ts.iter().map(sizes).collect::<Vec<_>>().join(", ");
        let span = layer
            .body
            .args
            .first()
            .map(|&a| layer.value_spans.get(&a))
            .unwrap_or(input_span);
        let (what, declared, label) = match m.func_id(names::EMBED) {
            Some(e) => (
                "`@embed`'s result",
                m.spans.get(&Item::Func(e)),
                "`@embed` declared here",
            ),
            None => ("`input`", input_span, "input type declared here"),
        };
        return Err(vec![Diagnostic::error(
            format!(
                "`@layer` maps ({}) to ({}), but stages chain {what} {} to itself",
                show(&args),
                show(&results),
                sizes(&stage_ty)
            ),
            span,
            "layer signature",
        )
        .with_label(declared, label)
        .with_note(
            "stage s feeds stage s+1, so the layer must take and return exactly the type between stages",
        )]);
    }
    crate::model_rules::check_ends(m)?;
    let out = m.output_type();
    if let (Some(t), crate::ir::Loss::SoftmaxCrossEntropy) = (&m.target, m.loss_or_default()) {
        let want = Type::of(crate::DType::I32, &out.shape()[..out.rank() - 1]);
        if !t.same_as(&want) {
            return Err(vec![Diagnostic::error(
                format!(
                    "`loss softmax_cross_entropy` takes one class index per row of outputs {}: targets must be {want}, got {}",
                    sizes(&out),
                    sizes(t)
                ),
                m.spans.get(&Item::Target),
                "target type",
            )
            .with_note("the last axis of the outputs holds the logits of the classes")]);
        }
    }
    if let Some(t) = &m.target {
        if !t.same_as(&out) && m.loss_or_default() == crate::ir::Loss::Mse {
            let what = match m.loss {
                Some(_) => "`loss mse`",
                None => "`loss mse` (the default: the model has no `loss` line)",
            };
            return Err(vec![Diagnostic::error(
                format!(
                    "{what} compares outputs {} with targets {}, which differ",
                    sizes(&out),
                    sizes(t)
                ),
                m.spans.get(&Item::Target),
                "target type",
            )]);
        }
    }
    Ok(())
}
