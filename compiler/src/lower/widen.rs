//! Floats stored narrower than f32: math runs in f32, as the interpreter's does, so values are
//! extended on load and rounded on store; conversions between element types and selections
//! that round alike on every CPU.

use super::buf::{elt, Buf, Scalar};
use super::emit::Emitter;
use super::text::identity;
use ppc_dialect::DType;

/// The value of a float block argument in f32.
///
/// bf16 is converted as integer arithmetic on its bits (here and in [`trunc`]), and bf16 values
/// are never selected as floats ([`select_value`]): LLVM legalizes vector `bfloat` selects
/// through `__truncsfbf2` on CPUs without AVX512-BF16 (a call libgcc before 13 lacks), and the
/// arithmetic rounds alike on every CPU. f16 uses F16C (every x86-64-v3 CPU), or libgcc's
/// `__truncsfhf2`/`__extendhfsf2` below it.
pub fn ext(e: &mut Emitter, v: &str, d: DType) -> String {
    match d {
        DType::F32 => v.to_string(),
        DType::BF16 => {
            // The bits become the upper half of an f32's.
            let b = e.let_(&format!("arith.bitcast {v} : bf16 to i16"));
            let w = e.let_(&format!("arith.extui {b} : i16 to i32"));
            let sixteen = e.constant(16.0, DType::I32);
            let s = e.let_(&format!("arith.shli {w}, {sixteen} : i32"));
            e.let_(&format!("arith.bitcast {s} : i32 to f32"))
        }
        DType::F16 => e.let_(&format!("arith.extf {v} : f16 to f32")),
        DType::I32 | DType::I1 => unreachable!("invariant: float op on {d}"),
    }
}

/// An f32 value rounded to a float dtype: to nearest, ties to even; a NaN becomes the quiet
/// NaN `0x7fc0` in bf16.
pub fn trunc(e: &mut Emitter, v: &str, d: DType) -> String {
    match d {
        DType::F32 => v.to_string(),
        DType::BF16 => {
            let bits = e.let_(&format!("arith.bitcast {v} : f32 to i32"));
            let (sixteen, one, half) = (
                e.constant(16.0, DType::I32),
                e.constant(1.0, DType::I32),
                e.constant(f64::from(0x7fff), DType::I32),
            );
            // Adding 0x7fff plus the lowest kept bit rounds the dropped half to even.
            let kept = e.let_(&format!("arith.shrui {bits}, {sixteen} : i32"));
            let lsb = e.let_(&format!("arith.andi {kept}, {one} : i32"));
            let r = e.let_(&format!("arith.addi {bits}, {half} : i32"));
            let r = e.let_(&format!("arith.addi {r}, {lsb} : i32"));
            let hi = e.let_(&format!("arith.shrui {r}, {sixteen} : i32"));
            let h = e.let_(&format!("arith.trunci {hi} : i32 to i16"));
            let nan = e.let_(&format!("arith.cmpf uno, {v}, {v} : f32"));
            let quiet = e.constant(f64::from(0x7fc0), Scalar::I16);
            let h = e.let_(&format!("arith.select {nan}, {quiet}, {h} : i16"));
            e.let_(&format!("arith.bitcast {h} : i16 to bf16"))
        }
        DType::F16 => e.let_(&format!("arith.truncf {v} : f32 to f16")),
        DType::I32 | DType::I1 => unreachable!("invariant: float op on {d}"),
    }
}

/// `c ? a : b` for values of dtype `d`; 16-bit floats are selected as their bits (see [`ext`]).
pub fn select_value(e: &mut Emitter, c: &str, a: &str, b: &str, d: DType) -> String {
    match d {
        DType::BF16 | DType::F16 => {
            let t = elt(d);
            let ai = e.let_(&format!("arith.bitcast {a} : {t} to i16"));
            let bi = e.let_(&format!("arith.bitcast {b} : {t} to i16"));
            let s = e.let_(&format!("arith.select {c}, {ai}, {bi} : i16"));
            e.let_(&format!("arith.bitcast {s} : i16 to {t}"))
        }
        DType::F32 | DType::I32 | DType::I1 => {
            e.let_(&format!("arith.select {c}, {a}, {b} : {}", elt(d)))
        }
    }
}

/// `b` as an f32 buffer (itself, or an extended copy).
pub fn to_f32(e: &mut Emitter, b: &Buf) -> Buf {
    if b.ty.dtype == DType::F32 {
        return b.clone();
    }
    let t = e.alloc(&b.ty.with_dtype(DType::F32));
    convert(e, b, &t);
    t
}

/// Result buffer for f32 accumulation: `out` itself if it is f32, else scratch.
pub fn f32_scratch(e: &mut Emitter, out: &Buf) -> Buf {
    if out.ty.dtype == DType::F32 {
        out.clone()
    } else {
        e.alloc(&out.ty.with_dtype(DType::F32))
    }
}

/// Stores an f32 scratch buffer into `out` (a no-op when they are the same buffer).
pub fn store(e: &mut Emitter, scratch: &Buf, out: &Buf) {
    if scratch.name != out.name {
        convert(e, scratch, out);
    }
}

/// One scalar conversion between element types, with the interpreter's rounding.
pub fn convert_value(e: &mut Emitter, v: &str, from: DType, to: DType) -> String {
    use DType::*;
    match (from, to) {
        (a, b) if a == b => v.to_string(),
        (F32 | BF16 | F16, F32 | BF16 | F16) => {
            let x = ext(e, v, from);
            trunc(e, &x, to)
        }
        (F32 | BF16 | F16, I32) => {
            // Saturating, NaN to 0, as the interpreter defines it: `fptosi` alone is poison
            // out of range (x86 gives i32::MIN for NaN and +inf).
            let x = ext(e, v, from);
            let t = e.let_(&format!("arith.fptosi {x} : f32 to i32"));
            let (lo, hi) = (
                e.constant(-2_147_483_648.0, DType::F32),
                e.constant(2_147_483_648.0, DType::F32),
            );
            let (min, max, zero) = (
                e.constant(f64::from(i32::MIN), DType::I32),
                e.constant(f64::from(i32::MAX), DType::I32),
                e.constant(0.0, DType::I32),
            );
            let below = e.let_(&format!("arith.cmpf olt, {x}, {lo} : f32"));
            let above = e.let_(&format!("arith.cmpf oge, {x}, {hi} : f32"));
            let nan = e.let_(&format!("arith.cmpf uno, {x}, {x} : f32"));
            let t = e.let_(&format!("arith.select {below}, {min}, {t} : i32"));
            let t = e.let_(&format!("arith.select {above}, {max}, {t} : i32"));
            e.let_(&format!("arith.select {nan}, {zero}, {t} : i32"))
        }
        (F32 | BF16 | F16, I1) => {
            let x = ext(e, v, from);
            let z = e.constant(0.0, DType::F32);
            e.let_(&format!("arith.cmpf une, {x}, {z} : f32"))
        }
        (I32, F32 | BF16 | F16) => {
            let x = e.let_(&format!("arith.sitofp {v} : i32 to f32"));
            trunc(e, &x, to)
        }
        (I1, F32 | BF16 | F16) => {
            let x = e.let_(&format!("arith.uitofp {v} : i1 to f32"));
            trunc(e, &x, to)
        }
        (I32, I1) => {
            let z = e.constant(0.0, DType::I32);
            e.let_(&format!("arith.cmpi ne, {v}, {z} : i32"))
        }
        (I1, I32) => e.let_(&format!("arith.extui {v} : i1 to i32")),
        (I32, I32) | (I1, I1) => unreachable!("invariant: equal dtypes are handled first"),
    }
}

pub fn convert(e: &mut Emitter, src: &Buf, dst: &Buf) {
    let r = dst.ty.rank();
    let (from, to) = (src.ty.dtype, dst.ty.dtype);
    e.generic(
        r,
        &[(src, identity(r))],
        (dst, identity(r)),
        &vec!["parallel"; r],
        |e, a| convert_value(e, &a[0], from, to),
    );
}

/// A constant of dtype `d` (16-bit floats rounded from f32).
pub fn fill_value(e: &mut Emitter, v: f64, d: DType) -> String {
    match d {
        DType::BF16 | DType::F16 => {
            let c = e.constant(v, DType::F32);
            trunc(e, &c, d)
        }
        DType::F32 | DType::I32 | DType::I1 => e.constant(v, d),
    }
}
