//! The VJP rules of `autodiff`: for each op, the cotangents of its float operands given the
//! cotangent `d` of its result, built as ppc ops; and which primal values each rule reads (what
//! a reverse loop must recompute or keep).
//!
//! Zero cotangents are `-0.0`, the additive identity: adding a structural zero (a bubble slot,
//! the stages a select did not pick, the slices an `index` did not read) never changes a bit,
//! which is what makes pipelined gradients equal the sequential model's bit for bit.
//! `loop`, `call` and `index` (whose transpose adds into an accumulator's slice) are not here:
//! they need the whole pass (`autodiff.rs`).

use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{Block, Func, Op, ValueId};
use ppc_dialect::op::{BinaryOp, CmpPred, Float, OpKind, ReduceOp, UnaryOp};
use ppc_dialect::{DType, Dim, Type};
use std::collections::{HashMap, HashSet};

/// Source value → the value that holds it in the function being built.
pub type Env = HashMap<ValueId, ValueId>;

/// The values of `f` whose cotangent is zero by construction: constants, iotas and what is
/// computed from them alone (a scale `1 / sqrt(dh)`, a mask, RoPE's angle tables), not from
/// an argument, a parameter, a loop's carried value or a call's result. No rule computes
/// their cotangents, so none reads what only those would need: `mul %s, %scale` does not
/// keep `%s` for the backward.
pub fn fixed_values(f: &Func) -> HashSet<ValueId> {
    fn walk(f: &Func, block: &Block, fixed: &mut HashSet<ValueId>) {
        for &id in &block.ops {
            let op = &f.ops[id];
            let operands = op.kind.operands();
            let made_of_fixed = match &op.kind {
                OpKind::Constant { .. } | OpKind::Iota { .. } => true,
                OpKind::Loop { body, .. } => {
                    walk(f, body, fixed);
                    false
                }
                OpKind::Call { .. } | OpKind::Exchange { .. } | OpKind::Rank => false,
                _ => !operands.is_empty() && operands.iter().all(|v| fixed.contains(v)),
            };
            if made_of_fixed {
                fixed.extend(&op.results);
            }
        }
    }
    let mut fixed = HashSet::new();
    walk(f, &f.body, &mut fixed);
    fixed
}

/// The primal values (operands or the result) that `op`'s rule reads, besides shapes: none
/// that only the cotangent of a [`fixed_values`] operand would need.
pub fn reads(f: &Func, fixed: &HashSet<ValueId>, op: &Op) -> Vec<ValueId> {
    match &op.kind {
        OpKind::Call { .. } => return op.kind.operands(),
        // A nested loop is recomputed whole, with its own tapes.
        OpKind::Loop { .. } => return op.results.clone(),
        _ => {}
    }
    let r = op.results[0];
    if !f.ty(r).dtype.is_float() {
        return vec![];
    }
    match &op.kind {
        OpKind::Unary { op: u, x } => match u {
            UnaryOp::Neg => vec![],
            UnaryOp::Abs
            | UnaryOp::Log
            | UnaryOp::Relu
            | UnaryOp::Gelu
            | UnaryOp::Sin
            | UnaryOp::Cos => vec![*x],
            UnaryOp::Exp | UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Sqrt | UnaryOp::Rsqrt => {
                vec![r]
            }
        },
        OpKind::Binary { op: bo, lhs, rhs } => match bo {
            BinaryOp::Add | BinaryOp::Sub => vec![],
            // `d lhs = d * rhs`, `d rhs = d * lhs`.
            BinaryOp::Mul => partners(*lhs, *rhs, fixed),
            BinaryOp::Max | BinaryOp::Min => vec![*lhs, *rhs],
            // `d lhs = d / rhs`, `d rhs = -d * r / rhs`.
            BinaryOp::Div => match (fixed.contains(lhs), fixed.contains(rhs)) {
                (true, true) => vec![],
                (false, true) => vec![*rhs],
                (_, false) => vec![*rhs, r],
            },
        },
        OpKind::Select { cond, .. } => vec![*cond],
        // `d lhs = d · rhsᵀ`, `d rhs = lhsᵀ · d`, both masked alike.
        OpKind::MatMul { lhs, rhs, mask } => {
            let mut read = partners(*lhs, *rhs, fixed);
            read.extend(*mask);
            read
        }
        OpKind::Reduce {
            op: ReduceOp::Max,
            x,
            ..
        } => vec![*x, r],
        OpKind::Softmax { .. } => vec![r],
        OpKind::LayerNorm { x, .. } => vec![*x, r],
        OpKind::Index { index, .. } | OpKind::Update { index, .. } => vec![*index],
        OpKind::Gather { ids, .. } => vec![*ids],
        _ => vec![],
    }
}

/// What a product's rule reads: each operand's partner, where the operand's cotangent (the
/// cotangent of the result times the partner) is built.
fn partners(lhs: ValueId, rhs: ValueId, fixed: &HashSet<ValueId>) -> Vec<ValueId> {
    [(lhs, rhs), (rhs, lhs)]
        .into_iter()
        .filter(|(of, _)| !fixed.contains(of))
        .map(|(_, partner)| partner)
        .collect()
}

/// If `op` is `select(c, w, x)` with a scalar `c`, `w = update(x, u, i)`, and `w` and `x` read
/// nowhere else in `f` (a pipeline loop writing its outputs where a microbatch left the last
/// stage): that update. Its cotangents are one guarded update ([`guarded_update`]).
pub fn guarding(f: &Func, op: &OpKind) -> Option<OpKind> {
    let &OpKind::Select {
        cond,
        on_true,
        on_false,
    } = op
    else {
        return None;
    };
    if f.ty(cond).rank() != 0 {
        return None; // the common case, a mask: no search for the producer
    }
    let update = f.producer(on_true)?;
    let single = matches!(update.kind, OpKind::Update { x, .. } if x == on_false)
        && f.uses(&f.body, on_true) == 1
        && f.uses(&f.body, on_false) == 2;
    single.then(|| update.kind.clone())
}

/// The cotangents of `select(c, update(x, u, i), x)` ([`guarding`]), given `d`: `u`'s
/// `select(c, index(d, i), -0.0)` and `x`'s `select(c, update(d, -0.0, i), d)`, a guarded
/// update, which the lowering writes as a slice under an `scf.if` (`lower/in_place.rs`). The
/// two ops' own rules give the same bits as whole-buffer selects and an add of `x`'s two
/// parts, one of which is `-0.0` everywhere.
pub fn guarded_update(
    b: &mut Builder,
    f: &Func,
    env: &Env,
    (cond, update): (ValueId, &OpKind),
    d: ValueId,
) -> Result<Vec<(ValueId, ValueId)>, Diagnostic> {
    let &OpKind::Update {
        x,
        update: u,
        index,
        axis,
    } = update
    else {
        unreachable!("invariant: `guarding` gives an update")
    };
    let (c, i) = (env[&cond], env[&index]);
    // The slot is read before it is zeroed, so that the update may be written in place.
    let read = b.op(
        "d",
        OpKind::Index {
            x: d,
            index: i,
            axis,
        },
        None,
    )?;
    let zero = scalar(b, f.ty(u).dtype, -0.0)?;
    let du = select(b, c, read, zero)?;
    let z = zeros(b, f.ty(u))?;
    let zeroed = OpKind::Update {
        x: d,
        update: z,
        index: i,
        axis,
    };
    let zeroed = b.op("d", zeroed, None)?;
    let dx = select(b, c, zeroed, d)?;
    Ok(vec![(x, dx), (u, du)])
}

/// The cotangents `(operand, cotangent)` of `op`'s float operands, given `d`, the cotangent of
/// its result `r`. Operands whose cotangent is zero by construction are left out, and so are
/// `fixed` ones ([`fixed_values`]), whose cotangents are not built.
pub fn rule(
    b: &mut Builder,
    (f, fixed): (&Func, &HashSet<ValueId>),
    env: &Env,
    op: &OpKind,
    r: ValueId,
    d: ValueId,
) -> Result<Vec<(ValueId, ValueId)>, Diagnostic> {
    let p = |v: ValueId| env[&v];
    let ty = |v: ValueId| f.ty(v).clone();
    let want = |v: &ValueId| !fixed.contains(v);
    let dt = f.ty(r).dtype;
    let all = match op {
        OpKind::Unary { op: u, x } => {
            let dx = match u {
                UnaryOp::Neg => neg(b, d)?,
                UnaryOp::Abs => {
                    let z = scalar(b, dt, 0.0)?;
                    let lt = cmp(b, CmpPred::Lt, p(*x), z)?;
                    let nd = neg(b, d)?;
                    select(b, lt, nd, d)?
                }
                UnaryOp::Exp => bin(b, BinaryOp::Mul, d, p(r))?,
                UnaryOp::Log => bin(b, BinaryOp::Div, d, p(*x))?,
                UnaryOp::Tanh => {
                    let rr = bin(b, BinaryOp::Mul, p(r), p(r))?;
                    let one = scalar(b, dt, 1.0)?;
                    let s = bin(b, BinaryOp::Sub, one, rr)?;
                    bin(b, BinaryOp::Mul, d, s)?
                }
                UnaryOp::Sigmoid => {
                    let one = scalar(b, dt, 1.0)?;
                    let s = bin(b, BinaryOp::Sub, one, p(r))?;
                    let rs = bin(b, BinaryOp::Mul, p(r), s)?;
                    bin(b, BinaryOp::Mul, d, rs)?
                }
                UnaryOp::Relu => {
                    let z = scalar(b, dt, 0.0)?;
                    let pos = cmp(b, CmpPred::Gt, p(*x), z)?;
                    let zero = scalar(b, dt, -0.0)?;
                    select(b, pos, d, zero)?
                }
                UnaryOp::Gelu => gelu_grad(b, p(*x), d, dt)?,
                UnaryOp::Sqrt => {
                    let half = scalar(b, dt, 0.5)?;
                    let h = bin(b, BinaryOp::Mul, d, half)?;
                    bin(b, BinaryOp::Div, h, p(r))?
                }
                UnaryOp::Sin => {
                    let c = unary(b, "cos", UnaryOp::Cos, p(*x))?;
                    bin(b, BinaryOp::Mul, d, c)?
                }
                UnaryOp::Cos => {
                    let s = unary(b, "sin", UnaryOp::Sin, p(*x))?;
                    let ns = neg(b, s)?;
                    bin(b, BinaryOp::Mul, d, ns)?
                }
                UnaryOp::Rsqrt => {
                    // d/dx x^(-1/2) = -1/2 r^3.
                    let r2 = bin(b, BinaryOp::Mul, p(r), p(r))?;
                    let r3 = bin(b, BinaryOp::Mul, r2, p(r))?;
                    let c = scalar(b, dt, -0.5)?;
                    let s = bin(b, BinaryOp::Mul, r3, c)?;
                    bin(b, BinaryOp::Mul, d, s)?
                }
            };
            vec![(*x, dx)]
        }
        OpKind::Binary { op: bo, lhs, rhs } => {
            let (dl, dr) = match bo {
                BinaryOp::Add => (want(lhs).then_some(d), want(rhs).then_some(d)),
                BinaryOp::Sub => (
                    want(lhs).then_some(d),
                    want(rhs).then(|| neg(b, d)).transpose()?,
                ),
                BinaryOp::Mul => (
                    want(lhs)
                        .then(|| bin(b, BinaryOp::Mul, d, p(*rhs)))
                        .transpose()?,
                    want(rhs)
                        .then(|| bin(b, BinaryOp::Mul, d, p(*lhs)))
                        .transpose()?,
                ),
                BinaryOp::Div => (
                    want(lhs)
                        .then(|| bin(b, BinaryOp::Div, d, p(*rhs)))
                        .transpose()?,
                    want(rhs)
                        .then(|| {
                            let q = bin(b, BinaryOp::Mul, d, p(r))?;
                            let q = bin(b, BinaryOp::Div, q, p(*rhs))?;
                            neg(b, q)
                        })
                        .transpose()?,
                ),
                // Ties go to the left operand.
                BinaryOp::Max | BinaryOp::Min => {
                    let pred = if *bo == BinaryOp::Max {
                        CmpPred::Ge
                    } else {
                        CmpPred::Le
                    };
                    let left = cmp(b, pred, p(*lhs), p(*rhs))?;
                    let zero = scalar(b, dt, -0.0)?;
                    (
                        Some(select(b, left, d, zero)?),
                        Some(select(b, left, zero, d)?),
                    )
                }
            };
            unbroadcast_each(b, f, [(*lhs, dl), (*rhs, dr)])?
        }
        OpKind::Select {
            cond,
            on_true,
            on_false,
        } => {
            let zero = scalar(b, dt, -0.0)?;
            let dt_ = select(b, p(*cond), d, zero)?;
            let df = select(b, p(*cond), zero, d)?;
            vec![
                (*on_true, unbroadcast(b, dt_, &ty(*on_true))?),
                (*on_false, unbroadcast(b, df, &ty(*on_false))?),
            ]
        }
        OpKind::MatMul { lhs, rhs, mask } => {
            let rt = want(lhs).then(|| swap_last(b, p(*rhs))).transpose()?;
            let lt = want(rhs).then(|| swap_last(b, p(*lhs))).transpose()?;
            let mask = mask.map(p);
            let product =
                |b: &mut Builder, lhs, rhs| b.op("d", OpKind::MatMul { lhs, rhs, mask }, None);
            let dl = rt.map(|rt| product(b, d, rt)).transpose()?;
            let dr = lt.map(|lt| product(b, lt, d)).transpose()?;
            unbroadcast_each(b, f, [(*lhs, dl), (*rhs, dr)])?
        }
        OpKind::Transpose { x, perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &q) in perm.iter().enumerate() {
                inv[q] = i;
            }
            vec![(*x, b.op("d", OpKind::Transpose { x: d, perm: inv }, None)?)]
        }
        OpKind::Reshape { x } => vec![(*x, b.op("d", OpKind::Reshape { x: d }, Some(ty(*x)))?)],
        OpKind::Broadcast { x } => vec![(*x, unbroadcast(b, d, &ty(*x))?)],
        OpKind::Convert { x } if f.ty(*x).dtype.is_float() => {
            vec![(*x, b.op("d", OpKind::Convert { x: d }, Some(ty(*x)))?)]
        }
        OpKind::Slice { x, start, end } => {
            let full = f.ty(*x).shape();
            let mut dx = d;
            for a in 0..full.len() {
                let (low, high) = (start[a], full[a] - end[a]);
                if low > 0 || high > 0 {
                    dx = pad(b, dx, a, low, high)?;
                }
            }
            vec![(*x, dx)]
        }
        OpKind::Concat { xs, axis } => {
            let shape = f.ty(r).shape();
            let mut at = 0;
            let mut out = Vec::new();
            for &x in xs {
                let n = f.ty(x).shape()[*axis];
                out.push((x, slice_axis(b, d, &shape, *axis, at, at + n)?));
                at += n;
            }
            out
        }
        OpKind::Reduce { op: ro, x, axes } => {
            let xt = ty(*x);
            let dk = keep_dims(b, d, &xt, axes)?;
            let dx = match ro {
                ReduceOp::Sum => b.op("d", OpKind::Broadcast { x: dk }, Some(xt))?,
                ReduceOp::Mean => {
                    let n: u64 = axes.iter().map(|&a| xt.shape()[a]).product();
                    let full = b.op("d", OpKind::Broadcast { x: dk }, Some(xt))?;
                    let c = scalar(b, dt, n as f64)?;
                    bin(b, BinaryOp::Div, full, c)?
                }
                // Shared equally by the entries that attain the maximum (as JAX does).
                ReduceOp::Max => {
                    let rk = keep_dims(b, p(r), &xt, axes)?;
                    let at_max = cmp(b, CmpPred::Eq, p(*x), rk)?;
                    let (zero, one) = (scalar(b, dt, -0.0)?, scalar(b, dt, 1.0)?);
                    let hits = select(b, at_max, one, zero)?;
                    let count = b.op(
                        "count",
                        OpKind::Reduce {
                            op: ReduceOp::Sum,
                            x: hits,
                            axes: axes.clone(),
                        },
                        None,
                    )?;
                    let count = keep_dims(b, count, &xt, axes)?;
                    let share = bin(b, BinaryOp::Div, dk, count)?;
                    select(b, at_max, share, zero)?
                }
            };
            vec![(*x, dx)]
        }
        OpKind::Softmax { x, axis, log: true } => {
            // dx = d - exp(y) * sum(d): softmax(x) is exp(y), and no maximum is differentiated.
            let s = reduce(b, ReduceOp::Sum, d, &ty(r), *axis)?;
            let p = unary(b, "p", UnaryOp::Exp, p(r))?;
            let ps = bin(b, BinaryOp::Mul, p, s)?;
            vec![(*x, bin(b, BinaryOp::Sub, d, ps)?)]
        }
        OpKind::Softmax {
            x,
            axis,
            log: false,
        } => {
            // dx = y * (d - sum(d * y)).
            let dy = bin(b, BinaryOp::Mul, d, p(r))?;
            let s = reduce(b, ReduceOp::Sum, dy, &ty(r), *axis)?;
            let c = bin(b, BinaryOp::Sub, d, s)?;
            vec![(*x, bin(b, BinaryOp::Mul, p(r), c)?)]
        }
        OpKind::LayerNorm { x, axis, eps } => {
            // dx = inv * (d - mean(d) - y * mean(d * y)), inv = 1 / sqrt(var + eps).
            let xt = ty(*x);
            let mu = reduce(b, ReduceOp::Mean, p(*x), &xt, *axis)?;
            let xc = bin(b, BinaryOp::Sub, p(*x), mu)?;
            let sq = bin(b, BinaryOp::Mul, xc, xc)?;
            let var = reduce(b, ReduceOp::Mean, sq, &xt, *axis)?;
            let e = scalar(b, dt, eps.0)?;
            let ve = bin(b, BinaryOp::Add, var, e)?;
            let inv = unary(b, "inv", UnaryOp::Rsqrt, ve)?;
            let md = reduce(b, ReduceOp::Mean, d, &xt, *axis)?;
            let dy = bin(b, BinaryOp::Mul, d, p(r))?;
            let mdy = reduce(b, ReduceOp::Mean, dy, &xt, *axis)?;
            let c = bin(b, BinaryOp::Sub, d, md)?;
            let ym = bin(b, BinaryOp::Mul, p(r), mdy)?;
            let c = bin(b, BinaryOp::Sub, c, ym)?;
            vec![(*x, bin(b, BinaryOp::Mul, inv, c)?)]
        }
        OpKind::Pad { x, axis, low, .. } => {
            let shape = f.ty(r).shape();
            let n = f.ty(*x).shape()[*axis];
            let dx = slice_axis(b, d, &shape, *axis, *low, low + n)?;
            b.relabel(dx, f.ty(*x));
            vec![(*x, dx)]
        }
        // The transpose of a shift is the opposite shift, filled with zeros.
        OpKind::Shift { x, axis, .. } => {
            let shape = f.ty(r).shape();
            let n = shape[*axis];
            let dx = if n == 1 {
                zeros(b, &ty(*x))?
            } else {
                let moved = slice_axis(b, d, &shape, *axis, 1, n)?;
                pad(b, moved, *axis, 0, 1)?
            };
            vec![(*x, dx)]
        }
        // `index` and `update` transpose into each other: `update`'s here, `index`'s (an update
        // of the cotangent's slice) in `autodiff.rs`, which adds it into the accumulator.
        OpKind::Update {
            x,
            update,
            index,
            axis,
        } => {
            let z = zeros(b, &ty(*update))?;
            let dx = b.op(
                "d",
                OpKind::Update {
                    x: d,
                    update: z,
                    index: p(*index),
                    axis: *axis,
                },
                None,
            )?;
            let du = b.op(
                "d",
                OpKind::Index {
                    x: d,
                    index: p(*index),
                    axis: *axis,
                },
                None,
            )?;
            vec![(*x, dx), (*update, du)]
        }
        OpKind::Gather { table, ids, axis } => {
            let dt = super::scatter_add::scatter_add(b, f.ty(*table), p(*ids), d, *axis)?;
            vec![(*table, dt)]
        }
        // The transpose of the ring exchange is the exchange the other way round.
        OpKind::Exchange { x, reverse } => {
            let back = OpKind::Exchange {
                x: d,
                reverse: !reverse,
            };
            vec![(*x, b.op("d", back, None)?)]
        }
        OpKind::Convert { .. }
        | OpKind::Compare { .. }
        | OpKind::Iota { .. }
        | OpKind::Constant { .. }
        | OpKind::Rank => vec![],
        OpKind::Index { .. } | OpKind::Call { .. } | OpKind::Loop { .. } => {
            unreachable!("invariant: autodiff differentiates index, calls and loops itself")
        }
    };
    Ok(all.into_iter().filter(|(x, _)| want(x)).collect())
}

/// The cotangents of a binary op's operands, each summed over the axes its operand was
/// broadcast along; `None`: not built ([`fixed_values`]).
fn unbroadcast_each(
    b: &mut Builder,
    f: &Func,
    cotangents: [(ValueId, Option<ValueId>); 2],
) -> Result<Vec<(ValueId, ValueId)>, Diagnostic> {
    let mut out = Vec::new();
    for (x, dx) in cotangents {
        if let Some(dx) = dx {
            out.push((x, unbroadcast(b, dx, f.ty(x))?));
        }
    }
    Ok(out)
}

/// The gradient of the tanh-approximated GELU:
/// `0.5 (1 + th) + 0.5 x (1 - th^2) c (1 + 3 a x^2)`, `th = tanh(c (x + a x^3))`.
fn gelu_grad(b: &mut Builder, x: ValueId, d: ValueId, dt: DType) -> Result<ValueId, Diagnostic> {
    let (c, a) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044715);
    let x2 = bin(b, BinaryOp::Mul, x, x)?;
    let x3 = bin(b, BinaryOp::Mul, x2, x)?;
    let ca = scalar(b, dt, a)?;
    let ax3 = bin(b, BinaryOp::Mul, x3, ca)?;
    let inner = bin(b, BinaryOp::Add, x, ax3)?;
    let cc = scalar(b, dt, c)?;
    let u = bin(b, BinaryOp::Mul, inner, cc)?;
    let th = unary(b, "th", UnaryOp::Tanh, u)?;
    let (one, half) = (scalar(b, dt, 1.0)?, scalar(b, dt, 0.5)?);
    let left = bin(b, BinaryOp::Add, one, th)?;
    let left = bin(b, BinaryOp::Mul, left, half)?;
    let th2 = bin(b, BinaryOp::Mul, th, th)?;
    let sech2 = bin(b, BinaryOp::Sub, one, th2)?;
    let c3a = scalar(b, dt, 3.0 * a)?;
    let p = bin(b, BinaryOp::Mul, x2, c3a)?;
    let p = bin(b, BinaryOp::Add, one, p)?;
    let p = bin(b, BinaryOp::Mul, p, cc)?;
    let right = bin(b, BinaryOp::Mul, sech2, p)?;
    let right = bin(b, BinaryOp::Mul, right, x)?;
    let right = bin(b, BinaryOp::Mul, right, half)?;
    let g = bin(b, BinaryOp::Add, left, right)?;
    bin(b, BinaryOp::Mul, d, g)
}

/// `d` (of a broadcast result's shape) summed back to `to`'s shape.
pub fn unbroadcast(b: &mut Builder, d: ValueId, to: &Type) -> Result<ValueId, Diagnostic> {
    let from = b.ty(d).shape();
    let want = to.shape();
    if from == want {
        return Ok(d);
    }
    let lead = from.len() - want.len();
    let axes: Vec<usize> = (0..from.len())
        .filter(|&a| a < lead || (want[a - lead] == 1 && from[a] != 1))
        .collect();
    let mut v = d;
    if !axes.is_empty() {
        v = b.op(
            "d",
            OpKind::Reduce {
                op: ReduceOp::Sum,
                x: d,
                axes,
            },
            None,
        )?;
    }
    if b.ty(v).shape() != want {
        v = b.op(
            "d",
            OpKind::Reshape { x: v },
            Some(to.with_dtype(b.ty(d).dtype)),
        )?;
    }
    Ok(v)
}

/// `op` over `axis` of `x` (of type `xt`), keeping the axis as size 1.
fn reduce(
    b: &mut Builder,
    op: ReduceOp,
    x: ValueId,
    xt: &Type,
    axis: usize,
) -> Result<ValueId, Diagnostic> {
    let r = b.op(
        "r",
        OpKind::Reduce {
            op,
            x,
            axes: vec![axis],
        },
        None,
    )?;
    keep_dims(b, r, xt, &[axis])
}

/// A reduction's result reshaped to `xt`'s rank with the reduced `axes` as size 1.
fn keep_dims(
    b: &mut Builder,
    r: ValueId,
    xt: &Type,
    axes: &[usize],
) -> Result<ValueId, Diagnostic> {
    let dims = (0..xt.rank())
        .map(|a| {
            if axes.contains(&a) {
                Dim::lit(1)
            } else {
                xt.dims[a].clone()
            }
        })
        .collect();
    let t = Type::new(b.ty(r).dtype, dims);
    b.op("k", OpKind::Reshape { x: r }, Some(t))
}

/// Entries `from..to` of `axis` of `d`, whose shape is `shape`.
fn slice_axis(
    b: &mut Builder,
    d: ValueId,
    shape: &[u64],
    axis: usize,
    from: u64,
    to: u64,
) -> Result<ValueId, Diagnostic> {
    let mut start = vec![0; shape.len()];
    let mut end = shape.to_vec();
    start[axis] = from;
    end[axis] = to;
    b.op("d", OpKind::Slice { x: d, start, end }, None)
}

fn pad(
    b: &mut Builder,
    x: ValueId,
    axis: usize,
    low: u64,
    high: u64,
) -> Result<ValueId, Diagnostic> {
    b.op(
        "d",
        OpKind::Pad {
            x,
            axis,
            low,
            high,
            fill: Float(-0.0),
        },
        None,
    )
}

fn swap_last(b: &mut Builder, x: ValueId) -> Result<ValueId, Diagnostic> {
    let r = b.ty(x).rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    b.op("t", OpKind::Transpose { x, perm }, None)
}

/// The zero cotangent of type `ty` (`-0.0` everywhere), or an empty tape.
pub fn zeros(b: &mut Builder, ty: &Type) -> Result<ValueId, Diagnostic> {
    // `-0.0` adds nothing; integer and mask tapes start at plain 0.
    let zero = if ty.dtype.is_float() { -0.0 } else { 0.0 };
    b.op(
        "zero",
        OpKind::Constant { value: Float(zero) },
        Some(ty.clone()),
    )
}

fn scalar(b: &mut Builder, dt: DType, v: f64) -> Result<ValueId, Diagnostic> {
    b.op(
        "c",
        OpKind::Constant { value: Float(v) },
        Some(Type::scalar(dt)),
    )
}

pub fn bin(
    b: &mut Builder,
    op: BinaryOp,
    lhs: ValueId,
    rhs: ValueId,
) -> Result<ValueId, Diagnostic> {
    b.op("d", OpKind::Binary { op, lhs, rhs }, None)
}

fn cmp(b: &mut Builder, pred: CmpPred, lhs: ValueId, rhs: ValueId) -> Result<ValueId, Diagnostic> {
    b.op("m", OpKind::Compare { pred, lhs, rhs }, None)
}

pub fn select(
    b: &mut Builder,
    cond: ValueId,
    on_true: ValueId,
    on_false: ValueId,
) -> Result<ValueId, Diagnostic> {
    b.select("d", cond, on_true, on_false)
}

fn unary(b: &mut Builder, hint: &str, op: UnaryOp, x: ValueId) -> Result<ValueId, Diagnostic> {
    b.op(hint, OpKind::Unary { op, x }, None)
}

fn neg(b: &mut Builder, x: ValueId) -> Result<ValueId, Diagnostic> {
    unary(b, "d", UnaryOp::Neg, x)
}
