//! The meaning of every op, as naive loops over host tensors.
//!
//! This is the definition that every pass and backend is checked against, so it favours the
//! obvious loop over the fast one. Float arithmetic is f32, each result rounded to its dtype on
//! store; i32 arithmetic is on the integers, wrapping as two's complement does (as compiled
//! code's `arith` ops); ops that only move elements copy the stored words whatever the dtype. Accumulations (matmul, reductions, softmax, layernorm) run in a fixed order, index by
//! index, so an op computes the same bits whether or not it is batched over extra leading axes.

use crate::op::{BinaryOp, CmpPred, ReduceOp, UnaryOp};
use crate::types::DType;
use ppc_tensor::tensor::strides;
use ppc_tensor::Tensor;

/// Strides that read `from` (a shape NumPy-broadcastable to `to`) at each index of `to`.
fn broadcast_strides(from: &[usize], to: &[usize]) -> Vec<usize> {
    let s = strides(from);
    let off = to.len() - from.len();
    (0..to.len())
        .map(|i| {
            if i < off || from[i - off] == 1 {
                0
            } else {
                s[i - off]
            }
        })
        .collect()
}

/// Calls `f(out_index, in_offsets)` for every index of `shape`, with the offsets of each input
/// computed from its strides.
fn walk(shape: &[usize], ins: &[Vec<usize>], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    let mut offs = vec![0usize; ins.len()];
    for o in 0..n {
        f(o, &offs);
        for ax in (0..shape.len()).rev() {
            idx[ax] += 1;
            for (k, s) in ins.iter().enumerate() {
                offs[k] += s[ax];
            }
            if idx[ax] < shape[ax] {
                break;
            }
            for (k, s) in ins.iter().enumerate() {
                offs[k] -= s[ax] * shape[ax];
            }
            idx[ax] = 0;
        }
    }
}

/// `x` broadcast to `shape`.
pub fn broadcast(x: &Tensor, dtype: DType, shape: &[usize]) -> Tensor {
    let st = broadcast_strides(&x.shape, shape);
    let mut data = vec![0.0; shape.iter().product()];
    walk(shape, &[st], |o, offs| data[o] = x.data[offs[0]]);
    Tensor::new(dtype, shape.to_vec(), data)
}

fn zip2(
    a: &Tensor,
    b: &Tensor,
    dtype: DType,
    shape: &[usize],
    f: impl Fn(f32, f32) -> f32,
) -> Tensor {
    let sa = broadcast_strides(&a.shape, shape);
    let sb = broadcast_strides(&b.shape, shape);
    let mut data = vec![0.0; shape.iter().product()];
    walk(shape, &[sa, sb], |o, offs| {
        data[o] = f(a.data[offs[0]], b.data[offs[1]])
    });
    Tensor::new(dtype, shape.to_vec(), data)
}

fn gelu(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

pub fn unary(op: UnaryOp, x: &Tensor) -> Tensor {
    let f: fn(f32) -> f32 = match op {
        UnaryOp::Neg => |v| -v,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Exp => f32::exp,
        UnaryOp::Log => f32::ln,
        UnaryOp::Tanh => f32::tanh,
        UnaryOp::Sigmoid => |v| 1.0 / (1.0 + (-v).exp()),
        UnaryOp::Relu => |v| if v > 0.0 { v } else { 0.0 },
        UnaryOp::Gelu => gelu,
        UnaryOp::Sqrt => f32::sqrt,
        UnaryOp::Rsqrt => |v| 1.0 / v.sqrt(),
        UnaryOp::Sin => f32::sin,
        UnaryOp::Cos => f32::cos,
    };
    Tensor::new(
        x.dtype,
        x.shape.clone(),
        x.data.iter().map(|&v| f(v)).collect(),
    )
}

pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, shape: &[usize]) -> Tensor {
    if a.dtype == DType::I32 {
        return zip2(a, b, a.dtype, shape, move |x, y| {
            let (x, y) = (int(x), int(y));
            word(match op {
                BinaryOp::Add => x.wrapping_add(y),
                BinaryOp::Sub => x.wrapping_sub(y),
                BinaryOp::Mul => x.wrapping_mul(y),
                // Rounds toward negative infinity; dividing by zero gives 0 (and i32::MIN / -1
                // wraps, as `arith.floordivsi` does).
                BinaryOp::Div if y == 0 => 0,
                BinaryOp::Div if y == -1 => x.wrapping_neg(),
                BinaryOp::Div => x.div_euclid(y) - i32::from(y < 0 && x.rem_euclid(y) != 0),
                BinaryOp::Max => x.max(y),
                BinaryOp::Min => x.min(y),
            })
        });
    }
    let f = move |x: f32, y: f32| match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        // NaN-propagating, like XLA and MLIR's `arith.maximumf`.
        BinaryOp::Max => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                x.max(y)
            }
        }
        BinaryOp::Min => {
            if x.is_nan() || y.is_nan() {
                f32::NAN
            } else {
                x.min(y)
            }
        }
    };
    zip2(a, b, a.dtype, shape, f)
}

/// The integer an i32 element's word holds.
fn int(w: f32) -> i32 {
    w.to_bits() as i32
}

/// The word that holds the integer `i`.
fn word(i: i32) -> f32 {
    f32::from_bits(i as u32)
}

pub fn compare(pred: CmpPred, a: &Tensor, b: &Tensor, shape: &[usize]) -> Tensor {
    fn holds<T: PartialOrd>(pred: CmpPred, x: T, y: T) -> bool {
        match pred {
            CmpPred::Lt => x < y,
            CmpPred::Le => x <= y,
            CmpPred::Eq => x == y,
            CmpPred::Gt => x > y,
            CmpPred::Ge => x >= y,
            CmpPred::Ne => x != y,
        }
    }
    let ints = a.dtype == DType::I32;
    zip2(a, b, DType::I1, shape, move |x, y| {
        let r = if ints {
            holds(pred, int(x), int(y))
        } else {
            holds(pred, x, y)
        };
        f32::from(u8::from(r))
    })
}

pub fn select(c: &Tensor, t: &Tensor, f: &Tensor, shape: &[usize]) -> Tensor {
    let ins = [&c.shape, &t.shape, &f.shape].map(|s| broadcast_strides(s, shape));
    let mut data = vec![0.0; shape.iter().product()];
    walk(shape, &ins, |o, offs| {
        data[o] = if c.data[offs[0]] != 0.0 {
            t.data[offs[1]]
        } else {
            f.data[offs[2]]
        }
    });
    Tensor::new(t.dtype, shape.to_vec(), data)
}

/// `[..., m, k] x [..., k, n]`: for each output element, `sum_k a[i,k] * b[k,j]` in k order.
/// Where `mask` (over the first axis) is false, the result is `-0.0`.
pub fn matmul(a: &Tensor, b: &Tensor, mask: Option<&Tensor>, shape: &[usize]) -> Tensor {
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let k = a.shape[a.shape.len() - 1];
    let batch = &shape[..r - 2];
    let sa = broadcast_strides(&a.shape[..a.shape.len() - 2], batch);
    let sb = broadcast_strides(&b.shape[..b.shape.len() - 2], batch);
    let mut data = vec![0.0f32; shape.iter().product()];
    let per_first: usize = batch.iter().skip(1).product();
    walk(batch, &[sa, sb], |o, offs| {
        if mask.is_some_and(|mk| mk.data[o / per_first] == 0.0) {
            data[o * m * n..(o + 1) * m * n].fill(-0.0);
            return;
        }
        let (pa, pb) = (offs[0] * m * k, offs[1] * k * n);
        let out = &mut data[o * m * n..(o + 1) * m * n];
        for i in 0..m {
            let row = &mut out[i * n..(i + 1) * n];
            for kk in 0..k {
                let av = a.data[pa + i * k + kk];
                let brow = &b.data[pb + kk * n..pb + (kk + 1) * n];
                for (acc, &bv) in row.iter_mut().zip(brow) {
                    *acc += av * bv;
                }
            }
        }
    });
    Tensor::new(a.dtype, shape.to_vec(), data)
}

pub fn transpose(x: &Tensor, perm: &[usize]) -> Tensor {
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let s = strides(&x.shape);
    let st: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
    let mut data = vec![0.0; x.len()];
    walk(&shape, &[st], |o, offs| data[o] = x.data[offs[0]]);
    Tensor::new(x.dtype, shape, data)
}

pub fn slice(x: &Tensor, start: &[u64], end: &[u64]) -> Tensor {
    let shape: Vec<usize> = start
        .iter()
        .zip(end)
        .map(|(&s, &e)| (e - s) as usize)
        .collect();
    let s = strides(&x.shape);
    let base: usize = start.iter().zip(&s).map(|(&a, &b)| a as usize * b).sum();
    let mut data = vec![0.0; shape.iter().product()];
    walk(&shape, &[s], |o, offs| data[o] = x.data[base + offs[0]]);
    Tensor::new(x.dtype, shape, data)
}

/// Splits `shape` around `axis` into (outer, size, inner) element counts.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

pub fn concat(xs: &[&Tensor], axis: usize) -> Tensor {
    let mut shape = xs[0].shape.clone();
    shape[axis] = xs.iter().map(|x| x.shape[axis]).sum();
    let (outer, _, inner) = around(&shape, axis);
    let mut data = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for x in xs {
            let chunk = x.shape[axis] * inner;
            data.extend_from_slice(&x.data[o * chunk..(o + 1) * chunk]);
        }
    }
    Tensor::new(xs[0].dtype, shape, data)
}

pub fn reduce(op: ReduceOp, x: &Tensor, axes: &[usize]) -> Tensor {
    let shape: Vec<usize> = (0..x.shape.len())
        .filter(|a| !axes.contains(a))
        .map(|a| x.shape[a])
        .collect();
    // Read the input in row-major order, accumulating into the output index it maps to.
    let out_strides = strides(&shape);
    let mut st = Vec::with_capacity(x.shape.len());
    let mut j = 0;
    for a in 0..x.shape.len() {
        if axes.contains(&a) {
            st.push(0);
        } else {
            st.push(out_strides[j]);
            j += 1;
        }
    }
    let n_out: usize = shape.iter().product();
    // Sums start from -0.0, the additive identity: a sum whose other terms are all zeros is
    // its one nonzero term bit for bit, sign of zero included (autodiff relies on it).
    if x.dtype == DType::I32 {
        // Only `max` takes integers (the type rules).
        let mut acc = vec![i32::MIN; n_out];
        walk(&x.shape, &[st], |i, offs| {
            acc[offs[0]] = acc[offs[0]].max(int(x.data[i]));
        });
        return Tensor::from_ints(shape, acc);
    }
    let init = if op == ReduceOp::Max {
        f32::NEG_INFINITY
    } else {
        -0.0
    };
    let mut acc = vec![init; n_out];
    walk(&x.shape, &[st], |i, offs| {
        let v = x.data[i];
        let a = &mut acc[offs[0]];
        *a = match op {
            ReduceOp::Sum | ReduceOp::Mean => *a + v,
            ReduceOp::Max => {
                if a.is_nan() || v.is_nan() {
                    f32::NAN
                } else {
                    a.max(v)
                }
            }
        };
    });
    if op == ReduceOp::Mean {
        let count = (x.len() / n_out.max(1)) as f32;
        acc.iter_mut().for_each(|a| *a /= count);
    }
    Tensor::new(x.dtype, shape, acc)
}

/// Applies `f` to each line of `x` along `axis` (a strided view, copied in and out).
fn per_line(x: &Tensor, axis: usize, f: impl Fn(&mut [f32])) -> Tensor {
    let (outer, n, inner) = around(&x.shape, axis);
    let mut data = x.data.clone();
    let mut line = vec![0.0f32; n];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * n * inner + k * inner + i;
            for (k, l) in line.iter_mut().enumerate() {
                *l = data[at(k)];
            }
            f(&mut line);
            for (k, l) in line.iter().enumerate() {
                data[at(k)] = *l;
            }
        }
    }
    Tensor::new(x.dtype, x.shape.clone(), data)
}

/// `softmax` along `axis`, or with `log` its logarithm, `(x − max) − ln Σ e^(x − max)`, whose
/// exponentials are summed as softmax sums them.
pub fn softmax(x: &Tensor, axis: usize, log: bool) -> Tensor {
    per_line(x, axis, |line| {
        let max = line.iter().fold(f32::NEG_INFINITY, |m, &v| {
            if v.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(v)
            }
        });
        let mut sum = -0.0f32;
        if log {
            for &v in line.iter() {
                sum += (v - max).exp();
            }
            let lse = sum.ln();
            line.iter_mut().for_each(|v| *v = (*v - max) - lse);
            return;
        }
        for v in line.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        line.iter_mut().for_each(|v| *v /= sum);
    })
}

pub fn layernorm(x: &Tensor, axis: usize, eps: f64) -> Tensor {
    let eps = eps as f32;
    per_line(x, axis, |line| {
        let n = line.len() as f32;
        let mean = line.iter().fold(-0.0f32, |s, &v| s + v) / n;
        let var = line
            .iter()
            .fold(-0.0f32, |s, &v| s + (v - mean) * (v - mean))
            / n;
        let inv = 1.0 / (var + eps).sqrt();
        line.iter_mut().for_each(|v| *v = (*v - mean) * inv);
    })
}

pub fn iota(dtype: DType, shape: &[usize], axis: usize) -> Tensor {
    let (outer, n, inner) = around(shape, axis);
    let positions = (0..outer).flat_map(|_| (0..n).flat_map(|k| std::iter::repeat_n(k, inner)));
    Tensor::from_values(dtype, shape.to_vec(), positions.map(|k| k as f64))
}

pub fn pad(x: &Tensor, axis: usize, low: usize, high: usize, fill: f64) -> Tensor {
    let fill = x.dtype.store(fill);
    let (outer, n, inner) = around(&x.shape, axis);
    let mut shape = x.shape.clone();
    shape[axis] = n + low + high;
    let mut data = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        data.extend(std::iter::repeat_n(fill, low * inner));
        data.extend_from_slice(&x.data[o * n * inner..(o + 1) * n * inner]);
        data.extend(std::iter::repeat_n(fill, high * inner));
    }
    Tensor::new(x.dtype, shape, data)
}

pub fn shift(x: &Tensor, axis: usize, fill: f64) -> Tensor {
    let fill = x.dtype.store(fill);
    let (outer, n, inner) = around(&x.shape, axis);
    let mut data = Vec::with_capacity(x.len());
    for o in 0..outer {
        data.extend(std::iter::repeat_n(fill, inner));
        data.extend_from_slice(&x.data[o * n * inner..(o * n + n - 1) * inner]);
    }
    Tensor::new(x.dtype, x.shape.clone(), data)
}

/// `gather`: for each id (the `axis` leading axes shared with `table`), the table's row at that
/// id, clamped into range.
pub fn gather(table: &Tensor, ids: &Tensor, axis: usize) -> Tensor {
    let (outer, n, row) = around(&table.shape, axis);
    let per_outer = ids.len() / outer.max(1);
    let mut data = Vec::with_capacity(ids.len() * row);
    for (i, _) in ids.data.iter().enumerate() {
        let o = i / per_outer.max(1);
        let k = position(ids, i, n);
        let at = (o * n + k) * row;
        data.extend_from_slice(&table.data[at..at + row]);
    }
    let mut shape = ids.shape.clone();
    shape.extend_from_slice(&table.shape[axis + 1..]);
    Tensor::new(table.dtype, shape, data)
}

/// The position along `axis` that `index` selects for outer position `o`, clamped into range
/// (as XLA's dynamic slice does) so that no index is ever out of bounds.
fn position(index: &Tensor, o: usize, n: usize) -> usize {
    (index.int(o).max(0) as usize).min(n - 1)
}

pub fn index(x: &Tensor, idx: &Tensor, axis: usize) -> Tensor {
    let (outer, n, inner) = around(&x.shape, axis);
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let k = position(idx, o, n);
        let at = o * n * inner + k * inner;
        data.extend_from_slice(&x.data[at..at + inner]);
    }
    let mut shape = x.shape.clone();
    shape.remove(axis);
    Tensor::new(x.dtype, shape, data)
}

pub fn update(x: &Tensor, upd: &Tensor, idx: &Tensor, axis: usize) -> Tensor {
    let (outer, n, inner) = around(&x.shape, axis);
    let mut data = x.data.clone();
    for o in 0..outer {
        let k = position(idx, o, n);
        let at = o * n * inner + k * inner;
        data[at..at + inner].copy_from_slice(&upd.data[o * inner..(o + 1) * inner]);
    }
    Tensor::new(x.dtype, x.shape.clone(), data)
}
