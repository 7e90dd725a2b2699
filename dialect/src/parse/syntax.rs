//! The text format's grammar (`grammar.pest`) and what every part of the parser needs of it:
//! the span of a parse node, integers, and syntax errors as diagnostics.

use crate::diag::Diagnostic;
use crate::span::Span;
use pest::iterators::Pair;

#[derive(pest_derive::Parser)]
#[grammar = "grammar.pest"]
pub(super) struct Grammar;

/// The most stages, microbatches, repeats or layers a pipeline may have.
pub const MAX_PIPELINE_SETTING: u64 = 1 << 16;

pub(super) type PResult<T> = Result<T, Diagnostic>;

/// The span of a parse node, without the whitespace and comments the grammar let it swallow.
pub(super) fn span_of(p: &Pair<Rule>) -> Span {
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

/// Whether a type node is written `f32!` (kept f32 under `--dtype`).
pub(super) fn is_pinned(t: &Pair<Rule>) -> bool {
    let text = t.as_str();
    let dtype_end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    text[dtype_end..].trim_start().starts_with('!')
}

pub(super) fn parse_u64(p: &Pair<Rule>, what: &str) -> PResult<u64> {
    p.as_str().parse::<u64>().map_err(|_| {
        Diagnostic::error(
            format!("{what} `{}` does not fit in 64 bits", p.as_str()),
            span_of(p),
            "integer overflow",
        )
    })
}

pub(super) fn syntax_error(e: pest::error::Error<Rule>) -> Diagnostic {
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
        Rule::expr | Rule::term | Rule::factor | Rule::apply | Rule::neg => {
            "a number or size like `4`, `d` or `d / heads`"
        }
        Rule::add_op | Rule::mul_op => "an operator (`+ - * /`)",
        Rule::axis => "an axis like `#stages`",
        Rule::list => "a list like `[0, 1]`",
        Rule::EOI => "end of file",
        other => return format!("{other:?}"),
    }
    .to_string()
}
