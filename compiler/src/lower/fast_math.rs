//! `exp` and `tanh` for the fast numerics, written in `arith` so that LLVM vectorizes the loops
//! that use them (a libm call in a loop body keeps it scalar: glibc's `tanhf` was a quarter of
//! the transformer's step). Straight-line code with selects, no branches and no table: the same
//! bits on every CPU, in the JIT and in executables, and a shape a GPU kernel can take as is.
//!
//! Both are the classic single-precision algorithms (Cody–Waite reduction and a degree-6
//! polynomial for `exp`; an odd polynomial near zero and `1 - 2/(e^{2|x|} + 1)` elsewhere for
//! `tanh`), within a few units in the last place of libm (`tests/conformance/unary.ppc`).

use super::emit::Emitter;
use ppc_dialect::DType;

/// How the generated code computes: as the interpreter does, or as fast as it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// The runtime's tuned GEMM and vectorizable `exp`/`tanh` written in `arith` (this
    /// file): equal to the interpreter up to rounding (1e-5 normwise in f32).
    Fast,
    /// Matmuls as `linalg.generic` loops in the interpreter's order and libm's `exp`/`tanh`:
    /// slow; bit-identical to the interpreter.
    Exact,
}

/// `c0 + x·(c1 + x·(c2 + …))`, Horner's scheme, coefficients from the constant term up.
fn horner(e: &mut Emitter, x: &str, coefficients: &[f64]) -> String {
    let (last, rest) = coefficients
        .split_last()
        .expect("a polynomial has a coefficient");
    let mut acc = e.constant(*last, DType::F32);
    for &c in rest.iter().rev() {
        let k = e.constant(c, DType::F32);
        let m = e.let_(&format!("arith.mulf {acc}, {x} : f32"));
        acc = e.let_(&format!("arith.addf {m}, {k} : f32"));
    }
    acc
}

/// `e^x` in f32 for the `x <= 0` that a softmax exponentiates (its scores less their row's
/// maximum), with what would be subnormal (`x < -87`) flushed to 0: no subnormal arithmetic,
/// which costs a microcode assist per element on x86 (a softmax over causally masked scores,
/// half of them -1e9: 511 ms of the large transformer's 1.9 s step, 225 ms with the flush;
/// BENCHMARKS.md). For sums that are at least 1 (a softmax's) the flushed terms never changed
/// a bit. NaN stays NaN. On `[-87, 0]`, [`exp`]'s bits with one scaling instead of two.
pub fn exp_flushed(e: &mut Emitter, x: &str) -> String {
    let lo = e.constant(-87.0, DType::F32);
    let zero = e.constant(0.0, DType::F32);
    let tiny = e.let_(&format!("arith.cmpf olt, {x}, {lo} : f32"));
    let c = e.let_(&format!("arith.maximumf {x}, {lo} : f32"));
    let y = exp_normal(e, &c);
    let y = e.let_(&format!("arith.select {tiny}, {zero}, {y} : f32"));
    keep_nan(e, x, &y)
}

/// `e^x` in f32. Overflows to +inf, underflows through the subnormals to 0, NaN stays NaN.
pub fn exp(e: &mut Emitter, x: &str) -> String {
    // Beyond these every result is +inf or 0; inside them n below stays in [-150, 128].
    let (lo, hi) = (e.constant(-104.0, DType::F32), e.constant(88.8, DType::F32));
    let c = e.let_(&format!("arith.maximumf {x}, {lo} : f32"));
    let c = e.let_(&format!("arith.minimumf {c}, {hi} : f32"));
    let (p, ni) = exp_reduced(e, &c);
    // Times 2^n as two normal powers of two, 2^(n/2) and 2^(n - n/2), so that neither
    // overflows nor is subnormal and the product rounds once.
    let two = e.constant(2.0, DType::I32);
    let n1 = e.let_(&format!("arith.divsi {ni}, {two} : i32"));
    let n2 = e.let_(&format!("arith.subi {ni}, {n1} : i32"));
    let s1 = pow2(e, &n1);
    let s2 = pow2(e, &n2);
    let y = e.let_(&format!("arith.mulf {p}, {s1} : f32"));
    let y = e.let_(&format!("arith.mulf {y}, {s2} : f32"));
    keep_nan(e, x, &y)
}

/// `e^c` for a `c` in `[-87.3, 88.3]` (so that `2^n` below is a normal number), NaN not
/// handled: `e^r · 2^n`, one rounding, the same bits as [`exp`].
fn exp_normal(e: &mut Emitter, c: &str) -> String {
    let (p, n) = exp_reduced(e, c);
    let s = pow2(e, &n);
    e.let_(&format!("arith.mulf {p}, {s} : f32"))
}

/// `e^c` as `e^r` and `n` (i32) with `e^c = e^r · 2^n`, `|r| <= ln 2 / 2`: Cody–Waite
/// reduction and a degree-6 polynomial.
fn exp_reduced(e: &mut Emitter, c: &str) -> (String, String) {
    // n = round-to-even(x / ln 2), by adding and subtracting 1.5·2^23.
    let log2e = e.constant(std::f64::consts::LOG2_E, DType::F32);
    let magic = e.constant(12_582_912.0, DType::F32);
    let t = e.let_(&format!("arith.mulf {c}, {log2e} : f32"));
    let t = e.let_(&format!("arith.addf {t}, {magic} : f32"));
    let n = e.let_(&format!("arith.subf {t}, {magic} : f32"));
    // r = x - n·ln 2, with ln 2 split so that n·hi is exact.
    let (ln2_hi, ln2_lo) = (
        e.constant(0.693_359_375, DType::F32),
        e.constant(-2.121_944_4e-4, DType::F32),
    );
    let a = e.let_(&format!("arith.mulf {n}, {ln2_hi} : f32"));
    let r = e.let_(&format!("arith.subf {c}, {a} : f32"));
    let b = e.let_(&format!("arith.mulf {n}, {ln2_lo} : f32"));
    let r = e.let_(&format!("arith.subf {r}, {b} : f32"));
    // e^r = 1 + r + r²·P(r) on |r| <= ln 2 / 2.
    let p = horner(
        e,
        &r,
        &[
            5.000_000_1e-1,
            1.666_666_5e-1,
            4.166_579_6e-2,
            8.333_452e-3,
            1.398_199_9e-3,
            1.987_569_1e-4,
        ],
    );
    let r2 = e.let_(&format!("arith.mulf {r}, {r} : f32"));
    let p = e.let_(&format!("arith.mulf {p}, {r2} : f32"));
    let p = e.let_(&format!("arith.addf {p}, {r} : f32"));
    let one = e.constant(1.0, DType::F32);
    let p = e.let_(&format!("arith.addf {p}, {one} : f32"));
    let n = e.let_(&format!("arith.fptosi {n} : f32 to i32"));
    (p, n)
}

/// `y`, or `x` where `x` is NaN.
fn keep_nan(e: &mut Emitter, x: &str, y: &str) -> String {
    let nan = e.let_(&format!("arith.cmpf uno, {x}, {x} : f32"));
    e.let_(&format!("arith.select {nan}, {x}, {y} : f32"))
}

/// 2^k for an i32 k in [-126, 127], built from its exponent bits.
fn pow2(e: &mut Emitter, k: &str) -> String {
    let (bias, shift) = (e.constant(127.0, DType::I32), e.constant(23.0, DType::I32));
    let biased = e.let_(&format!("arith.addi {k}, {bias} : i32"));
    let bits = e.let_(&format!("arith.shli {biased}, {shift} : i32"));
    e.let_(&format!("arith.bitcast {bits} : i32 to f32"))
}

/// `tanh x` in f32: ±1 for large |x|, the sign of x (also for ±0), NaN stays NaN.
pub fn tanh(e: &mut Emitter, x: &str) -> String {
    // On |x|, then x's sign bit on the result (also for ±0 and NaN).
    let ax = e.let_(&format!("math.absf {x} : f32"));
    // Near zero: |x| + |x|³·P(x²) (where 1 - 2/(e^{2|x|} + 1) would cancel).
    let z = e.let_(&format!("arith.mulf {ax}, {ax} : f32"));
    let p = horner(
        e,
        &z,
        &[
            -3.333_328_2e-1,
            1.333_144_2e-1,
            -5.373_971_6e-2,
            2.063_908_9e-2,
            -5.704_988_7e-3,
        ],
    );
    let xz = e.let_(&format!("arith.mulf {ax}, {z} : f32"));
    let q = e.let_(&format!("arith.mulf {xz}, {p} : f32"));
    let small = e.let_(&format!("arith.addf {ax}, {q} : f32"));
    // Elsewhere: 1 - 2/(e^{2|x|} + 1), which is 1 in f32 from 2|x| = 18.1 on: with 2|x| capped
    // at 20 the exponential needs one scaling, not [`exp`]'s two (the same bits).
    let two = e.constant(2.0, DType::F32);
    let one = e.constant(1.0, DType::F32);
    let cap = e.constant(20.0, DType::F32);
    let ax2 = e.let_(&format!("arith.mulf {ax}, {two} : f32"));
    let ax2 = e.let_(&format!("arith.minimumf {ax2}, {cap} : f32"));
    let ex = exp_normal(e, &ax2);
    let d = e.let_(&format!("arith.addf {ex}, {one} : f32"));
    let f = e.let_(&format!("arith.divf {two}, {d} : f32"));
    let large = e.let_(&format!("arith.subf {one}, {f} : f32"));
    let edge = e.constant(0.625, DType::F32);
    let near = e.let_(&format!("arith.cmpf olt, {ax}, {edge} : f32"));
    let y = e.let_(&format!("arith.select {near}, {small}, {large} : f32"));
    let (xb, yb) = (
        e.let_(&format!("arith.bitcast {x} : f32 to i32")),
        e.let_(&format!("arith.bitcast {y} : f32 to i32")),
    );
    let sign = e.constant(f64::from(i32::MIN), DType::I32);
    let s = e.let_(&format!("arith.andi {xb}, {sign} : i32"));
    let b = e.let_(&format!("arith.ori {yb}, {s} : i32"));
    let y = e.let_(&format!("arith.bitcast {b} : i32 to f32"));
    keep_nan(e, x, &y)
}
