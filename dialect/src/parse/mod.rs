//! The parser: text → [`Module`], with names resolved, shapes inferred and user errors as
//! spanned diagnostics.
//!
//! Model files and pass dumps share this one grammar (`grammar.pest`), the exact inverse of
//! `print.rs`. Command-line overrides (`--dim`, `--stages`, ...) apply while parsing, before any
//! shape is computed, so every size in the module already reflects them.

mod attrs;
mod expr;
mod func;
mod module;
mod overrides;
pub mod signature;
mod syntax;

use crate::diag::Diagnostics;
use crate::ir::Module;
use crate::span::{Span, SpanTable};
use module::ModuleBuilder;
pub use overrides::Overrides;
use pest::Parser;
pub use syntax::MAX_PIPELINE_SETTING;
use syntax::{span_of, syntax_error, Grammar, Rule};

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
        input_init: None,
        target: None,
        loss: None,
        ignore_index: None,
        train: None,
        schedule: None,
        funcs: Default::default(),
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
