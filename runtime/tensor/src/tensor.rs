//! Host tensors: a dtype, a static row-major shape and the elements.
//!
//! Elements are held as f32 whatever the dtype: bf16 and f16 values are f32 numbers that were
//! rounded to that format on store ([`DType::round`]), i32 values are integers (exact up to 2^24,
//! which covers every index ppc generates) and i1 values are 0 or 1. One element type keeps the
//! interpreter to a single code path per op while the rounding keeps the meaning of each dtype.

use half::{bf16, f16};
use std::fmt;

/// The most axes of a `matmul` operand: the runtime's GEMM keeps shapes inline, and the
/// front end rejects more.
pub const MAX_MATMUL_RANK: usize = 16;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    I1,
}

impl DType {
    pub const ALL: [DType; 5] = [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I1];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I1 => "i1",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    /// Bytes one element takes in memory.
    pub fn size_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I1 => 1,
        }
    }

    /// The value `x` becomes when stored in this dtype.
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::BF16 => bf16::from_f32(x).to_f32(),
            DType::F16 => f16::from_f32(x).to_f32(),
            // Toward zero, saturating, NaN to 0 (Rust's `as`, and what compiled code does).
            DType::I32 => (x as i32) as f32,
            DType::I1 => f32::from(u8::from(x != 0.0)),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dense host tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor from elements, rounded to `dtype`.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "invariant: data length matches shape"
        );
        let data = if dtype == DType::F32 {
            data
        } else {
            data.into_iter().map(|x| dtype.round(x)).collect()
        };
        Tensor { dtype, shape, data }
    }

    pub fn splat(dtype: DType, shape: Vec<usize>, value: f32) -> Tensor {
        let n = shape.iter().product();
        Tensor::new(dtype, shape, vec![value; n])
    }

    pub fn scalar(dtype: DType, value: f32) -> Tensor {
        Tensor::new(dtype, vec![], vec![value])
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        strides(&self.shape)
    }

    /// A summary number that changes when any element changes: the sum of `x * (1 + i mod 7)`
    /// in f64, so that swapped elements change it too.
    pub fn checksum(&self) -> f64 {
        self.data
            .iter()
            .enumerate()
            .map(|(i, &x)| f64::from(x) * (1 + i % 7) as f64)
            .sum()
    }
}

/// The index of row-major element `flat` of `shape`.
pub fn unflatten(flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0usize; shape.len()];
    let mut rest = flat;
    for ax in (0..shape.len()).rev() {
        idx[ax] = rest % shape[ax];
        rest /= shape[ax];
    }
    idx
}

/// Row-major strides of `shape`, in elements.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_on_store() {
        let t = Tensor::new(DType::BF16, vec![2], vec![1.0 + 1.0 / 512.0, 3.0]);
        assert_eq!(t.data, vec![1.0, 3.0]);
        assert_eq!(DType::I1.round(-2.0), 1.0);
        assert_eq!(DType::I32.round(-2.7), -2.0);
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
    }
}
