//! How far a result is from its reference, and how far it may be.

use ppc_dialect::DType;
use ppc_runtime::Tensor;

/// How far apart two results are.
pub struct Comparison {
    pub max_abs: f64,
    /// Normwise: `max |want - got| / max |want|`, so that outputs near zero do not dominate.
    pub max_rel: f64,
    /// Same shape and the same bits everywhere (NaN included).
    pub bit_exact: bool,
    /// The flat index of the largest difference (the first, among equals), if any differs.
    pub worst: Option<usize>,
}

/// Compares `got` with the reference `want`. A NaN on one side only counts as infinitely far.
pub fn compare(want: &Tensor, got: &Tensor) -> Comparison {
    if want.shape != got.shape {
        return Comparison {
            max_abs: f64::INFINITY,
            max_rel: f64::INFINITY,
            bit_exact: false,
            worst: None,
        };
    }
    let (mut max_abs, mut scale, mut worst) = (0.0f64, 0.0f64, None);
    for (i, (&a, &b)) in want.data.iter().zip(&got.data).enumerate() {
        let d = if a.is_nan() != b.is_nan() {
            f64::INFINITY
        } else if a.is_nan() {
            0.0
        } else {
            (f64::from(a) - f64::from(b)).abs()
        };
        if d > max_abs || (worst.is_none() && a.to_bits() != b.to_bits() && !a.is_nan()) {
            worst = Some(i);
        }
        max_abs = max_abs.max(d);
        if a.is_finite() {
            scale = scale.max(f64::from(a).abs());
        }
    }
    let max_rel = if max_abs == 0.0 {
        0.0
    } else {
        max_abs / scale.max(f64::MIN_POSITIVE)
    };
    let bit_exact = want
        .data
        .iter()
        .zip(&got.data)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    Comparison {
        max_abs,
        max_rel,
        bit_exact,
        worst,
    }
}

/// The largest normwise relative difference `ppc verify --backend cpu` accepts from a compiled
/// program that sums matmuls in another order than the interpreter: 1e-5 for f32; for bf16
/// (8 significant bits) and f16 (11) eight units in the last place (2^-5 and 2^-8), since a
/// different summation order can move a rounding boundary in every layer.
pub fn tolerance(d: DType) -> f64 {
    match d {
        DType::BF16 => 3.2e-2,
        DType::F16 => 4e-3,
        DType::F32 | DType::I32 | DType::I1 => 1e-5,
    }
}
