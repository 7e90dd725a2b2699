//! The optimizer's update as kernels of a CUDA training step (`--target cuda`): the weights,
//! their gradients, moments and f32 masters stay on the GPU from step to step; the host sends
//! each step's hyper-parameters (eight floats) and fetches the state only for a checkpoint and
//! at the end of a run.
//!
//! The compiler writes the kernels (`compiler/src/lower/update.rs`) with
//! [`crate::optim::Optimizer::update`]'s operations in its order, each rounded once (PTX `.rn`,
//! no fused multiply-adds), so that they compute the same bits as the host would.
//!
//! With `grad_clip`, more kernels compute the sums of squares of the gradients' (parameter,
//! layer) slices in `clip.rs`'s order: the host fetches those numbers only, finds the global
//! norm (across ranks too), and the update's kernels apply the scale.
//!
//! What still goes through the host: the gradients of the parameters every rank holds (summed
//! across the pipeline) and every gradient with `--replicas` (summed across the replicas). They
//! are fetched, summed, and copied back.

use crate::exec::{CallError, Program};
use crate::manifest::{Arg, Manifest, Role};
use crate::memref::HostBuffer;
use crate::optim::{Kind, Optimizer};
use crate::tensor::{DType, Tensor};

/// The entry points: AdamW's update, SGD's, the gradients' sums of squares.
pub const ADAMW: &str = "ppc_update_adamw";
pub const SGD: &str = "ppc_update_sgd";
pub const SQUARES: &str = "ppc_grad_squares";

/// The slots of the update's last argument (role `Hyper`, f32).
pub mod hyper {
    pub const LR: usize = 0;
    /// AdamW's `beta1`; SGD's momentum.
    pub const BETA1: usize = 1;
    pub const BETA2: usize = 2;
    pub const EPS: usize = 3;
    pub const WEIGHT_DECAY: usize = 4;
    /// AdamW's bias corrections, `1 - beta1^t` and `1 - beta2^t`.
    pub const BIAS1: usize = 5;
    pub const BIAS2: usize = 6;
    /// What every gradient is multiplied by first: `grad_clip`'s scale, else 1.
    pub const SCALE: usize = 7;
    pub const COUNT: usize = 8;
}

/// Whether a program has the update entries: a CUDA training step.
pub fn built(m: &Manifest) -> bool {
    m.gpu.is_some() && m.trains()
}

/// The arguments of the update of `kind`: for each parameter, in the manifest's order, the
/// parameter, its gradient, its first moment, (AdamW) its second moment and (a parameter not
/// stored in f32) its f32 master, all of the parameter's shape; then the hyper-parameters.
pub fn args(m: &Manifest, kind: Kind) -> Vec<Arg> {
    let mut args = Vec::new();
    for p in m.args.iter().filter(|a| a.role == Role::Param) {
        let f32_as = |role| Arg {
            role,
            dtype: DType::F32,
            ..p.clone()
        };
        args.extend([p.clone(), f32_as(Role::Grad), f32_as(Role::Moment1)]);
        if kind == Kind::AdamW {
            args.push(f32_as(Role::Moment2));
        }
        if p.dtype != DType::F32 {
            args.push(f32_as(Role::Master));
        }
    }
    args.push(vector(Role::Hyper, DType::F32, hyper::COUNT));
    args
}

/// A vector argument of the optimizer's entries, named as its role.
fn vector(role: Role, dtype: DType, len: usize) -> Arg {
    Arg {
        role,
        name: format!("{role:?}").to_lowercase(),
        dtype,
        shape: vec![len],
        init: crate::Init::Zeros,
        layer_axes: 0,
        shard_axis: None,
    }
}

/// The arguments of the gradients' sums of squares: each parameter's gradient (f32, of the
/// parameter's shape, in the manifest's order), then the sums: for each parameter its
/// `clip::slices` sums in order, each f64 as two i32 (its bits, low half first).
pub fn squares_args(m: &Manifest) -> Vec<Arg> {
    let params = m.args.iter().filter(|a| a.role == Role::Param);
    let mut args: Vec<Arg> = params
        .clone()
        .map(|p| Arg {
            role: Role::Grad,
            dtype: DType::F32,
            ..p.clone()
        })
        .collect();
    let slices: usize = params.map(crate::clip::slices).sum();
    args.push(vector(Role::Squares, DType::I32, 2 * slices));
    args
}

/// The sums of squares of the [`crate::clip::slices`] of `grads` (one per parameter of
/// `params`, the program's, in order), computed by the program's kernels in `clip.rs`'s order
/// ([`crate::clip::sum_of_squares`]): only these numbers leave the GPU.
pub fn sums_of_squares(
    program: &Program,
    params: &[&Arg],
    grads: Vec<&mut HostBuffer>,
) -> Result<Vec<Vec<f64>>, CallError> {
    let slices: Vec<usize> = params.iter().map(|a| crate::clip::slices(a)).collect();
    let mut out = HostBuffer::zeros(DType::I32, &[2 * slices.iter().sum::<usize>()]);
    program.squares(grads, &mut out)?;
    let mut sums = (out.bytes().chunks(8))
        .map(|b| f64::from_le_bytes(b.try_into().expect("invariant: eight bytes")));
    Ok(slices
        .iter()
        .map(|&n| sums.by_ref().take(n).collect())
        .collect())
}

/// What clipping `grads` (one per parameter of `params`, in order) to the global norm `max`
/// multiplies them by (1: nothing to clip), from their [`sums_of_squares`] on the GPU.
pub fn clip_scale(
    program: &Program,
    params: &[&Arg],
    grads: Vec<&mut HostBuffer>,
    max: f64,
) -> Result<f32, CallError> {
    let sums = sums_of_squares(program, params, grads)?;
    let norm = crate::clip::global_norm_of_sums(&program.manifest, params, &sums);
    Ok(crate::clip::scale(norm, max).unwrap_or(1.0))
}

/// The optimizer's state as the update's arguments: per parameter, its first and second
/// moments and its master (`None`: stored in f32, its own master), and the hyper-parameters.
pub struct GpuUpdate {
    m: Vec<HostBuffer>,
    v: Vec<HostBuffer>,
    master: Vec<Option<HostBuffer>>,
    hyper: HostBuffer,
}

impl GpuUpdate {
    /// The state of `opt`, which updates `params`.
    pub fn new(opt: &Optimizer, params: &[HostBuffer]) -> GpuUpdate {
        let buffer = |p: &HostBuffer, data: &[f32]| {
            HostBuffer::from_tensor(&Tensor::new(DType::F32, p.shape.clone(), data.to_vec()))
        };
        GpuUpdate {
            m: params
                .iter()
                .zip(&opt.m)
                .map(|(p, m)| buffer(p, m))
                .collect(),
            v: params
                .iter()
                .zip(&opt.v)
                .map(|(p, v)| buffer(p, v))
                .collect(),
            master: (params.iter().zip(&opt.master))
                .map(|(p, w)| (p.dtype != DType::F32).then(|| buffer(p, w)))
                .collect(),
            hyper: HostBuffer::zeros(DType::F32, &[hyper::COUNT]),
        }
    }

    /// One step of `opt` on the GPU: `params` updated from `grads` (one per parameter, in
    /// order) multiplied by `scale`, as [`Optimizer::update`] updates them on the host.
    pub fn step(
        &mut self,
        program: &Program,
        opt: &mut Optimizer,
        params: &mut [HostBuffer],
        grads: Vec<&mut HostBuffer>,
        scale: f32,
    ) -> Result<(), CallError> {
        let (c, (bias1, bias2)) = opt.next_step();
        let h = self.hyper.f32s_mut().expect("invariant: f32");
        h[hyper::LR] = c.lr;
        h[hyper::BETA1] = match c.kind {
            Kind::AdamW => c.beta1,
            Kind::Sgd => c.momentum,
        };
        h[hyper::BETA2] = c.beta2;
        h[hyper::EPS] = c.eps;
        h[hyper::WEIGHT_DECAY] = c.weight_decay;
        h[hyper::BIAS1] = bias1;
        h[hyper::BIAS2] = bias2;
        h[hyper::SCALE] = scale;
        let mut v = self.v.iter_mut();
        let mut bufs = Vec::new();
        for (((p, g), m), w) in params
            .iter_mut()
            .zip(grads)
            .zip(&mut self.m)
            .zip(&mut self.master)
        {
            bufs.extend([p, g, m]);
            if c.kind == Kind::AdamW {
                bufs.push(v.next().expect("invariant: AdamW has second moments"));
            }
            bufs.extend(w.as_mut());
        }
        bufs.push(&mut self.hyper);
        program.update(c.kind, bufs)
    }

    /// Brings the weights and the optimizer's state back from the GPU: `params` and `opt` as
    /// the host's updates would have left them.
    pub fn fetch(&mut self, program: &Program, opt: &mut Optimizer, params: &mut [HostBuffer]) {
        let names: Vec<String> = (program.manifest.args.iter())
            .filter(|a| a.role == Role::Param)
            .map(|a| a.name.clone())
            .collect();
        let f32s = |b: &HostBuffer| b.f32s().expect("invariant: f32").to_vec();
        for (i, name) in names.iter().enumerate() {
            program.fetch(Role::Param, name, &mut params[i]);
            program.fetch(Role::Moment1, name, &mut self.m[i]);
            opt.m[i] = f32s(&self.m[i]);
            if let Some(v) = self.v.get_mut(i) {
                program.fetch(Role::Moment2, name, v);
                opt.v[i] = f32s(v);
            }
            if let Some(w) = &mut self.master[i] {
                program.fetch(Role::Master, name, w);
                opt.master[i] = f32s(w);
            }
        }
    }
}
