//! Diagnostics: what went wrong, where in the model file, and rendering with a source excerpt.
//!
//! Everything a user can get wrong becomes a [`Diagnostic`], never a panic. Rendering goes
//! through codespan-reporting so messages read `error: ... --> file:line:col` with the line
//! and a label under the offending text.

use crate::span::Span;
use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label as CsLabel};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, termcolor};

#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub span: Span,
    pub message: String,
    pub primary: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    pub message: String,
    /// Empty when the error has no place in the source (a bad command-line value).
    pub labels: Vec<Label>,
    pub notes: Vec<String>,
}

/// All the errors found, in source order.
pub type Diagnostics = Vec<Diagnostic>;

impl Diagnostic {
    /// An error pointing at `span`, labelled `label`.
    pub fn error(message: impl Into<String>, span: Span, label: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            labels: vec![Label {
                span,
                message: label.into(),
                primary: true,
            }],
            notes: vec![],
        }
    }

    /// An error that has no source location.
    pub fn plain(message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            labels: vec![],
            notes: vec![],
        }
    }

    pub fn with_label(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.labels.push(Label {
            span,
            message: message.into(),
            primary: false,
        });
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }
}

fn to_codespan(d: &Diagnostic) -> CsDiagnostic<()> {
    CsDiagnostic::error()
        .with_message(&d.message)
        .with_labels(
            d.labels
                .iter()
                .map(|l| {
                    if l.primary {
                        CsLabel::primary((), l.span.range())
                    } else {
                        CsLabel::secondary((), l.span.range())
                    }
                    .with_message(&l.message)
                })
                .collect(),
        )
        .with_notes(d.notes.clone())
}

/// Renders diagnostics against the source as plain text (no colour): for tests and logs.
pub fn render(file: &str, source: &str, diags: &[Diagnostic]) -> String {
    let mut out = termcolor::NoColor::new(Vec::new());
    let files = SimpleFile::new(file, source);
    let config = term::Config::default();
    for d in diags {
        // Writing into a Vec cannot fail; a span outside the source is a compiler bug that we
        // still show, without the excerpt, rather than lose.
        if term::emit(&mut out, &config, &files, &to_codespan(d)).is_err() {
            let _ = std::io::Write::write_all(
                out.get_mut(),
                format!("error: {}\n", d.message).as_bytes(),
            );
        }
    }
    String::from_utf8_lossy(&out.into_inner()).into_owned()
}

/// Renders diagnostics to stderr, in colour when stderr is a terminal.
pub fn emit_stderr(file: &str, source: &str, diags: &[Diagnostic]) {
    let choice = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        termcolor::ColorChoice::Auto
    } else {
        termcolor::ColorChoice::Never
    };
    let writer = termcolor::StandardStream::stderr(choice);
    let files = SimpleFile::new(file, source);
    let config = term::Config::default();
    for d in diags {
        if term::emit(&mut writer.lock(), &config, &files, &to_codespan(d)).is_err() {
            eprintln!("error: {}", d.message);
        }
    }
}
