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

#[test]
fn the_error_corpus_covers_every_class() {
    let count = std::fs::read_dir(root().join("tests/errors"))
        .expect("tests/errors")
        .count();
    assert!(count >= 25, "only {count} error cases");
}
