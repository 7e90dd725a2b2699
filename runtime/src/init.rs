//! Parameter values and synthetic inputs, drawn from the seeded generator.
//!
//! The interpreter, the JIT and generated executables all call these two functions, so they
//! see identical numbers for one seed, whatever the backend and however the stages are laid out.

use crate::rng::{Init, Rng};
use crate::tensor::{DType, Tensor};

/// How synthetic inputs are drawn: normal with standard deviation 1.
pub const INPUT_INIT: Init = Init::Normal(1.0);

/// A parameter of `shape` whose first `layer_axes` axes enumerate layers (row-major): the slice
/// of layer `l` comes from the stream `(name, l)`. With `layer_axes = 0` the whole tensor
/// belongs to layer `layer`.
pub fn param(
    seed: u64,
    name: &str,
    dtype: DType,
    shape: &[usize],
    layer_axes: usize,
    init: Init,
    layer: u64,
) -> Tensor {
    let layers: usize = shape[..layer_axes].iter().product();
    let inner: usize = shape[layer_axes..].iter().product();
    let mut data = Vec::with_capacity(layers * inner);
    for l in 0..layers {
        let index = if layer_axes == 0 { layer } else { l as u64 };
        data.extend(Rng::stream(seed, name, index).fill(init, inner));
    }
    Tensor::new(dtype, shape.to_vec(), data)
}

/// `microbatches` synthetic microbatches of `shape`, stacked as `[microbatches, ...shape]`:
/// microbatch `m` comes from the stream `("input", m)`.
pub fn synthetic_inputs(seed: u64, dtype: DType, shape: &[usize], microbatches: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let mut data = Vec::with_capacity(n * microbatches);
    for m in 0..microbatches {
        data.extend(Rng::stream(seed, "input", m as u64).fill(INPUT_INIT, n));
    }
    let mut full = vec![microbatches];
    full.extend(shape);
    Tensor::new(dtype, full, data)
}
