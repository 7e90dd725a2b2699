//! The lowering rules: one arm per op, each writing its result buffer with `linalg` ops.
//!
//! Floating-point math runs in f32: bf16 and f16 operands are extended on load and the result
//! is rounded on store, exactly as the interpreter does, and multi-step ops (matmul, reductions,
//! softmax, layernorm) accumulate into f32 scratch buffers. Accumulation orders follow the
//! interpreter's, so that with `--exact` the CPU result is the interpreter's bit for bit.

use super::buf::{elt, Buf};
use super::emit::Emitter;
use super::fast_math::{self, Numerics};
use super::matmul::matmul;
use super::slabs;
use super::text::identity;
use super::widen::{
    convert_value, ext, f32_scratch, fill_value, select_value, store, to_f32, trunc,
};
use ppc_dialect::op::{BinaryOp, CmpPred, OpKind, ReduceOp, UnaryOp};
use ppc_dialect::{DType, Type};
use ppc_runtime::abi;

/// `e^x` (f32): libm's for the exact numerics, the vectorizable one for the fast.
fn exp_value(e: &mut Emitter, num: Numerics, x: &str) -> String {
    match num {
        Numerics::Exact => e.let_(&format!("math.exp {x} : f32")),
        Numerics::Fast => fast_math::exp(e, x),
    }
}

/// `tanh x` (f32), chosen as [`exp_value`] is.
fn tanh_value(e: &mut Emitter, num: Numerics, x: &str) -> String {
    match num {
        Numerics::Exact => e.let_(&format!("math.tanh {x} : f32")),
        Numerics::Fast => fast_math::tanh(e, x),
    }
}

fn unary_value(e: &mut Emitter, num: Numerics, op: UnaryOp, x: &str) -> String {
    match op {
        UnaryOp::Neg => e.let_(&format!("arith.negf {x} : f32")),
        UnaryOp::Abs => e.let_(&format!("math.absf {x} : f32")),
        UnaryOp::Exp => exp_value(e, num, x),
        UnaryOp::Log => e.let_(&format!("math.log {x} : f32")),
        UnaryOp::Tanh => tanh_value(e, num, x),
        UnaryOp::Sqrt => e.let_(&format!("math.sqrt {x} : f32")),
        UnaryOp::Sin => e.let_(&format!("math.sin {x} : f32")),
        UnaryOp::Cos => e.let_(&format!("math.cos {x} : f32")),
        UnaryOp::Rsqrt => {
            let s = e.let_(&format!("math.sqrt {x} : f32"));
            let one = e.constant(1.0, DType::F32);
            e.let_(&format!("arith.divf {one}, {s} : f32"))
        }
        UnaryOp::Sigmoid => {
            // 1 / (1 + exp(-x))
            let n = e.let_(&format!("arith.negf {x} : f32"));
            let ex = exp_value(e, num, &n);
            let one = e.constant(1.0, DType::F32);
            let d = e.let_(&format!("arith.addf {one}, {ex} : f32"));
            e.let_(&format!("arith.divf {one}, {d} : f32"))
        }
        UnaryOp::Relu => {
            // x > 0 ? x : 0 (NaN gives 0, as in the interpreter)
            let z = e.constant(0.0, DType::F32);
            let c = e.let_(&format!("arith.cmpf ogt, {x}, {z} : f32"));
            e.let_(&format!("arith.select {c}, {x}, {z} : f32"))
        }
        UnaryOp::Gelu => {
            // ((0.5 * x) * (1 + tanh(C * (x + ((0.044715 * x) * x) * x))))
            let (half, c, k, one) = (
                e.constant(0.5, DType::F32),
                e.constant(f64::from(0.797_884_6f32), DType::F32),
                e.constant(f64::from(0.044_715f32), DType::F32),
                e.constant(1.0, DType::F32),
            );
            let kx = e.let_(&format!("arith.mulf {k}, {x} : f32"));
            let kxx = e.let_(&format!("arith.mulf {kx}, {x} : f32"));
            let kxxx = e.let_(&format!("arith.mulf {kxx}, {x} : f32"));
            let inner = e.let_(&format!("arith.addf {x}, {kxxx} : f32"));
            let scaled = e.let_(&format!("arith.mulf {c}, {inner} : f32"));
            let t = tanh_value(e, num, &scaled);
            let onet = e.let_(&format!("arith.addf {one}, {t} : f32"));
            let hx = e.let_(&format!("arith.mulf {half}, {x} : f32"));
            e.let_(&format!("arith.mulf {hx}, {onet} : f32"))
        }
    }
}

fn binary_value(e: &mut Emitter, op: BinaryOp, a: &str, b: &str, d: DType) -> String {
    if d == DType::I32 {
        return match op {
            BinaryOp::Add => e.let_(&format!("arith.addi {a}, {b} : i32")),
            BinaryOp::Sub => e.let_(&format!("arith.subi {a}, {b} : i32")),
            BinaryOp::Mul => e.let_(&format!("arith.muli {a}, {b} : i32")),
            BinaryOp::Max => e.let_(&format!("arith.maxsi {a}, {b} : i32")),
            BinaryOp::Min => e.let_(&format!("arith.minsi {a}, {b} : i32")),
            BinaryOp::Div => {
                // Floor division; dividing by zero gives 0 and by -1 the wrapped negation, so
                // that no trapping divide (x86's `idiv` of i32::MIN by -1) ever executes.
                let zero = e.constant(0.0, DType::I32);
                let (one, minus1) = (e.constant(1.0, DType::I32), e.constant(-1.0, DType::I32));
                let is0 = e.let_(&format!("arith.cmpi eq, {b}, {zero} : i32"));
                let is_m1 = e.let_(&format!("arith.cmpi eq, {b}, {minus1} : i32"));
                let special = e.let_(&format!("arith.ori {is0}, {is_m1} : i1"));
                let safe = e.let_(&format!("arith.select {special}, {one}, {b} : i32"));
                let q = e.let_(&format!("arith.floordivsi {a}, {safe} : i32"));
                let neg = e.let_(&format!("arith.subi {zero}, {a} : i32"));
                let q = e.let_(&format!("arith.select {is_m1}, {neg}, {q} : i32"));
                e.let_(&format!("arith.select {is0}, {zero}, {q} : i32"))
            }
        };
    }
    let (x, y) = (ext(e, a, d), ext(e, b, d));
    let r = match op {
        BinaryOp::Add => e.let_(&format!("arith.addf {x}, {y} : f32")),
        BinaryOp::Sub => e.let_(&format!("arith.subf {x}, {y} : f32")),
        BinaryOp::Mul => e.let_(&format!("arith.mulf {x}, {y} : f32")),
        BinaryOp::Div => e.let_(&format!("arith.divf {x}, {y} : f32")),
        BinaryOp::Max => e.let_(&format!("arith.maximumf {x}, {y} : f32")),
        BinaryOp::Min => e.let_(&format!("arith.minimumf {x}, {y} : f32")),
    };
    trunc(e, &r, d)
}

fn compare_value(e: &mut Emitter, pred: CmpPred, a: &str, b: &str, d: DType) -> String {
    let (f, s, u) = match pred {
        CmpPred::Lt => ("olt", "slt", "ult"),
        CmpPred::Le => ("ole", "sle", "ule"),
        CmpPred::Eq => ("oeq", "eq", "eq"),
        CmpPred::Gt => ("ogt", "sgt", "ugt"),
        CmpPred::Ge => ("oge", "sge", "uge"),
        CmpPred::Ne => ("une", "ne", "ne"),
    };
    match d {
        DType::I32 => e.let_(&format!("arith.cmpi {s}, {a}, {b} : i32")),
        DType::I1 => e.let_(&format!("arith.cmpi {u}, {a}, {b} : i1")),
        DType::F32 | DType::BF16 | DType::F16 => {
            let (x, y) = (ext(e, a, d), ext(e, b, d));
            e.let_(&format!("arith.cmpf {f}, {x}, {y} : f32"))
        }
    }
}

/// One element of an elementwise op ([`OpKind::is_elementwise`]), a scalar function, which is
/// what lets `fuse.rs` chain them: `args` are its operands' elements (of dtypes `ins`), the
/// result is of dtype `out`, rounded as the interpreter rounds it.
pub fn elementwise_value(
    e: &mut Emitter,
    numerics: Numerics,
    kind: &OpKind,
    args: &[String],
    ins: &[DType],
    out: DType,
) -> String {
    match kind {
        OpKind::Unary { op, .. } => {
            let x = ext(e, &args[0], out);
            let y = unary_value(e, numerics, *op, &x);
            trunc(e, &y, out)
        }
        OpKind::Binary { op, .. } => binary_value(e, *op, &args[0], &args[1], out),
        OpKind::Compare { pred, .. } => compare_value(e, *pred, &args[0], &args[1], ins[0]),
        OpKind::Select { .. } => select_value(e, &args[0], &args[1], &args[2], out),
        OpKind::Broadcast { .. } => args[0].clone(),
        OpKind::Convert { .. } => convert_value(e, &args[0], ins[0], out),
        _ => unreachable!("invariant: {} is not elementwise", kind.name()),
    }
}

/// Reduces `x` (f32) over `axes` into `acc` (f32, shape without those axes). Sums start from
/// -0.0, as in the interpreter.
fn reduce_into(e: &mut Emitter, num: Numerics, x: &Buf, axes: &[usize], acc: &Buf, max: bool) {
    let r = x.ty.rank();
    if e.gpu.is_some() && axes.len() == r && r >= 2 && x.ty.elements() >= GPU_SPLIT_REDUCTION {
        // A kernel needs a parallel loop: on the GPU a big reduction to one number first
        // reduces rows (at least ~1024 of them, in parallel), then the host reduces those.
        let shape = x.ty.shape();
        let lead = (1..r)
            .find(|&k| shape[..k].iter().product::<u64>() >= 1024)
            .unwrap_or(r - 1);
        let rows = e.alloc(&Type::of(acc.ty.dtype, &shape[..lead]));
        reduce_into(e, num, x, &(lead..r).collect::<Vec<_>>(), &rows, max);
        reduce_into(e, num, &rows, &(0..lead).collect::<Vec<_>>(), acc, max);
        return;
    }
    if super::gpu_reduce::applies(e, num, x, axes, acc, max) {
        super::gpu_reduce::emit(e, x, acc, max);
        return;
    }
    if super::row_reduce::applies(e, x, axes, acc) {
        super::row_reduce::emit(e, x, acc, max);
        return;
    }
    let init = if max { f64::NEG_INFINITY } else { -0.0 };
    let init = if acc.ty.dtype == DType::I32 {
        e.constant(if max { f64::from(i32::MIN) } else { 0.0 }, DType::I32)
    } else {
        e.constant(init, DType::F32)
    };
    e.fill(&init, acc);
    let keep: Vec<String> = (0..r)
        .filter(|a| !axes.contains(a))
        .map(|a| format!("d{a}"))
        .collect();
    let iters: Vec<&str> = (0..r)
        .map(|a| {
            if axes.contains(&a) {
                "reduction"
            } else {
                "parallel"
            }
        })
        .collect();
    let int = acc.ty.dtype == DType::I32;
    e.generic(
        r,
        &[(x, identity(r))],
        (acc, keep.join(", ")),
        &iters,
        |e, a| match (max, int) {
            (true, true) => e.let_(&format!("arith.maxsi {}, {} : i32", a[1], a[0])),
            (true, false) => e.let_(&format!("arith.maximumf {}, {} : f32", a[1], a[0])),
            (false, _) => e.let_(&format!("arith.addf {}, {} : f32", a[1], a[0])),
        },
    );
}

/// `--target cuda`: reductions to one number of at least this many elements are split (see
/// [`reduce_into`]); below it, the host sums them.
const GPU_SPLIT_REDUCTION: u64 = 4096;

/// `acc /= n` elementwise (f32), in place.
fn scale_down(e: &mut Emitter, acc: &Buf, n: u64) {
    let c = e.constant(n as f64, DType::F32);
    e.update_with(acc, acc, |e, a| {
        e.let_(&format!("arith.divf {}, {c} : f32", a[0]))
    });
}

/// Lowers one op whose result is a fresh buffer `out`.
pub fn lower(e: &mut Emitter, numerics: Numerics, kind: &OpKind, ins: &[Buf], out: &Buf) {
    let d = out.ty.dtype;
    let r = out.ty.rank();
    let par = vec!["parallel"; r];
    match kind {
        OpKind::MatMul { .. } => matmul(e, numerics, &ins[0], &ins[1], ins.get(2), out),
        OpKind::Transpose { perm, .. } => {
            let mut m = vec![String::new(); r];
            for (i, &p) in perm.iter().enumerate() {
                m[p] = format!("d{i}");
            }
            e.generic(
                r,
                &[(&ins[0], m.join(", "))],
                (out, identity(r)),
                &par,
                |_, a| a[0].clone(),
            );
        }
        OpKind::Slice { start, .. } => {
            // A view of the window, copied: an indexing map with offsets would let linalg take
            // the loop bounds from the input wherever a start is 0.
            let window = e.subview(&ins[0], start, &out.ty.shape());
            e.copy(&window, out);
        }
        OpKind::Concat { axis, .. } => {
            let mut at = 0;
            for x in ins {
                let mut offs = vec![0; r];
                offs[*axis] = at;
                let view = e.subview(out, &offs, &x.ty.shape());
                e.copy(x, &view);
                at += x.ty.dims[*axis].size;
            }
        }
        OpKind::Reduce { op, axes, .. } => {
            let int = d == DType::I32;
            let x = if int {
                ins[0].clone()
            } else {
                to_f32(e, &ins[0])
            };
            let acc = if int {
                out.clone()
            } else {
                f32_scratch(e, out)
            };
            reduce_into(e, numerics, &x, axes, &acc, *op == ReduceOp::Max);
            if *op == ReduceOp::Mean {
                let n = ins[0].ty.elements() / out.ty.elements().max(1);
                scale_down(e, &acc, n);
            }
            store(e, &acc, out);
        }
        OpKind::Softmax { axis, log, .. } => softmax(e, numerics, &ins[0], *axis, *log, out),
        OpKind::LayerNorm { axis, eps, .. } => layernorm(e, numerics, &ins[0], *axis, eps.0, out),
        OpKind::Rank => {
            e.declare(&abi::RANK);
            let v = e.let_(&abi::RANK.call(&[]));
            e.fill(&v, out);
        }
        OpKind::Exchange { reverse, .. } => {
            let t = elt(d);
            let f = abi::exchange(d, *reverse);
            e.declare(f);
            let (send, recv) = (&ins[0], out);
            // The runtime moves the buffers through host memory.
            e.host_reads(send);
            e.host_writes(recv);
            let us = e.let_(&format!(
                "memref.cast {} : {} to memref<*x{t}>",
                send.name,
                send.mty()
            ));
            let ur = e.let_(&format!(
                "memref.cast {} : {} to memref<*x{t}>",
                recv.name,
                recv.mty()
            ));
            e.op(&f.call(&[&us, &ur]));
        }
        OpKind::Iota { axis } => {
            let axis = *axis;
            e.generic(r, &[], (out, identity(r)), &par, |e, _| {
                let i = e.let_(&format!("linalg.index {axis} : index"));
                let v = e.let_(&format!("arith.index_cast {i} : index to i32"));
                convert_value(e, &v, DType::I32, d)
            });
        }
        OpKind::Constant { value } => {
            let v = match d {
                DType::F32 | DType::I32 | DType::I1 => e.constant(value.0, d),
                DType::BF16 | DType::F16 => {
                    let c = e.constant(value.0, DType::F32);
                    trunc(e, &c, d)
                }
            };
            e.fill(&v, out);
        }
        OpKind::Pad {
            axis, low, fill, ..
        } => {
            let f = fill_value(e, fill.0, d);
            e.fill(&f, out);
            let mut offs = vec![0; r];
            offs[*axis] = *low;
            let view = e.subview(out, &offs, &ins[0].ty.shape());
            e.copy(&ins[0], &view);
        }
        OpKind::Shift { axis, fill, .. } => {
            let f = fill_value(e, fill.0, d);
            let shape = out.ty.shape();
            let n = shape[*axis];
            let mut first = shape.clone();
            first[*axis] = 1;
            let head = e.subview(out, &vec![0; r], &first);
            e.fill(&f, &head);
            if n > 1 {
                let mut rest = shape.clone();
                rest[*axis] = n - 1;
                let mut offs = vec![0; r];
                offs[*axis] = 1;
                let src = e.subview(&ins[0], &vec![0; r], &rest);
                let dst = e.subview(out, &offs, &rest);
                e.copy(&src, &dst);
            }
        }
        OpKind::Index { axis, .. } => {
            let (x, idx, axis) = (&ins[0], &ins[1], *axis);
            if slabs::copy_slabs(e, x, idx, axis, out) {
                return;
            }
            let n = x.ty.dims[axis].size;
            let (xname, xty) = (x.name.clone(), x.mty());
            e.also_reads(x);
            e.generic(
                r,
                &[(idx, identity(axis))],
                (out, identity(r)),
                &par,
                |e, a| {
                    let k = e.clamped_index(&a[0], n);
                    let mut at: Vec<String> = (0..r)
                        .map(|i| e.let_(&format!("linalg.index {i} : index")))
                        .collect();
                    at.insert(axis, k);
                    e.let_(&format!("memref.load {xname}[{}] : {xty}", at.join(", ")))
                },
            );
        }
        OpKind::Gather { axis, .. } => {
            let (table, ids, axis) = (&ins[0], &ins[1], *axis);
            if slabs::copy_slabs(e, table, ids, axis, out) {
                return;
            }
            let n = table.ty.dims[axis].size;
            let q = ids.ty.rank();
            let (tname, tty) = (table.name.clone(), table.mty());
            e.also_reads(table);
            e.generic(
                r,
                &[(ids, identity(q))],
                (out, identity(r)),
                &par,
                |e, a| {
                    let k = e.clamped_index(&a[0], n);
                    let mut at: Vec<String> = (0..axis)
                        .chain(q..r)
                        .map(|i| e.let_(&format!("linalg.index {i} : index")))
                        .collect();
                    at.insert(axis, k);
                    e.let_(&format!("memref.load {tname}[{}] : {tty}", at.join(", ")))
                },
            );
        }
        OpKind::Update { axis, .. } => {
            let (x, upd, idx, axis) = (&ins[0], &ins[1], &ins[2], *axis);
            let n = x.ty.dims[axis].size;
            let upd_map: Vec<String> = (0..r)
                .filter(|&i| i != axis)
                .map(|i| format!("d{i}"))
                .collect();
            e.generic(
                r,
                &[
                    (x, identity(r)),
                    (upd, upd_map.join(", ")),
                    (idx, identity(axis)),
                ],
                (out, identity(r)),
                &par,
                |e, a| {
                    let k = e.clamped_index(&a[2], n);
                    let here = e.let_(&format!("linalg.index {axis} : index"));
                    let hit = e.let_(&format!("arith.cmpi eq, {here}, {k} : index"));
                    select_value(e, &hit, &a[1], &a[0], d)
                },
            );
        }
        OpKind::Reshape { .. } | OpKind::Call { .. } | OpKind::Loop { .. } => {
            unreachable!(
                "invariant: {} is lowered by the function walker",
                kind.name()
            )
        }
        OpKind::Unary { .. }
        | OpKind::Binary { .. }
        | OpKind::Compare { .. }
        | OpKind::Select { .. }
        | OpKind::Broadcast { .. }
        | OpKind::Convert { .. } => {
            unreachable!("invariant: {} is lowered by fuse.rs", kind.name())
        }
    }
}

/// The type of `x` without `axis`, in f32.
fn without(x: &Type, axis: usize) -> Type {
    x.remove(axis).with_dtype(DType::F32)
}

/// The map from `x`'s domain to a buffer without `axis`.
fn drop_axis(r: usize, axis: usize) -> String {
    (0..r)
        .filter(|&i| i != axis)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `softmax`, or with `log` its logarithm: the exponentials of `x − max` summed as softmax sums
/// them (into the output's scratch), then `(x − max) − log Σ` from `x` again.
fn softmax(e: &mut Emitter, num: Numerics, x: &Buf, axis: usize, log: bool, out: &Buf) {
    if !log && super::gpu_norm::applies(e, num, x, axis) {
        return super::gpu_norm::softmax(e, x, out);
    }
    let r = x.ty.rank();
    let par = vec!["parallel"; r];
    let xf = to_f32(e, x);
    let max = e.alloc(&without(&x.ty, axis));
    reduce_into(e, num, &xf, &[axis], &max, true);
    let ex = f32_scratch(e, out);
    e.generic(
        r,
        &[(&xf, identity(r)), (&max, drop_axis(r, axis))],
        (&ex, identity(r)),
        &par,
        |e, a| {
            let s = e.let_(&format!("arith.subf {}, {} : f32", a[0], a[1]));
            match num {
                Numerics::Exact => exp_value(e, num, &s),
                Numerics::Fast => fast_math::exp_flushed(e, &s),
            }
        },
    );
    let sum = e.alloc(&without(&x.ty, axis));
    reduce_into(e, num, &ex, &[axis], &sum, false);
    if log {
        // The logarithm once a row, in place of the sum, not once an element.
        let rows = r - 1;
        e.generic(
            rows,
            &[],
            (&sum, identity(rows)),
            &vec!["parallel"; rows],
            |e, a| e.let_(&format!("math.log {} : f32", a[0])),
        );
        let at = [
            (&xf, identity(r)),
            (&max, drop_axis(r, axis)),
            (&sum, drop_axis(r, axis)),
        ];
        e.generic(r, &at, (&ex, identity(r)), &par, |e, a| {
            let s = e.let_(&format!("arith.subf {}, {} : f32", a[0], a[1]));
            e.let_(&format!("arith.subf {s}, {} : f32", a[2]))
        });
    } else {
        e.generic(
            r,
            &[(&sum, drop_axis(r, axis))],
            (&ex, identity(r)),
            &par,
            |e, a| e.let_(&format!("arith.divf {}, {} : f32", a[1], a[0])),
        );
    }
    store(e, &ex, out);
}

fn layernorm(e: &mut Emitter, num: Numerics, x: &Buf, axis: usize, eps: f64, out: &Buf) {
    if super::gpu_norm::applies(e, num, x, axis) {
        return super::gpu_norm::layernorm(e, x, eps, out);
    }
    let r = x.ty.rank();
    let par = vec!["parallel"; r];
    let n = x.ty.dims[axis].size;
    let xf = to_f32(e, x);
    let mean = e.alloc(&without(&x.ty, axis));
    reduce_into(e, num, &xf, &[axis], &mean, false);
    scale_down(e, &mean, n);
    let sq = e.alloc(&x.ty.with_dtype(DType::F32));
    e.generic(
        r,
        &[(&xf, identity(r)), (&mean, drop_axis(r, axis))],
        (&sq, identity(r)),
        &par,
        |e, a| {
            let c = e.let_(&format!("arith.subf {}, {} : f32", a[0], a[1]));
            e.let_(&format!("arith.mulf {c}, {c} : f32"))
        },
    );
    let var = e.alloc(&without(&x.ty, axis));
    reduce_into(e, num, &sq, &[axis], &var, false);
    scale_down(e, &var, n);
    let y = f32_scratch(e, out);
    let eps = e.constant(f64::from(eps as f32), DType::F32);
    let one = e.constant(1.0, DType::F32);
    e.generic(
        r,
        &[
            (&xf, identity(r)),
            (&mean, drop_axis(r, axis)),
            (&var, drop_axis(r, axis)),
        ],
        (&y, identity(r)),
        &par,
        |e, a| {
            let ve = e.let_(&format!("arith.addf {}, {eps} : f32", a[2]));
            let s = e.let_(&format!("math.sqrt {ve} : f32"));
            let inv = e.let_(&format!("arith.divf {one}, {s} : f32"));
            let c = e.let_(&format!("arith.subf {}, {} : f32", a[0], a[1]));
            e.let_(&format!("arith.mulf {c}, {inv} : f32"))
        },
    );
    store(e, &y, out);
}
