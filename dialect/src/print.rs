//! The printer: [`Module`] → canonical text, the exact inverse of the parser.
//!
//! Model files and every pass dump print this way, so `parse(print(m)) == m` holds for anything
//! the compiler makes. Output is deterministic: items in a fixed order, every op with its types.
//! Comments are not part of the IR, so `ppc fmt` drops them.

use crate::ir::{Block, Func, Init, Module};
use crate::op::OpKind;
use crate::setting::SCHEDULE;
use std::fmt::Write;

/// The canonical text of `m`.
pub fn print(m: &Module) -> String {
    let mut out = String::new();
    if !m.dims.is_empty() {
        let dims: Vec<String> = m
            .dims
            .iter()
            .map(|d| format!("{} = {}", d.name, d.expr))
            .collect();
        let _ = writeln!(out, "dims {{ {} }}", dims.join(", "));
    }
    let settings: Vec<String> = m
        .pipeline
        .settings()
        .iter()
        .map(|(s, v)| format!("{} = {v}", s.name()))
        .chain(m.schedule.iter().map(|k| format!("{SCHEDULE} = {k}")))
        .collect();
    let _ = writeln!(out, "pipeline {{ {} }}", settings.join(", "));
    match &m.input_init {
        Some(i) => {
            let init = init_text(i.init, i.written.as_ref());
            let _ = writeln!(out, "input {} = {init}", m.input);
        }
        None => {
            let _ = writeln!(out, "input {}", m.input);
        }
    }
    if let Some(t) = &m.target {
        let _ = writeln!(out, "target {t}");
    }
    if let Some(l) = m.loss {
        match m.ignore_index {
            Some(i) => {
                let _ = writeln!(out, "loss {}, ignore_index = {i}", l.name());
            }
            None => {
                let _ = writeln!(out, "loss {}", l.name());
            }
        }
    }
    if !m.train.is_empty() {
        let s: Vec<String> = m.train.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        let _ = writeln!(out, "train {{ {} }}", s.join(", "));
    }
    for f in m.funcs.values() {
        out.push('\n');
        print_func(&mut out, m, f);
    }
    out
}

/// An initializer as written (when an argument names a dimension), else canonical.
pub(crate) fn init_text(init: Init, written: Option<&String>) -> String {
    match (init, written) {
        (_, Some(written)) => written.clone(),
        (Init::Zeros, _) => "zeros".to_string(),
        (Init::Ones, _) => "ones".to_string(),
        (Init::Normal(s), _) => format!("normal({})", number(s)),
        (Init::Uniform(a, b), _) => format!("uniform({}, {})", number(a), number(b)),
    }
}

/// A number as the grammar reads it back exactly.
pub fn number(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else {
        format!("{v:?}")
    }
}

fn list<T: ToString>(xs: &[T]) -> String {
    format!(
        "[{}]",
        xs.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The type of `v` as written: `f32!` where the model file pinned it (`as_written.rs`).
fn ty_of(f: &Func, v: crate::ir::ValueId) -> String {
    let t = f.ty(v);
    let text = t.to_string();
    if f.written.pinned.contains(&v) {
        text.replacen(t.dtype.name(), &format!("{}!", t.dtype.name()), 1)
    } else {
        text
    }
}

fn print_func(out: &mut String, m: &Module, f: &Func) {
    let name = |v| format!("%{}", f.values[v].name);
    let args: Vec<String> = f
        .body
        .args
        .iter()
        .map(|&a| format!("{}: {}", name(a), ty_of(f, a)))
        .collect();
    let results: Vec<String> = f.result_types().iter().map(|t| t.to_string()).collect();
    let _ = writeln!(
        out,
        "func @{}({}) -> {} {{",
        f.name,
        args.join(", "),
        results.join(", ")
    );
    for p in &f.params {
        let init = init_text(p.init, f.written.inits.get(&p.value));
        let axes = if p.layer_axes > 0 {
            format!(", layer_axes = {}", p.layer_axes)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  param {}: {} = {init}{axes}",
            name(p.value),
            ty_of(f, p.value)
        );
    }
    print_ops(out, m, f, &f.body, 1);
    let rets: Vec<String> = f.body.results.iter().map(|&v| name(v)).collect();
    let _ = writeln!(out, "  return {}", rets.join(", "));
    out.push_str("}\n");
}

fn print_ops(out: &mut String, m: &Module, f: &Func, block: &Block, depth: usize) {
    let pad = "  ".repeat(depth);
    let name = |v| format!("%{}", f.values[v].name);
    for &id in &block.ops {
        let op = &f.ops[id];
        let results: Vec<String> = op.results.iter().map(|&v| name(v)).collect();
        let mut args: Vec<String> = Vec::new();
        let written = |key: &str| f.written.exprs.get(&(id, key.to_string()));
        match &op.kind {
            OpKind::Constant { .. } if written("").is_some() => {
                args.extend(written("").cloned());
            }
            OpKind::Constant { value }
                if !f.ty(op.results[0]).dtype.is_float() && value.0.fract() == 0.0 =>
            {
                args.push(format!("{}", value.0 as i64))
            }
            OpKind::Constant { value } => args.push(number(value.0)),
            OpKind::Call { callee, .. } => args.push(format!("@{}", m.funcs[*callee].name)),
            _ => {}
        }
        args.extend(op.kind.operands().into_iter().map(name));
        args.extend(attrs(&op.kind).into_iter().map(|(key, value)| {
            let value = written(key).cloned().unwrap_or(value);
            format!("{key} = {value}")
        }));
        let types: Vec<String> = op.results.iter().map(|&v| ty_of(f, v)).collect();
        let _ = write!(out, "{pad}{} = {}", results.join(", "), op.kind.name());
        if !args.is_empty() {
            let _ = write!(out, " {}", args.join(", "));
        }
        let _ = write!(out, " : {}", types.join(", "));
        if let OpKind::Loop { body, .. } = &op.kind {
            let bargs: Vec<String> = body.args.iter().map(|&v| name(v)).collect();
            let _ = writeln!(out, " {{\n{pad}^body({}):", bargs.join(", "));
            print_ops(out, m, f, body, depth + 1);
            let ys: Vec<String> = body.results.iter().map(|&v| name(v)).collect();
            let _ = writeln!(out, "{pad}  yield {}", ys.join(", "));
            let _ = write!(out, "{pad}}}");
        }
        out.push('\n');
    }
}

/// The keyword attributes of an op, as `(key, value)` in canonical order.
fn attrs(kind: &OpKind) -> Vec<(&'static str, String)> {
    match kind {
        OpKind::Transpose { perm, .. } => vec![("perm", list(perm))],
        OpKind::Slice { start, end, .. } => vec![("start", list(start)), ("end", list(end))],
        OpKind::Concat { axis, .. }
        | OpKind::Softmax { axis, .. }
        | OpKind::Iota { axis }
        | OpKind::Index { axis, .. }
        | OpKind::Gather { axis, .. }
        | OpKind::Update { axis, .. } => vec![("axis", axis.to_string())],
        OpKind::Reduce { axes, .. } => vec![("axes", list(axes))],
        OpKind::LayerNorm { axis, eps, .. } => {
            vec![("axis", axis.to_string()), ("eps", number(eps.0))]
        }
        OpKind::Pad {
            axis,
            low,
            high,
            fill,
            ..
        } => vec![
            ("axis", axis.to_string()),
            ("low", low.to_string()),
            ("high", high.to_string()),
            ("fill", number(fill.0)),
        ],
        OpKind::Shift { axis, fill, .. } => {
            vec![("axis", axis.to_string()), ("fill", number(fill.0))]
        }
        OpKind::Loop { trips, .. } => vec![("trips", trips.to_string())],
        OpKind::Unary { .. }
        | OpKind::Binary { .. }
        | OpKind::Compare { .. }
        | OpKind::Select { .. }
        | OpKind::MatMul { .. }
        | OpKind::Reshape { .. }
        | OpKind::Broadcast { .. }
        | OpKind::Convert { .. }
        | OpKind::Constant { .. }
        | OpKind::Rank
        | OpKind::Exchange { reverse: false, .. }
        | OpKind::Call { .. } => vec![],
        OpKind::Exchange { reverse: true, .. } => vec![("from", "next".to_string())],
    }
}
