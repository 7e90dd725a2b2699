//! Op attributes (`axis = 1`, `perm = [1, 0]`, `fill = nan`, `end = [t - 1]`), numbers and
//! initializers.

use super::syntax::{span_of, PResult, Rule};
use crate::diag::Diagnostic;
use crate::expr::{Expr, ExprKind};
use crate::ir::Init;
use crate::span::Span;
use pest::iterators::Pair;
use std::rc::Rc;

/// An attribute as written: an expression (`axis = 1`, `fill = nan`, `from = next`,
/// `eps = 1 / d`) or a list of them (`perm = [1, 0]`).
pub(super) enum Attr {
    One(Expr),
    List(Vec<Expr>),
}

impl Attr {
    /// Its canonical text if it names a dimension (`as_written.rs`), else `None`.
    pub(super) fn written(&self) -> Option<String> {
        match self {
            Attr::One(e) => e.names_a_dim().then(|| e.to_string()),
            Attr::List(es) if es.iter().any(Expr::names_a_dim) => {
                let items: Vec<String> = es.iter().map(Expr::to_string).collect();
                Some(format!("[{}]", items.join(", ")))
            }
            Attr::List(_) => None,
        }
    }
}

/// The dimensions and pipeline settings an expression may name, with their values.
pub(super) type Dims = Rc<[(String, u64)]>;

/// Keyword attributes of one op, consumed by name; leftovers are an error.
pub(super) struct Args<'a> {
    pub(super) op: &'a str,
    pub(super) span: Span,
    pub(super) attrs: Vec<(String, Attr, Span)>,
    pub(super) used: Vec<String>,
    pub(super) dims: Dims,
}

/// The value of `name` among `dims`.
pub(super) fn lookup(dims: &Dims) -> impl Fn(&str) -> Option<u64> + '_ {
    |name| dims.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
}

impl Args<'_> {
    pub(super) fn take(&mut self, key: &str) -> PResult<(&Attr, Span)> {
        self.used.push(key.to_string());
        let (op, span) = (self.op, self.span);
        let Some(i) = self.attrs.iter().position(|(k, _, _)| k == key) else {
            let mut d = Diagnostic::error(
                format!("`{op}` needs `{key} = ...`"),
                span,
                format!("missing `{key}`"),
            );
            for (k, _, s) in self.attrs.iter().filter(|(k, _, _)| !self.used.contains(k)) {
                d = d.with_label(*s, format!("`{op}` has no attribute `{k}`"));
            }
            return Err(d);
        };
        let (_, a, s) = &self.attrs[i];
        Ok((a, *s))
    }

    /// An optional word attribute (`from = next`) and where it is.
    pub(super) fn ident_opt(&mut self, key: &str) -> PResult<Option<(String, Span)>> {
        if !self.attrs.iter().any(|(k, _, _)| k == key) {
            return Ok(None);
        }
        match self.take(key)? {
            (Attr::One(e), span) if e.as_name().is_some() => {
                Ok(Some((e.as_name().unwrap_or_default().to_string(), span)))
            }
            (_, span) => Err(Diagnostic::error(
                format!("`{key}` must be a word"),
                span,
                "not a word",
            )),
        }
    }

    pub(super) fn int(&mut self, key: &str) -> PResult<usize> {
        let dims = self.dims.clone();
        let (a, span) = self.take(key)?;
        match a {
            Attr::One(e) => index(e, &dims, key, span),
            Attr::List(_) => Err(Diagnostic::error(
                format!("`{key}` must be an integer, not a list"),
                span,
                "not an integer",
            )),
        }
    }

    pub(super) fn ints(&mut self, key: &str) -> PResult<Vec<usize>> {
        let dims = self.dims.clone();
        let (a, span) = self.take(key)?;
        match a {
            Attr::List(es) => es.iter().map(|e| index(e, &dims, key, span)).collect(),
            Attr::One(e) => Err(Diagnostic::error(
                format!("`{key}` must be a list like `[0, 1]`, not `{e}`"),
                span,
                "not a list",
            )),
        }
    }

    pub(super) fn float(&mut self, key: &str) -> PResult<f64> {
        let dims = self.dims.clone();
        let (a, span) = self.take(key)?;
        match a {
            Attr::One(e) => match &e.kind {
                ExprKind::Name(w) if lookup(&dims)(w).is_none() => Err(Diagnostic::error(
                    format!("`{key}` must be a number, not `{w}`"),
                    span,
                    "not a number",
                )),
                _ => e.float(&lookup(&dims)),
            },
            Attr::List(_) => Err(Diagnostic::error(
                format!("`{key}` must be a number, not a list"),
                span,
                "not a number",
            )),
        }
    }

    pub(super) fn finish(&self) -> PResult<()> {
        for (k, _, s) in &self.attrs {
            if !self.used.contains(k) {
                return Err(Diagnostic::error(
                    format!("`{}` has no attribute `{k}`", self.op),
                    *s,
                    "unknown attribute",
                ));
            }
        }
        Ok(())
    }
}

/// A non-negative integer attribute `key` that indexes or sizes something (at most 2^32): a
/// number, or an expression over dimensions.
fn index(e: &Expr, dims: &Dims, key: &str, span: Span) -> PResult<usize> {
    match &e.kind {
        ExprKind::Number(text) => parse_index(text, span),
        ExprKind::Name(w) if lookup(dims)(w).is_none() => Err(Diagnostic::error(
            format!("`{key}` must be an integer, not `{w}`"),
            span,
            "not an integer",
        )),
        _ => {
            let v = e.index(&lookup(dims))?;
            parse_index(&v.to_string(), e.span)
        }
    }
}

fn parse_index(text: &str, span: Span) -> PResult<usize> {
    match text.parse::<u64>() {
        Ok(v) if v <= crate::infer::MAX_ELEMENTS => Ok(v as usize),
        Ok(_) | Err(_) if text.bytes().all(|b| b.is_ascii_digit()) => Err(Diagnostic::error(
            format!("`{text}` is too large"),
            span,
            "integer overflow",
        )),
        _ => Err(Diagnostic::error(
            format!("`{text}` is not a non-negative integer"),
            span,
            "expected an integer",
        )),
    }
}

/// An initializer, its arguments evaluated over `dims` (`normal(1 / sqrt(d))`), and its
/// canonical text if an argument names a dimension (`as_written.rs`).
pub(super) fn parse_init(p: Pair<Rule>, dims: &Dims) -> PResult<(Init, Option<String>)> {
    let span = span_of(&p);
    let mut it = p.into_inner();
    let name = it.next().expect("init name");
    let exprs = it.map(super::expr::expr).collect::<PResult<Vec<_>>>()?;
    let args = exprs
        .iter()
        .map(|e| e.float(&lookup(dims)))
        .collect::<PResult<Vec<_>>>()?;
    let written = exprs.iter().any(Expr::names_a_dim).then(|| {
        let items: Vec<String> = exprs.iter().map(Expr::to_string).collect();
        format!("{}({})", name.as_str(), items.join(", "))
    });
    let bad = |msg: &str| Diagnostic::error(msg.to_string(), span, "bad initializer");
    let init = match (name.as_str(), args.as_slice()) {
        ("zeros", []) => Init::Zeros,
        ("ones", []) => Init::Ones,
        ("normal", [std]) if std.is_finite() && *std >= 0.0 => Init::Normal(*std),
        ("normal", _) => {
            return Err(bad(
                "`normal` takes one finite, non-negative standard deviation: `normal(0.02)`",
            ))
        }
        ("uniform", [a, b]) if a.is_finite() && b.is_finite() && a < b => Init::Uniform(*a, *b),
        ("uniform", _) => {
            return Err(bad(
                "`uniform` takes two finite bounds, low < high: `uniform(-0.1, 0.1)`",
            ))
        }
        ("zeros" | "ones", _) => return Err(bad("`zeros` and `ones` take no arguments")),
        (other, _) => {
            return Err(Diagnostic::error(
                format!("unknown initializer `{other}`"),
                span_of(&name),
                "not an initializer",
            )
            .with_note("initializers are zeros, ones, normal(std) and uniform(low, high)"))
        }
    };
    Ok((init, written))
}
