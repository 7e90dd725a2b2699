//! Module-level items: named dimensions, the pipeline block, types, and the overrides from the
//! command line that replace what the file says.

use super::attrs::{parse_init, Dims};
use super::func::{FuncBuilder, ModuleScope};
use super::overrides::Overrides;
use super::syntax::{parse_u64, span_of, PResult, Rule, MAX_PIPELINE_SETTING};
use crate::arena::Arena;
use crate::diag::Diagnostic;
use crate::expr::{Expr, ExprKind};
use crate::infer::checked_elements;
use crate::ir::{Depth, DimDef, Func, Item, Loss, Module, Pipeline, Setting, WrittenInit};
use crate::setting::{SCHEDULE, SCHEDULES};
use crate::span::{Span, SpanTable};
use crate::types::{Axis, DType, Dim, Type};
use pest::iterators::Pair;

pub(super) struct ModuleBuilder<'a> {
    pub(super) overrides: &'a Overrides,
    pub(super) dims: Vec<DimDef>,
    /// Settings as written, with the spans of their names and values, until the pipeline is
    /// resolved.
    pub(super) pipeline: Vec<(String, u64, Span, Span)>,
    pub(super) input: Option<Type>,
    pub(super) input_init: Option<WrittenInit>,
    pub(super) target: Option<Type>,
    pub(super) loss: Option<Loss>,
    pub(super) ignore_index: Option<i32>,
    pub(super) train: Option<Vec<(String, String)>>,
    pub(super) schedule: Option<String>,
    pub(super) funcs: Arena<Func>,
    pub(super) spans: SpanTable<Item>,
    /// The pipeline, once `dims` and `pipeline` are both known (needed to resolve shapes).
    pub(super) resolved: Option<Pipeline>,
}

impl ModuleBuilder<'_> {
    fn once(&mut self, key: Item, span: Span, seen: bool) -> PResult<()> {
        if seen {
            return Err(Diagnostic::error(
                format!("`{}` is given twice", key.keyword()),
                span,
                "second one here",
            )
            .with_label(self.spans.get(&key), "first one here"));
        }
        self.spans.set(key, span);
        Ok(())
    }

    pub(super) fn item(&mut self, item: Pair<Rule>) -> PResult<()> {
        let span = span_of(&item);
        match item.as_rule() {
            Rule::dims => {
                let seen = !self.dims.is_empty();
                self.once(Item::Dims, span, seen)?;
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
                self.once(Item::Pipeline, span, seen)?;
                for s in item.into_inner() {
                    let mut it = s.into_inner();
                    let (name, value) = (
                        it.next().expect("setting name"),
                        it.next().expect("setting value"),
                    );
                    if name.as_str() == SCHEDULE {
                        self.schedule_setting(&name, &value)?;
                        continue;
                    }
                    if value.as_rule() == Rule::name_value {
                        return Err(Diagnostic::error(
                            format!("pipeline setting `{}` is a whole number", name.as_str()),
                            span_of(&value),
                            "not a number",
                        ));
                    }
                    let v = parse_u64(&value, "setting")?;
                    if self.pipeline.iter().any(|(n, ..)| n == name.as_str()) {
                        return Err(Diagnostic::error(
                            format!("pipeline setting `{}` is given twice", name.as_str()),
                            span_of(&name),
                            "again here",
                        ));
                    }
                    self.pipeline.push((
                        name.as_str().to_string(),
                        v,
                        span_of(&name),
                        span_of(&value),
                    ));
                }
                self.resolve_pipeline(span).map(|_| ())
            }
            Rule::input | Rule::target => {
                let (key, seen) = if item.as_rule() == Rule::input {
                    (Item::Input, self.input.is_some())
                } else {
                    (Item::Target, self.target.is_some())
                };
                self.once(key, span, seen)?;
                let mut inner = item.into_inner();
                let t = Some(self.ty(inner.next().expect("type"))?);
                if let Some(init) = inner.next() {
                    let (init, written) = parse_init(init, &ModuleScope::dims(self))?;
                    self.input_init = Some(WrittenInit { init, written });
                }
                match key {
                    Item::Input => self.input = t,
                    _ => self.target = t,
                }
                Ok(())
            }
            Rule::loss => {
                self.once(Item::Loss, span, self.loss.is_some())?;
                let mut inner = item.into_inner();
                let name = inner.next().expect("loss name");
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
                if let Some(v) = inner.next() {
                    let at = span_of(&v);
                    let index = v.as_str().parse::<i32>().map_err(|_| {
                        Diagnostic::error(
                            format!(
                                "`ignore_index` is a whole i32 target value, not `{}`",
                                v.as_str()
                            ),
                            at,
                            "not an i32",
                        )
                    })?;
                    if self.loss != Some(Loss::SoftmaxCrossEntropy) {
                        return Err(Diagnostic::error(
                            "`ignore_index` skips class-index targets: it needs `softmax_cross_entropy`",
                            at,
                            "ignored targets",
                        ));
                    }
                    self.ignore_index = Some(index);
                }
                Ok(())
            }
            Rule::train => {
                self.once(Item::Train, span, self.train.is_some())?;
                let mut settings: Vec<(String, String)> = Vec::new();
                for s in item.into_inner() {
                    let mut it = s.into_inner();
                    let (name, value) = (it.next().expect("name"), it.next().expect("value"));
                    if settings.iter().any(|(n, _)| n == name.as_str()) {
                        return Err(Diagnostic::error(
                            format!("training setting `{}` is given twice", name.as_str()),
                            span_of(&name),
                            "again here",
                        ));
                    }
                    // What is valid is the runtime's optimizer's to say (the compiler's
                    // front end checks it); the spans are kept for its diagnostics.
                    let i = settings.len();
                    self.spans.set(Item::TrainKey(i), span_of(&name));
                    self.spans.set(Item::TrainValue(i), span_of(&value));
                    settings.push((name.as_str().to_string(), value.as_str().to_string()));
                }
                self.train = Some(settings);
                Ok(())
            }
            Rule::func => {
                if self.resolved.is_none() {
                    return Err(Diagnostic::error(
                        "functions must come after the `pipeline` block",
                        span,
                        "too early",
                    ));
                }
                let name_span = item
                    .clone()
                    .into_inner()
                    .next()
                    .map_or(span, |n| span_of(&n));
                let f = FuncBuilder::build(self, item)?;
                if self.funcs.values().any(|g| g.name == f.name) {
                    return Err(Diagnostic::error(
                        format!("function `@{}` is defined twice", f.name),
                        span,
                        "second definition",
                    ));
                }
                let id = self.funcs.push(f);
                self.spans.set(Item::Func(id), name_span);
                Ok(())
            }
            other => unreachable!("invariant: grammar yields only items here, got {other:?}"),
        }
    }

    fn dim_def(&mut self, d: Pair<Rule>) -> PResult<()> {
        let mut it = d.into_inner();
        let name = it.next().expect("dim name");
        let expr = it.next().expect("dim expr");
        if let Some(first) = self.dims.iter().position(|x| x.name == name.as_str()) {
            return Err(Diagnostic::error(
                format!("dimension `{}` is declared twice", name.as_str()),
                span_of(&name),
                "again here",
            )
            .with_label(self.spans.get(&Item::Dim(first)), "first declared here"));
        }
        if is_pipeline_name(name.as_str()) {
            return Err(Diagnostic::error(
                format!("`{}` is a pipeline setting, not a dimension", name.as_str()),
                span_of(&name),
                "reserved name",
            )
            .with_note("set it in the `pipeline { ... }` block"));
        }
        let expr = super::expr::expr(expr)?;
        let value = self.dim_value(name.as_str(), &expr, self.dims.len())?;
        self.check_dim_size(name.as_str(), value, span_of(&name))?;
        self.spans.set(Item::Dim(self.dims.len()), span_of(&name));
        self.dims.push(DimDef {
            name: name.as_str().to_string(),
            expr,
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
            d.expr = Expr::number(*v, d.expr.span);
        }
        for i in 0..self.dims.len() {
            let d = &self.dims[i];
            let value = self.dim_value(&d.name, &d.expr, i)?;
            self.dims[i].value = value;
        }
        Ok(())
    }

    /// The value of dimension `name = expr`, the `before` dimensions declared before it known.
    fn dim_value(&self, name: &str, expr: &Expr, before: usize) -> PResult<u64> {
        let earlier = |n: &str| {
            self.dims[..before]
                .iter()
                .find(|x| x.name == n)
                .map(|x| x.value)
        };
        let value = expr.index(&earlier).map_err(|mut d| {
            if d.message.starts_with("unknown dimension") {
                d.labels[0].message = "not declared before this point".into();
            }
            d
        })?;
        self.check_dim_size(name, value, expr.span)?;
        Ok(value)
    }

    /// `schedule = NAME`: one of [`SCHEDULES`], given once.
    fn schedule_setting(&mut self, name: &Pair<Rule>, value: &Pair<Rule>) -> PResult<()> {
        let at = span_of(value);
        if self.schedule.is_some() {
            return Err(Diagnostic::error(
                "pipeline setting `schedule` is given twice",
                span_of(name),
                "again here",
            ));
        }
        if !SCHEDULES.contains(&value.as_str()) {
            return Err(Diagnostic::error(
                format!("unknown schedule `{}`", value.as_str()),
                at,
                "not a schedule",
            )
            .with_note(format!(
                "schedules are {}",
                SCHEDULES.map(|s| format!("`{s}`")).join(", ")
            )));
        }
        self.schedule = Some(value.as_str().to_string());
        self.spans.set(Item::Schedule, at);
        Ok(())
    }

    fn resolve_pipeline(&mut self, block: Span) -> PResult<Pipeline> {
        let get = |setting: Setting| -> PResult<Option<(u64, Span)>> {
            Ok(self
                .pipeline
                .iter()
                .find(|(n, ..)| n == setting.name())
                .map(|(_, v, _, s)| (*v, *s)))
        };
        for (name, _, span, _) in &self.pipeline {
            if Setting::from_name(name).is_none() {
                return Err(Diagnostic::error(format!("unknown pipeline setting `{name}`"), *span, "unknown")
                    .with_note("settings are `stages`, `layers` or `layers_per_stage`, `microbatches`, `repeats`, `ranks` and `schedule`"));
            }
        }
        let ov = self.overrides;
        let pick =
            |written: Option<(u64, Span)>, over: Option<u64>| over.map(|v| (v, block)).or(written);
        // Where each setting in effect was written; the command line's have no place in the file.
        for s in [
            Setting::Stages,
            Setting::Microbatches,
            Setting::Repeats,
            Setting::Ranks,
        ] {
            if let (None, Some((_, span))) = (ov.setting(s), get(s)?) {
                self.spans.set(Item::Setting(s), span);
            }
        }
        let given = |s: Setting| Ok::<_, Diagnostic>(pick(get(s)?, ov.setting(s)));
        let stages = given(Setting::Stages)?;
        let micro = given(Setting::Microbatches)?;
        let repeats = given(Setting::Repeats)?.unwrap_or((1, block));
        let ranks = given(Setting::Ranks)?.unwrap_or((1, block));
        // `--layers` or `--layers-per-stage` replaces either way the file gives the depth.
        let (layers, per_stage) = match (ov.layers, ov.layers_per_stage) {
            (Some(l), _) => (Some((l, block)), None),
            (None, Some(k)) => (None, Some((k, block))),
            (None, None) => (get(Setting::Layers)?, get(Setting::LayersPerStage)?),
        };
        let (Some(stages), Some(micro)) = (stages, micro) else {
            return Err(Diagnostic::error(
                "the pipeline needs `stages` and `microbatches`",
                block,
                "incomplete pipeline",
            ));
        };
        for (setting, (v, span)) in [
            (Setting::Stages, stages),
            (Setting::Microbatches, micro),
            (Setting::Repeats, repeats),
            (Setting::Ranks, ranks),
        ]
        .into_iter()
        .chain(layers.map(|l| (Setting::Layers, l)))
        .chain(per_stage.map(|l| (Setting::LayersPerStage, l)))
        {
            let name = setting.name();
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
        // Where a setting in effect comes from: its place in the file, or the command line.
        let set_here = |s: Setting, v: u64| match ov.setting(s) {
            Some(_) => format!("`{} {v}` from the command line", s.flag()),
            None => format!("{} set here", s.name()),
        };
        if stages.0 % ranks.0 != 0 {
            let label = match ov.setting(Setting::Ranks) {
                Some(_) => format!(
                    "`--ranks {}` from the command line does not divide `stages`",
                    ranks.0
                ),
                None => "not a divisor of `stages`".to_string(),
            };
            return Err(Diagnostic::error(
                format!("{} ranks do not divide {} stages", ranks.0, stages.0),
                ranks.1,
                label,
            )
            .with_label(stages.1, set_here(Setting::Stages, stages.0))
            .with_note("each rank holds the same number of consecutive stages"));
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
            // Any count: the stages hold ⌈L / (S·R)⌉ slots each, the last ones empty.
            (Some((l, _)), None) => l,
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
            ranks: ranks.0,
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

    /// A dimension written as a size: `4`, `d`, `3 * d`; labelled as written.
    fn size(&self, e: Expr) -> PResult<Dim> {
        let lookup = |n: &str| self.dim_size(n);
        let size = e.index(&lookup).map_err(|mut diag| {
            if let (Some(name), true) = (e.as_name(), self.resolved.is_none()) {
                if is_pipeline_name(name) {
                    diag = diag.with_note(
                        "pipeline settings can be used as dimensions after the `pipeline` block",
                    );
                }
            }
            diag
        })?;
        Ok(match &e.kind {
            ExprKind::Number(_) => Dim::lit(size),
            ExprKind::Name(n) => Dim::named(n, size),
            _ => Dim::named(&e.to_string(), size),
        })
    }

    /// `#stages` or `#stages_per_rank`: the stage axis, sized by the pipeline.
    fn axis(&self, d: &Pair<Rule>) -> PResult<Dim> {
        let name = &d.as_str()[1..];
        let known = || {
            let names: Vec<String> = Axis::ALL.iter().map(|a| format!("#{}", a.name())).collect();
            names.join(" and ")
        };
        let axis = Axis::from_name(name).ok_or_else(|| {
            Diagnostic::error(
                format!("unknown axis `#{name}`"),
                span_of(d),
                "not a pipeline axis",
            )
            .with_note(format!(
                "the pipeline axes that passes add are {}; an ordinary dimension has no `#`",
                known()
            ))
        })?;
        let p = self.resolved.ok_or_else(|| {
            Diagnostic::error(
                format!("`#{name}` before the `pipeline` block"),
                span_of(d),
                "its size is not known yet",
            )
        })?;
        Ok(Dim::axis(
            axis,
            match axis {
                Axis::Stages => p.stages,
                Axis::RankStages => p.stages_per_rank(),
            },
        ))
    }

    pub(super) fn ty(&self, t: Pair<Rule>) -> PResult<Type> {
        let span = span_of(&t);
        let pinned = super::syntax::is_pinned(&t);
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
                Rule::axis => self.axis(&d)?,
                _ => self.size(super::expr::expr(d)?)?,
            });
        }
        let dtype = match (dtype, self.overrides.float_dtype) {
            (DType::F32, Some(d)) if !pinned => d,
            _ => dtype,
        };
        let t = Type::new(dtype, dims);
        checked_elements(&t.shape())
            .map_err(|m| Diagnostic::error(format!("bad type {t}: {m}"), span, "this type"))?;
        Ok(t)
    }

    pub(super) fn finish(self, end: Span) -> PResult<Module> {
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
            input_init: self.input_init,
            target: self.target,
            loss: self.loss,
            ignore_index: self.ignore_index,
            train: self.train.unwrap_or_default(),
            schedule: self.schedule,
            funcs: self.funcs,
            spans: self.spans,
        })
    }
}

/// Names that shapes may use for pipeline settings, so they cannot be declared as dimensions.
pub(super) fn is_pipeline_name(s: &str) -> bool {
    Setting::from_name(s).is_some() || s == crate::ir::STAGES_PER_RANK
}

impl ModuleScope for ModuleBuilder<'_> {
    fn ty(&self, t: Pair<Rule>) -> PResult<Type> {
        ModuleBuilder::ty(self, t)
    }

    fn funcs(&self) -> &Arena<Func> {
        &self.funcs
    }

    fn float_dtype(&self) -> Option<DType> {
        self.overrides.float_dtype
    }

    fn dims(&self) -> Dims {
        let mut all: Vec<(String, u64)> = self
            .dims
            .iter()
            .map(|d| (d.name.clone(), d.value))
            .collect();
        if let Some(p) = self.resolved {
            all.extend(p.dim_names().iter().map(|(n, v)| (n.to_string(), *v)));
        }
        all.into()
    }
}
