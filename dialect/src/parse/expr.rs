//! Compile-time expressions (`3 * d`, `1 / sqrt(dh)`) from their parse nodes; `crate::expr`
//! evaluates and prints them.

use super::syntax::{span_of, PResult, Rule};
use crate::diag::Diagnostic;
use crate::expr::{BinOp, Expr, ExprKind, Function};
use pest::iterators::Pair;

/// An `expr` node.
pub(super) fn expr(p: Pair<Rule>) -> PResult<Expr> {
    let mut it = p.into_inner();
    let mut acc = term(it.next().expect("term"))?;
    while let Some(op) = it.next() {
        let rhs = term(it.next().expect("term after operator"))?;
        acc = binary(
            if op.as_str() == "+" {
                BinOp::Add
            } else {
                BinOp::Sub
            },
            acc,
            rhs,
        );
    }
    Ok(acc)
}

fn term(p: Pair<Rule>) -> PResult<Expr> {
    let mut it = p.into_inner();
    let mut acc = factor(it.next().expect("factor"))?;
    while let Some(op) = it.next() {
        let rhs = factor(it.next().expect("factor after operator"))?;
        acc = binary(
            if op.as_str() == "*" {
                BinOp::Mul
            } else {
                BinOp::Div
            },
            acc,
            rhs,
        );
    }
    Ok(acc)
}

fn binary(op: BinOp, a: Expr, b: Expr) -> Expr {
    let span = a.span.merge(b.span);
    Expr {
        kind: ExprKind::Binary(op, Box::new(a), Box::new(b)),
        span,
    }
}

fn factor(p: Pair<Rule>) -> PResult<Expr> {
    let span = span_of(&p);
    let mut negations = 0;
    let mut x = None;
    for part in p.into_inner() {
        let pspan = span_of(&part);
        x = Some(match part.as_rule() {
            Rule::neg => {
                negations += 1;
                continue;
            }
            Rule::number => Expr {
                kind: ExprKind::Number(part.as_str().to_string()),
                span: pspan,
            },
            Rule::ident => Expr {
                kind: ExprKind::Name(part.as_str().to_string()),
                span: pspan,
            },
            Rule::expr => expr(part)?,
            Rule::apply => {
                let mut a = part.into_inner();
                let name = a.next().expect("function name");
                let f = Function::from_name(name.as_str()).ok_or_else(|| {
                    let known: Vec<&str> = Function::ALL.iter().map(|f| f.name()).collect();
                    Diagnostic::error(
                        format!("unknown function `{}`", name.as_str()),
                        span_of(&name),
                        "not a function",
                    )
                    .with_note(format!("expressions may call {}", known.join(", ")))
                })?;
                let arg = expr(a.next().expect("argument"))?;
                Expr {
                    kind: ExprKind::Apply(f, Box::new(arg)),
                    span: pspan,
                }
            }
            other => unreachable!("invariant: unexpected {other:?} in a factor"),
        });
    }
    let mut x = x.expect("invariant: a factor has an operand");
    for _ in 0..negations {
        x = Expr {
            kind: ExprKind::Neg(Box::new(x)),
            span,
        };
    }
    Ok(x)
}
