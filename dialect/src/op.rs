//! The op set: one enum variant per op, attributes as typed fields.
//!
//! Every `match` on [`OpKind`] in the verifier, interpreter and passes is exhaustive, so a new op
//! does not compile until every rule table handles it. Shapes are static; broadcasting follows
//! NumPy (align trailing axes, size 1 stretches).

use crate::ir::{Block, FuncId, ValueId};

/// A float attribute, equal by bits: a NaN fill (poisoned bubbles) equals itself, so the
/// round-trip law holds for every module.
#[derive(Clone, Copy, Debug)]
pub struct Float(pub f64);

impl PartialEq for Float {
    fn eq(&self, other: &Float) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Tanh,
    Sigmoid,
    Relu,
    /// The tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu,
    Sqrt,
    Rsqrt,
    /// Radians; rotary position embeddings.
    Sin,
    Cos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// On i32: division rounded toward negative infinity.
    Div,
    Max,
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpPred {
    Lt,
    Le,
    Eq,
    Gt,
    Ge,
    Ne,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    Unary {
        op: UnaryOp,
        x: ValueId,
    },
    /// Elementwise with broadcasting.
    Binary {
        op: BinaryOp,
        lhs: ValueId,
        rhs: ValueId,
    },
    /// Elementwise comparison with broadcasting; the result is i1.
    Compare {
        pred: CmpPred,
        lhs: ValueId,
        rhs: ValueId,
    },
    /// `cond ? on_true : on_false`, elementwise with broadcasting.
    Select {
        cond: ValueId,
        on_true: ValueId,
        on_false: ValueId,
    },
    /// `[..., m, k] x [..., k, n] -> [..., m, n]`, batch axes broadcast; f32 accumulation.
    /// With a `mask` (i1 over the result's first axis, which must be a batch axis), entries
    /// whose mask is false are `-0.0` (the additive identity: adding them changes no bit) and
    /// need not be computed: this is how the GPipe loop predicates bubble slots away.
    MatMul {
        lhs: ValueId,
        rhs: ValueId,
        mask: Option<ValueId>,
    },
    /// Result axis `i` is input axis `perm[i]`.
    Transpose {
        x: ValueId,
        perm: Vec<usize>,
    },
    /// Same elements, row-major, in the result type's shape.
    Reshape {
        x: ValueId,
    },
    /// NumPy broadcast to the result type's shape.
    Broadcast {
        x: ValueId,
    },
    /// Change of dtype; values are rounded to the result dtype.
    Convert {
        x: ValueId,
    },
    /// Static slice `start..end` on every axis.
    Slice {
        x: ValueId,
        start: Vec<u64>,
        end: Vec<u64>,
    },
    Concat {
        xs: Vec<ValueId>,
        axis: usize,
    },
    /// Reduction over `axes`, which are removed from the shape.
    Reduce {
        op: ReduceOp,
        x: ValueId,
        axes: Vec<usize>,
    },
    /// `eˣ / Σ eˣ` along `axis`, or with `log` its logarithm, `x − max − log Σ e^(x − max)`.
    Softmax {
        x: ValueId,
        axis: usize,
        log: bool,
    },
    /// `(x - mean) / sqrt(var + eps)` over `axis` (biased variance, no affine part).
    LayerNorm {
        x: ValueId,
        axis: usize,
        eps: Float,
    },
    /// The result type filled with the index along `axis`.
    Iota {
        axis: usize,
    },
    /// The result type filled with `value`.
    Constant {
        value: Float,
    },
    /// `low` and `high` slices of `fill` added along `axis`.
    Pad {
        x: ValueId,
        axis: usize,
        low: u64,
        high: u64,
        fill: Float,
    },
    /// Every slice along `axis` moves up by one; slice 0 becomes `fill`; the last drops out.
    Shift {
        x: ValueId,
        axis: usize,
        fill: Float,
    },
    /// Dynamic index: `out[p.., r..] = x[p.., index[p..], r..]`, where `p` are the axes before
    /// `axis` and `index` (i32) has exactly those axes. With `axis = 0`, `index` is a scalar.
    Index {
        x: ValueId,
        index: ValueId,
        axis: usize,
    },
    /// Rows of a table by integer ids (an embedding lookup):
    /// `out[p.., q.., r..] = table[p.., ids[p.., q..], r..]`, where `p` are the `axis` axes that
    /// `table` and `ids` (i32) share, `q` the rest of `ids`' axes and `r` those of a row. Ids
    /// out of range are clamped into it, as XLA does.
    Gather {
        table: ValueId,
        ids: ValueId,
        axis: usize,
    },
    /// `x` with the slice that [`OpKind::Index`] would read replaced by `update`.
    Update {
        x: ValueId,
        update: ValueId,
        index: ValueId,
        axis: usize,
    },
    /// This process's rank, `0..ranks` (an i32 scalar). Only `shard-stages` creates it.
    Rank,
    /// The ring exchange of a program sharded over ranks: the result is the operand of the
    /// previous rank (rank `ranks - 1` for rank 0), or with `reverse` (text: `from = next`) of
    /// the next rank, the direction of the backward pass; with one rank, the operand itself.
    Exchange {
        x: ValueId,
        reverse: bool,
    },
    /// Call of another function of the module; its parameters are its own. With `on` (an `i1`
    /// scalar; text `call_if @f, %on, %x`) the callee runs only where `on` is true, and
    /// elsewhere the results are `-0.0` (integers 0): the additive identity, so that the
    /// gradients of a call that did not run add nothing. `embed-head` and `loss` use it to run
    /// a model's ends only on the ranks that hold them.
    Call {
        callee: FuncId,
        args: Vec<ValueId>,
        on: Option<ValueId>,
    },
    /// `trips` iterations of `body`; body arguments are the iteration number (i32 scalar) and
    /// the carried values, which start as `inits`; the results are the last carried values.
    Loop {
        trips: u64,
        inits: Vec<ValueId>,
        body: Block,
    },
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 12] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
    ];
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
        }
    }

    /// What it computes, for the language reference.
    pub fn summary(self) -> &'static str {
        match self {
            UnaryOp::Neg => "−x",
            UnaryOp::Abs => "|x|",
            UnaryOp::Exp => "eˣ",
            UnaryOp::Log => "natural logarithm",
            UnaryOp::Tanh => "hyperbolic tangent",
            UnaryOp::Sigmoid => "1 / (1 + e⁻ˣ)",
            UnaryOp::Relu => "max(x, 0)",
            UnaryOp::Gelu => "GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))",
            UnaryOp::Sqrt => "√x",
            UnaryOp::Rsqrt => "1 / √x",
            UnaryOp::Sin => "sine of x radians (the C library's `sinf` on the CPU)",
            UnaryOp::Cos => "cosine of x radians (the C library's `cosf` on the CPU)",
        }
    }
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 6] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Max,
        BinaryOp::Min,
    ];
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
        }
    }

    /// What it computes, for the language reference.
    pub fn summary(self) -> &'static str {
        match self {
            BinaryOp::Add => "x + y",
            BinaryOp::Sub => "x − y",
            BinaryOp::Mul => "x · y",
            BinaryOp::Div => "x / y; on i32 rounded toward −∞ (floor division)",
            BinaryOp::Max => "the larger; NaN if either is NaN",
            BinaryOp::Min => "the smaller; NaN if either is NaN",
        }
    }
}

impl CmpPred {
    pub const ALL: [CmpPred; 6] = [
        CmpPred::Lt,
        CmpPred::Le,
        CmpPred::Eq,
        CmpPred::Gt,
        CmpPred::Ge,
        CmpPred::Ne,
    ];
    pub fn name(self) -> &'static str {
        match self {
            CmpPred::Lt => "lt",
            CmpPred::Le => "le",
            CmpPred::Eq => "eq",
            CmpPred::Gt => "gt",
            CmpPred::Ge => "ge",
            CmpPred::Ne => "ne",
        }
    }

    /// What it computes, for the language reference.
    pub fn summary(self) -> &'static str {
        match self {
            CmpPred::Lt => "x < y",
            CmpPred::Le => "x ≤ y",
            CmpPred::Eq => "x = y",
            CmpPred::Gt => "x > y",
            CmpPred::Ge => "x ≥ y",
            CmpPred::Ne => "x ≠ y",
        }
    }
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max];
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Mean => "reduce_mean",
            ReduceOp::Max => "reduce_max",
        }
    }

    /// What it computes, for the language reference.
    pub fn summary(self) -> &'static str {
        match self {
            ReduceOp::Sum => "the sum over `axes`, which are removed",
            ReduceOp::Mean => "the mean over `axes`, which are removed",
            ReduceOp::Max => "the largest element over `axes`, which are removed",
        }
    }
}

impl OpKind {
    /// The op's name in the text format.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Unary { op, .. } => op.name(),
            OpKind::Binary { op, .. } => op.name(),
            OpKind::Compare { pred, .. } => pred.name(),
            OpKind::Reduce { op, .. } => op.name(),
            OpKind::Select { .. } => "select",
            OpKind::MatMul { .. } => "matmul",
            OpKind::Transpose { .. } => "transpose",
            OpKind::Reshape { .. } => "reshape",
            OpKind::Broadcast { .. } => "broadcast",
            OpKind::Convert { .. } => "convert",
            OpKind::Slice { .. } => "slice",
            OpKind::Concat { .. } => "concat",
            OpKind::Softmax { log: false, .. } => "softmax",
            OpKind::Softmax { log: true, .. } => "log_softmax",
            OpKind::LayerNorm { .. } => "layernorm",
            OpKind::Iota { .. } => "iota",
            OpKind::Constant { .. } => "constant",
            OpKind::Pad { .. } => "pad",
            OpKind::Shift { .. } => "shift",
            OpKind::Index { .. } => "index",
            OpKind::Gather { .. } => "gather",
            OpKind::Update { .. } => "update",
            OpKind::Rank => "rank",
            OpKind::Exchange { .. } => "exchange",
            OpKind::Call { on: None, .. } => "call",
            OpKind::Call { on: Some(_), .. } => "call_if",
            OpKind::Loop { .. } => "loop",
        }
    }

    /// The values this op reads, in text order (not those used inside a loop body).
    pub fn operands(&self) -> Vec<ValueId> {
        match self {
            OpKind::Unary { x, .. }
            | OpKind::Transpose { x, .. }
            | OpKind::Reshape { x }
            | OpKind::Broadcast { x }
            | OpKind::Convert { x }
            | OpKind::Slice { x, .. }
            | OpKind::Reduce { x, .. }
            | OpKind::Softmax { x, .. }
            | OpKind::LayerNorm { x, .. }
            | OpKind::Pad { x, .. }
            | OpKind::Shift { x, .. }
            | OpKind::Exchange { x, .. } => vec![*x],
            OpKind::Binary { lhs, rhs, .. }
            | OpKind::Compare { lhs, rhs, .. }
            | OpKind::MatMul {
                lhs,
                rhs,
                mask: None,
            } => vec![*lhs, *rhs],
            OpKind::MatMul {
                lhs,
                rhs,
                mask: Some(m),
            } => vec![*lhs, *rhs, *m],
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => vec![*cond, *on_true, *on_false],
            OpKind::Index { x, index, .. } => vec![*x, *index],
            OpKind::Gather { table, ids, .. } => vec![*table, *ids],
            OpKind::Update {
                x, update, index, ..
            } => vec![*x, *update, *index],
            OpKind::Concat { xs, .. } => xs.clone(),
            OpKind::Call { args, on, .. } => on.iter().chain(args).copied().collect(),
            OpKind::Loop { inits, .. } => inits.clone(),
            OpKind::Iota { .. } | OpKind::Constant { .. } | OpKind::Rank => vec![],
        }
    }

    /// The same op reading `f(v)` for each operand `v`. A loop's body is kept as it is: its
    /// values live in the function's arenas and are remapped by whoever copies the loop.
    pub fn map_operands(&self, mut f: impl FnMut(ValueId) -> ValueId) -> OpKind {
        let mut k = self.clone();
        match &mut k {
            OpKind::Unary { x, .. }
            | OpKind::Transpose { x, .. }
            | OpKind::Reshape { x }
            | OpKind::Broadcast { x }
            | OpKind::Convert { x }
            | OpKind::Slice { x, .. }
            | OpKind::Reduce { x, .. }
            | OpKind::Softmax { x, .. }
            | OpKind::LayerNorm { x, .. }
            | OpKind::Pad { x, .. }
            | OpKind::Shift { x, .. }
            | OpKind::Exchange { x, .. } => *x = f(*x),
            OpKind::Binary { lhs, rhs, .. } | OpKind::Compare { lhs, rhs, .. } => {
                *lhs = f(*lhs);
                *rhs = f(*rhs);
            }
            OpKind::MatMul { lhs, rhs, mask } => {
                *lhs = f(*lhs);
                *rhs = f(*rhs);
                *mask = mask.map(&mut f);
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => {
                *cond = f(*cond);
                *on_true = f(*on_true);
                *on_false = f(*on_false);
            }
            OpKind::Index { x, index, .. } => {
                *x = f(*x);
                *index = f(*index);
            }
            OpKind::Gather { table, ids, .. } => {
                *table = f(*table);
                *ids = f(*ids);
            }
            OpKind::Update {
                x, update, index, ..
            } => {
                *x = f(*x);
                *update = f(*update);
                *index = f(*index);
            }
            OpKind::Call { args, on, .. } => {
                *on = on.map(&mut f);
                args.iter_mut().for_each(|v| *v = f(*v));
            }
            OpKind::Concat { xs, .. } | OpKind::Loop { inits: xs, .. } => {
                xs.iter_mut().for_each(|v| *v = f(*v))
            }
            OpKind::Iota { .. } | OpKind::Constant { .. } | OpKind::Rank => {}
        }
        k
    }

    /// True for ops computed element by element from their operands' elements (NumPy-broadcast),
    /// which a backend may compute inside their consumer's loop (fusion).
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            OpKind::Unary { .. }
                | OpKind::Binary { .. }
                | OpKind::Compare { .. }
                | OpKind::Select { .. }
                | OpKind::Broadcast { .. }
                | OpKind::Convert { .. }
        )
    }

    /// True for ops whose result type is given, not inferred from operands.
    pub fn has_declared_type(&self) -> bool {
        matches!(
            self,
            OpKind::Reshape { .. }
                | OpKind::Broadcast { .. }
                | OpKind::Convert { .. }
                | OpKind::Iota { .. }
                | OpKind::Constant { .. }
        )
    }
}
