//! Compile-time expressions over numbers and dimensions, written wherever the model file gives
//! a size or a number: `f32[d, 3 * d]`, `dims { dh = d / heads }`, `end = [t - 1]`,
//! `constant 1 / sqrt(dh)`. Evaluated while parsing, after `--dim` overrides, so a size that
//! follows `d` in the file follows it on the command line too.
//!
//! Two ways to evaluate: [`Expr::int`] for sizes and integer attributes (whole numbers only; a
//! division must come out even, so `d / heads` with 1000 / 16 is an error, not 62) and
//! [`Expr::float`] for scalars (`constant`, `eps`, `fill`), which also takes decimals and the
//! functions of [`Function`].

use crate::diag::Diagnostic;
use crate::span::Span;
use std::fmt;

/// An expression as written, with the span of every part. Equal when written alike, wherever
/// (spans are metadata, as in `span.rs`).
#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

impl PartialEq for Expr {
    fn eq(&self, other: &Expr) -> bool {
        self.kind == other.kind
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    /// A number as written: `4`, `0.5`, `1e-5`, `nan`, `-inf`.
    Number(String),
    /// A dimension or pipeline setting: `d`, `stages`.
    Name(String),
    Neg(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Apply(Function, Box<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
        }
    }

    fn precedence(self) -> u8 {
        match self {
            BinOp::Add | BinOp::Sub => 1,
            BinOp::Mul | BinOp::Div => 2,
        }
    }
}

/// The functions a scalar expression may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    Sqrt,
    Exp,
    Log,
}

impl Function {
    pub const ALL: [Function; 3] = [Function::Sqrt, Function::Exp, Function::Log];

    pub fn name(self) -> &'static str {
        match self {
            Function::Sqrt => "sqrt",
            Function::Exp => "exp",
            Function::Log => "log",
        }
    }

    pub fn from_name(s: &str) -> Option<Function> {
        Function::ALL.into_iter().find(|f| f.name() == s)
    }

    fn apply(self, x: f64) -> f64 {
        match self {
            Function::Sqrt => x.sqrt(),
            Function::Exp => x.exp(),
            Function::Log => x.ln(),
        }
    }
}

/// The value of a dimension or pipeline setting, by name.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<u64>;

impl Expr {
    pub fn number(v: u64, span: Span) -> Expr {
        Expr {
            kind: ExprKind::Number(v.to_string()),
            span,
        }
    }

    /// The name, if the expression is one bare name (`from = next`, `f32[d]`).
    pub fn as_name(&self) -> Option<&str> {
        match &self.kind {
            ExprKind::Name(n) => Some(n),
            _ => None,
        }
    }

    /// Whether it names a dimension anywhere (so its value depends on `--dim`).
    pub fn names_a_dim(&self) -> bool {
        match &self.kind {
            ExprKind::Number(_) => false,
            ExprKind::Name(_) => true,
            ExprKind::Neg(x) | ExprKind::Apply(_, x) => x.names_a_dim(),
            ExprKind::Binary(_, a, b) => a.names_a_dim() || b.names_a_dim(),
        }
    }

    /// Its value as a whole number: every division exact, no decimals, no functions.
    pub fn int(&self, dims: Lookup) -> Result<i64, Diagnostic> {
        let overflow = || {
            Diagnostic::error(
                format!("`{self}` overflows 64 bits"),
                self.span,
                "integer overflow",
            )
        };
        match &self.kind {
            ExprKind::Number(t) => t.parse::<i64>().map_err(|_| {
                let why = if t.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
                    "integer overflow"
                } else {
                    "expected a whole number"
                };
                Diagnostic::error(
                    format!("`{t}` is not a whole number that fits 64 bits"),
                    self.span,
                    why,
                )
            }),
            ExprKind::Name(n) => dims(n)
                .map(|v| v as i64)
                .ok_or_else(|| unknown(n, self.span)),
            ExprKind::Neg(x) => x.int(dims)?.checked_neg().ok_or_else(overflow),
            ExprKind::Binary(op, a, b) => {
                let (x, y) = (a.int(dims)?, b.int(dims)?);
                let v = match op {
                    BinOp::Add => x.checked_add(y),
                    BinOp::Sub => x.checked_sub(y),
                    BinOp::Mul => x.checked_mul(y),
                    BinOp::Div if y == 0 => {
                        return Err(Diagnostic::error(
                            format!("`{self}` divides by zero"),
                            b.span,
                            "this is 0",
                        ))
                    }
                    BinOp::Div if x % y != 0 => {
                        return Err(Diagnostic::error(
                            format!("`{self}` is {x} / {y}, which is not a whole number"),
                            self.span,
                            "does not divide evenly",
                        )
                        .with_note("sizes and integer attributes are whole numbers"))
                    }
                    BinOp::Div => x.checked_div(y),
                };
                v.ok_or_else(overflow)
            }
            ExprKind::Apply(f, _) => Err(Diagnostic::error(
                format!(
                    "`{}` gives a real number; a whole number is needed here",
                    f.name()
                ),
                self.span,
                "not a whole number",
            )),
        }
    }

    /// Its value as a non-negative whole number (a size, an axis, an index).
    pub fn index(&self, dims: Lookup) -> Result<u64, Diagnostic> {
        let v = self.int(dims)?;
        u64::try_from(v).map_err(|_| {
            let d = Diagnostic::error(
                format!("`{self}` is not a non-negative integer"),
                self.span,
                "expected an integer",
            );
            if self.to_string() == v.to_string() {
                d
            } else {
                d.with_note(format!("it is {v}"))
            }
        })
    }

    /// Its value as a real number (`f64`), dimensions included.
    pub fn float(&self, dims: Lookup) -> Result<f64, Diagnostic> {
        match &self.kind {
            ExprKind::Number(t) => number(t, self.span),
            ExprKind::Name(n) => dims(n)
                .map(|v| v as f64)
                .ok_or_else(|| unknown(n, self.span)),
            ExprKind::Neg(x) => Ok(-x.float(dims)?),
            ExprKind::Binary(op, a, b) => {
                let (x, y) = (a.float(dims)?, b.float(dims)?);
                Ok(match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                })
            }
            ExprKind::Apply(f, x) => Ok(f.apply(x.float(dims)?)),
        }
    }

    fn precedence(&self) -> u8 {
        match &self.kind {
            ExprKind::Binary(op, ..) => op.precedence(),
            _ => 3,
        }
    }
}

fn unknown(name: &str, span: Span) -> Diagnostic {
    Diagnostic::error(format!("unknown dimension `{name}`"), span, "not declared")
}

/// A number as written: decimal, `nan`, `inf`, `-inf`.
pub fn number(text: &str, span: Span) -> Result<f64, Diagnostic> {
    let v = match text {
        "nan" | "-nan" => f64::NAN,
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        t => t
            .parse::<f64>()
            .map_err(|_| Diagnostic::error(format!("`{t}` is not a number"), span, "bad number"))?,
    };
    if v.is_infinite() && !text.contains("inf") {
        return Err(Diagnostic::error(
            format!("`{text}` is too large for a number"),
            span,
            "overflow",
        ));
    }
    Ok(v)
}

/// The canonical text: operators spaced, parentheses only where precedence needs them, so
/// that a printed module parses back to the same expression.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Number(t) | ExprKind::Name(t) => f.write_str(t),
            ExprKind::Neg(x) if x.precedence() < 3 => write!(f, "-({x})"),
            ExprKind::Neg(x) => write!(f, "-{x}"),
            ExprKind::Apply(func, x) => write!(f, "{}({x})", func.name()),
            ExprKind::Binary(op, a, b) => {
                let p = op.precedence();
                if a.precedence() < p {
                    write!(f, "({a})")?;
                } else {
                    write!(f, "{a}")?;
                }
                write!(f, " {} ", op.symbol())?;
                // Left-associative: `a - (b - c)` and `a / (b * c)` keep their parentheses.
                if b.precedence() <= p
                    && !(b.precedence() == p && matches!(op, BinOp::Add | BinOp::Mul))
                {
                    write!(f, "({b})")
                } else {
                    write!(f, "{b}")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(kind: ExprKind) -> Expr {
        Expr {
            kind,
            span: Span::default(),
        }
    }
    fn num(t: &str) -> Expr {
        e(ExprKind::Number(t.into()))
    }
    fn name(t: &str) -> Expr {
        e(ExprKind::Name(t.into()))
    }
    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        e(ExprKind::Binary(op, Box::new(a), Box::new(b)))
    }

    fn dims(n: &str) -> Option<u64> {
        match n {
            "d" => Some(1024),
            "heads" => Some(16),
            _ => None,
        }
    }

    #[test]
    fn whole_numbers_need_even_division_and_known_names() {
        let dh = bin(BinOp::Div, name("d"), name("heads"));
        assert_eq!(dh.int(&dims).unwrap(), 64);
        let odd = bin(BinOp::Div, name("d"), num("3"));
        let err = odd.int(&dims).unwrap_err();
        assert!(err.message.contains("1024 / 3"), "{}", err.message);
        assert!(name("t").int(&dims).is_err());
        let neg = bin(BinOp::Sub, num("1"), name("d"));
        assert!(neg.index(&dims).is_err());
        assert_eq!(neg.int(&dims).unwrap(), -1023);
    }

    #[test]
    fn reals_take_functions_and_decimals() {
        let inv = bin(
            BinOp::Div,
            num("1"),
            e(ExprKind::Apply(Function::Sqrt, Box::new(name("heads")))),
        );
        assert_eq!(inv.float(&dims).unwrap(), 0.25);
        assert!(inv.int(&dims).is_err());
        assert!(num("0.5").int(&dims).is_err());
    }

    #[test]
    fn printing_keeps_only_the_parentheses_precedence_needs() {
        let a = bin(BinOp::Mul, bin(BinOp::Add, name("d"), num("1")), num("2"));
        assert_eq!(a.to_string(), "(d + 1) * 2");
        let b = bin(BinOp::Sub, name("d"), bin(BinOp::Sub, num("2"), num("1")));
        assert_eq!(b.to_string(), "d - (2 - 1)");
        let c = bin(BinOp::Add, name("d"), bin(BinOp::Add, num("2"), num("1")));
        assert_eq!(c.to_string(), "d + 2 + 1");
        let d = bin(
            BinOp::Div,
            name("d"),
            bin(BinOp::Mul, name("heads"), num("2")),
        );
        assert_eq!(d.to_string(), "d / (heads * 2)");
    }
}
