//! What a model file may hold beyond what parses: the parser also reads the passes' output,
//! where the compiler's own ops and functions are expected, but a model that uses them would
//! be accepted by `ppc check` and then fail in a later step. Checked by `ppc check` and every
//! command that loads a model.
//!
//! - Only the ops a user may write ([`Writer::User`]): `rank`, `exchange` and `loop` depend on
//!   how the compiler lays out the pipeline.
//! - Every function runs: `@layer`, and the functions it calls (which are then inlined,
//!   `inline.rs`). A function nothing calls would be silently ignored.
//! - No pipeline axis (`#stages`) and no masked `matmul`: passes add them.
//! - A circular pipeline has as many microbatches as stages ([`circular_fits`]).
//! - A schedule the file names trains the file's pipeline ([`schedule_fits`]).
//! - `@embed` takes the input and `@head` what the stages chain; their parameters are the
//!   model's, named apart from `@layer`'s, one parameter where both declare a name (a tied
//!   embedding) ([`check_ends`]).

use crate::diag::{Diagnostic, Diagnostics};
use crate::ir::{names, Func, FuncId, Item, Module, Setting};
use crate::op::OpKind;
use crate::parse::signature::{self, Writer};
use std::collections::BTreeSet;

pub fn check_user_code(m: &Module) -> Result<(), Diagnostics> {
    let mut diags = Vec::new();
    diags.extend(circular_fits(m).err());
    diags.extend(schedule_fits(m).err());
    for f in m.funcs.values() {
        diags.extend(pipeline_axis(f));
        for (id, op) in f.ops.iter() {
            let name = op.kind.name();
            if signature::find(name).is_some_and(|s| s.writer == Writer::Compiler) {
                diags.push(
                    Diagnostic::error(
                        format!(
                            "`{name}` is an op the compiler writes; a model file may not use it"
                        ),
                        f.op_spans.get(&id),
                        "compiler op",
                    )
                    .with_note(user_ops_note()),
                );
            }
            if let OpKind::MatMul { mask: Some(_), .. } = op.kind {
                diags.push(
                    Diagnostic::error(
                        "a third operand of `matmul` is the stage mask the compiler adds",
                        f.op_spans.get(&id),
                        "masked matmul",
                    )
                    .with_note("a model's `matmul` takes two operands"),
                );
            }
        }
    }
    let roots: Vec<FuncId> = names::ROOTS.iter().filter_map(|r| m.func_id(r)).collect();
    if m.func_id(names::LAYER).is_none() {
        return if diags.is_empty() { Ok(()) } else { Err(diags) };
    }
    let called: BTreeSet<FuncId> = roots.iter().flat_map(|&r| m.reachable(r)).collect();
    for (id, f) in m.funcs.iter().filter(|(id, _)| !called.contains(id)) {
        diags.push(
            Diagnostic::error(
                format!("`@{}` is never called", f.name),
                m.spans.get(&Item::Func(id)),
                "defined here",
            )
            .with_note("a model runs `@embed` (if any), `@layer` once per layer, `@head` (if any), and the functions they call (`call @name, ...`); nothing else runs"),
        );
    }
    if diags.is_empty() {
        Ok(())
    } else {
        Err(diags)
    }
}

/// A circular pipeline (`repeats` > 1) brings microbatch m back to stage 0 at iteration
/// (r+1)·M + m, which is only after it left the last stage if M ≥ S.
pub fn circular_fits(m: &Module) -> Result<(), Diagnostic> {
    let p = m.pipeline;
    if p.repeats > 1 && p.microbatches < p.stages {
        // Point at the numbers where the file gives them; name those the command line gave.
        let at = |s| m.spans.lookup(&Item::Setting(s));
        let (span, label) = match at(Setting::Microbatches) {
            Some(s) => (s, format!("{} microbatches", p.microbatches)),
            None => (m.spans.get(&Item::Pipeline), "in this pipeline".to_string()),
        };
        let mut d = Diagnostic::error(
            format!(
                "a circular pipeline ({} repeats) needs at least as many microbatches as stages, got {} microbatches for {} stages",
                p.repeats, p.microbatches, p.stages
            ),
            span,
            label,
        );
        let mut given = Vec::new();
        for s in [Setting::Stages, Setting::Microbatches, Setting::Repeats] {
            let v = p.get(s);
            match at(s) {
                Some(span) if s != Setting::Microbatches => {
                    d = d.with_label(span, format!("{v} {}", s.name()))
                }
                Some(_) => {}
                None => given.push(format!("{} {v}", s.flag())),
            }
        }
        if !given.is_empty() {
            d = d.with_note(format!("from the command line: {}", given.join(", ")));
        }
        return Err(d
        .with_note("microbatch m comes back to stage 0 for repeat r+1 at iteration (r+1)·M + m, but leaves the last stage only at iteration r·M + m + S - 1")
        .with_note(format!("use --microbatches {} or more, or --repeats 1", p.stages)));
    }
    Ok(())
}

/// The file's `schedule = zb-h1` on a circular pipeline: ZB-H1's weight gradients fill the
/// parity order's idle half-ticks, which the interleaved order of a circular pipeline has not,
/// so training could not run the schedule the file names.
pub fn schedule_fits(m: &Module) -> Result<(), Diagnostic> {
    let p = m.pipeline;
    let Some(span) = m.spans.lookup(&Item::Schedule) else {
        return Ok(());
    };
    if m.schedule.as_deref() != Some("zb-h1") || p.repeats == 1 {
        return Ok(());
    }
    let mut d = Diagnostic::error(
        format!(
            "`schedule = zb-h1` is not built for a circular pipeline ({} repeats)",
            p.repeats
        ),
        span,
        "zb-h1",
    );
    match m.spans.lookup(&Item::Setting(Setting::Repeats)) {
        Some(at) => d = d.with_label(at, format!("{} repeats", p.repeats)),
        None => d = d.with_note(format!("from the command line: --repeats {}", p.repeats)),
    }
    Err(d.with_note("its weight gradients fill the idle half-ticks of 1F1B's parity order, which the interleaved order of a circular pipeline has not: `schedule = 1f1b` trains it interleaved, `gpipe` circular, or set `repeats = 1`"))
}

/// A value of `f` typed with a pipeline axis, which only passes add: one written in a model
/// would be taken for the stage axis by every later pass.
pub fn pipeline_axis(f: &Func) -> Option<Diagnostic> {
    let (v, a) = f
        .values
        .iter()
        .find_map(|(v, val)| val.ty.stage_axis().map(|(_, a)| (v, a)))?;
    Some(
        Diagnostic::error(
            format!(
                "`@{}` has the pipeline axis `#{}`, which only passes add",
                f.name,
                a.name()
            ),
            f.value_spans.get(&v),
            "this value",
        )
        .with_note("for a dimension as long as the pipeline setting, write it without `#`"),
    )
}

/// The note that lists the ops a model may use and where they are described.
pub fn user_ops_note() -> String {
    let names: Vec<&str> = signature::user_ops().map(|s| s.name).collect();
    format!(
        "ops a model may use (docs/language.md describes each): {}",
        names.join(" ")
    )
}

/// The rules of the functions around the pipelined layers: `@embed` maps the input to one
/// value (what the stages chain, checked with `@layer`), `@head` takes that value; parameters of
/// all three take no `layer_axes`. `@embed`'s and `@head`'s parameters are one set, held once
/// (not per layer): a name both declare is one parameter (a tied embedding), so both must
/// declare it alike, and no name may also be `@layer`'s.
pub fn check_ends(m: &Module) -> Result<(), Diagnostics> {
    let mut diags = Vec::new();
    let stage_ty = m.stage_type();
    let signatures = [
        (names::EMBED, &m.input, "`input`"),
        (names::HEAD, &stage_ty, "what the stages chain"),
    ];
    for (name, want, what) in signatures {
        let Some(id) = m.func_id(name) else { continue };
        let f = &m.funcs[id];
        let (args, results) = (f.arg_types(), f.result_types());
        if args.len() != 1 || results.len() != 1 || !args[0].same_as(want) {
            diags.push(
                Diagnostic::error(
                    format!(
                        "`@{name}` must take one value, {what} {}, and return one; it takes ({}) and returns {} value(s)",
                        crate::types::sizes(want),
                        args.iter().map(crate::types::sizes).collect::<Vec<_>>().join(", "),
                        results.len()
                    ),
                    m.spans.get(&Item::Func(id)),
                    "signature",
                )
                .with_note("a model runs `@embed` on the input, `@layer` once per layer, then `@head`"),
            );
        }
    }
    for root in names::ROOTS {
        let Some(f) = m.func(root) else { continue };
        if let Some(p) = f.params.iter().find(|p| p.layer_axes != 0) {
            diags.push(Diagnostic::error(
                match root {
                    names::LAYER => {
                        "`@layer` parameters belong to one layer and take no `layer_axes`".into()
                    }
                    _ => format!("`@{root}` parameters are held once and take no `layer_axes`"),
                },
                f.value_spans.get(&p.value),
                "here",
            ));
        }
    }
    let layer_names: BTreeSet<&str> = m
        .func(names::LAYER)
        .map(|l| {
            l.params
                .iter()
                .map(|p| l.values[p.value].name.as_str())
                .collect()
        })
        .unwrap_or_default();
    let mut seen: Vec<(&Func, &crate::ir::Param)> = Vec::new();
    for f in [names::EMBED, names::HEAD].iter().filter_map(|n| m.func(n)) {
        for p in &f.params {
            let name = f.values[p.value].name.as_str();
            let span = f.value_spans.get(&p.value);
            if layer_names.contains(name) {
                diags.push(
                    Diagnostic::error(
                        format!("`@{}`'s parameter `%{name}` has the name of a `@layer` parameter", f.name),
                        span,
                        "rename it",
                    )
                    .with_note("the model's parameters and their gradients are known by name; `@layer`'s are per layer, `@embed`'s and `@head`'s once"),
                );
            }
            let twin = seen.iter().find(|(g, q)| g.values[q.value].name == name);
            match twin {
                Some((g, q)) if !(g.ty(q.value).same_as(f.ty(p.value)) && q.init == p.init) => {
                    diags.push(
                        Diagnostic::error(
                            format!(
                                "`%{name}` is declared in `@{}` and `@{}` differently: {} = {} and {} = {}",
                                g.name,
                                f.name,
                                g.ty(q.value),
                                crate::print::init_text(q.init, None),
                                f.ty(p.value),
                                crate::print::init_text(p.init, None)
                            ),
                            span,
                            "here",
                        )
                        .with_label(g.value_spans.get(&q.value), "and here")
                        .with_note("a name that `@embed` and `@head` both declare is one parameter (a tied embedding): declare it alike in both"),
                    );
                }
                _ => seen.push((f, p)),
            }
        }
    }
    if diags.is_empty() {
        Ok(())
    } else {
        Err(diags)
    }
}
