//! The parts of the language reference (`docs/language.md`) that the tables know, written from
//! them: the ops (the parser's op table), so that the page cannot miss an op or an attribute.
//! A test compares the page with [`ops_markdown`] (`UPDATE_DOCS=1` rewrites it).

use ppc_dialect::parse::signature::{signatures, Arity, Extra, Signature, Writer};

/// Where the generated op tables begin and end in `docs/language.md`.
pub const BEGIN: &str = "<!-- generated from the op table: do not edit by hand -->";
pub const END: &str = "<!-- end of generated op table -->";

/// The op tables: the ops a model may write, then those only the compiler writes.
pub fn ops_markdown() -> String {
    let mut s = String::new();
    for (writer, title) in [
        (Writer::User, "Ops a model may use"),
        (
            Writer::Compiler,
            "Ops only the compiler writes (in pass dumps; `ppc check` rejects them in a model)",
        ),
    ] {
        s.push_str(&format!("\n#### {title}\n\n| op | operands | attributes | meaning | example |\n|---|---|---|---|---|\n"));
        for sig in signatures().iter().filter(|s| s.writer == writer) {
            s.push_str(&row(sig));
        }
    }
    s
}

fn row(sig: &Signature) -> String {
    let mut operands = match sig.operands {
        Arity::Exactly(n) => n.to_string(),
        Arity::TwoOrThree => "2".to_string(),
        Arity::AtLeastOne => "1 or more".to_string(),
        Arity::Any => "as many as it takes".to_string(),
    };
    match sig.extra {
        Some(Extra::Number) => operands.push_str(", and a number"),
        Some(Extra::Function) => operands.push_str(", after `@function`"),
        Some(Extra::Body) => operands.push_str(", and a body"),
        None => {}
    }
    let attrs = match sig.attributes {
        [] => "—".to_string(),
        a => a
            .iter()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "| `{}` | {operands} | {attrs} | {} | `{}` |\n",
        sig.name,
        sig.summary.replace('|', "\\|"),
        sig.example
    )
}
