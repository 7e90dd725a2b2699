//! Every file in `tests/errors/` is a malformed model: ppc must reject it with a diagnostic that
//! points into the file (file:line:col, excerpt, label), and the rendering is snapshot-tested.

use crate::common::root;
use ppc::passes::Options;
use ppc::pipeline::{compile, frontend, PipelineError};
use ppc_dialect::diag::render;
use ppc_dialect::{Diagnostics, Overrides};

/// What ppc says about `text`: the front end's errors, or else the passes' errors.
fn diagnose(text: &str) -> Option<Diagnostics> {
    match frontend(text, &Overrides::default()) {
        Err(d) => Some(d),
        Ok(mut m) => match compile(&mut m, &Options::default(), None, None) {
            Ok(()) => None,
            Err(PipelineError::Pass(_, d)) => Some(d),
            Err(e) => panic!("not a user error: {e:?}"),
        },
    }
}

#[test]
fn malformed_models_get_spanned_diagnostics() {
    insta::glob!("..", "errors/*.ppc", |path| {
        let text = std::fs::read_to_string(path).expect("readable case");
        let name = format!(
            "tests/errors/{}",
            path.file_name().expect("file name").to_string_lossy()
        );
        let diags = diagnose(&text).unwrap_or_else(|| panic!("{name} was accepted"));
        assert!(!diags.is_empty());
        for d in &diags {
            assert!(
                !d.labels.is_empty(),
                "{name}: diagnostic without a source span: {}",
                d.message
            );
            for l in &d.labels {
                assert!(
                    (l.span.end as usize) <= text.len(),
                    "{name}: span past the end of the file"
                );
            }
        }
        let rendered = render(&name, &text, &diags);
        assert!(rendered.starts_with("error"), "{rendered}");
        assert!(
            rendered.contains(&format!("{name}:")),
            "no file:line:col in\n{rendered}"
        );
        insta::assert_snapshot!(rendered);
    });
}

/// Diagnostics no model file can cause, each with what guards it instead.
const UNREACHABLE_FROM_A_MODEL: &[(&str, &str)] = &[
    (
        "exchanges with the neighbouring ranks, but",
        "a model writes neither `call_if` nor `exchange`; the verifier guards passes (passes::a_call_if_that_exchanges_is_rejected)",
    ),
    (
        "has the name of a value of",
        "`@model` and `@train` declare the model's parameters before any other value",
    ),
    (
        "before its definition",
        "the parser resolves names in order; the verifier guards passes",
    ),
    (
        "records result types",
        "the parser infers or checks every type; the verifier guards passes",
    ),
    (
        "loop body arguments must be",
        "the parser checks loop bodies; the verifier guards passes",
    ),
    (
        "loop body must yield",
        "the parser checks loop bodies; the verifier guards passes",
    ),
    (
        "the callee is not a function defined before",
        "the parser resolves callees (unknown_callee)",
    ),
    (
        "cannot build `",
        "a pass built an ill-typed op: a compiler bug, with the pass's span",
    ),
    (
        "needs exactly one result type after",
        "the parser counts written types first (result_types_count)",
    ),
    (
        "is not a number",
        "the grammar admits only numbers where a number is parsed",
    ),
    (
        "layer count overflows",
        "settings are at most 2^16, so their product fits (too_many_layers)",
    ),
    (
        "bad initializer",
        "a label; its callers' messages: unknown_initializer, initializer_arguments",
    ),
    (
        "MLIR: ",
        "lowering errors are compiler bugs; cpu::mlir_locations_point_into_the_model_file",
    ),
    (
        "cannot be vectorized over stages",
        "`ppc check` rejects the compiler's ops and masked matmuls first (loop_in_layer, rank_in_layer, masked_matmul_in_layer); `vmap-stages` guards pass dumps",
    ),
    (
        "the model file is not UTF-8",
        "the corpus is text; cli::a_model_file_that_is_not_utf8_*",
    ),
];

/// The fixed text of every diagnostic message in `dir`'s sources: the longest literal piece of
/// each `Diagnostic::error` message and each shape-inference error.
fn message_classes(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).expect("source dir") {
        let path = e.expect("entry").path();
        if path.is_dir() {
            message_classes(&path, out);
            continue;
        }
        if path.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("source");
        let infer = path.ends_with("infer.rs");
        for (i, _) in text.match_indices("Diagnostic::error(") {
            if let Some(m) = first_literal(&text[i..]) {
                out.push((path.display().to_string(), m));
            }
        }
        if infer {
            for key in ["err(", "message: "] {
                for (i, _) in text.match_indices(key) {
                    if let Some(m) = first_literal(&text[i..]) {
                        out.push((path.display().to_string(), m));
                    }
                }
            }
        }
    }
}

/// The longest piece between `{...}` holes of the first string literal in `code`'s first
/// statement (its message), unescaped.
fn first_literal(code: &str) -> Option<String> {
    let stmt = &code[..code.find(';').unwrap_or(code.len()).min(400)];
    let start = stmt.find('"')? + 1;
    let end = start + stmt[start..].find('"')?;
    let lit = stmt[start..end].replace("\\'", "'");
    let mut pieces = Vec::new();
    let mut rest = lit.as_str();
    while let Some(open) = rest.find('{') {
        pieces.push(&rest[..open]);
        rest = rest[open..].find('}').map_or("", |c| &rest[open + c + 1..]);
    }
    pieces.push(rest);
    pieces
        .into_iter()
        .max_by_key(|p| p.len())
        .map(str::to_string)
        .filter(|p| p.len() >= 4)
}

#[test]
fn every_diagnostic_a_model_can_cause_has_an_error_case() {
    let mut classes = Vec::new();
    for dir in ["dialect/src", "compiler/src"] {
        message_classes(&root().join(dir), &mut classes);
    }
    assert!(
        classes.len() > 60,
        "found only {} messages: is the scan broken?",
        classes.len()
    );
    let snapshots: String = std::fs::read_dir(root().join("tests/suite/snapshots"))
        .expect("snapshots")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("snapshot"))
        .collect();
    let missing: Vec<String> = classes
        .iter()
        .filter(|(_, m)| !snapshots.contains(m.as_str()))
        .filter(|(_, m)| {
            !UNREACHABLE_FROM_A_MODEL
                .iter()
                .any(|(k, _)| m.contains(k) || k.contains(m.as_str()))
        })
        .map(|(file, m)| format!("{file}: {m:?}"))
        .collect();
    assert!(
        missing.is_empty(),
        "diagnostics without a case in tests/errors (or a pass case) rendering them:\n{}",
        missing.join("\n")
    );
    // Every exemption still names a message that exists.
    for (k, why) in UNREACHABLE_FROM_A_MODEL {
        assert!(
            classes
                .iter()
                .any(|(_, m)| m.contains(k) || k.contains(m.as_str())),
            "stale exemption {k:?} ({why})"
        );
    }
}
