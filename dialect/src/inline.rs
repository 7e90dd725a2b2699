//! Calls from `@layer` to the model's own functions, inlined as the model is loaded, so that
//! every pass, the interpreter and every backend see one `@layer` of plain ops.
//!
//! A function's parameters are its own: they become parameters of `@layer` named
//! `function.parameter` (`%block.w1`), one set however often the function is called, as a
//! module's weights are shared by each of its uses in PyTorch and Flax. Two blocks with their
//! own weights are two functions.
//!
//! ```text
//! func @block(%x: f32[b, d]) -> f32[b, d] {         func @layer(%x: f32[b, d]) -> f32[b, d] {
//!   param %w: f32[d, d] = normal(0.1)                  param %block.w: f32[d, d] = normal(0.1)
//!   %y = matmul %x, %w                       ──▶       %y = matmul %x, %block.w
//!   return %y                                          %a = matmul %y, %block.w
//! }                                                    return %a
//! func @layer(%x: f32[b, d]) -> f32[b, d] {        }
//!   %y = call @block, %x
//!   %a = call @block, %y
//!   return %a
//! }
//! ```

use crate::build::Builder;
use crate::diag::Diagnostic;
use crate::ir::{names, Block, Func, FuncId, Module, ValueId};
use crate::op::OpKind;
use std::collections::HashMap;

/// Inlines every call in `@layer`; the functions it called are then dropped from the module.
pub fn inline_calls(m: &mut Module) -> Result<(), Diagnostic> {
    let Some(layer_id) = m.func_id(names::LAYER) else {
        return Ok(());
    };
    let layer = &m.funcs[layer_id];
    if !layer
        .ops
        .values()
        .any(|op| matches!(op.kind, OpKind::Call { .. }))
    {
        return Ok(());
    }
    let mut inliner = Inliner {
        m,
        b: Builder::new(names::LAYER),
        params: HashMap::new(),
    };
    let b = &mut inliner.b;
    let mut env = HashMap::new();
    for &a in &layer.body.args {
        b.span = layer.value_spans.get(&a);
        env.insert(a, b.arg(&layer.values[a].name, layer.ty(a).clone()));
    }
    for p in &layer.params {
        b.span = layer.value_spans.get(&p.value);
        let v = b.param(
            &layer.values[p.value].name,
            layer.ty(p.value).clone(),
            p.init,
            p.layer_axes,
        );
        env.insert(p.value, v);
    }
    inliner.block(layer, &layer.body, &mut env)?;
    let results = layer.body.results.iter().map(|v| env[v]).collect();
    let inlined = inliner.b.finish(results);
    let mut funcs = crate::arena::Arena::default();
    funcs.push(inlined);
    m.funcs = funcs;
    Ok(())
}

struct Inliner<'m> {
    m: &'m Module,
    b: Builder,
    /// The parameters of each function inlined so far, as `@layer`'s.
    params: HashMap<FuncId, Vec<ValueId>>,
}

impl Inliner<'_> {
    /// Copies `block` of `f`, its values renamed by `env`, calls inlined.
    fn block(
        &mut self,
        f: &Func,
        block: &Block,
        env: &mut HashMap<ValueId, ValueId>,
    ) -> Result<(), Diagnostic> {
        for &id in &block.ops {
            let op = &f.ops[id];
            self.b.span = f.op_spans.get(&id);
            let outs = match &op.kind {
                OpKind::Call { callee, args } => {
                    let args: Vec<ValueId> = args.iter().map(|v| env[v]).collect();
                    self.call(*callee, &args)?
                }
                _ => vec![self.b.copy_op(f, op, env)?],
            };
            env.extend(op.results.iter().copied().zip(outs));
        }
        Ok(())
    }

    /// The body of function `callee` on `args`: its results.
    fn call(&mut self, callee: FuncId, args: &[ValueId]) -> Result<Vec<ValueId>, Diagnostic> {
        let g = &self.m.funcs[callee];
        let mut env = crate::build::bind(&g.body.args, args);
        if !self.params.contains_key(&callee) {
            let span = self.b.span;
            let mut vs = Vec::new();
            for p in &g.params {
                self.b.span = g.value_spans.get(&p.value);
                let name = format!("{}.{}", g.name, g.values[p.value].name);
                vs.push(
                    self.b
                        .param(&name, g.ty(p.value).clone(), p.init, p.layer_axes),
                );
            }
            self.b.span = span;
            self.params.insert(callee, vs);
        }
        env.extend(
            g.params
                .iter()
                .map(|p| p.value)
                .zip(self.params[&callee].iter().copied()),
        );
        self.block(g, &g.body, &mut env)?;
        Ok(g.body.results.iter().map(|v| env[v]).collect())
    }
}
