//! Gradient-norm clipping (`grad_clip`): when the global L2 norm of all gradients, over every
//! parameter of every layer, exceeds `max`, every gradient is scaled by `max / norm`.
//!
//! The norm is one number on every rank and the same on any rank count: each (parameter, model
//! layer) slice's sum of squares is added up in f64 in a fixed order ([`sum_of_squares`]) by
//! the rank that holds it, the slices are gathered from the pipeline's ranks (one reduction per
//! step) and added in model order. A parameter every rank holds (`@embed`'s, `@head`'s) counts
//! once, rank 0's. A CUDA program computes the slices' sums on the GPU in the same order
//! (`compiler/src/lower/grad_norms.rs`), so its norm is the host's, bit for bit.

use crate::manifest::{Arg, Manifest};

/// The lanes a slice's sum of squares is split over: element `i` adds into lane `i % LANES`,
/// in element order, and the lanes add up in lane order (on a GPU a thread per lane, its
/// neighbours reading neighbouring elements).
pub const LANES: usize = 4096;

/// The sum of squares of `slice`, in f64, in [`LANES`]' order.
pub fn sum_of_squares(slice: &[f32]) -> f64 {
    let mut lanes = vec![0.0f64; LANES.min(slice.len())];
    // Row by row of LANES elements: each lane adds its elements in order, the lanes side by
    // side (vectorized).
    for row in slice.chunks(LANES) {
        for (lane, &v) in lanes.iter_mut().zip(row) {
            *lane += f64::from(v) * f64::from(v);
        }
    }
    lanes.iter().fold(0.0, |sum, &lane| sum + lane)
}

/// How many `[layer axes...]` slices parameter `a` has (one for `@embed`'s and `@head`'s).
pub fn slices(a: &Arg) -> usize {
    a.shape[..a.layer_axes].iter().product()
}

/// The global norm of `grads` (of parameters `params`, in order) on this rank's pipeline.
pub fn global_norm(m: &Manifest, params: &[&Arg], grads: &[&[f32]]) -> f64 {
    let sums: Vec<Vec<f64>> = (params.iter().zip(grads))
        .map(|(a, g)| {
            let n = g.len() / slices(a).max(1);
            g.chunks(n.max(1)).map(sum_of_squares).collect()
        })
        .collect();
    global_norm_of_sums(m, params, &sums)
}

/// The global norm from this rank's sums of squares: `sums[i]` those of parameter `i`'s
/// [`slices`], in order.
pub fn global_norm_of_sums(m: &Manifest, params: &[&Arg], sums: &[Vec<f64>]) -> f64 {
    let rank = crate::comm::rank();
    let layers = m.layers as usize;
    // Slot (parameter, model layer): this rank's sum of squares there, else 0.
    let mut slots = vec![0.0f64; params.len() * layers];
    for (i, (a, sums)) in params.iter().zip(sums).enumerate() {
        if a.layer_axes == 0 && rank != 0 {
            continue;
        }
        for (l, &sum) in m.layer_ids(a, rank).into_iter().zip(sums) {
            // Empty slots of uneven depth (zero gradients) hold no layer.
            if l < m.layers {
                slots[i * layers + l as usize] = sum;
            }
        }
    }
    let all = crate::comm::gather_pipeline_f64(&slots);
    let mut total = 0.0f64;
    for slot in 0..slots.len() {
        // Exactly one rank holds each slot: the others add 0.
        total += all.chunks(slots.len()).map(|part| part[slot]).sum::<f64>();
    }
    total.sqrt()
}

/// What gradients of global norm `norm` are multiplied by to clip them to `max`: `max / norm`
/// where `norm > max`, else `None` (they stay as they are).
pub fn scale(norm: f64, max: f64) -> Option<f32> {
    (norm > max).then(|| (max / norm) as f32)
}

/// Scales `grads` by `max / norm` where `norm > max`; returns the norm.
pub fn clip(m: &Manifest, params: &[&Arg], grads: &mut [&mut [f32]], max: f64) -> f64 {
    let norm = {
        let shared: Vec<&[f32]> = grads.iter().map(|g| &**g).collect();
        global_norm(m, params, &shared)
    };
    if let Some(scale) = scale(norm, max) {
        for g in grads.iter_mut() {
            g.iter_mut().for_each(|v| *v *= scale);
        }
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Role;
    use crate::rng::Init;

    fn arg(name: &str, shape: Vec<usize>, layer_axes: usize) -> Arg {
        Arg {
            role: Role::Param,
            name: name.into(),
            dtype: crate::DType::F32,
            shape,
            init: Init::Zeros,
            layer_axes,
            shard_axis: None,
        }
    }

    /// Element `i` adds into lane `i % LANES` in element order, the lanes in lane order: the
    /// order the GPU's kernels share. Three small squares in one lane add up before they meet a
    /// large one; in element order the large one absorbs each of them.
    #[test]
    fn squares_add_in_lanes_then_the_lanes_in_order() {
        let big = 2f32.powi(27); // its square 2^54, whose f64 ulp is 4
        let mut slice = vec![0.0f32; 2 * LANES + 2];
        slice[0] = big;
        for i in [1, LANES + 1, 2 * LANES + 1] {
            slice[i] = 1.0;
        }
        let lanes = [f64::from(big) * f64::from(big), 3.0];
        let want = (0.0 + lanes[0]) + lanes[1];
        assert_eq!(sum_of_squares(&slice).to_bits(), want.to_bits());
        let element_order = slice
            .iter()
            .fold(0.0f64, |s, &v| s + f64::from(v) * f64::from(v));
        assert_ne!(want, element_order, "the example tells the orders apart");
        assert_eq!(sum_of_squares(&[]), 0.0);
    }

    #[test]
    fn the_norm_covers_every_layer_and_clipping_scales_to_the_limit() {
        let m = Manifest {
            model: "m".into(),
            stages: 2,
            microbatches: 1,
            repeats: 1,
            layers: 2,
            ranks: 1,
            replicas: 1,
            flops: 0,
            calls_per_slot: 1,
            target: None,
            gpu: None,
            flush_to_zero: false,
            args: Vec::new(),
            evaluate: Vec::new(),
            groups: Vec::new(),
            kernels: Vec::new(),
            train: Vec::new(),
            cross_entropy: false,
            ignore_index: None,
            dims: Vec::new(),
        };
        let (w, e) = (arg("w", vec![2, 3], 1), arg("e", vec![4], 0));
        let mut gw = vec![1.0f32, 2.0, 2.0, 0.0, 4.0, 0.0];
        let mut ge = vec![0.0f32, 0.0, 0.0, 4.0];
        let want = (1.0f64 + 4.0 + 4.0 + 16.0 + 16.0).sqrt();
        let params = [&w, &e];
        assert_eq!(global_norm(&m, &params, &[&gw, &ge]), want);
        let norm = clip(&m, &params, &mut [&mut gw, &mut ge], want / 2.0);
        assert_eq!(norm, want);
        let after = global_norm(&m, &params, &[&gw, &ge]);
        assert!((after - want / 2.0).abs() < 1e-6, "{after}");
        // Below the limit nothing changes.
        let before = gw.clone();
        clip(&m, &params, &mut [&mut gw, &mut ge], 100.0);
        assert_eq!(gw, before);
    }
}
