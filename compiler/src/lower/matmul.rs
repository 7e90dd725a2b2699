//! `matmul`: the runtime's GEMM for the fast numerics (`abi::matmul`), or loops in the
//! interpreter's order for the exact ones, accumulating in f32.

use super::buf::{elt, Buf};
use super::emit::Emitter;
use super::fast_math::Numerics;
use super::text::broadcast_map;
use super::widen::{ext, f32_scratch, store, to_f32};
use ppc_dialect::DType;
use ppc_runtime::abi;

/// `out = a · b`, skipping (and zeroing) the first-axis entries where `mask` is false. On the
/// GPU, 16-bit operands and result go to cuBLAS as they are, which rounds its f32 sums into
/// `out`; elsewhere the sums go to an f32 scratch buffer, then to `out`.
pub fn matmul(
    e: &mut Emitter,
    numerics: Numerics,
    a: &Buf,
    b: &Buf,
    mask: Option<&Buf>,
    out: &Buf,
) {
    if numerics == Numerics::Fast && sixteen_bit_on_gpu(e, a, b) && out.ty.dtype == a.ty.dtype {
        return gemm(e, numerics, a, b, mask, out, false);
    }
    let acc = f32_scratch(e, out);
    gemm(e, numerics, a, b, mask, &acc, false);
    store(e, &acc, out);
}

/// Whether the GPU multiplies `a` and `b` as they are stored: both bf16 or both f16 (tensor
/// cores, f32 accumulation); the CPU's GEMM takes f32.
fn sixteen_bit_on_gpu(e: &Emitter, a: &Buf, b: &Buf) -> bool {
    let d = a.ty.dtype;
    e.gpu.is_some() && d == b.ty.dtype && matches!(d, DType::BF16 | DType::F16)
}

/// `acc += a · b` (f32 `acc`; where `mask` is false, `acc` stays as it is), in the runtime's
/// GEMM (`accumulate.rs`).
pub fn matmul_into(e: &mut Emitter, a: &Buf, b: &Buf, mask: Option<&Buf>, acc: &Buf) {
    gemm(e, Numerics::Fast, a, b, mask, acc, true);
}

/// `acc = a · b`, or `acc += a · b` when `accumulate` (fast numerics only), into f32 `acc`
/// (or, not accumulating, a 16-bit `acc` of the operands' type on the GPU).
fn gemm(
    e: &mut Emitter,
    numerics: Numerics,
    a: &Buf,
    b: &Buf,
    mask: Option<&Buf>,
    acc: &Buf,
    accumulate: bool,
) {
    let acc = acc.clone();
    match numerics {
        Numerics::Fast => {
            let d = a.ty.dtype;
            let half = sixteen_bit_on_gpu(e, a, b);
            let (fa, fb, t) = if half {
                (a.clone(), b.clone(), elt(d))
            } else {
                (to_f32(e, a), to_f32(e, b), "f32")
            };
            let operands = if half { d } else { DType::F32 };
            let rounded = acc.ty.dtype != DType::F32;
            let entry = |masked| match rounded {
                true => abi::matmul_rounded(operands, masked),
                false => abi::matmul(operands, accumulate, masked),
            };
            // The f32 GEMMs are declared with the module; the others where used.
            if half || accumulate {
                for masked in [false, true] {
                    e.declare(entry(masked));
                }
            }
            let cast = |e: &mut Emitter, x: &Buf, t: &str| {
                e.let_(&format!(
                    "memref.cast {} : {} to memref<*x{t}>",
                    x.name,
                    x.mty()
                ))
            };
            let (ua, ub, uc) = (
                cast(e, &fa, t),
                cast(e, &fb, t),
                cast(e, &acc, elt(acc.ty.dtype)),
            );
            // The runtime reads the mask on the host.
            if let Some(m) = mask {
                e.host_reads(m);
            }
            if accumulate {
                e.device_uses(&[&fa, &fb, &acc], &acc);
            } else {
                e.device_uses(&[&fa, &fb], &acc);
            }
            match mask {
                None => e.op(&entry(false).call(&[&ua, &ub, &uc])),
                Some(m) => {
                    let um = cast(e, m, "i1");
                    e.op(&entry(true).call(&[&ua, &ub, &uc, &um]));
                }
            }
        }
        Numerics::Exact => {
            let r = acc.ty.rank();
            let nb = r - 2;
            let zero = e.constant(0.0, DType::F32);
            e.fill(&zero, &acc);
            let (m, n, k) = (
                format!("d{nb}"),
                format!("d{}", nb + 1),
                format!("d{}", nb + 2),
            );
            let batch = |x: &Buf| {
                let xs = x.ty.shape();
                let mut m = broadcast_map(&xs[..xs.len() - 2], &acc.ty.shape()[..nb]);
                if !m.is_empty() {
                    m.push_str(", ");
                }
                m
            };
            let la = format!("{}{m}, {k}", batch(a));
            let lb = format!("{}{k}, {n}", batch(b));
            let lo = format!(
                "{}{m}, {n}",
                (0..nb).map(|i| format!("d{i}, ")).collect::<String>()
            );
            let mut iters = vec!["parallel"; r];
            iters.push("reduction");
            let (da, db) = (a.ty.dtype, b.ty.dtype);
            let mut ins = vec![(a, la), (b, lb)];
            if let Some(m) = mask {
                ins.push((m, "d0".to_string()));
            }
            // Entries of masked-out stages are -0.0, as the interpreter's.
            let skipped = mask.map(|_| e.constant(-0.0, DType::F32));
            e.generic(r + 1, &ins, (&acc, lo), &iters, |e, v| {
                let (x, y) = (ext(e, &v[0], da), ext(e, &v[1], db));
                let p = e.let_(&format!("arith.mulf {x}, {y} : f32"));
                let acc = v.last().expect("the output block argument");
                let sum = e.let_(&format!("arith.addf {acc}, {p} : f32"));
                match &skipped {
                    Some(z) => e.let_(&format!("arith.select {}, {sum}, {z} : f32", v[2])),
                    None => sum,
                }
            });
        }
    }
}
