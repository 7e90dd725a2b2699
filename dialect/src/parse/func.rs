//! Functions: arguments, parameters, op statements and loop bodies, with names resolved in
//! scope and every op typed by shape inference as it is read.

use super::attrs::{parse_f64, parse_init, Args, Attr};
use super::module::ModuleBuilder;
use super::{parse_u64, span_of, PResult, Rule, MAX_PIPELINE_SETTING};
use crate::diag::Diagnostic;
use crate::infer::{checked_elements, infer};
use crate::ir::{Block, Func, Op, Param, Value, ValueId};
use crate::op::{BinaryOp, CmpPred, Float, OpKind, ReduceOp, UnaryOp};
use crate::span::Span;
use crate::types::{sizes, DType, Type};
use pest::iterators::Pair;
use std::collections::HashMap;

pub(super) struct FuncBuilder<'m, 'o> {
    module: &'m ModuleBuilder<'o>,
    func: Func,
    /// Names in scope, innermost block last.
    scopes: Vec<HashMap<String, ValueId>>,
}

impl<'m, 'o> FuncBuilder<'m, 'o> {
    pub(super) fn build(module: &'m ModuleBuilder<'o>, p: Pair<Rule>) -> PResult<Func> {
        if module.resolved.is_none() {
            return Err(Diagnostic::error(
                "functions must come after the `pipeline` block",
                span_of(&p),
                "too early",
            ));
        }
        let mut it = p.into_inner();
        let name = it.next().expect("func name");
        let mut fb = FuncBuilder {
            module,
            func: Func::new(&name.as_str()[1..]),
            scopes: vec![HashMap::new()],
        };
        let mut declared_results = Vec::new();
        for part in it {
            match part.as_rule() {
                Rule::arg_def => {
                    let mut a = part.into_inner();
                    let (v, t) = (a.next().expect("arg name"), a.next().expect("arg type"));
                    let ty = module.ty(t)?;
                    let id = fb.define(&v, ty)?;
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
        let ty = self.module.ty(it.next().expect("param type"))?;
        let init_pair = it.next().expect("param init");
        let init = parse_init(init_pair)?;
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
        self.func.params.push(Param {
            value,
            init,
            layer_axes,
        });
        Ok(())
    }

    fn stmt(&mut self, s: Pair<Rule>) -> PResult<crate::ir::OpId> {
        let span = span_of(&s);
        let mut results = Vec::new();
        let mut name = None;
        let mut operands: Vec<(ValueId, Span)> = Vec::new();
        let mut attrs: Vec<(String, Attr, Span)> = Vec::new();
        let mut number: Option<(String, Span)> = None;
        let mut symbol: Option<(String, Span)> = None;
        let mut declared: Vec<(Type, Span)> = Vec::new();
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
                        Rule::number => number = Some((a.as_str().to_string(), aspan)),
                        Rule::kwarg => {
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
                                    val.into_inner().map(|n| n.as_str().to_string()).collect(),
                                ),
                                Rule::number => Attr::Num(val.as_str().to_string()),
                                _ => Attr::Ident(val.as_str().to_string()),
                            };
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
                        declared.push((self.module.ty(t)?, tspan));
                    }
                }
                Rule::region => region = Some(part),
                Rule::assign => {}
                other => unreachable!("invariant: unexpected {other:?} in stmt"),
            }
        }
        let name = name.expect("invariant: stmt has an op name");
        let op_name = name.as_str();
        let name_span = span_of(&name);
        let mut a = Args {
            op: op_name,
            span: name_span,
            attrs,
            used: Vec::new(),
        };
        let ids: Vec<ValueId> = operands.iter().map(|(v, _)| *v).collect();
        let arity = |n: usize| -> PResult<()> {
            if ids.len() != n {
                return Err(Diagnostic::error(
                    format!(
                        "`{op_name}` takes {n} operand{}, got {}",
                        if n == 1 { "" } else { "s" },
                        ids.len()
                    ),
                    span,
                    "wrong number of operands",
                ));
            }
            Ok(())
        };
        if number.is_some() && op_name != "constant" {
            let (_, nspan) = number.clone().expect("checked");
            return Err(Diagnostic::error(
                format!("`{op_name}` takes no number operand"),
                nspan,
                "unexpected number",
            ));
        }
        if symbol.is_some() && op_name != "call" {
            let (_, sspan) = symbol.clone().expect("checked");
            return Err(Diagnostic::error(
                format!("`{op_name}` takes no function operand"),
                sspan,
                "unexpected function name",
            ));
        }
        if region.is_some() && op_name != "loop" {
            return Err(Diagnostic::error(
                format!("`{op_name}` takes no body"),
                span,
                "unexpected `{ ... }`",
            ));
        }
        let un = UnaryOp::ALL.into_iter().find(|o| o.name() == op_name);
        let bin = BinaryOp::ALL.into_iter().find(|o| o.name() == op_name);
        let cmp = CmpPred::ALL.into_iter().find(|o| o.name() == op_name);
        let red = ReduceOp::ALL.into_iter().find(|o| o.name() == op_name);
        let kind = if let Some(op) = un {
            arity(1)?;
            OpKind::Unary { op, x: ids[0] }
        } else if let Some(op) = bin {
            arity(2)?;
            OpKind::Binary {
                op,
                lhs: ids[0],
                rhs: ids[1],
            }
        } else if let Some(pred) = cmp {
            arity(2)?;
            OpKind::Compare {
                pred,
                lhs: ids[0],
                rhs: ids[1],
            }
        } else if let Some(op) = red {
            arity(1)?;
            OpKind::Reduce {
                op,
                x: ids[0],
                axes: a.ints("axes")?,
            }
        } else {
            match op_name {
                "select" => {
                    arity(3)?;
                    OpKind::Select {
                        cond: ids[0],
                        on_true: ids[1],
                        on_false: ids[2],
                    }
                }
                "matmul" => {
                    if ids.len() != 3 {
                        arity(2)?;
                    }
                    OpKind::MatMul {
                        lhs: ids[0],
                        rhs: ids[1],
                        mask: ids.get(2).copied(),
                    }
                }
                "transpose" => {
                    arity(1)?;
                    OpKind::Transpose {
                        x: ids[0],
                        perm: a.ints("perm")?,
                    }
                }
                "reshape" => {
                    arity(1)?;
                    OpKind::Reshape { x: ids[0] }
                }
                "broadcast" => {
                    arity(1)?;
                    OpKind::Broadcast { x: ids[0] }
                }
                "convert" => {
                    arity(1)?;
                    OpKind::Convert { x: ids[0] }
                }
                "slice" => {
                    arity(1)?;
                    let start = a.ints("start")?.into_iter().map(|v| v as u64).collect();
                    let end = a.ints("end")?.into_iter().map(|v| v as u64).collect();
                    OpKind::Slice {
                        x: ids[0],
                        start,
                        end,
                    }
                }
                "concat" => {
                    if ids.is_empty() {
                        return Err(Diagnostic::error(
                            "`concat` needs at least one operand",
                            span,
                            "no operands",
                        ));
                    }
                    OpKind::Concat {
                        xs: ids.clone(),
                        axis: a.int("axis")?,
                    }
                }
                "softmax" => {
                    arity(1)?;
                    OpKind::Softmax {
                        x: ids[0],
                        axis: a.int("axis")?,
                    }
                }
                "layernorm" => {
                    arity(1)?;
                    OpKind::LayerNorm {
                        x: ids[0],
                        axis: a.int("axis")?,
                        eps: Float(a.float("eps")?),
                    }
                }
                "iota" => {
                    arity(0)?;
                    OpKind::Iota {
                        axis: a.int("axis")?,
                    }
                }
                "constant" => {
                    arity(0)?;
                    let (text, nspan) = number.ok_or_else(|| {
                        Diagnostic::error(
                            "`constant` needs a value, as in `constant 0.5 : f32[d]`",
                            span,
                            "no value",
                        )
                    })?;
                    OpKind::Constant {
                        value: Float(parse_f64(&text, nspan)?),
                    }
                }
                "pad" => {
                    arity(1)?;
                    OpKind::Pad {
                        x: ids[0],
                        axis: a.int("axis")?,
                        low: a.int("low")? as u64,
                        high: a.int("high")? as u64,
                        fill: Float(a.float("fill")?),
                    }
                }
                "shift" => {
                    arity(1)?;
                    OpKind::Shift {
                        x: ids[0],
                        axis: a.int("axis")?,
                        fill: Float(a.float("fill")?),
                    }
                }
                "index" => {
                    arity(2)?;
                    OpKind::Index {
                        x: ids[0],
                        index: ids[1],
                        axis: a.int("axis")?,
                    }
                }
                "update" => {
                    arity(3)?;
                    OpKind::Update {
                        x: ids[0],
                        update: ids[1],
                        index: ids[2],
                        axis: a.int("axis")?,
                    }
                }
                "rank" => {
                    arity(0)?;
                    OpKind::Rank
                }
                "exchange" => {
                    arity(1)?;
                    let reverse = match a.ident_opt("from")? {
                        None => false,
                        Some((w, _)) if w == "previous" => false,
                        Some((w, _)) if w == "next" => true,
                        Some((w, span)) => {
                            return Err(Diagnostic::error(
                                format!("`from` is `previous` or `next`, not `{w}`"),
                                span,
                                "not a neighbour",
                            ))
                        }
                    };
                    OpKind::Exchange { x: ids[0], reverse }
                }
                "call" => {
                    let (callee, cspan) = symbol.clone().ok_or_else(|| {
                        Diagnostic::error(
                            "`call` needs a function, as in `call @stage, %x`",
                            span,
                            "no callee",
                        )
                    })?;
                    let id = self
                        .module
                        .funcs
                        .iter()
                        .find(|(_, f)| f.name == callee)
                        .map(|(id, _)| id)
                        .ok_or_else(|| {
                            let defined: Vec<String> = self
                                .module
                                .funcs
                                .values()
                                .map(|f| format!("@{}", f.name))
                                .collect();
                            Diagnostic::error(
                                format!("unknown function `@{callee}`"),
                                cspan,
                                "not defined before this function",
                            )
                            .with_note(if defined.is_empty() {
                                "no function is defined before this one".to_string()
                            } else {
                                format!("defined so far: {}", defined.join(", "))
                            })
                        })?;
                    OpKind::Call {
                        callee: id,
                        args: ids.clone(),
                    }
                }
                "loop" => {
                    let trips = a.int("trips")? as u64;
                    if trips == 0 || trips > MAX_PIPELINE_SETTING * MAX_PIPELINE_SETTING {
                        return Err(Diagnostic::error(
                            format!("loop trip count {trips} is out of range"),
                            span,
                            "bad trip count",
                        ));
                    }
                    let r = region.take().ok_or_else(|| {
                        Diagnostic::error(
                            "`loop` needs a body `{ ^body(...): ... yield ... }`",
                            span,
                            "no body",
                        )
                    })?;
                    let body = self.region(r, &ids)?;
                    OpKind::Loop {
                        trips,
                        inits: ids.clone(),
                        body,
                    }
                }
                other => {
                    return Err(Diagnostic::error(
                        format!("unknown op `{other}`"),
                        name_span,
                        "not an op",
                    )
                    .with_note(format!("ops: {}", crate::op::all_op_names().join(" "))))
                }
            }
        };
        a.finish()?;
        // Shape inference, with the written result types as the target or as a check.
        let operand_types: Vec<&Type> = ids.iter().map(|&v| self.func.ty(v)).collect();
        let written: Vec<Type> = declared.iter().map(|(t, _)| t.clone()).collect();
        let callee = match &kind {
            OpKind::Call { callee, .. } => Some(&self.module.funcs[*callee]),
            _ => None,
        };
        let inferred = infer(&kind, &operand_types, &written, callee).map_err(|e| {
            let label_span = e
                .operand
                .and_then(|i| operands.get(i))
                .map(|(_, s)| *s)
                .unwrap_or(name_span);
            let mut d = Diagnostic::error(e.message, label_span, "here");
            if label_span != name_span {
                d = d.with_label(name_span, format!("in this `{op_name}`"));
            }
            d
        })?;
        if results.len() != inferred.len() {
            return Err(Diagnostic::error(
                format!(
                    "`{op_name}` produces {} value{}, but {} name{} given",
                    inferred.len(),
                    if inferred.len() == 1 { "" } else { "s" },
                    results.len(),
                    if results.len() == 1 { " is" } else { "s are" }
                ),
                span,
                "wrong number of results",
            ));
        }
        let mut types = inferred.clone();
        if !kind.has_declared_type() && !declared.is_empty() {
            if declared.len() != inferred.len() {
                return Err(Diagnostic::error(
                    format!(
                        "`{op_name}` has {} results but {} types are written",
                        inferred.len(),
                        declared.len()
                    ),
                    span,
                    "wrong number of types",
                ));
            }
            for ((d, dspan), inf) in declared.iter().zip(&inferred) {
                if !d.same_as(inf) {
                    return Err(Diagnostic::error(
                        format!(
                            "`{op_name}` produces {} but the written type is {}",
                            sizes(inf),
                            sizes(d)
                        ),
                        *dspan,
                        format!("should be {}", sizes(inf)),
                    ));
                }
            }
            types = declared.into_iter().map(|(t, _)| t).collect();
        }
        for t in &types {
            checked_elements(&t.shape()).map_err(|m| {
                Diagnostic::error(format!("`{op_name}` result {t}: {m}"), span, "too large")
            })?;
        }
        let result_ids = results
            .iter()
            .zip(types)
            .map(|(r, t)| self.define(r, t))
            .collect::<PResult<Vec<_>>>()?;
        let id = self.func.ops.push(Op {
            kind,
            results: result_ids,
        });
        self.func.op_spans.set(id, span);
        Ok(id)
    }

    fn region(&mut self, r: Pair<Rule>, inits: &[ValueId]) -> PResult<Block> {
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
