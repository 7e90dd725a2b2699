//! Calls from `@layer` (and `@embed`, `@head`) to the model's own functions, inlined as the
//! model is loaded, so that every pass, the interpreter and every backend see plain ops.
//!
//! A function's parameters are its own: they become parameters of the caller (`@layer`) named
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

/// Inlines every call in the model's functions (`@embed`, `@layer`, `@head`); the functions
/// they called are then dropped from the module.
pub fn inline_calls(m: &mut Module) -> Result<(), Diagnostic> {
    let has_calls = |f: &Func| {
        f.ops
            .values()
            .any(|op| matches!(op.kind, OpKind::Call { .. }))
    };
    let roots: Vec<FuncId> = m
        .funcs
        .iter()
        .filter(|(_, f)| names::ROOTS.contains(&f.name.as_str()))
        .map(|(id, _)| id)
        .collect();
    if !roots.iter().any(|&r| has_calls(&m.funcs[r])) {
        return Ok(());
    }
    let mut funcs = crate::arena::Arena::default();
    for r in roots {
        funcs.push(inline_root(m, &m.funcs[r])?);
    }
    m.funcs = funcs;
    Ok(())
}

/// `root` with every call inlined.
fn inline_root(m: &Module, root: &Func) -> Result<Func, Diagnostic> {
    let mut inliner = Inliner {
        m,
        b: Builder::new(&root.name),
        params: HashMap::new(),
    };
    let b = &mut inliner.b;
    let mut env = HashMap::new();
    for &a in &root.body.args {
        b.span = root.value_spans.get(&a);
        env.insert(a, b.arg(&root.values[a].name, root.ty(a).clone()));
    }
    for p in &root.params {
        b.span = root.value_spans.get(&p.value);
        let v = b.param(
            &root.values[p.value].name,
            root.ty(p.value).clone(),
            p.init,
            p.layer_axes,
        );
        env.insert(p.value, v);
    }
    inliner.block(root, &root.body, &mut env)?;
    let results = root.body.results.iter().map(|v| env[v]).collect();
    Ok(inliner.b.finish(results))
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
                // Model files cannot write `call_if` (only passes do; `ppc check` rejects it).
                OpKind::Call { callee, args, .. } => {
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
