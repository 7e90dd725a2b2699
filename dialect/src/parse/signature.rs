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

/// Who writes an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// Model files may use it.
    User,
    /// Only passes write it (`rank`, `exchange`, `loop`): it depends on how the pipeline is
    /// laid out, which a model file does not know; `ppc check` rejects it in a model.
    Compiler,
}

/// One op as the text format writes it.
#[derive(Clone, Copy)]
pub struct Signature {
    pub name: &'static str,
    pub operands: Arity,
    pub extra: Option<Extra>,
    /// The attributes it takes, in the order a reference lists them (`from` of `exchange` is
    /// optional; the others are required).
    pub attributes: &'static [&'static str],
    /// What it computes, one line of the language reference (`docs/language.md`).
    pub summary: &'static str,
    /// One statement using it, over the reference's example values (`docs/language.md`).
    pub example: &'static str,
    pub writer: Writer,
    build: Build,
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
    /// Which of the declared types are written `f32!`.
    pub pinned: Vec<bool>,
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

/// Every op, in the order the reference and the "unknown op" note list them.
pub fn signatures() -> &'static [Signature] {
    static TABLE: OnceLock<Vec<Signature>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let family = |name, operands, summary, example: String, attributes, build| Signature {
            name,
            operands: Arity::Exactly(operands),
            extra: None,
            attributes,
            summary,
            example: example.leak(),
            writer: Writer::User,
            build,
        };
        let mut t: Vec<Signature> = Vec::new();
        t.extend(BinaryOp::ALL.map(|o| {
            let example = format!("%z = {} %x, %y", o.name());
            family(o.name(), 2, o.summary(), example, &[], binary as Build)
        }));
        t.extend(UnaryOp::ALL.map(|o| {
            let example = format!("%z = {} %x", o.name());
            family(o.name(), 1, o.summary(), example, &[], unary as Build)
        }));
        t.extend(CmpPred::ALL.map(|o| {
            let example = format!("%z = {} %x, %y", o.name());
            family(o.name(), 2, o.summary(), example, &[], compare as Build)
        }));
        let (shaping, rest) = OTHERS.split_at(8);
        t.extend(shaping.iter().copied());
        t.extend(ReduceOp::ALL.map(|o| {
            let example = format!("%z = {} %s, axes = [1] : f32[b, d]", o.name());
            family(
                o.name(),
                1,
                o.summary(),
                example,
                &["axes"],
                reduce as Build,
            )
        }));
        t.extend(rest.iter().copied());
        t
    })
}

/// The op named `name`.
pub fn find(name: &str) -> Option<&'static Signature> {
    signatures().iter().find(|s| s.name == name)
}

/// The ops a model file may use, in the reference's order.
pub fn user_ops() -> impl Iterator<Item = &'static Signature> {
    signatures().iter().filter(|s| s.writer == Writer::User)
}

type Build = fn(&mut dyn FuncScope, &mut Stmt) -> PResult<OpKind>;

/// The ops that are not of a family ([`UnaryOp`], [`BinaryOp`], [`CmpPred`], [`ReduceOp`]).
#[rustfmt::skip]
const OTHERS: [Signature; 23] = [
    Signature { name: "select", operands: Arity::Exactly(3), extra: None, attributes: &[],
        summary: "elementwise `cond ? x : y`, with broadcasting", example: "%z = select %c, %x, %y",
        writer: Writer::User, build: |_, s| {
        let x = s.ids();
        Ok(OpKind::Select { cond: x[0], on_true: x[1], on_false: x[2] })
    }},
    Signature { name: "matmul", operands: Arity::TwoOrThree, extra: None, attributes: &[],
        summary: "matrix product over the last two axes; leading axes broadcast (a third operand, an i1 stage mask, is the compiler's)",
        example: "%z = matmul %x, %w", writer: Writer::User, build: |_, s| {
        let x = s.ids();
        Ok(OpKind::MatMul { lhs: x[0], rhs: x[1], mask: x.get(2).copied() })
    }},
    Signature { name: "transpose", operands: Arity::Exactly(1), extra: None, attributes: &["perm"],
        summary: "axis `i` of the result is axis `perm[i]` of the operand",
        example: "%z = transpose %x, perm = [1, 0] : f32[d, b]", writer: Writer::User, build: |_, s| {
        Ok(OpKind::Transpose { x: s.ids()[0], perm: s.attrs.ints("perm")? })
    }},
    Signature { name: "reshape", operands: Arity::Exactly(1), extra: None, attributes: &[],
        summary: "the same elements in row-major order, in the written type (same element count)",
        example: "%z = reshape %x : f32[b, 2, d / 2]", writer: Writer::User,
        build: |_, s| Ok(OpKind::Reshape { x: s.ids()[0] }) },
    Signature { name: "broadcast", operands: Arity::Exactly(1), extra: None, attributes: &[],
        summary: "repeats the operand to the written type, aligning trailing axes (NumPy rules)",
        example: "%z = broadcast %x : f32[t, b, d]", writer: Writer::User,
        build: |_, s| Ok(OpKind::Broadcast { x: s.ids()[0] }) },
    Signature { name: "convert", operands: Arity::Exactly(1), extra: None, attributes: &[],
        summary: "to the written dtype: floats round to nearest even, to i32 toward zero, to i1 `x ≠ 0`",
        example: "%z = convert %x : bf16[b, d]", writer: Writer::User,
        build: |_, s| Ok(OpKind::Convert { x: s.ids()[0] }) },
    Signature { name: "slice", operands: Arity::Exactly(1), extra: None, attributes: &["start", "end"],
        summary: "elements `start[i] ≤ j < end[i]` along every axis",
        example: "%z = slice %x, start = [0, 0], end = [b, d / 2] : f32[b, d / 2]", writer: Writer::User,
        build: |_, s| {
        let start = s.attrs.ints("start")?.into_iter().map(|v| v as u64).collect();
        let end = s.attrs.ints("end")?.into_iter().map(|v| v as u64).collect();
        Ok(OpKind::Slice { x: s.ids()[0], start, end })
    }},
    Signature { name: "concat", operands: Arity::AtLeastOne, extra: None, attributes: &["axis"],
        summary: "the operands one after another along `axis`",
        example: "%z = concat %x, %y, axis = 1 : f32[b, 2 * d]", writer: Writer::User, build: |_, s| {
        Ok(OpKind::Concat { xs: s.ids(), axis: s.attrs.int("axis")? })
    }},
    Signature { name: "softmax", operands: Arity::Exactly(1), extra: None, attributes: &["axis"],
        summary: "eˣ / Σ eˣ along `axis`, computed after subtracting the maximum",
        example: "%z = softmax %x, axis = 1", writer: Writer::User, build: |_, s| {
        Ok(OpKind::Softmax { x: s.ids()[0], axis: s.attrs.int("axis")?, log: false })
    }},
    Signature { name: "log_softmax", operands: Arity::Exactly(1), extra: None, attributes: &["axis"],
        summary: "x − max − log Σ e^(x − max) along `axis`: the logarithm of `softmax`, without its underflow (a cross entropy's log-probabilities)",
        example: "%z = log_softmax %x, axis = 1", writer: Writer::User, build: |_, s| {
        Ok(OpKind::Softmax { x: s.ids()[0], axis: s.attrs.int("axis")?, log: true })
    }},
    Signature { name: "layernorm", operands: Arity::Exactly(1), extra: None, attributes: &["axis", "eps"],
        summary: "(x − mean) / √(variance + eps) along `axis` (no scale or shift: multiply and add them)",
        example: "%z = layernorm %x, axis = 1, eps = 1e-5", writer: Writer::User, build: |_, s| {
        let axis = s.attrs.int("axis")?;
        Ok(OpKind::LayerNorm { x: s.ids()[0], axis, eps: Float(s.attrs.float("eps")?) })
    }},
    Signature { name: "iota", operands: Arity::Exactly(0), extra: None, attributes: &["axis"],
        summary: "each element's position along `axis`, in the written type",
        example: "%z = iota axis = 1 : i32[b, d]", writer: Writer::User,
        build: |_, s| Ok(OpKind::Iota { axis: s.attrs.int("axis")? }) },
    Signature { name: "constant", operands: Arity::Exactly(0), extra: Some(Extra::Number), attributes: &[],
        summary: "every element the number (an expression over dimensions), rounded to the written dtype",
        example: "%z = constant 1 / sqrt(d) : f32[]", writer: Writer::User, build: |_, s| {
        let (e, _) = s.number.clone().ok_or_else(|| {
            Diagnostic::error("`constant` needs a value, as in `constant 0.5 : f32[d]`", s.span, "no value")
        })?;
        Ok(OpKind::Constant { value: Float(e.float(&lookup(&s.attrs.dims))?) })
    }},
    Signature { name: "pad", operands: Arity::Exactly(1), extra: None, attributes: &["axis", "low", "high", "fill"],
        summary: "`low` elements of `fill` before and `high` after, along `axis`",
        example: "%z = pad %x, axis = 1, low = 1, high = 0, fill = 0 : f32[b, d + 1]", writer: Writer::User,
        build: |_, s| {
        let a = &mut s.attrs;
        let (axis, low, high) = (a.int("axis")?, a.int("low")? as u64, a.int("high")? as u64);
        Ok(OpKind::Pad { x: s.ids()[0], axis, low, high, fill: Float(s.attrs.float("fill")?) })
    }},
    Signature { name: "shift", operands: Arity::Exactly(1), extra: None, attributes: &["axis", "fill"],
        summary: "moves every element one place up `axis` (element i to i + 1); the first becomes `fill`, the last is dropped",
        example: "%z = shift %s, axis = 1, fill = 0", writer: Writer::User, build: |_, s| {
        let axis = s.attrs.int("axis")?;
        Ok(OpKind::Shift { x: s.ids()[0], axis, fill: Float(s.attrs.float("fill")?) })
    }},
    Signature { name: "index", operands: Arity::Exactly(2), extra: None, attributes: &["axis"],
        summary: "the slice at position `k` along `axis`, one i32 `k` per entry of the axes before it; positions out of range are clamped into the axis (as XLA does)",
        example: "%z = index %s, %k, axis = 1 : f32[b, d]", writer: Writer::User, build: |_, s| {
        let x = s.ids();
        Ok(OpKind::Index { x: x[0], index: x[1], axis: s.attrs.int("axis")? })
    }},
    Signature { name: "gather", operands: Arity::Exactly(2), extra: None, attributes: &["axis"],
        summary: "rows of a table by i32 ids (an embedding lookup): `table[ids[q..], r..]`; with `axis = n`, table and ids share their first n axes; ids out of range are clamped into it",
        example: "%z = gather %w, %ids, axis = 0 : f32[b, t, d]", writer: Writer::User, build: |_, s| {
        let x = s.ids();
        Ok(OpKind::Gather { table: x[0], ids: x[1], axis: s.attrs.int("axis")? })
    }},
    Signature { name: "update", operands: Arity::Exactly(3), extra: None, attributes: &["axis"],
        summary: "the operand with the slice at position `k` along `axis` replaced, positions as `index` reads them",
        example: "%z = update %s, %x, %k, axis = 1", writer: Writer::User, build: |_, s| {
        let x = s.ids();
        Ok(OpKind::Update { x: x[0], update: x[1], index: x[2], axis: s.attrs.int("axis")? })
    }},
    Signature { name: "rank", operands: Arity::Exactly(0), extra: None, attributes: &[],
        summary: "this process's rank under `mpirun`, as i32",
        example: "%r = rank : i32[]", writer: Writer::Compiler, build: |_, _| Ok(OpKind::Rank) },
    Signature { name: "exchange", operands: Arity::Exactly(1), extra: None, attributes: &["from"],
        summary: "sends the operand to the next rank and returns the previous rank's (`from = next`: the other way)",
        example: "%z = exchange %x", writer: Writer::Compiler, build: exchange },
    Signature { name: "call", operands: Arity::Any, extra: Some(Extra::Function), attributes: &[],
        summary: "the results of a function defined earlier in the file, on these operands; its parameters are its own (shared by every call)",
        example: "%z = call @block, %x", writer: Writer::User, build: call },
    Signature { name: "call_if", operands: Arity::AtLeastOne, extra: Some(Extra::Function), attributes: &[],
        summary: "`call` where the first operand (an i1 scalar) is true; elsewhere the results are -0.0 (integers 0) and the function does not run",
        example: "%z = call_if @block, %on, %x", writer: Writer::Compiler, build: call },
    Signature { name: "loop", operands: Arity::Any, extra: Some(Extra::Body), attributes: &["trips"],
        summary: "runs the body `trips` times on carried values",
        example: "%z = loop %x, trips = 2 { ^body(%i, %v): yield %v }", writer: Writer::Compiler, build: loop_ },
];

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
    let mut args = s.ids();
    let on = (s.op() == "call_if").then(|| args.remove(0));
    Ok(OpKind::Call {
        callee: fb.callee(&callee, span)?,
        args,
        on,
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
