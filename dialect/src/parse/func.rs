//! Functions: arguments, parameters, op statements and loop bodies, with names resolved in
//! scope and every op typed by shape inference as it is read.

use super::attrs::{parse_init, Args, Attr, Dims};
use super::signature::{self, Extra, FuncScope, Signature, Stmt};
use super::syntax::{is_pinned, parse_u64, span_of, PResult, Rule};
use crate::arena::Arena;
use crate::diag::Diagnostic;
use crate::infer::{checked_elements, infer};
use crate::ir::{Block, Func, FuncId, Op, Param, Value, ValueId};
use crate::op::OpKind;
use crate::span::Span;
use crate::types::{sizes, DType, Type};
use pest::iterators::Pair;
use std::collections::HashMap;

/// What a function sees of the module being parsed.
pub(super) trait ModuleScope {
    /// A written type, its dimensions resolved.
    fn ty(&self, t: Pair<Rule>) -> PResult<Type>;
    /// The functions defined so far.
    fn funcs(&self) -> &Arena<Func>;
    /// The dimensions and pipeline settings expressions may name, with their values.
    fn dims(&self) -> Dims;
    /// `--dtype`: the float type that written `f32` types mean.
    fn float_dtype(&self) -> Option<DType>;
}

pub(super) struct FuncBuilder<'m> {
    module: &'m dyn ModuleScope,
    func: Func,
    /// Names in scope, innermost block last.
    scopes: Vec<HashMap<String, ValueId>>,
    dims: Dims,
}

impl<'m> FuncBuilder<'m> {
    /// Parses a function; the module's types must be resolved (its `pipeline` read).
    pub(super) fn build(module: &'m dyn ModuleScope, p: Pair<Rule>) -> PResult<Func> {
        let mut it = p.into_inner();
        let name = it.next().expect("func name");
        let mut fb = FuncBuilder {
            module,
            func: Func::new(&name.as_str()[1..]),
            scopes: vec![HashMap::new()],
            dims: module.dims(),
        };
        let mut declared_results = Vec::new();
        for part in it {
            match part.as_rule() {
                Rule::arg_def => {
                    let mut a = part.into_inner();
                    let (v, t) = (a.next().expect("arg name"), a.next().expect("arg type"));
                    let pinned = is_pinned(&t);
                    let ty = module.ty(t)?;
                    let id = fb.define(&v, ty)?;
                    if pinned {
                        fb.func.written.pinned.insert(id);
                    }
                    fb.func.body.args.push(id);
                }
                Rule::tys => {
                    for t in part.into_inner() {
                        let span = span_of(&t);
                        declared_results.push((module.ty(t)?, span));
                    }
                }
                Rule::param => fb.param(part)?,
                Rule::stmt => {
                    let op = fb.stmt(part)?;
                    fb.func.body.ops.push(op);
                }
                Rule::ret => {
                    let span = span_of(&part);
                    let vals = part
                        .into_inner()
                        .map(|v| fb.lookup(&v))
                        .collect::<PResult<Vec<_>>>()?;
                    if vals.len() != declared_results.len() {
                        return Err(Diagnostic::error(
                            format!(
                                "`@{}` declares {} results but returns {}",
                                fb.func.name,
                                declared_results.len(),
                                vals.len()
                            ),
                            span,
                            "wrong number of values",
                        ));
                    }
                    for (&v, (t, tspan)) in vals.iter().zip(&declared_results) {
                        if !fb.func.ty(v).same_as(t) {
                            return Err(Diagnostic::error(
                                format!(
                                    "`@{}` returns {} where its signature says {}",
                                    fb.func.name,
                                    sizes(fb.func.ty(v)),
                                    sizes(t)
                                ),
                                span,
                                format!("this is {}", sizes(fb.func.ty(v))),
                            )
                            .with_label(*tspan, "declared here"));
                        }
                    }
                    fb.func.body.results = vals;
                }
                Rule::rbrace => {}
                other => unreachable!("invariant: unexpected {other:?} in func"),
            }
        }
        Ok(fb.func)
    }

    fn define(&mut self, v: &Pair<Rule>, ty: Type) -> PResult<ValueId> {
        let name = &v.as_str()[1..];
        if self.func.values.iter().any(|(_, x)| x.name == name) {
            return Err(Diagnostic::error(
                format!("`%{name}` is defined twice"),
                span_of(v),
                "redefined here",
            )
            .with_note("every value has one definition (SSA); pick a new name"));
        }
        let id = self.func.values.push(Value {
            name: name.to_string(),
            ty,
        });
        self.func.value_spans.set(id, span_of(v));
        self.scopes
            .last_mut()
            .expect("invariant: a scope is open")
            .insert(name.to_string(), id);
        Ok(id)
    }

    fn lookup(&self, v: &Pair<Rule>) -> PResult<ValueId> {
        let name = &v.as_str()[1..];
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.get(name).copied())
            .ok_or_else(|| {
                let mut d = Diagnostic::error(
                    format!("unknown value `%{name}`"),
                    span_of(v),
                    "not defined before this use",
                );
                if self.func.values.iter().any(|(_, x)| x.name == name) {
                    d = d.with_note("it is defined inside a loop body and is not visible here");
                }
                d
            })
    }

    fn param(&mut self, p: Pair<Rule>) -> PResult<()> {
        let mut it = p.into_inner();
        let v = it.next().expect("param name");
        let t = it.next().expect("param type");
        let pinned = is_pinned(&t);
        let ty = self.module.ty(t)?;
        let init_pair = it.next().expect("param init");
        let (init, init_text) = parse_init(init_pair, &self.dims)?;
        let layer_axes = match it.next() {
            Some(n) => {
                let k = parse_u64(&n, "layer_axes")? as usize;
                if k > ty.rank() {
                    return Err(Diagnostic::error(
                        format!("layer_axes = {k} exceeds the rank of {ty}"),
                        span_of(&n),
                        "too many",
                    ));
                }
                k
            }
            None => 0,
        };
        if !ty.dtype.is_float() {
            return Err(Diagnostic::error(
                format!(
                    "parameter `{}` must be floating point, not {}",
                    v.as_str(),
                    ty.dtype
                ),
                span_of(&v),
                "not trainable",
            ));
        }
        let value = self.define(&v, ty)?;
        if pinned {
            self.func.written.pinned.insert(value);
        }
        if let Some(text) = init_text {
            self.func.written.inits.insert(value, text);
        }
        self.func.params.push(Param {
            value,
            init,
            layer_axes,
        });
        Ok(())
    }

    /// An op statement: collect its parts, look its op up, build it, type its results.
    fn stmt(&mut self, s: Pair<Rule>) -> PResult<crate::ir::OpId> {
        let mut stmt = self.collect(s)?;
        let sig = self.signature(&stmt)?;
        let kind = sig.build(self, &mut stmt)?;
        let types = self.result_types(&stmt, &kind)?;
        let result_ids = stmt
            .results
            .iter()
            .zip(types)
            .map(|(r, t)| self.define(r, t))
            .collect::<PResult<Vec<_>>>()?;
        let written = &mut self.func.written;
        for (&r, _) in result_ids.iter().zip(&stmt.pinned).filter(|(_, &p)| p) {
            written.pinned.insert(r);
        }
        let id = self.func.ops.push(Op {
            kind,
            results: result_ids,
        });
        self.func.op_spans.set(id, stmt.span);
        let written = &mut self.func.written;
        for (key, attr, _) in &stmt.attrs.attrs {
            if let Some(text) = attr.written() {
                written.exprs.insert((id, key.clone()), text);
            }
        }
        if let Some((e, _)) = stmt.number.as_ref().filter(|(e, _)| e.names_a_dim()) {
            written.exprs.insert((id, String::new()), e.to_string());
        }
        Ok(id)
    }

    /// The parts of a statement as written, operands resolved in scope.
    fn collect<'i>(&self, s: Pair<'i, Rule>) -> PResult<Stmt<'i>> {
        let span = span_of(&s);
        let mut results = Vec::new();
        let mut name = None;
        let mut operands: Vec<(ValueId, Span)> = Vec::new();
        let mut attrs: Vec<(String, Attr, Span)> = Vec::new();
        let mut number: Option<(crate::expr::Expr, Span)> = None;
        let mut symbol: Option<(String, Span)> = None;
        let mut declared: Vec<(Type, Span)> = Vec::new();
        let mut pinned = Vec::new();
        let mut region = None;
        for part in s.into_inner() {
            match part.as_rule() {
                Rule::results => results = part.into_inner().collect::<Vec<_>>(),
                Rule::ident => name = Some(part),
                Rule::arg => {
                    let a = part.into_inner().next().expect("arg");
                    let aspan = span_of(&a);
                    match a.as_rule() {
                        Rule::value => operands.push((self.lookup(&a)?, aspan)),
                        Rule::symbol => symbol = Some((a.as_str()[1..].to_string(), aspan)),
                        Rule::expr => number = Some((super::expr::expr(a)?, aspan)),
                        Rule::kwarg => {
                            let (key, attr) = attribute(a)?;
                            if attrs.iter().any(|(k2, _, _)| *k2 == key) {
                                return Err(Diagnostic::error(
                                    format!("attribute `{key}` is given twice"),
                                    aspan,
                                    "again here",
                                ));
                            }
                            attrs.push((key, attr, aspan));
                        }
                        other => unreachable!("invariant: unexpected {other:?} in arg"),
                    }
                }
                Rule::tys => {
                    for t in part.into_inner() {
                        let tspan = span_of(&t);
                        pinned.push(is_pinned(&t));
                        declared.push((self.module.ty(t)?, tspan));
                    }
                }
                Rule::region => region = Some(part),
                Rule::assign => {}
                other => unreachable!("invariant: unexpected {other:?} in stmt"),
            }
        }
        let name = name.expect("invariant: stmt has an op name");
        let name_span = span_of(&name);
        Ok(Stmt {
            span,
            results,
            name_span,
            operands,
            attrs: Args {
                op: name.as_str(),
                span: name_span,
                attrs,
                used: Vec::new(),
                dims: self.dims.clone(),
            },
            number,
            symbol,
            declared,
            pinned,
            region,
        })
    }

    /// The statement's op, once what it takes besides operands matches what is written.
    fn signature(&self, s: &Stmt) -> PResult<&'static Signature> {
        let op = s.op();
        let sig = signature::find(op);
        let extra = sig.and_then(|sig| sig.extra);
        if let (Some((_, span)), false) = (&s.number, extra == Some(Extra::Number)) {
            return Err(Diagnostic::error(
                format!("`{op}` takes no number operand"),
                *span,
                "unexpected number",
            ));
        }
        if let (Some((_, span)), false) = (&s.symbol, extra == Some(Extra::Function)) {
            return Err(Diagnostic::error(
                format!("`{op}` takes no function operand"),
                *span,
                "unexpected function name",
            ));
        }
        if s.region.is_some() && extra != Some(Extra::Body) {
            return Err(Diagnostic::error(
                format!("`{op}` takes no body"),
                s.span,
                "unexpected `{ ... }`",
            ));
        }
        sig.ok_or_else(|| {
            Diagnostic::error(format!("unknown op `{op}`"), s.name_span, "not an op")
                .with_note(crate::model_rules::user_ops_note())
        })
    }

    /// The function `@name` a `call` names, defined before this one.
    fn find_callee(&self, name: &str, span: Span) -> PResult<FuncId> {
        let funcs = self.module.funcs();
        funcs
            .iter()
            .find(|(_, f)| f.name == name)
            .map(|(id, _)| id)
            .ok_or_else(|| {
                let defined: Vec<String> = funcs.values().map(|f| format!("@{}", f.name)).collect();
                Diagnostic::error(
                    format!("unknown function `@{name}`"),
                    span,
                    "not defined before this function",
                )
                .with_note(if defined.is_empty() {
                    "no function is defined before this one".to_string()
                } else {
                    format!("defined so far: {}", defined.join(", "))
                })
            })
    }

    /// Shape inference, with the written result types as the target or as a check.
    fn result_types(&self, s: &Stmt, kind: &OpKind) -> PResult<Vec<Type>> {
        let (op, span, name_span) = (s.op(), s.span, s.name_span);
        let operand_types: Vec<&Type> = s.operands.iter().map(|&(v, _)| self.func.ty(v)).collect();
        let written: Vec<Type> = s.declared.iter().map(|(t, _)| t.clone()).collect();
        let callee = match kind {
            OpKind::Call { callee, .. } => Some(&self.module.funcs()[*callee]),
            _ => None,
        };
        let inferred = infer(kind, &operand_types, &written, callee).map_err(|e| {
            let label_span = e
                .operand
                .and_then(|i| s.operands.get(i))
                .map(|(_, s)| *s)
                .unwrap_or(name_span);
            let mut d = Diagnostic::error(e.message, label_span, "here");
            if label_span != name_span {
                d = d.with_label(name_span, format!("in this `{op}`"));
            }
            d
        })?;
        if s.results.len() != inferred.len() {
            return Err(Diagnostic::error(
                format!(
                    "`{op}` produces {} value{}, but {} name{} given",
                    inferred.len(),
                    if inferred.len() == 1 { "" } else { "s" },
                    s.results.len(),
                    if s.results.len() == 1 { " is" } else { "s are" }
                ),
                span,
                "wrong number of results",
            ));
        }
        let mut types = inferred.clone();
        if !kind.has_declared_type() && !s.declared.is_empty() {
            if s.declared.len() != inferred.len() {
                return Err(Diagnostic::error(
                    format!(
                        "`{op}` has {} results but {} types are written",
                        inferred.len(),
                        s.declared.len()
                    ),
                    span,
                    "wrong number of types",
                ));
            }
            let mut written = written;
            for (i, ((d, dspan), inf)) in s.declared.iter().zip(&inferred).enumerate() {
                // A written `f32` that `--dtype` turned into the model's float type, on a
                // value computed from `f32!` values: the check holds, and the value is f32.
                let from_pinned = inf.dtype == DType::F32
                    && !s.pinned[i]
                    && Some(d.dtype) == self.module.float_dtype()
                    && d.shape() == inf.shape();
                if from_pinned {
                    written[i] = d.with_dtype(DType::F32);
                } else if !d.same_as(inf) {
                    return Err(Diagnostic::error(
                        format!(
                            "`{op}` produces {} but the written type is {}",
                            sizes(inf),
                            sizes(d)
                        ),
                        *dspan,
                        format!("should be {}", sizes(inf)),
                    ));
                }
            }
            types = written;
        }
        for t in &types {
            checked_elements(&t.shape()).map_err(|m| {
                Diagnostic::error(format!("`{op}` result {t}: {m}"), span, "too large")
            })?;
        }
        Ok(types)
    }

    fn loop_body(&mut self, r: Pair<Rule>, inits: &[ValueId]) -> PResult<Block> {
        let rspan = span_of(&r);
        self.scopes.push(HashMap::new());
        let mut block = Block::default();
        let mut arg_pairs = Vec::new();
        for part in r.into_inner() {
            match part.as_rule() {
                Rule::value => arg_pairs.push(part),
                Rule::stmt => {
                    if block.args.is_empty() {
                        self.region_args(&arg_pairs, inits, rspan, &mut block)?;
                    }
                    let op = self.stmt(part)?;
                    block.ops.push(op);
                }
                Rule::yield_ => {
                    if block.args.is_empty() {
                        self.region_args(&arg_pairs, inits, rspan, &mut block)?;
                    }
                    let yspan = span_of(&part);
                    let vals = part
                        .into_inner()
                        .map(|v| self.lookup(&v))
                        .collect::<PResult<Vec<_>>>()?;
                    if vals.len() != inits.len() {
                        return Err(Diagnostic::error(
                            format!(
                                "the loop carries {} values but the body yields {}",
                                inits.len(),
                                vals.len()
                            ),
                            yspan,
                            "wrong number of values",
                        ));
                    }
                    for (&v, &i) in vals.iter().zip(inits) {
                        if !self.func.ty(v).same_as(self.func.ty(i)) {
                            return Err(Diagnostic::error(
                                format!(
                                    "the body yields {} for a carried value of {}",
                                    sizes(self.func.ty(v)),
                                    sizes(self.func.ty(i))
                                ),
                                yspan,
                                "type changes across iterations",
                            ));
                        }
                    }
                    block.results = vals;
                }
                Rule::rbrace => {}
                other => unreachable!("invariant: unexpected {other:?} in region"),
            }
        }
        self.scopes.pop();
        Ok(block)
    }

    fn region_args(
        &mut self,
        names: &[Pair<Rule>],
        inits: &[ValueId],
        span: Span,
        block: &mut Block,
    ) -> PResult<()> {
        if names.len() != inits.len() + 1 {
            return Err(Diagnostic::error(
                format!("the loop body takes {} arguments (the iteration number and {} carried values), got {}", inits.len() + 1, inits.len(), names.len()),
                span,
                "wrong number of body arguments",
            ));
        }
        let mut types = vec![Type::scalar(DType::I32)];
        types.extend(inits.iter().map(|&v| self.func.ty(v).clone()));
        for (n, t) in names.iter().zip(types) {
            let id = self.define(n, t)?;
            block.args.push(id);
        }
        Ok(())
    }
}

impl FuncScope for FuncBuilder<'_> {
    fn callee(&self, name: &str, span: Span) -> PResult<FuncId> {
        self.find_callee(name, span)
    }

    fn region(&mut self, r: Pair<Rule>, inits: &[ValueId]) -> PResult<Block> {
        self.loop_body(r, inits)
    }
}

/// `key = value` as written.
fn attribute(a: Pair<Rule>) -> PResult<(String, Attr)> {
    let mut k = a.into_inner();
    let key = k.next().expect("key").as_str().to_string();
    let val = k
        .next()
        .expect("attr")
        .into_inner()
        .next()
        .expect("attr value");
    let attr = match val.as_rule() {
        Rule::list => Attr::List(
            val.into_inner()
                .map(super::expr::expr)
                .collect::<PResult<_>>()?,
        ),
        _ => Attr::One(super::expr::expr(val)?),
    };
    Ok((key, attr))
}
