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

use crate::diag::{Diagnostic, Diagnostics};
use crate::ir::{names, Func, FuncId, Item, Module, Setting};
use crate::op::OpKind;
use crate::parse::signature::{self, Writer};
use std::collections::BTreeSet;

pub fn check_user_code(m: &Module) -> Result<(), Diagnostics> {
    let mut diags = Vec::new();
    diags.extend(circular_fits(m).err());
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
    let Some(layer) = m.func_id(names::LAYER) else {
        return if diags.is_empty() { Ok(()) } else { Err(diags) };
    };
    let called = reachable(m, layer);
    for (id, f) in m.funcs.iter().filter(|(id, _)| !called.contains(id)) {
        diags.push(
            Diagnostic::error(
                format!("`@{}` is never called", f.name),
                m.spans.get(&Item::Func(id)),
                "defined here",
            )
            .with_note("a model runs `@layer`, once per layer, and the functions it calls (`call @name, ...`); nothing else runs"),
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

/// `from` and every function it calls, directly or not.
fn reachable(m: &Module, from: FuncId) -> BTreeSet<FuncId> {
    let mut seen = BTreeSet::from([from]);
    let mut todo = vec![from];
    while let Some(f) = todo.pop() {
        for op in m.funcs[f].ops.values() {
            if let OpKind::Call { callee, .. } = op.kind {
                if seen.insert(callee) {
                    todo.push(callee);
                }
            }
        }
    }
    seen
}

/// The note that lists the ops a model may use and where they are described.
pub fn user_ops_note() -> String {
    let names: Vec<&str> = signature::user_ops().map(|s| s.name).collect();
    format!(
        "ops a model may use (docs/language.md describes each): {}",
        names.join(" ")
    )
}
