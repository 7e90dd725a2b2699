//! Gradient-norm clipping (`grad_clip`): when the global L2 norm of all gradients, over every
//! parameter of every layer, exceeds `max`, every gradient is scaled by `max / norm`.
//!
//! The norm is one number on every rank and the same on any rank count: each (parameter, model
//! layer) slice's sum of squares is added up in f64 in element order by the rank that holds it,
//! the slices are gathered from the pipeline's ranks (one reduction per step) and added in
//! model order. A parameter every rank holds (`@embed`'s, `@head`'s) counts once, rank 0's.

use crate::manifest::{Arg, Manifest};

/// The global norm of `grads` (of parameters `params`, in order) on this rank's pipeline.
pub fn global_norm(m: &Manifest, params: &[&Arg], grads: &[&[f32]]) -> f64 {
    let rank = crate::comm::rank();
    let layers = m.layers as usize;
    // Slot (parameter, model layer): this rank's sum of squares there, else 0.
    let mut sums = vec![0.0f64; params.len() * layers];
    for (i, (a, g)) in params.iter().zip(grads).enumerate() {
        if a.layer_axes == 0 && rank != 0 {
            continue;
        }
        let ids = m.layer_ids(a, rank);
        let n = g.len() / ids.len().max(1);
        for (l, slice) in ids.into_iter().zip(g.chunks(n.max(1))) {
            // Empty slots of uneven depth (zero gradients) hold no layer.
            if l < m.layers {
                sums[i * layers + l as usize] =
                    slice.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            }
        }
    }
    let all = crate::comm::gather_pipeline_f64(&sums);
    let mut total = 0.0f64;
    for slot in 0..sums.len() {
        // Exactly one rank holds each slot: the others add 0.
        total += all.chunks(sums.len()).map(|part| part[slot]).sum::<f64>();
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
            args: Vec::new(),
            evaluate: Vec::new(),
            groups: Vec::new(),
            kernels: Vec::new(),
            train: Vec::new(),
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
