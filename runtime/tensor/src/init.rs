//! Parameter values and synthetic inputs, drawn from the seeded generator.
//!
//! The interpreter, the JIT and generated executables all call these two functions, so they
//! see identical numbers for one seed, whatever the backend and however the stages are laid out.

use crate::params::{ParamError, ParamFile};
use crate::rng::{Init, Rng};
use crate::tensor::{DType, Tensor};
use std::sync::Arc;

/// How synthetic inputs are drawn: normal with standard deviation 1.
pub const INPUT_INIT: Init = Init::Normal(1.0);

/// Which part of a full parameter a rank holds: along `axis` (one of the layer axes), entries
/// `offset..offset + shape[axis]` of a full axis of `full` entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub axis: usize,
    pub full: usize,
    pub offset: usize,
}

/// Which layers a parameter's values belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layers {
    /// The whole tensor is the parameter of this one layer.
    One(u64),
    /// The first `axes` axes enumerate layer slots, row-major; a `shard` holds part of them.
    /// Slots `model_layers..` are empty (uneven depth): zeros, from any source.
    Stacked {
        axes: usize,
        shard: Option<Shard>,
        model_layers: u64,
    },
}

/// Where parameter values come from: the seeded generator, or a file (`--params`).
#[derive(Clone, Debug)]
pub enum Source {
    Seeded(u64),
    File(Arc<ParamFile>),
}

impl Source {
    /// The `n` values of parameter `name` (drawn with `init`) of model layer `layer`, before
    /// rounding to the storage dtype.
    pub fn layer(
        &self,
        name: &str,
        layer: u64,
        init: Init,
        n: usize,
    ) -> Result<Vec<f32>, ParamError> {
        match self {
            Source::Seeded(seed) => Ok(Rng::stream(*seed, name, layer).fill(init, n)),
            Source::File(f) => f.layer(name, layer),
        }
    }
}

/// A parameter of `shape` whose layer `l` comes from `source`: the seeded stream `(name, l)` or
/// the file's `layers.{l}.{name}`. A shard is numbered by its place in the full parameter, so a
/// rank holds exactly the numbers the one-process program holds in its slice.
pub fn param_from(
    source: &Source,
    name: &str,
    dtype: DType,
    shape: &[usize],
    layers: Layers,
    init: Init,
) -> Result<Tensor, ParamError> {
    let axes = match layers {
        Layers::One(_) => 0,
        Layers::Stacked { axes, shard, .. } => {
            assert!(
                shard.is_none_or(|s| s.axis < axes),
                "invariant: a parameter is sharded along one of its layer axes"
            );
            axes
        }
    };
    let layer_shape = &shape[..axes];
    let count: usize = layer_shape.iter().product();
    let inner: usize = shape[axes..].iter().product();
    let mut data = Vec::with_capacity(count * inner);
    for l in 0..count {
        let index = match layers {
            Layers::One(layer) => layer,
            Layers::Stacked {
                shard,
                model_layers,
                ..
            } => match global_layer(l, layer_shape, shard) as u64 {
                empty if empty >= model_layers => {
                    data.extend(std::iter::repeat_n(0.0, inner));
                    continue;
                }
                layer => layer,
            },
        };
        data.extend(source.layer(name, index, init, inner)?);
    }
    Ok(Tensor::new(dtype, shape.to_vec(), data))
}

/// The row-major index, in the full layer axes, of local layer `l`.
pub fn global_layer(l: usize, local: &[usize], shard: Option<Shard>) -> usize {
    let Some(s) = shard else { return l };
    let (mut rest, mut flat, mut scale) = (l, 0, 1);
    for ax in (0..local.len()).rev() {
        let (i, full) = if ax == s.axis {
            (rest % local[ax] + s.offset, s.full)
        } else {
            (rest % local[ax], local[ax])
        };
        rest /= local[ax];
        flat += i * scale;
        scale *= full;
    }
    flat
}

/// `microbatches` synthetic microbatches of `shape`, stacked as `[microbatches, ...shape]`:
/// microbatch `m` comes from the stream `("input", m)`, drawn with `init` ([`INPUT_INIT`]
/// unless the model says otherwise) and rounded to `dtype` (integers toward zero: token ids
/// `uniform(0, vocab)` are `0..vocab`).
pub fn synthetic_inputs(
    seed: u64,
    dtype: DType,
    init: Init,
    shape: &[usize],
    microbatches: usize,
) -> Tensor {
    let n: usize = shape.iter().product();
    let mut data = Vec::with_capacity(n * microbatches);
    for m in 0..microbatches {
        data.extend(Rng::stream(seed, "input", m as u64).fill(init, n));
    }
    let mut full = vec![microbatches];
    full.extend(shape);
    Tensor::from_values(dtype, full, data.into_iter().map(f64::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_slices_of_the_full_parameter() {
        // [repeats 2, stages 4, k 3] layers, 5 values each; rank 1 of 2 holds stages 2..4.
        let stacked = |shard| Layers::Stacked {
            axes: 3,
            shard,
            model_layers: 24,
        };
        let src = Source::Seeded(7);
        let param = |shape: &[usize], layers| {
            param_from(&src, "w", DType::F32, shape, layers, INPUT_INIT).expect("seeded")
        };
        let full = param(&[2, 4, 3, 5], stacked(None));
        let shard = Shard {
            axis: 1,
            full: 4,
            offset: 2,
        };
        let part = param(&[2, 2, 3, 5], stacked(Some(shard)));
        for (r, s, k) in
            (0..2).flat_map(|r| (0..2).flat_map(move |s| (0..3).map(move |k| (r, s, k))))
        {
            let local = ((r * 2 + s) * 3 + k) * 5;
            let global = ((r * 4 + s + 2) * 3 + k) * 5;
            assert_eq!(part.data[local..local + 5], full.data[global..global + 5]);
        }
    }
}
