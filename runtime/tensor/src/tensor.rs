//! Host tensors: a dtype, a static row-major shape and the elements.
//!
//! Elements are held as 32-bit words whatever the dtype: bf16 and f16 values are f32 numbers
//! that were rounded to that format on store, i32 values are their two's-complement bits (so
//! every i32 is exact, and ops that only move elements copy them without knowing the dtype), and
//! i1 values are 0.0 or 1.0. [`DType::store`] turns a number into its word and [`DType::load`]
//! back; one element type keeps the interpreter to one code path for the ops that move data.

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

    /// The word that stores the number `x` in this dtype: floats rounded to the format (to
    /// nearest even), i32 toward zero and saturating with NaN to 0 (Rust's `as`, and what
    /// compiled code does), i1 as whether `x` is nonzero.
    pub fn store(self, x: f64) -> f32 {
        match self {
            DType::F32 => x as f32,
            DType::BF16 => bf16::from_f32(x as f32).to_f32(),
            DType::F16 => f16::from_f32(x as f32).to_f32(),
            DType::I32 => f32::from_bits((x as i32) as u32),
            DType::I1 => f32::from(u8::from(x != 0.0)),
        }
    }

    /// The number that the word `w` of this dtype holds.
    pub fn load(self, w: f32) -> f64 {
        match self {
            DType::I32 => f64::from(w.to_bits() as i32),
            _ => f64::from(w),
        }
    }

    /// `w` as it is stored: a no-op for a word already of this dtype.
    fn canonical(self, w: f32) -> f32 {
        match self {
            DType::F32 | DType::I32 => w,
            _ => self.store(f64::from(w)),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dense host tensor. Equal tensors have the same dtype, shape and elements (floats compared
/// as numbers, so NaN differs from itself and -0.0 equals 0.0; i32 as integers).
#[derive(Clone, Debug)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The elements as stored (see the module's doc): for i32, read them with [`Tensor::int`]
    /// or [`Tensor::values`].
    pub data: Vec<f32>,
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        let same = |a: &f32, b: &f32| match self.dtype {
            DType::I32 => a.to_bits() == b.to_bits(),
            _ => a == b,
        };
        self.dtype == other.dtype
            && self.shape == other.shape
            && self.data.len() == other.data.len()
            && self.data.iter().zip(&other.data).all(|(a, b)| same(a, b))
    }
}

impl Tensor {
    /// A tensor from its stored elements (words of `dtype`; a float is rounded to `dtype`,
    /// which leaves an element already of that dtype as it is). Numbers go through
    /// [`Tensor::from_values`] instead, integers through [`Tensor::from_ints`].
    pub fn new(dtype: DType, shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "invariant: data length matches shape"
        );
        let data = match dtype {
            DType::F32 | DType::I32 => data,
            _ => data.into_iter().map(|w| dtype.canonical(w)).collect(),
        };
        Tensor { dtype, shape, data }
    }

    /// A tensor holding the numbers `values`, each stored in `dtype` ([`DType::store`]).
    pub fn from_values(
        dtype: DType,
        shape: Vec<usize>,
        values: impl IntoIterator<Item = f64>,
    ) -> Tensor {
        let data = values.into_iter().map(|x| dtype.store(x)).collect();
        Tensor::new(dtype, shape, data)
    }

    /// An i32 tensor.
    pub fn from_ints(shape: Vec<usize>, ints: impl IntoIterator<Item = i32>) -> Tensor {
        let data = ints.into_iter().map(|i| f32::from_bits(i as u32)).collect();
        Tensor::new(DType::I32, shape, data)
    }

    /// Every element holding the number `value`.
    pub fn splat(dtype: DType, shape: Vec<usize>, value: f64) -> Tensor {
        let n = shape.iter().product();
        Tensor::new(dtype, shape, vec![dtype.store(value); n])
    }

    pub fn scalar(dtype: DType, value: f64) -> Tensor {
        Tensor::splat(dtype, vec![], value)
    }

    /// The number element `i` holds.
    pub fn value(&self, i: usize) -> f64 {
        self.dtype.load(self.data[i])
    }

    /// The numbers the elements hold, in order.
    pub fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.data.iter().map(|&w| self.dtype.load(w))
    }

    /// Element `i` of an i32 tensor (of another dtype: its number, toward zero).
    pub fn int(&self, i: usize) -> i32 {
        match self.dtype {
            DType::I32 => self.data[i].to_bits() as i32,
            _ => self.data[i] as i32,
        }
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
        self.values()
            .enumerate()
            .map(|(i, x)| x * (1 + i % 7) as f64)
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
        assert_eq!(DType::I1.store(-2.0), 1.0);
        assert_eq!(DType::I32.load(DType::I32.store(-2.7)), -2.0);
        assert_eq!(DType::I32.load(DType::I32.store(1e12)), f64::from(i32::MAX));
        let big = Tensor::from_ints(vec![2], [16_777_217, i32::MIN]);
        assert_eq!(
            big.values().collect::<Vec<_>>(),
            [16_777_217.0, -2_147_483_648.0]
        );
        assert_eq!(big.int(1), i32::MIN);
        // 0 and i32::MIN are different integers (their words are 0.0 and -0.0 as floats).
        assert_ne!(big, Tensor::from_ints(vec![2], [16_777_217, 0]));
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
    }
}
