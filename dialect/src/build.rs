//! The builder passes use to write IR: fresh names, inferred types, nested loop bodies.
//!
//! Every op goes through shape inference as it is built, so a pass cannot produce an op whose
//! recorded type disagrees with its operands; an inference failure comes back as a diagnostic
//! at the span of the source op the pass was rewriting.

use crate::diag::Diagnostic;
use crate::infer::infer;
use crate::ir::{Block, Func, FuncId, Init, Module, Op, OpId, Param, Value, ValueId};
use crate::op::OpKind;
use crate::span::Span;
use crate::types::Type;
use std::collections::{HashMap, HashSet};

pub struct Builder {
    pub func: Func,
    names: HashSet<String>,
    /// Ops of the blocks being built, innermost last.
    open: Vec<Vec<OpId>>,
    /// Span given to everything built until it is changed.
    pub span: Span,
}

impl Builder {
    pub fn new(name: &str) -> Builder {
        Builder {
            func: Func::new(name),
            names: HashSet::new(),
            open: vec![Vec::new()],
            span: Span::default(),
        }
    }

    /// A new value named `hint`, or `hint.1`, `hint.2`, ... if that is taken.
    pub fn value(&mut self, hint: &str, ty: Type) -> ValueId {
        let mut name = hint.to_string();
        let mut i = 1;
        while self.names.contains(&name) {
            name = format!("{hint}.{i}");
            i += 1;
        }
        self.names.insert(name.clone());
        let id = self.func.values.push(Value { name, ty });
        self.func.value_spans.set(id, self.span);
        id
    }

    pub fn arg(&mut self, hint: &str, ty: Type) -> ValueId {
        let v = self.value(hint, ty);
        self.func.body.args.push(v);
        v
    }

    /// An argument named `hint` (or `hint.N`) unless a parameter of `callees` has that name, so
    /// that their parameters, declared after it ([`Builder::params_of`]), keep their names.
    pub fn arg_apart(&mut self, hint: &str, ty: Type, callees: &[&Func]) -> ValueId {
        let taken = |n: &str| {
            (callees.iter()).any(|f| f.params.iter().any(|p| f.values[p.value].name == n))
        };
        let name = std::iter::once(hint.to_string())
            .chain((1..).map(|i| format!("{hint}.{i}")))
            .find(|n| !taken(n))
            .expect("invariant: finitely many parameters");
        self.arg(&name, ty)
    }

    pub fn param(&mut self, hint: &str, ty: Type, init: Init, layer_axes: usize) -> ValueId {
        let v = self.value(hint, ty);
        self.func.params.push(Param {
            value: v,
            init,
            layer_axes,
        });
        v
    }

    pub fn ty(&self, v: ValueId) -> &Type {
        self.func.ty(v)
    }

    /// Gives `v` the dimension names of `like`, a type of the same dtype and sizes: a slice
    /// that cuts a padded value back to its operand reads `f32[microbatches, b, d]` again, not
    /// `f32[8, b, d]`.
    pub fn relabel(&mut self, v: ValueId, like: &Type) {
        debug_assert!(self.func.ty(v).same_as(like), "relabel keeps sizes");
        self.func.values[v].ty = like.clone();
    }

    /// Appends an op with one result; `declared` is the result type of ops that need one.
    pub fn op(
        &mut self,
        hint: &str,
        kind: OpKind,
        declared: Option<Type>,
    ) -> Result<ValueId, Diagnostic> {
        Ok(self.op_n(hint, kind, declared.into_iter().collect(), None)?[0])
    }

    /// Appends a call of `m`'s function `callee`.
    pub fn call(
        &mut self,
        hint: &str,
        m: &Module,
        callee: FuncId,
        args: Vec<ValueId>,
    ) -> Result<ValueId, Diagnostic> {
        Ok(self.call_n(hint, m, callee, args)?[0])
    }

    /// Appends a call of `m`'s function `callee`, returning all its results.
    pub fn call_n(
        &mut self,
        hint: &str,
        m: &Module,
        callee: FuncId,
        args: Vec<ValueId>,
    ) -> Result<Vec<ValueId>, Diagnostic> {
        self.call_if(hint, m, callee, args, None)
    }

    /// As [`Builder::call_n`], the callee running only where `on` (`OpKind::Call`).
    pub fn call_if(
        &mut self,
        hint: &str,
        m: &Module,
        callee: FuncId,
        args: Vec<ValueId>,
        on: Option<ValueId>,
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let kind = OpKind::Call { callee, args, on };
        self.op_n(hint, kind, vec![], Some(&m.funcs[callee]))
    }

    fn op_n(
        &mut self,
        hint: &str,
        kind: OpKind,
        declared: Vec<Type>,
        callee: Option<&Func>,
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let operands = kind.operands();
        let types: Vec<&Type> = operands.iter().map(|&v| self.func.ty(v)).collect();
        let results = infer(&kind, &types, &declared, callee).map_err(|e| {
            Diagnostic::error(
                format!("cannot build `{}`: {}", kind.name(), e.message),
                self.span,
                "while rewriting this",
            )
        })?;
        let ids: Vec<ValueId> = results.into_iter().map(|t| self.value(hint, t)).collect();
        self.push(kind, ids.clone());
        Ok(ids)
    }

    /// Appends an op to the innermost open block, at the current span.
    fn push(&mut self, kind: OpKind, results: Vec<ValueId>) {
        let id = self.func.ops.push(Op { kind, results });
        self.func.op_spans.set(id, self.span);
        self.open
            .last_mut()
            .expect("invariant: a block is open")
            .push(id);
    }

    /// `lhs op rhs`, elementwise (a scalar operand broadcast).
    pub fn binary(
        &mut self,
        hint: &str,
        op: crate::op::BinaryOp,
        lhs: ValueId,
        rhs: ValueId,
    ) -> Result<ValueId, Diagnostic> {
        self.op(hint, OpKind::Binary { op, lhs, rhs }, None)
    }

    /// `lhs pred rhs`, elementwise, as `i1`.
    pub fn compare(
        &mut self,
        hint: &str,
        pred: crate::op::CmpPred,
        lhs: ValueId,
        rhs: ValueId,
    ) -> Result<ValueId, Diagnostic> {
        self.op(hint, OpKind::Compare { pred, lhs, rhs }, None)
    }

    /// `on_true` where `cond`, else `on_false`, elementwise (a scalar `cond` broadcast).
    pub fn select(
        &mut self,
        hint: &str,
        cond: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    ) -> Result<ValueId, Diagnostic> {
        let kind = OpKind::Select {
            cond,
            on_true,
            on_false,
        };
        self.op(hint, kind, None)
    }

    /// The scalar constant `value` of `dtype`.
    pub fn scalar(
        &mut self,
        hint: &str,
        value: f64,
        dtype: crate::types::DType,
    ) -> Result<ValueId, Diagnostic> {
        let value = crate::op::Float(value);
        self.op(hint, OpKind::Constant { value }, Some(Type::scalar(dtype)))
    }

    /// Appends a loop of `trips` iterations carrying `inits`; `body` receives the iteration
    /// number and the carried values and returns the values to carry on.
    pub fn loop_op(
        &mut self,
        trips: u64,
        inits: Vec<ValueId>,
        hints: &[&str],
        body: impl FnOnce(&mut Builder, ValueId, &[ValueId]) -> Result<Vec<ValueId>, Diagnostic>,
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let t = self.value("t", Type::scalar(crate::types::DType::I32));
        let carried: Vec<ValueId> = inits
            .iter()
            .zip(hints)
            .map(|(&v, h)| {
                let ty = self.func.ty(v).clone();
                self.value(h, ty)
            })
            .collect();
        self.open.push(Vec::new());
        let yields = body(self, t, &carried)?;
        let ops = self.open.pop().expect("invariant: the loop body is open");
        let mut args = vec![t];
        args.extend(carried);
        let block = Block {
            args,
            ops,
            results: yields,
        };
        let out_hints: Vec<String> = hints.iter().map(|h| format!("{h}_out")).collect();
        let types: Vec<Type> = inits.iter().map(|&v| self.func.ty(v).clone()).collect();
        let ids: Vec<ValueId> = types
            .into_iter()
            .zip(&out_hints)
            .map(|(ty, h)| self.value(h, ty))
            .collect();
        self.push(
            OpKind::Loop {
                trips,
                inits,
                body: block,
            },
            ids.clone(),
        );
        Ok(ids)
    }

    /// Declares `callee`'s parameters as this function's, of the same names (those not
    /// declared yet). Called before any other value is made, no name can be taken.
    pub fn params_of(&mut self, callee: &Func) -> Result<(), Diagnostic> {
        for p in &callee.params {
            let name = &callee.values[p.value].name;
            if self.param_named(name).is_some() {
                continue;
            }
            let span = std::mem::replace(&mut self.span, callee.value_spans.get(&p.value));
            let v = self.param(name, callee.ty(p.value).clone(), p.init, p.layer_axes);
            self.span = span;
            if self.func.values[v].name != *name {
                return Err(Diagnostic::error(
                    format!(
                        "parameter `%{name}` has the name of a value of `@{}`",
                        self.func.name
                    ),
                    callee.value_spans.get(&p.value),
                    "this parameter",
                ));
            }
        }
        Ok(())
    }

    /// Declares `callee`'s parameters as this function's ([`Builder::params_of`]) and binds
    /// each of `callee`'s to this function's of its name in `env`.
    pub fn bind_params_of(
        &mut self,
        callee: &Func,
        env: &mut HashMap<ValueId, ValueId>,
    ) -> Result<(), Diagnostic> {
        self.params_of(callee)?;
        for p in &callee.params {
            let v = self.param_named(&callee.values[p.value].name);
            env.insert(p.value, v.expect("invariant: declared by params_of"));
        }
        Ok(())
    }

    /// Takes `g`'s arguments (their names, types and spans) as this function's and its
    /// parameters ([`Builder::bind_params_of`]), each bound in `env` to this function's: the
    /// start of a function made from `g`.
    pub fn signature_of(
        &mut self,
        g: &Func,
        env: &mut HashMap<ValueId, ValueId>,
    ) -> Result<(), Diagnostic> {
        for &a in &g.body.args {
            self.span = g.value_spans.get(&a);
            env.insert(a, self.arg(&g.values[a].name, g.ty(a).clone()));
        }
        self.bind_params_of(g, env)
    }

    /// This function's parameter called `name`.
    pub fn param_named(&self, name: &str) -> Option<ValueId> {
        self.func
            .params
            .iter()
            .map(|p| p.value)
            .find(|&v| self.func.values[v].name == name)
    }

    /// Appends the body of `callee` (of `m`) reading `args`; returns the values of its results.
    /// The callee's parameters become this function's ([`Builder::params_of`]).
    pub fn inline(
        &mut self,
        m: &Module,
        callee: &Func,
        args: &[ValueId],
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let mut env = bind(&callee.body.args, args);
        self.bind_params_of(callee, &mut env)?;
        self.copy_ops(m, callee, &callee.body.ops, &mut env)?;
        Ok(callee.body.results.iter().map(|v| env[v]).collect())
    }

    /// Appends copies of `f`'s ops `ops` (loops and calls included), their operands renamed by
    /// `env`, to which their results are added.
    pub fn copy_ops(
        &mut self,
        m: &Module,
        f: &Func,
        ops: &[OpId],
        env: &mut HashMap<ValueId, ValueId>,
    ) -> Result<(), Diagnostic> {
        for &id in ops {
            let op = &f.ops[id];
            let hint = f.values[op.results[0]].name.clone();
            self.span = f.op_spans.get(&id);
            let outs = match &op.kind {
                OpKind::Loop { trips, inits, body } => {
                    let inits = inits.iter().map(|v| env[v]).collect();
                    let hints: Vec<&str> = body.args[1..]
                        .iter()
                        .map(|&a| f.values[a].name.as_str())
                        .collect();
                    self.loop_op(*trips, inits, &hints, |b, t, carried| {
                        env.insert(body.args[0], t);
                        env.extend(body.args[1..].iter().copied().zip(carried.iter().copied()));
                        b.copy_ops(m, f, &body.ops, env)?;
                        Ok(body.results.iter().map(|v| env[v]).collect())
                    })?
                }
                OpKind::Call { callee, args, on } => {
                    let args = args.iter().map(|v| env[v]).collect();
                    self.call_if(&hint, m, *callee, args, on.map(|v| env[&v]))?
                }
                _ => vec![self.copy_op(f, op, env)?],
            };
            env.extend(op.results.iter().copied().zip(outs));
        }
        Ok(())
    }

    /// Appends a copy of `f`'s op `op` (one result; not a loop or a call), its operands
    /// renamed by `env`, under its result's name.
    pub fn copy_op(
        &mut self,
        f: &Func,
        op: &crate::ir::Op,
        env: &HashMap<ValueId, ValueId>,
    ) -> Result<ValueId, Diagnostic> {
        let kind = op.kind.map_operands(|v| env[&v]);
        let declared = kind
            .has_declared_type()
            .then(|| f.ty(op.results[0]).clone());
        self.op(&f.values[op.results[0]].name, kind, declared)
    }

    /// The finished function, returning `results`.
    pub fn finish(mut self, results: Vec<ValueId>) -> Func {
        self.func.body.ops = self.open.pop().expect("invariant: the body is open");
        self.func.body.results = results;
        self.func
    }
}

/// The renaming that binds `params` (a function's arguments) to `args`.
pub fn bind(params: &[ValueId], args: &[ValueId]) -> HashMap<ValueId, ValueId> {
    params.iter().copied().zip(args.iter().copied()).collect()
}
