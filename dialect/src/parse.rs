//! The parser: text → [`Module`], with names resolved, shapes inferred and user errors as
//! spanned diagnostics.
//!
//! Model files and pass dumps share this one grammar (`grammar.pest`), the exact inverse of
//! `print.rs`. Command-line overrides (`--dim`, `--stages`, ...) apply while parsing, before any
//! shape is computed, so every size in the module already reflects them.

use crate::diag::{Diagnostic, Diagnostics};
use crate::infer::{checked_elements, infer};
use crate::ir::{
    Block, Depth, DimDef, DimFactor, Func, Init, Loss, Module, Op, Param, Pipeline, Value, ValueId,
};
use crate::op::{BinaryOp, CmpPred, Float, OpKind, ReduceOp, UnaryOp};
use crate::span::{Span, SpanTable};
use crate::types::{sizes, DType, Dim, Type};
use pest::iterators::Pair;
use pest::Parser;
use std::collections::HashMap;

#[derive(pest_derive::Parser)]
#[grammar = "grammar.pest"]
struct Grammar;

/// Values given on the command line that replace those written in the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub dims: Vec<(String, u64)>,
    pub stages: Option<u64>,
    pub microbatches: Option<u64>,
    pub repeats: Option<u64>,
    /// Every f32 type in the file becomes this dtype (bf16 or f16 storage).
    pub float_dtype: Option<DType>,
}

/// The most stages, microbatches, repeats or layers a pipeline may have.
pub const MAX_PIPELINE_SETTING: u64 = 1 << 16;

type PResult<T> = Result<T, Diagnostic>;

/// The span of a parse node, without the whitespace and comments the grammar let it swallow.
fn span_of(p: &Pair<Rule>) -> Span {
    let start = p.as_span().start();
    let text = p.as_str().trim_end();
    // A trailing comment is whitespace too: cut at the last line that has code.
    let code = text
        .lines()
        .rev()
        .find(|l| !l.trim_start().starts_with("//") && !l.trim().is_empty());
    let end = match code {
        Some(line) => line.as_ptr() as usize - p.as_str().as_ptr() as usize + line.trim_end().len(),
        None => text.len(),
    };
    Span::new(start, start + end)
}

fn parse_u64(p: &Pair<Rule>, what: &str) -> PResult<u64> {
    p.as_str().parse::<u64>().map_err(|_| {
        Diagnostic::error(
            format!("{what} `{}` does not fit in 64 bits", p.as_str()),
            span_of(p),
            "integer overflow",
        )
    })
}

/// Parses and type-checks a module. Module-level rules (a `@layer` that fits the pipeline)
/// are checked by [`crate::verify::check_model`].
pub fn parse(src: &str, overrides: &Overrides) -> Result<Module, Diagnostics> {
    let file = Grammar::parse(Rule::file, src).map_err(|e| vec![syntax_error(e)])?;
    let file = file
        .into_iter()
        .next()
        .expect("invariant: the file rule matched");
    let mut b = ModuleBuilder {
        overrides,
        dims: Vec::new(),
        pipeline: Vec::new(),
        input: None,
        target: None,
        loss: None,
        funcs: Vec::new(),
        spans: SpanTable::default(),
        resolved: None,
    };
    let mut diags = Vec::new();
    let mut file_end = Span::default();
    for item in file.into_inner() {
        if item.as_rule() == Rule::EOI {
            file_end = span_of(&item);
            continue;
        }
        if let Err(d) = b.item(item) {
            diags.push(d);
            // Later items usually depend on the failed one; one error is the useful one.
            if b.resolved.is_none() {
                break;
            }
        }
    }
    if !diags.is_empty() {
        return Err(diags);
    }
    b.finish(file_end).map_err(|d| vec![d])
}

fn syntax_error(e: pest::error::Error<Rule>) -> Diagnostic {
    let (start, end) = match e.location {
        pest::error::InputLocation::Pos(p) => (p, p),
        pest::error::InputLocation::Span((s, e)) => (s, e),
    };
    let message = match &e.variant {
        pest::error::ErrorVariant::ParsingError { positives, .. } => {
            let mut names: Vec<String> = positives.iter().map(|r| rule_name(*r)).collect();
            names.dedup();
            if names.is_empty() {
                "syntax error".to_string()
            } else {
                format!("syntax error: expected {}", names.join(" or "))
            }
        }
        pest::error::ErrorVariant::CustomError { message } => message.clone(),
    };
    Diagnostic::error(message, Span::new(start, end.max(start)), "here")
}

fn rule_name(r: Rule) -> String {
    match r {
        Rule::ident => "a name",
        Rule::int => "an integer",
        Rule::number => "a number",
        Rule::value => "a value like `%x`",
        Rule::symbol => "a function name like `@layer`",
        Rule::item
        | Rule::dims
        | Rule::pipeline
        | Rule::input
        | Rule::target
        | Rule::loss
        | Rule::func => "`dims`, `pipeline`, `input`, `target`, `loss` or `func`",
        Rule::ty => "a type like `f32[b, d]`",
        Rule::stmt | Rule::results => "an op like `%y = relu %x`",
        Rule::ret => "`return`",
        Rule::yield_ => "`yield`",
        Rule::rbrace => "`}`",
        Rule::assign => "`=`",
        Rule::region => "a loop body `{ ^body(...): ... }`",
        Rule::tys => "a list of types",
        Rule::param => "`param`",
        Rule::arg | Rule::kwarg => "an operand or `name = value`",
        Rule::EOI => "end of file",
        other => return format!("{other:?}"),
    }
    .to_string()
}

struct ModuleBuilder<'a> {
    overrides: &'a Overrides,
    dims: Vec<DimDef>,
    /// Settings as written, with spans, until the pipeline is resolved.
    pipeline: Vec<(String, u64, Span)>,
    input: Option<Type>,
    target: Option<Type>,
    loss: Option<Loss>,
    funcs: Vec<Func>,
    spans: SpanTable<String>,
    /// The pipeline, once `dims` and `pipeline` are both known (needed to resolve shapes).
    resolved: Option<Pipeline>,
}

impl ModuleBuilder<'_> {
    fn once(&mut self, key: &str, span: Span, seen: bool) -> PResult<()> {
        if seen {
            return Err(Diagnostic::error(
                format!("`{key}` is given twice"),
                span,
                "second one here",
            )
            .with_label(self.spans.get(&key.to_string()), "first one here"));
        }
        self.spans.set(key.to_string(), span);
        Ok(())
    }

    fn item(&mut self, item: Pair<Rule>) -> PResult<()> {
        let span = span_of(&item);
        match item.as_rule() {
            Rule::dims => {
                let seen = !self.dims.is_empty();
                self.once("dims", span, seen)?;
                if self.resolved.is_some() || !self.funcs.is_empty() {
                    return Err(Diagnostic::error(
                        "`dims` must come before `pipeline`, types and functions",
                        span,
                        "too late",
                    ));
                }
                for d in item.into_inner() {
                    self.dim_def(d)?;
                }
                self.apply_dim_overrides()
            }
            Rule::pipeline => {
                let seen = !self.pipeline.is_empty();
                self.once("pipeline", span, seen)?;
                for s in item.into_inner() {
                    let mut it = s.into_inner();
                    let (name, value) = (
                        it.next().expect("setting name"),
                        it.next().expect("setting value"),
                    );
                    let v = parse_u64(&value, "setting")?;
                    if self.pipeline.iter().any(|(n, _, _)| n == name.as_str()) {
                        return Err(Diagnostic::error(
                            format!("pipeline setting `{}` is given twice", name.as_str()),
                            span_of(&name),
                            "again here",
                        ));
                    }
                    self.pipeline
                        .push((name.as_str().to_string(), v, span_of(&value)));
                }
                self.resolve_pipeline(span).map(|_| ())
            }
            Rule::input | Rule::target => {
                let key = if item.as_rule() == Rule::input {
                    "input"
                } else {
                    "target"
                };
                let seen = if key == "input" {
                    self.input.is_some()
                } else {
                    self.target.is_some()
                };
                self.once(key, span, seen)?;
                let t = self.ty(item.into_inner().next().expect("type"))?;
                if key == "input" {
                    self.input = Some(t);
                } else {
                    self.target = Some(t);
                }
                Ok(())
            }
            Rule::loss => {
                self.once("loss", span, self.loss.is_some())?;
                let name = item.into_inner().next().expect("loss name");
                self.loss = Some(match name.as_str() {
                    "mse" => Loss::Mse,
                    "softmax_cross_entropy" => Loss::SoftmaxCrossEntropy,
                    other => {
                        return Err(Diagnostic::error(
                            format!("unknown loss `{other}`"),
                            span_of(&name),
                            "not a loss",
                        )
                        .with_note("expected `mse` or `softmax_cross_entropy`"))
                    }
                });
                Ok(())
            }
            Rule::func => {
                let f = FuncBuilder::build(self, item)?;
                if self.funcs.iter().any(|g| g.name == f.name) {
                    return Err(Diagnostic::error(
                        format!("function `@{}` is defined twice", f.name),
                        span,
                        "second definition",
                    ));
                }
                self.funcs.push(f);
                Ok(())
            }
            other => unreachable!("invariant: grammar yields only items here, got {other:?}"),
        }
    }

    fn dim_def(&mut self, d: Pair<Rule>) -> PResult<()> {
        let mut it = d.into_inner();
        let name = it.next().expect("dim name");
        let expr = it.next().expect("dim expr");
        if self.dims.iter().any(|x| x.name == name.as_str()) {
            return Err(Diagnostic::error(
                format!("dimension `{}` is declared twice", name.as_str()),
                span_of(&name),
                "again here",
            )
            .with_label(
                self.spans.get(&format!("dim.{}", name.as_str())),
                "first declared here",
            ));
        }
        if is_pipeline_name(name.as_str()) {
            return Err(Diagnostic::error(
                format!("`{}` is a pipeline setting, not a dimension", name.as_str()),
                span_of(&name),
                "reserved name",
            )
            .with_note("set it in the `pipeline { ... }` block"));
        }
        let mut factors = Vec::new();
        let mut value = 1u64;
        for term in expr.into_inner() {
            let t = term.into_inner().next().expect("dim term");
            let (f, v) = match t.as_rule() {
                Rule::int => {
                    let v = parse_u64(&t, &format!("dimension `{}` =", name.as_str()))?;
                    (DimFactor::Lit(v), v)
                }
                _ => {
                    let v = self
                        .dims
                        .iter()
                        .find(|x| x.name == t.as_str())
                        .map(|x| x.value)
                        .ok_or_else(|| {
                            Diagnostic::error(
                                format!("unknown dimension `{}`", t.as_str()),
                                span_of(&t),
                                "not declared before this point",
                            )
                        })?;
                    (DimFactor::Name(t.as_str().to_string()), v)
                }
            };
            value = value.checked_mul(v).ok_or_else(|| {
                Diagnostic::error(
                    format!("dimension `{}` overflows 64 bits", name.as_str()),
                    span_of(&t),
                    "integer overflow",
                )
            })?;
            factors.push(f);
        }
        self.check_dim_size(name.as_str(), value, span_of(&name))?;
        self.spans
            .set(format!("dim.{}", name.as_str()), span_of(&name));
        self.dims.push(DimDef {
            name: name.as_str().to_string(),
            factors,
            value,
        });
        Ok(())
    }

    fn check_dim_size(&self, name: &str, value: u64, span: Span) -> PResult<()> {
        if value == 0 {
            return Err(Diagnostic::error(
                format!("dimension `{name}` is zero"),
                span,
                "must be at least 1",
            ));
        }
        if value > crate::infer::MAX_ELEMENTS {
            return Err(Diagnostic::error(
                format!("dimension `{name}` = {value} is absurdly large"),
                span,
                "too large",
            )
            .with_note(format!(
                "a dimension may be at most {}",
                crate::infer::MAX_ELEMENTS
            )));
        }
        Ok(())
    }

    /// `--dim NAME=VALUE`: replace a declared dimension's value, then recompute those that
    /// are products of it.
    fn apply_dim_overrides(&mut self) -> PResult<()> {
        for (name, v) in &self.overrides.dims {
            let Some(d) = self.dims.iter_mut().find(|d| &d.name == name) else {
                let known: Vec<&str> = self.dims.iter().map(|d| d.name.as_str()).collect();
                return Err(Diagnostic::plain(format!(
                    "--dim {name}={v}: the model declares no dimension `{name}`"
                ))
                .with_note(format!("declared dimensions: {}", known.join(", "))));
            };
            d.factors = vec![DimFactor::Lit(*v)];
        }
        for i in 0..self.dims.len() {
            let mut value = 1u64;
            for f in &self.dims[i].factors {
                let v = match f {
                    DimFactor::Lit(v) => *v,
                    DimFactor::Name(n) => self.dims[..i]
                        .iter()
                        .find(|d| &d.name == n)
                        .map(|d| d.value)
                        .expect("invariant: checked at parse"),
                };
                value = value.checked_mul(v).ok_or_else(|| {
                    Diagnostic::plain(format!(
                        "dimension `{}` overflows 64 bits",
                        self.dims[i].name
                    ))
                })?;
            }
            let span = self.spans.get(&format!("dim.{}", self.dims[i].name));
            self.check_dim_size(&self.dims[i].name.clone(), value, span)?;
            self.dims[i].value = value;
        }
        Ok(())
    }

    fn resolve_pipeline(&mut self, block: Span) -> PResult<Pipeline> {
        let get = |name: &str| -> PResult<Option<(u64, Span)>> {
            Ok(self
                .pipeline
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, v, s)| (*v, *s)))
        };
        for (name, _, span) in &self.pipeline {
            if ![
                "stages",
                "layers",
                "layers_per_stage",
                "microbatches",
                "repeats",
            ]
            .contains(&name.as_str())
            {
                return Err(Diagnostic::error(format!("unknown pipeline setting `{name}`"), *span, "unknown")
                    .with_note("settings are `stages`, `layers` or `layers_per_stage`, `microbatches` and `repeats`"));
            }
        }
        let ov = self.overrides;
        let pick =
            |written: Option<(u64, Span)>, over: Option<u64>| over.map(|v| (v, block)).or(written);
        let stages = pick(get("stages")?, ov.stages);
        let micro = pick(get("microbatches")?, ov.microbatches);
        let repeats = pick(get("repeats")?, ov.repeats).unwrap_or((1, block));
        let layers = get("layers")?;
        let per_stage = get("layers_per_stage")?;
        let (Some(stages), Some(micro)) = (stages, micro) else {
            return Err(Diagnostic::error(
                "the pipeline needs `stages` and `microbatches`",
                block,
                "incomplete pipeline",
            ));
        };
        for (name, (v, span)) in [
            ("stages", stages),
            ("microbatches", micro),
            ("repeats", repeats),
        ]
        .into_iter()
        .chain(layers.map(|l| ("layers", l)))
        .chain(per_stage.map(|l| ("layers_per_stage", l)))
        {
            if v == 0 {
                return Err(Diagnostic::error(
                    format!("`{name}` is zero"),
                    span,
                    "must be at least 1",
                ));
            }
            if v > MAX_PIPELINE_SETTING {
                return Err(Diagnostic::error(
                    format!("`{name}` = {v} is absurdly large"),
                    span,
                    "too large",
                )
                .with_note(format!(
                    "pipeline settings may be at most {MAX_PIPELINE_SETTING}"
                )));
            }
        }
        let groups = stages.0 * repeats.0;
        let depth = if layers.is_some() {
            Depth::Layers
        } else {
            Depth::PerStage
        };
        let layers = match (layers, per_stage) {
            (Some(_), Some((_, s))) => {
                return Err(Diagnostic::error(
                    "give either `layers` or `layers_per_stage`, not both",
                    s,
                    "second way to say it",
                ))
            }
            (None, None) => groups,
            (None, Some((k, _))) => groups.checked_mul(k).ok_or_else(|| {
                Diagnostic::error("layer count overflows", block, "too many layers")
            })?,
            (Some((l, span)), None) => {
                if l % groups != 0 {
                    return Err(Diagnostic::error(
                        format!(
                            "{} stages × {} repeats = {groups} does not divide {l} layers",
                            stages.0, repeats.0
                        ),
                        span,
                        "not a multiple of stages × repeats",
                    )
                    .with_label(stages.1, "stages set here")
                    .with_note("each stage must hold the same number of layers in every repeat"));
                }
                l
            }
        };
        if layers > MAX_PIPELINE_SETTING {
            return Err(Diagnostic::error(
                format!("{layers} layers is absurdly many"),
                block,
                "too many layers",
            ));
        }
        let p = Pipeline {
            stages: stages.0,
            layers,
            microbatches: micro.0,
            repeats: repeats.0,
            depth,
        };
        self.resolved = Some(p);
        Ok(p)
    }

    fn dim_size(&self, name: &str) -> Option<u64> {
        self.dims
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.value)
            .or_else(|| {
                let p = self.resolved?;
                p.dim_names()
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| *v)
            })
    }

    fn ty(&self, t: Pair<Rule>) -> PResult<Type> {
        let span = span_of(&t);
        let mut it = t.into_inner();
        let dt = it.next().expect("dtype");
        let dtype = DType::from_name(dt.as_str()).ok_or_else(|| {
            Diagnostic::error(
                format!("unknown dtype `{}`", dt.as_str()),
                span_of(&dt),
                "not a dtype",
            )
            .with_note("dtypes are f32, bf16, f16, i32 and i1")
        })?;
        let mut dims = Vec::new();
        for d in it {
            let d = d.into_inner().next().expect("dim");
            dims.push(match d.as_rule() {
                Rule::int => Dim::lit(parse_u64(&d, "dimension")?),
                _ => {
                    let size = self.dim_size(d.as_str()).ok_or_else(|| {
                        let mut diag = Diagnostic::error(format!("unknown dimension `{}`", d.as_str()), span_of(&d), "not declared");
                        if self.resolved.is_none() && is_pipeline_name(d.as_str()) {
                            diag = diag.with_note("pipeline settings can be used as dimensions after the `pipeline` block");
                        }
                        diag
                    })?;
                    Dim::named(d.as_str(), size)
                }
            });
        }
        let dtype = match (dtype, self.overrides.float_dtype) {
            (DType::F32, Some(d)) => d,
            _ => dtype,
        };
        let t = Type::new(dtype, dims);
        checked_elements(&t.shape())
            .map_err(|m| Diagnostic::error(format!("bad type {t}: {m}"), span, "this type"))?;
        Ok(t)
    }

    fn finish(self, end: Span) -> PResult<Module> {
        let pipeline = self.resolved.ok_or_else(|| {
            Diagnostic::error(
                "the model has no `pipeline { ... }` block",
                end,
                "expected before the end of the file",
            )
        })?;
        let input = self.input.ok_or_else(|| {
            Diagnostic::error(
                "the model has no `input` type",
                end,
                "expected before the end of the file",
            )
        })?;
        Ok(Module {
            dims: self.dims,
            pipeline,
            input,
            target: self.target,
            loss: self.loss,
            funcs: self.funcs,
            spans: self.spans,
        })
    }
}

fn is_pipeline_name(s: &str) -> bool {
    [
        "stages",
        "layers",
        "layers_per_stage",
        "microbatches",
        "repeats",
    ]
    .contains(&s)
}

/// An attribute as written: `axis = 1`, `perm = [1, 0]`, `fill = nan`.
enum Attr {
    Num(String),
    List(Vec<String>),
    Ident(String),
}

struct FuncBuilder<'m, 'o> {
    module: &'m ModuleBuilder<'o>,
    func: Func,
    /// Names in scope, innermost block last.
    scopes: Vec<HashMap<String, ValueId>>,
}

impl<'m, 'o> FuncBuilder<'m, 'o> {
    fn build(module: &'m ModuleBuilder<'o>, p: Pair<Rule>) -> PResult<Func> {
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
                    OpKind::Select { cond: ids[0], on_true: ids[1], on_false: ids[2] }
                }
                "matmul" => {
                    if ids.len() != 3 {
                        arity(2)?;
                    }
                    OpKind::MatMul { lhs: ids[0], rhs: ids[1], mask: ids.get(2).copied() }
                }
                "transpose" => {
                    arity(1)?;
                    OpKind::Transpose { x: ids[0], perm: a.ints("perm")? }
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
                    OpKind::Slice { x: ids[0], start, end }
                }
                "concat" => {
                    if ids.is_empty() {
                        return Err(Diagnostic::error("`concat` needs at least one operand", span, "no operands"));
                    }
                    OpKind::Concat { xs: ids.clone(), axis: a.int("axis")? }
                }
                "softmax" => {
                    arity(1)?;
                    OpKind::Softmax { x: ids[0], axis: a.int("axis")? }
                }
                "layernorm" => {
                    arity(1)?;
                    OpKind::LayerNorm { x: ids[0], axis: a.int("axis")?, eps: Float(a.float("eps")?) }
                }
                "iota" => {
                    arity(0)?;
                    OpKind::Iota { axis: a.int("axis")? }
                }
                "constant" => {
                    arity(0)?;
                    let (text, nspan) = number.ok_or_else(|| Diagnostic::error("`constant` needs a value, as in `constant 0.5 : f32[d]`", span, "no value"))?;
                    OpKind::Constant { value: Float(parse_f64(&text, nspan)?) }
                }
                "pad" => {
                    arity(1)?;
                    OpKind::Pad { x: ids[0], axis: a.int("axis")?, low: a.int("low")? as u64, high: a.int("high")? as u64, fill: Float(a.float("fill")?) }
                }
                "shift" => {
                    arity(1)?;
                    OpKind::Shift { x: ids[0], axis: a.int("axis")?, fill: Float(a.float("fill")?) }
                }
                "index" => {
                    arity(2)?;
                    OpKind::Index { x: ids[0], index: ids[1], axis: a.int("axis")? }
                }
                "update" => {
                    arity(3)?;
                    OpKind::Update { x: ids[0], update: ids[1], index: ids[2], axis: a.int("axis")? }
                }
                "call" => {
                    let (callee, _) = symbol.clone().ok_or_else(|| Diagnostic::error("`call` needs a function, as in `call @stage, %x`", span, "no callee"))?;
                    OpKind::Call { callee, args: ids.clone() }
                }
                "loop" => {
                    let trips = a.int("trips")? as u64;
                    if trips == 0 || trips > MAX_PIPELINE_SETTING * MAX_PIPELINE_SETTING {
                        return Err(Diagnostic::error(format!("loop trip count {trips} is out of range"), span, "bad trip count"));
                    }
                    let r = region.take().ok_or_else(|| Diagnostic::error("`loop` needs a body `{ ^body(...): ... yield ... }`", span, "no body"))?;
                    let body = self.region(r, &ids)?;
                    OpKind::Loop { trips, inits: ids.clone(), body }
                }
                other => {
                    return Err(Diagnostic::error(format!("unknown op `{other}`"), name_span, "not an op").with_note(
                        "ops: add sub mul div max min neg abs exp log tanh sigmoid relu gelu sqrt rsqrt lt le eq gt ge ne select matmul \
                         transpose reshape broadcast convert slice concat reduce_sum reduce_mean reduce_max softmax layernorm iota constant \
                         pad shift index update call loop",
                    ))
                }
            }
        };
        a.finish()?;
        // Shape inference, with the written result types as the target or as a check.
        let operand_types: Vec<&Type> = ids.iter().map(|&v| self.func.ty(v)).collect();
        let written: Vec<Type> = declared.iter().map(|(t, _)| t.clone()).collect();
        let callee = match &kind {
            OpKind::Call { callee, .. } => self
                .module
                .funcs
                .iter()
                .find(|f| &f.name == callee)
                .map(|f| (f.arg_types(), f.result_types())),
            _ => None,
        };
        let inferred = infer(
            &kind,
            &operand_types,
            &written,
            callee.as_ref().map(|(a, r)| (a.as_slice(), r.as_slice())),
        )
        .map_err(|e| {
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

/// Keyword attributes of one op, consumed by name; leftovers are an error.
struct Args<'a> {
    op: &'a str,
    span: Span,
    attrs: Vec<(String, Attr, Span)>,
    used: Vec<String>,
}

impl Args<'_> {
    fn take(&mut self, key: &str) -> PResult<(&Attr, Span)> {
        self.used.push(key.to_string());
        let (op, span) = (self.op, self.span);
        let Some(i) = self.attrs.iter().position(|(k, _, _)| k == key) else {
            let mut d = Diagnostic::error(
                format!("`{op}` needs `{key} = ...`"),
                span,
                format!("missing `{key}`"),
            );
            for (k, _, s) in self.attrs.iter().filter(|(k, _, _)| !self.used.contains(k)) {
                d = d.with_label(*s, format!("`{op}` has no attribute `{k}`"));
            }
            return Err(d);
        };
        let (_, a, s) = &self.attrs[i];
        Ok((a, *s))
    }

    fn int(&mut self, key: &str) -> PResult<usize> {
        let (a, span) = self.take(key)?;
        match a {
            Attr::Num(n) => parse_index(n, span),
            Attr::Ident(w) => Err(Diagnostic::error(
                format!("`{key}` must be an integer, not `{w}`"),
                span,
                "not an integer",
            )),
            Attr::List(_) => Err(Diagnostic::error(
                format!("`{key}` must be an integer, not a list"),
                span,
                "not an integer",
            )),
        }
    }

    fn ints(&mut self, key: &str) -> PResult<Vec<usize>> {
        let (a, span) = self.take(key)?;
        match a {
            Attr::List(ns) => ns.iter().map(|n| parse_index(n, span)).collect(),
            Attr::Num(w) | Attr::Ident(w) => Err(Diagnostic::error(
                format!("`{key}` must be a list like `[0, 1]`, not `{w}`"),
                span,
                "not a list",
            )),
        }
    }

    fn float(&mut self, key: &str) -> PResult<f64> {
        let (a, span) = self.take(key)?;
        match a {
            Attr::Num(n) => parse_f64(n, span),
            Attr::Ident(w) => Err(Diagnostic::error(
                format!("`{key}` must be a number, not `{w}`"),
                span,
                "not a number",
            )),
            Attr::List(_) => Err(Diagnostic::error(
                format!("`{key}` must be a number, not a list"),
                span,
                "not a number",
            )),
        }
    }

    fn finish(&self) -> PResult<()> {
        for (k, _, s) in &self.attrs {
            if !self.used.contains(k) {
                return Err(Diagnostic::error(
                    format!("`{}` has no attribute `{k}`", self.op),
                    *s,
                    "unknown attribute",
                ));
            }
        }
        Ok(())
    }
}

/// A non-negative integer attribute that indexes or sizes something (at most 2^32).
fn parse_index(text: &str, span: Span) -> PResult<usize> {
    match text.parse::<u64>() {
        Ok(v) if v <= crate::infer::MAX_ELEMENTS => Ok(v as usize),
        Ok(_) | Err(_) if text.bytes().all(|b| b.is_ascii_digit()) => Err(Diagnostic::error(
            format!("`{text}` is too large"),
            span,
            "integer overflow",
        )),
        _ => Err(Diagnostic::error(
            format!("`{text}` is not a non-negative integer"),
            span,
            "expected an integer",
        )),
    }
}

fn parse_f64(text: &str, span: Span) -> PResult<f64> {
    let v = match text {
        "nan" | "-nan" => f64::NAN,
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        t => t
            .parse::<f64>()
            .map_err(|_| Diagnostic::error(format!("`{t}` is not a number"), span, "bad number"))?,
    };
    if v.is_infinite() && !text.contains("inf") {
        return Err(Diagnostic::error(
            format!("`{text}` is too large for a number"),
            span,
            "overflow",
        ));
    }
    Ok(v)
}

fn parse_init(p: Pair<Rule>) -> PResult<Init> {
    let span = span_of(&p);
    let mut it = p.into_inner();
    let name = it.next().expect("init name");
    let args = it
        .map(|n| parse_f64(n.as_str(), span_of(&n)))
        .collect::<PResult<Vec<_>>>()?;
    let bad = |msg: &str| Diagnostic::error(msg.to_string(), span, "bad initializer");
    let init = match (name.as_str(), args.as_slice()) {
        ("zeros", []) => Init::Zeros,
        ("ones", []) => Init::Ones,
        ("normal", [std]) if std.is_finite() && *std >= 0.0 => Init::Normal(*std),
        ("normal", _) => {
            return Err(bad(
                "`normal` takes one finite, non-negative standard deviation: `normal(0.02)`",
            ))
        }
        ("uniform", [a, b]) if a.is_finite() && b.is_finite() && a < b => Init::Uniform(*a, *b),
        ("uniform", _) => {
            return Err(bad(
                "`uniform` takes two finite bounds, low < high: `uniform(-0.1, 0.1)`",
            ))
        }
        ("zeros" | "ones", _) => return Err(bad("`zeros` and `ones` take no arguments")),
        (other, _) => {
            return Err(Diagnostic::error(
                format!("unknown initializer `{other}`"),
                span_of(&name),
                "not an initializer",
            )
            .with_note("initializers are zeros, ones, normal(std) and uniform(low, high)"))
        }
    };
    Ok(init)
}
