//! Gradients by the interpreter, for a cotangent `d_outputs` of the model's outputs: of the
//! pipelined program (its `@pipeline_vjp`) and of the model as written (each microbatch
//! backward through `@layer_vjp`, layers in reverse), both after the `autodiff` pass.
//!
//! Parameter gradients add up over microbatches `M-1, ..., 0`, starting from `-0.0`: the order
//! in which the pipeline's reverse loop meets them, so the two agree bit for bit.

use crate::interp::{microbatch, stack, Interp};
use crate::ir::names;
use crate::kernels;
use crate::op::BinaryOp;
use ppc_runtime::{DType, Tensor};

/// The outputs and the gradients of one backward pass.
#[derive(Clone, Debug)]
pub struct Grads {
    pub outputs: Tensor,
    /// `[M, ...input]`, the cotangent of the inputs.
    pub inputs: Tensor,
    /// Per parameter of `@layer` (in order): its name and its f32 gradient in each layer.
    pub params: Vec<(String, Vec<Tensor>)>,
}

impl Interp<'_> {
    /// The model as written: each microbatch through layers `0..L`, then back.
    pub fn sequential_vjp(&mut self, inputs: &Tensor, d_outputs: &Tensor) -> Result<Grads, String> {
        let m = self.module();
        let layer = m.func(names::LAYER).ok_or("the module has no `@layer`")?;
        let vjp = m
            .func(&names::vjp(names::LAYER))
            .ok_or("the module has no `@layer_vjp`: run `autodiff` first")?;
        let layers = m.pipeline.layers;
        let mut params: Vec<(String, Vec<Tensor>)> = layer
            .params
            .iter()
            .map(|p| {
                let shape = layer.ty(p.value).shape_usize();
                let zero = Tensor::splat(DType::F32, shape, -0.0);
                (
                    layer.values[p.value].name.clone(),
                    vec![zero; layers as usize],
                )
            })
            .collect();
        let mbs = m.pipeline.microbatches as usize;
        let (mut outs, mut d_ins) = (vec![None; mbs], vec![None; mbs]);
        for mb in (0..mbs).rev() {
            let mut xs = vec![microbatch(inputs, mb)];
            for l in 0..layers {
                let y = self.call(layer, vec![xs[l as usize].clone()], l)?.remove(0);
                xs.push(y);
            }
            let mut d = microbatch(d_outputs, mb);
            for l in (0..layers).rev() {
                let mut r = self.call(vjp, vec![xs[l as usize].clone(), d], l)?;
                let grads = r.split_off(2);
                d = r.remove(1);
                for ((_, acc), g) in params.iter_mut().zip(grads) {
                    let a = &mut acc[l as usize];
                    *a = kernels::binary(BinaryOp::Add, a, &g, &g.shape);
                }
            }
            outs[mb] = xs.pop();
            d_ins[mb] = Some(d);
        }
        let unwrap = |v: Vec<Option<Tensor>>| -> Vec<Tensor> { v.into_iter().flatten().collect() };
        Ok(Grads {
            outputs: stack(&unwrap(outs)),
            inputs: stack(&unwrap(d_ins)),
            params,
        })
    }

    /// The pipelined program's gradients (one process).
    pub fn pipeline_vjp(&mut self, inputs: &Tensor, d_outputs: &Tensor) -> Result<Grads, String> {
        let m = self.module();
        if m.pipeline.ranks > 1 {
            return Err("gradients of a program split over ranks are not supported yet".into());
        }
        let vjp = m
            .func(&names::vjp(names::PIPELINE))
            .ok_or("the module has no `@pipeline_vjp`: run `gpipe-loop` and `autodiff` first")?;
        let mut r = self.call(vjp, vec![inputs.clone(), d_outputs.clone()], 0)?;
        let grads = r.split_off(2);
        let d_inputs = r.remove(1);
        let outputs = r.remove(0);
        let params = per_layer(m, grads)?;
        Ok(Grads {
            outputs,
            inputs: d_inputs,
            params,
        })
    }
}

/// The loss of one training step and its gradients.
#[derive(Clone, Debug)]
pub struct Step {
    pub loss: f32,
    pub grads: Grads,
}

impl Interp<'_> {
    /// One training step's loss and gradients (`@train_vjp`: the pipelined program, then the
    /// model's loss on `targets`).
    pub fn train_step(&mut self, inputs: &Tensor, targets: &Tensor) -> Result<Step, String> {
        let m = self.module();
        let vjp = m
            .func(&names::vjp(names::TRAIN))
            .ok_or("the module has no `@train_vjp`: compile it for training")?;
        let one = Tensor::scalar(DType::F32, 1.0);
        let d_y = Tensor::splat(inputs.dtype, inputs.shape.clone(), -0.0);
        let args = vec![inputs.clone(), targets.clone(), one, d_y];
        let mut r = self.call(vjp, args, 0)?;
        // loss, outputs, d_inputs, d_targets (if float), then the parameters' gradients.
        let stage = m.func(names::STAGE).ok_or("the module has no `@stage`")?;
        let grads = r.split_off(r.len() - stage.params.len());
        let d_inputs = r.remove(2);
        let outputs = r.remove(1);
        Ok(Step {
            loss: r[0].data[0],
            grads: Grads {
                outputs,
                inputs: d_inputs,
                params: per_layer(m, grads)?,
            },
        })
    }
}

/// Gradients of `@stage`'s parameters (stacked `[R?, S, k?, ...]` in layer order), per layer.
fn per_layer(m: &crate::Module, grads: Vec<Tensor>) -> Result<Vec<(String, Vec<Tensor>)>, String> {
    let stage = m.func(names::STAGE).ok_or("the module has no `@stage`")?;
    Ok(stage
        .params
        .iter()
        .zip(grads)
        .map(|(p, g)| {
            let shape = stage.ty(p.value).shape_usize()[p.layer_axes..].to_vec();
            let n: usize = shape.iter().product();
            let layers = g
                .data
                .chunks(n)
                .map(|c| Tensor::new(DType::F32, shape.clone(), c.to_vec()))
                .collect();
            (stage.values[p.value].name.clone(), layers)
        })
        .collect())
}
