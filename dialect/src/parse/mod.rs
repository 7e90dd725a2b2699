//! The parser: text → [`Module`], with names resolved, shapes inferred and user errors as
//! spanned diagnostics.
//!
//! Model files and pass dumps share this one grammar (`grammar.pest`), the exact inverse of
//! `print.rs`. Command-line overrides (`--dim`, `--stages`, ...) apply while parsing, before any
//! shape is computed, so every size in the module already reflects them.

mod attrs;
mod func;
mod module;
pub mod signature;

use crate::diag::{Diagnostic, Diagnostics};
use crate::ir::{Module, Setting};
use crate::span::{Span, SpanTable};
use crate::types::DType;
use module::ModuleBuilder;
use pest::iterators::Pair;
use pest::Parser;

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
    pub ranks: Option<u64>,
    /// Layers per stage and repeat; replaces the file's `layers` or `layers_per_stage`.
    pub layers_per_stage: Option<u64>,
    /// Every f32 type in the file becomes this dtype (bf16 or f16 storage).
    pub float_dtype: Option<DType>,
}

impl Overrides {
    /// The command line's value for a setting (none overrides `layers`: `--layers-per-stage`
    /// replaces the depth either way the file gives it).
    pub fn setting(&self, s: Setting) -> Option<u64> {
        match s {
            Setting::Stages => self.stages,
            Setting::Layers => None,
            Setting::LayersPerStage => self.layers_per_stage,
            Setting::Microbatches => self.microbatches,
            Setting::Repeats => self.repeats,
            Setting::Ranks => self.ranks,
        }
    }
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
        train: None,
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
        | Rule::train
        | Rule::func => "`dims`, `pipeline`, `input`, `target`, `loss`, `train` or `func`",
        Rule::train_setting => "a setting like `lr = 0.001`",
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
