//! Gradients by the interpreter, for a cotangent `d_outputs` of the model's outputs: of the
//! pipelined program (its `@pipeline_vjp`) and of the model as written (each microbatch
//! backward through `@layer_vjp`, layers in reverse), both after the `autodiff` pass.
//!
//! Parameter gradients add up over microbatches `M-1, ..., 0`, starting from `-0.0`: the order
//! in which the pipeline's reverse loop meets them, so the two agree bit for bit.
//!
//! Errors are the interpreter's ([`InterpError`]): a function `autodiff` makes is missing, or a
//! run over ranks failed.

use crate::interp::{microbatch, on_ranks, shard, stack, Interp, InterpError};
use crate::ir::names;
use crate::kernels;
use crate::op::BinaryOp;
use ppc_tensor::init::{global_layer, Source};
use ppc_tensor::{DType, Tensor};

/// A seeded cotangent of the outputs, `[M, ...input]`: standard normal values.
pub fn synthetic_cotangent(m: &crate::Module, seed: u64) -> Tensor {
    let mut shape = vec![m.pipeline.microbatches as usize];
    shape.extend(m.input.shape_usize());
    let n = shape.iter().product();
    let data = ppc_tensor::Rng::stream(seed, "cotangent", 0).fill(ppc_tensor::Init::Normal(1.0), n);
    Tensor::new(m.input.dtype, shape, data)
}

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
    pub fn sequential_vjp(
        &mut self,
        inputs: &Tensor,
        d_outputs: &Tensor,
    ) -> Result<Grads, InterpError> {
        let m = self.module();
        let layer = m.func(names::LAYER).ok_or_else(|| no_func(names::LAYER))?;
        let vjp = m
            .func(&names::vjp(names::LAYER))
            .ok_or_else(|| not_transformed(names::LAYER, "run `autodiff` first"))?;
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
    pub fn pipeline_vjp(
        &mut self,
        inputs: &Tensor,
        d_outputs: &Tensor,
    ) -> Result<Grads, InterpError> {
        one_process(self.module())?;
        merge(vec![self.pipeline_vjp_part(inputs, d_outputs)?])
    }

    /// This rank's part of the pipelined program's gradients.
    fn pipeline_vjp_part(
        &mut self,
        inputs: &Tensor,
        d_outputs: &Tensor,
    ) -> Result<Part, InterpError> {
        let m = self.module();
        let vjp = m.func(&names::vjp(names::PIPELINE)).ok_or_else(|| {
            not_transformed(names::PIPELINE, "run `gpipe-loop` and `autodiff` first")
        })?;
        // The outputs are the last rank's: the cotangent enters there alone (elsewhere it would
        // flow back through the exchanges into the neighbours' stages).
        let d = if self.rank() + 1 == m.pipeline.ranks {
            d_outputs.clone()
        } else {
            Tensor::splat(d_outputs.dtype, d_outputs.shape.clone(), -0.0)
        };
        let mut r = self.call(vjp, vec![inputs.clone(), d], 0)?;
        let grads = r.split_off(2);
        let d_inputs = r.remove(1);
        Ok(Part {
            loss: 0.0,
            outputs: r.remove(0),
            inputs: d_inputs,
            params: self.per_layer(grads)?,
        })
    }

    /// One training step's loss and gradients (`@train_vjp`: the pipelined program, then the
    /// model's loss on `targets`), in one process.
    pub fn train_step(&mut self, inputs: &Tensor, targets: &Tensor) -> Result<Step, InterpError> {
        one_process(self.module())?;
        let part = self.train_step_part(inputs, targets)?;
        let loss = part.loss;
        Ok(Step {
            loss,
            grads: merge(vec![part])?,
        })
    }

    fn train_step_part(&mut self, inputs: &Tensor, targets: &Tensor) -> Result<Part, InterpError> {
        let m = self.module();
        let vjp = m
            .func(&names::vjp(names::TRAIN))
            .ok_or_else(|| not_transformed(names::TRAIN, "compile it for training"))?;
        let one = Tensor::scalar(DType::F32, 1.0);
        let d_y = Tensor::splat(inputs.dtype, inputs.shape.clone(), -0.0);
        let args = vec![inputs.clone(), targets.clone(), one, d_y];
        let mut r = self.call(vjp, args, 0)?;
        // loss, outputs, d_inputs, d_targets (if float), then the parameters' gradients.
        let stage = m.func(names::STAGE).ok_or_else(|| no_func(names::STAGE))?;
        let grads = r.split_off(r.len() - stage.params.len());
        let d_inputs = r.remove(2);
        let outputs = r.remove(1);
        Ok(Part {
            loss: r[0].data[0],
            outputs,
            inputs: d_inputs,
            params: self.per_layer(grads)?,
        })
    }

    /// Gradients of `@stage`'s parameters (stacked `[R?, S, k?, ...]`, this rank's stages) as
    /// `(model layer, gradient)`.
    fn per_layer(&self, grads: Vec<Tensor>) -> Result<LayerGrads, InterpError> {
        let m = self.module();
        let stage = m.func(names::STAGE).ok_or_else(|| no_func(names::STAGE))?;
        Ok(stage
            .params
            .iter()
            .zip(grads)
            .map(|(p, g)| {
                let ty = stage.ty(p.value);
                let full = ty.shape_usize();
                let (lead, shape) = full.split_at(p.layer_axes);
                let n: usize = shape.iter().product();
                let shard = shard(m, ty, self.rank());
                let layers = g
                    .data
                    .chunks(n)
                    .enumerate()
                    .map(|(l, c)| {
                        let t = Tensor::new(DType::F32, shape.to_vec(), c.to_vec());
                        (global_layer(l, lead, shard), t)
                    })
                    .collect();
                (stage.values[p.value].name.clone(), layers)
            })
            .collect())
    }
}

/// The loss of one training step and its gradients.
#[derive(Clone, Debug)]
pub struct Step {
    pub loss: f32,
    pub grads: Grads,
}

/// Per parameter, its name and `(model layer, gradient)` of the layers one rank holds.
type LayerGrads = Vec<(String, Vec<(usize, Tensor)>)>;

/// One rank's gradients: the parameters of its stages, by model layer.
struct Part {
    loss: f32,
    outputs: Tensor,
    inputs: Tensor,
    params: LayerGrads,
}

fn one_process(m: &crate::Module) -> Result<(), InterpError> {
    if m.pipeline.ranks > 1 {
        return Err(InterpError::SplitOverRanks {
            ranks: m.pipeline.ranks,
            instead: "use the `_on_ranks` functions",
        });
    }
    Ok(())
}

fn no_func(func: &str) -> InterpError {
    InterpError::NoFunc { func: func.into() }
}

/// `@{func}_vjp` is missing; `needs` says what makes it.
fn not_transformed(func: &str, needs: &'static str) -> InterpError {
    InterpError::NotTransformed {
        func: names::vjp(func),
        needs,
    }
}

/// The ranks' parts as one: outputs from the last rank (which holds the last stage), input
/// gradients from rank 0 (the first), every layer's parameters from the rank that holds it.
fn merge(parts: Vec<Part>) -> Result<Grads, InterpError> {
    let mut params: Vec<(String, Vec<Option<Tensor>>)> = Vec::new();
    for part in &parts {
        for (i, (name, layers)) in part.params.iter().enumerate() {
            if params.len() <= i {
                params.push((name.clone(), Vec::new()));
            }
            let slots = &mut params[i].1;
            for (l, t) in layers {
                if slots.len() <= *l {
                    slots.resize(*l + 1, None);
                }
                slots[*l] = Some(t.clone());
            }
        }
    }
    let params = params
        .into_iter()
        .map(|(name, slots)| {
            let layers = slots
                .into_iter()
                .enumerate()
                .map(|(l, t)| {
                    t.ok_or_else(|| InterpError::LayerNotHeld {
                        layer: l,
                        param: name.clone(),
                    })
                })
                .collect::<Result<_, _>>()?;
            Ok((name, layers))
        })
        .collect::<Result<_, InterpError>>()?;
    let first = parts.first().ok_or(InterpError::NoRanks)?;
    let last = parts.last().ok_or(InterpError::NoRanks)?;
    Ok(Grads {
        outputs: last.outputs.clone(),
        inputs: first.inputs.clone(),
        params,
    })
}

/// [`Interp::pipeline_vjp`] of a module sharded over ranks (one thread per rank).
pub fn pipeline_vjp_on_ranks(
    m: &crate::Module,
    seed: u64,
    source: &Source,
    inputs: &Tensor,
    d_outputs: &Tensor,
) -> Result<Grads, InterpError> {
    merge(on_ranks(m, seed, source, |i| {
        i.pipeline_vjp_part(inputs, d_outputs)
    })?)
}

/// [`Interp::train_step`] of a module sharded over ranks (one thread per rank); the loss is the
/// last rank's, the one whose outputs are the model's.
pub fn train_step_on_ranks(
    m: &crate::Module,
    seed: u64,
    source: &Source,
    inputs: &Tensor,
    targets: &Tensor,
) -> Result<Step, InterpError> {
    let parts = on_ranks(m, seed, source, |i| i.train_step_part(inputs, targets))?;
    let loss = parts.last().ok_or(InterpError::NoRanks)?.loss;
    Ok(Step {
        loss,
        grads: merge(parts)?,
    })
}
