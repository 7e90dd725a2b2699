//! The op table: every op of the text format once, with its operands, what else its statement
//! takes, its attributes and how it is built. The parser looks ops up here (`func.rs`), the
//! "unknown op" note and the conformance suite list it. The printer names ops by
//! [`OpKind::name`]; the round-trip tests (print, then parse) hold the two to the same names.

use super::attrs::{lookup, Args};
use super::syntax::{PResult, Rule, MAX_PIPELINE_SETTING};
use crate::diag::Diagnostic;
use crate::expr::Expr;
use crate::ir::{Block, FuncId, ValueId};
use crate::op::{BinaryOp, CmpPred, Float, OpKind, ReduceOp, UnaryOp};
use crate::span::Span;
use crate::types::Type;
use pest::iterators::Pair;
use std::sync::OnceLock;

/// How many value operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    Exactly(usize),
    /// `matmul`: two, or three with a stage mask.
    TwoOrThree,
    /// `concat`.
    AtLeastOne,
    /// `call` and `loop`: as many as the callee or the body takes.
    Any,
}

/// What a statement takes besides value operands and attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extra {
    /// A number: `constant 0.5 : f32[d]`.
    Number,
    /// A function: `call @stage, %x`.
    Function,
    /// A body: `loop %x { trips = 4 } { ^body(%i, %x): ... yield %y }`.
    Body,
}

/// One op as the text format writes it.
pub struct Signature {
    pub name: &'static str,
    pub operands: Arity,
    pub extra: Option<Extra>,
    /// The attributes it takes, in the order a reference lists them (`from` of `exchange` is
    /// optional; the others are required).
    pub attributes: &'static [&'static str],
    build: fn(&mut dyn FuncScope, &mut Stmt) -> PResult<OpKind>,
}

/// What building an op needs of the function being parsed: `call`'s callee and `loop`'s body.
pub(super) trait FuncScope {
    /// The function `@name` (written at `span`), defined before this one.
    fn callee(&self, name: &str, span: Span) -> PResult<FuncId>;
    /// A loop body carrying `inits`, parsed in a scope of its own.
    fn region(&mut self, r: Pair<Rule>, inits: &[ValueId]) -> PResult<Block>;
}

/// One op statement as written, before its op is built.
pub(super) struct Stmt<'i> {
    pub span: Span,
    pub results: Vec<Pair<'i, Rule>>,
    pub name_span: Span,
    pub operands: Vec<(ValueId, Span)>,
    pub attrs: Args<'i>,
    /// A value written as an expression: `constant 1 / sqrt(dh)`.
    pub number: Option<(Expr, Span)>,
    pub symbol: Option<(String, Span)>,
    pub declared: Vec<(Type, Span)>,
    pub region: Option<Pair<'i, Rule>>,
}

impl Stmt<'_> {
    pub fn op(&self) -> &str {
        self.attrs.op
    }

    pub fn ids(&self) -> Vec<ValueId> {
        self.operands.iter().map(|(v, _)| *v).collect()
    }
}

impl Signature {
    /// Checks the operand count, builds the op and checks that no attribute is left over.
    pub(super) fn build(&self, fb: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
        self.check_arity(s)?;
        let kind = (self.build)(fb, s)?;
        debug_assert!(
            s.attrs
                .used
                .iter()
                .all(|k| self.attributes.contains(&k.as_str())),
            "`{}` reads attributes {:?} that its signature does not list",
            self.name,
            s.attrs.used
        );
        s.attrs.finish()?;
        Ok(kind)
    }

    fn check_arity(&self, s: &Stmt) -> PResult<()> {
        let got = s.operands.len();
        let n = match self.operands {
            Arity::Exactly(n) if got != n => n,
            Arity::TwoOrThree if got != 2 && got != 3 => 2,
            Arity::AtLeastOne if got == 0 => {
                return Err(Diagnostic::error(
                    format!("`{}` needs at least one operand", self.name),
                    s.span,
                    "no operands",
                ))
            }
            _ => return Ok(()),
        };
        Err(Diagnostic::error(
            format!(
                "`{}` takes {n} operand{}, got {got}",
                self.name,
                if n == 1 { "" } else { "s" },
            ),
            s.span,
            "wrong number of operands",
        ))
    }
}

/// Every op, in the order the "unknown op" note lists them.
pub fn signatures() -> &'static [Signature] {
    static TABLE: OnceLock<Vec<Signature>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let family = |name, operands, attributes: &'static [&'static str], build| Signature {
            name,
            operands: Arity::Exactly(operands),
            extra: None,
            attributes,
            build,
        };
        let mut t: Vec<Signature> = Vec::new();
        t.extend(BinaryOp::ALL.map(|o| family(o.name(), 2, &[], binary)));
        t.extend(UnaryOp::ALL.map(|o| family(o.name(), 1, &[], unary)));
        t.extend(CmpPred::ALL.map(|o| family(o.name(), 2, &[], compare)));
        let (shaping, rest) = OTHERS.split_at(8);
        t.extend(shaping.iter().map(Signature::of));
        t.extend(ReduceOp::ALL.map(|o| family(o.name(), 1, &["axes"], reduce)));
        t.extend(rest.iter().map(Signature::of));
        t
    })
}

/// The op named `name`.
pub fn find(name: &str) -> Option<&'static Signature> {
    signatures().iter().find(|s| s.name == name)
}

type Build = fn(&mut dyn FuncScope, &mut Stmt) -> PResult<OpKind>;

/// One op of [`OTHERS`]: name, operands, extra, attributes, builder.
type Row = (
    &'static str,
    Arity,
    Option<Extra>,
    &'static [&'static str],
    Build,
);

/// The ops that are not of a family ([`UnaryOp`], [`BinaryOp`], [`CmpPred`], [`ReduceOp`]).
#[rustfmt::skip]
const OTHERS: [Row; 20] = [
    ("select", Arity::Exactly(3), None, &[], |_, s| {
        let x = s.ids();
        Ok(OpKind::Select { cond: x[0], on_true: x[1], on_false: x[2] })
    }),
    ("matmul", Arity::TwoOrThree, None, &[], |_, s| {
        let x = s.ids();
        Ok(OpKind::MatMul { lhs: x[0], rhs: x[1], mask: x.get(2).copied() })
    }),
    ("transpose", Arity::Exactly(1), None, &["perm"], |_, s| {
        Ok(OpKind::Transpose { x: s.ids()[0], perm: s.attrs.ints("perm")? })
    }),
    ("reshape", Arity::Exactly(1), None, &[], |_, s| Ok(OpKind::Reshape { x: s.ids()[0] })),
    ("broadcast", Arity::Exactly(1), None, &[], |_, s| Ok(OpKind::Broadcast { x: s.ids()[0] })),
    ("convert", Arity::Exactly(1), None, &[], |_, s| Ok(OpKind::Convert { x: s.ids()[0] })),
    ("slice", Arity::Exactly(1), None, &["start", "end"], |_, s| {
        let start = s.attrs.ints("start")?.into_iter().map(|v| v as u64).collect();
        let end = s.attrs.ints("end")?.into_iter().map(|v| v as u64).collect();
        Ok(OpKind::Slice { x: s.ids()[0], start, end })
    }),
    ("concat", Arity::AtLeastOne, None, &["axis"], |_, s| {
        Ok(OpKind::Concat { xs: s.ids(), axis: s.attrs.int("axis")? })
    }),
    ("softmax", Arity::Exactly(1), None, &["axis"], |_, s| {
        Ok(OpKind::Softmax { x: s.ids()[0], axis: s.attrs.int("axis")? })
    }),
    ("layernorm", Arity::Exactly(1), None, &["axis", "eps"], |_, s| {
        let axis = s.attrs.int("axis")?;
        Ok(OpKind::LayerNorm { x: s.ids()[0], axis, eps: Float(s.attrs.float("eps")?) })
    }),
    ("iota", Arity::Exactly(0), None, &["axis"], |_, s| Ok(OpKind::Iota { axis: s.attrs.int("axis")? })),
    ("constant", Arity::Exactly(0), Some(Extra::Number), &[], |_, s| {
        let (e, _) = s.number.clone().ok_or_else(|| {
            Diagnostic::error("`constant` needs a value, as in `constant 0.5 : f32[d]`", s.span, "no value")
        })?;
        Ok(OpKind::Constant { value: Float(e.float(&lookup(&s.attrs.dims))?) })
    }),
    ("pad", Arity::Exactly(1), None, &["axis", "low", "high", "fill"], |_, s| {
        let a = &mut s.attrs;
        let (axis, low, high) = (a.int("axis")?, a.int("low")? as u64, a.int("high")? as u64);
        Ok(OpKind::Pad { x: s.ids()[0], axis, low, high, fill: Float(s.attrs.float("fill")?) })
    }),
    ("shift", Arity::Exactly(1), None, &["axis", "fill"], |_, s| {
        let axis = s.attrs.int("axis")?;
        Ok(OpKind::Shift { x: s.ids()[0], axis, fill: Float(s.attrs.float("fill")?) })
    }),
    ("index", Arity::Exactly(2), None, &["axis"], |_, s| {
        let x = s.ids();
        Ok(OpKind::Index { x: x[0], index: x[1], axis: s.attrs.int("axis")? })
    }),
    ("update", Arity::Exactly(3), None, &["axis"], |_, s| {
        let x = s.ids();
        Ok(OpKind::Update { x: x[0], update: x[1], index: x[2], axis: s.attrs.int("axis")? })
    }),
    ("rank", Arity::Exactly(0), None, &[], |_, _| Ok(OpKind::Rank)),
    ("exchange", Arity::Exactly(1), None, &["from"], exchange),
    ("call", Arity::Any, Some(Extra::Function), &[], call),
    ("loop", Arity::Any, Some(Extra::Body), &["trips"], loop_),
];

impl Signature {
    fn of(&(name, operands, extra, attributes, build): &Row) -> Signature {
        Signature {
            name,
            operands,
            extra,
            attributes,
            build,
        }
    }
}

fn unary(_: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
    let op = UnaryOp::ALL.into_iter().find(|o| o.name() == s.op());
    Ok(OpKind::Unary {
        op: op.expect("invariant: in the table by its name"),
        x: s.ids()[0],
    })
}

fn binary(_: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
    let op = BinaryOp::ALL.into_iter().find(|o| o.name() == s.op());
    let x = s.ids();
    Ok(OpKind::Binary {
        op: op.expect("invariant: in the table by its name"),
        lhs: x[0],
        rhs: x[1],
    })
}

fn compare(_: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
    let pred = CmpPred::ALL.into_iter().find(|o| o.name() == s.op());
    let x = s.ids();
    Ok(OpKind::Compare {
        pred: pred.expect("invariant: in the table by its name"),
        lhs: x[0],
        rhs: x[1],
    })
}

fn reduce(_: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
    let op = ReduceOp::ALL.into_iter().find(|o| o.name() == s.op());
    Ok(OpKind::Reduce {
        op: op.expect("invariant: in the table by its name"),
        x: s.ids()[0],
        axes: s.attrs.ints("axes")?,
    })
}

fn exchange(_: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
    let reverse = match s.attrs.ident_opt("from")? {
        None => false,
        Some((w, _)) if w == "previous" => false,
        Some((w, _)) if w == "next" => true,
        Some((w, span)) => {
            return Err(Diagnostic::error(
                format!("`from` is `previous` or `next`, not `{w}`"),
                span,
                "not a neighbour",
            ))
        }
    };
    Ok(OpKind::Exchange {
        x: s.ids()[0],
        reverse,
    })
}

fn call(fb: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
    let (callee, span) = s.symbol.clone().ok_or_else(|| {
        Diagnostic::error(
            "`call` needs a function, as in `call @stage, %x`",
            s.span,
            "no callee",
        )
    })?;
    Ok(OpKind::Call {
        callee: fb.callee(&callee, span)?,
        args: s.ids(),
    })
}

fn loop_(fb: &mut dyn FuncScope, s: &mut Stmt) -> PResult<OpKind> {
    let trips = s.attrs.int("trips")? as u64;
    if trips == 0 || trips > MAX_PIPELINE_SETTING * MAX_PIPELINE_SETTING {
        return Err(Diagnostic::error(
            format!("loop trip count {trips} is out of range"),
            s.span,
            "bad trip count",
        ));
    }
    let r = s.region.take().ok_or_else(|| {
        Diagnostic::error(
            "`loop` needs a body `{ ^body(...): ... yield ... }`",
            s.span,
            "no body",
        )
    })?;
    let inits = s.ids();
    let body = fb.region(r, &inits)?;
    Ok(OpKind::Loop { trips, inits, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_are_unique_and_each_parses_as_an_op() {
        let names: Vec<&str> = signatures().iter().map(|s| s.name).collect();
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "a name twice in {names:?}");
        for name in names {
            // Whatever else is wrong with the statement, the name itself is known.
            let text = format!(
                "dims {{ b = 2 }}\npipeline {{ stages = 1, microbatches = 1 }}\ninput f32[b]\n\
                 func @layer(%x: f32[b]) -> f32[b] {{\n  %y = {name} %x\n  return %x\n}}\n"
            );
            if let Err(d) = crate::parse(&text, &crate::Overrides::default()) {
                assert!(
                    !d.iter().any(|d| d.message.starts_with("unknown op")),
                    "`{name}` is listed but not parsed"
                );
            }
        }
    }
}
