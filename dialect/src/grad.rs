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

/// A seeded cotangent of the outputs, `[M, ...output]`: standard normal values.
pub fn synthetic_cotangent(m: &crate::Module, seed: u64) -> Tensor {
    let out = m.output_type();
    let mut shape = vec![m.pipeline.microbatches as usize];
    shape.extend(out.shape_usize());
    let n = shape.iter().product();
    let data = ppc_tensor::Rng::stream(seed, "cotangent", 0).fill(ppc_tensor::Init::Normal(1.0), n);
    Tensor::new(out.dtype, shape, data)
}

/// The outputs and the gradients of one backward pass.
#[derive(Clone, Debug)]
pub struct Grads {
    pub outputs: Tensor,
    /// `[M, ...input]`, the cotangent of float inputs (token ids have none).
    pub inputs: Option<Tensor>,
    /// Per parameter of `@layer` (in order): its name and its f32 gradient in each layer.
    pub params: Vec<(String, Vec<Tensor>)>,
    /// Per parameter of `@embed` and `@head` (as `@model` declares them): its name and its f32
    /// gradient, the sum over both functions' uses and every microbatch.
    pub held_once: Vec<(String, Tensor)>,
}

impl Grads {
    /// The gradient of parameter `name`, every layer's in order.
    pub fn of(&self, name: &str) -> Option<Vec<f32>> {
        let layers = self
            .params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, ls)| ls);
        match layers {
            Some(ls) => Some(ls.iter().flat_map(|t| t.data.iter().copied()).collect()),
            None => self
                .held_once
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.data.clone()),
        }
    }
}

impl Interp<'_> {
    /// The model as written: each microbatch through `@embed`, layers `0..L` and `@head`,
    /// then back.
    pub fn sequential_vjp(
        &mut self,
        inputs: &Tensor,
        d_outputs: &Tensor,
    ) -> Result<Grads, InterpError> {
        let m = self.module();
        let layer = m.func(names::LAYER).ok_or_else(|| no_func(names::LAYER))?;
        let vjp_of = |f: &str| {
            m.func(&names::vjp(f))
                .ok_or_else(|| not_transformed(f, "run `autodiff` first"))
        };
        let vjp = vjp_of(names::LAYER)?;
        let ends: Vec<(&crate::ir::Func, &crate::ir::Func)> = [names::EMBED, names::HEAD]
            .iter()
            .filter_map(|&f| m.func(f).map(|func| vjp_of(f).map(|v| (func, v))))
            .collect::<Result<_, _>>()?;
        let embed = ends.iter().find(|(f, _)| f.name == names::EMBED).copied();
        let head = ends.iter().find(|(f, _)| f.name == names::HEAD).copied();
        let layers = m.pipeline.layers;
        let zero = |shape| Tensor::splat(DType::F32, shape, -0.0);
        let mut params: Vec<(String, Vec<Tensor>)> = layer
            .params
            .iter()
            .map(|p| {
                let shape = layer.ty(p.value).shape_usize();
                (
                    layer.values[p.value].name.clone(),
                    vec![zero(shape); layers as usize],
                )
            })
            .collect();
        let mut held_once: Vec<(String, Tensor)> = Vec::new();
        for (f, _) in &ends {
            for p in &f.params {
                let name = &f.values[p.value].name;
                if !held_once.iter().any(|(n, _)| n == name) {
                    held_once.push((name.clone(), zero(f.ty(p.value).shape_usize())));
                }
            }
        }
        let mbs = m.pipeline.microbatches as usize;
        let (mut outs, mut d_ins) = (vec![None; mbs], vec![None; mbs]);
        for mb in (0..mbs).rev() {
            let x = microbatch(inputs, mb);
            let mut xs = vec![match embed {
                Some((f, _)) => self.call(f, vec![x.clone()], 0)?.remove(0),
                None => x.clone(),
            }];
            for l in 0..layers {
                let y = self.call(layer, vec![xs[l as usize].clone()], l)?.remove(0);
                xs.push(y);
            }
            let mut d = microbatch(d_outputs, mb);
            let last = xs.last().expect("at least the input").clone();
            outs[mb] = Some(match head {
                Some((f, v)) => {
                    let y = self.call(f, vec![last.clone()], 0)?.remove(0);
                    let mut r = self.call(v, vec![last, d], 0)?;
                    let grads = r.split_off(2);
                    d = r.remove(1);
                    add_by_name(&mut held_once, f, grads);
                    y
                }
                None => last,
            });
            for l in (0..layers).rev() {
                let mut r = self.call(vjp, vec![xs[l as usize].clone(), d], l)?;
                let grads = r.split_off(2);
                d = r.remove(1);
                for ((_, acc), g) in params.iter_mut().zip(grads) {
                    let a = &mut acc[l as usize];
                    *a = kernels::binary(BinaryOp::Add, a, &g, &g.shape);
                }
            }
            d_ins[mb] = match embed {
                Some((f, v)) => {
                    // Token ids have no cotangent: the results are the output, then the grads.
                    let mut r = self.call(v, vec![x, d], 0)?;
                    let float_input = usize::from(m.input.dtype.is_float());
                    let grads = r.split_off(1 + float_input);
                    add_by_name(&mut held_once, f, grads);
                    (float_input == 1).then(|| r.remove(1))
                }
                None => Some(d),
            };
        }
        let unwrap = |v: Vec<Option<Tensor>>| -> Vec<Tensor> { v.into_iter().flatten().collect() };
        let d_ins = unwrap(d_ins);
        Ok(Grads {
            outputs: stack(&unwrap(outs)),
            inputs: (!d_ins.is_empty()).then(|| stack(&d_ins)),
            params,
            held_once,
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

    /// This rank's part of the pipelined program's gradients (`@model_vjp`, else
    /// `@pipeline_vjp`).
    fn pipeline_vjp_part(
        &mut self,
        inputs: &Tensor,
        d_outputs: &Tensor,
    ) -> Result<Part, InterpError> {
        let m = self.module();
        let name = match m.func(names::MODEL) {
            Some(_) => names::MODEL,
            None => names::PIPELINE,
        };
        let f = m.func(name).ok_or_else(|| no_func(name))?;
        let vjp = m
            .func(&names::vjp(name))
            .ok_or_else(|| not_transformed(name, "run `gpipe-loop` and `autodiff` first"))?;
        // The outputs are the last rank's: the cotangent enters there alone (elsewhere it would
        // flow back through the exchanges into the neighbours' stages).
        let d = if self.rank() + 1 == m.pipeline.ranks {
            d_outputs.clone()
        } else {
            Tensor::splat(d_outputs.dtype, d_outputs.shape.clone(), -0.0)
        };
        let r = self.call(vjp, vec![inputs.clone(), d], 0)?;
        let mut r = self.split(f, r)?;
        Ok(Part {
            loss: 0.0,
            outputs: r.results.remove(0),
            inputs: r.d_args.into_iter().next(),
            params: r.stage,
            held_once: r.own,
        })
    }

    /// The results of `@f_vjp`, `f` a function nothing calls: `f`'s results, the cotangents
    /// of its float arguments, the gradients of its own parameters (`@embed`'s and
    /// `@head`'s), then `@stage`'s by model layer ([`crate::grad`]'s `trainables` order).
    fn split(&self, f: &crate::ir::Func, mut r: Vec<Tensor>) -> Result<VjpResults, InterpError> {
        let stage = self
            .module()
            .func(names::STAGE)
            .ok_or_else(|| no_func(names::STAGE))?;
        let stage_grads = r.split_off(r.len() - stage.params.len());
        let own = r.split_off(r.len() - f.params.len());
        let d_args = r.split_off(f.body.results.len());
        let own = f
            .params
            .iter()
            .zip(own)
            .map(|(p, g)| (f.values[p.value].name.clone(), g))
            .collect();
        Ok(VjpResults {
            results: r,
            d_args,
            own,
            stage: self.per_layer(stage_grads)?,
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
        let train = m.func(names::TRAIN).ok_or_else(|| no_func(names::TRAIN))?;
        let vjp = m
            .func(&names::vjp(names::TRAIN))
            .ok_or_else(|| not_transformed(names::TRAIN, "compile it for training"))?;
        let one = Tensor::scalar(DType::F32, 1.0);
        let out = m.output_type();
        let mut shape = vec![m.pipeline.microbatches as usize];
        shape.extend(out.shape_usize());
        let d_y = Tensor::splat(out.dtype, shape, -0.0);
        let args = vec![inputs.clone(), targets.clone(), one, d_y];
        let r = self.call(vjp, args, 0)?;
        // loss, outputs; d_inputs (if float), d_targets (if float); the parameters' gradients.
        let mut r = self.split(train, r)?;
        let float_input = m.input.dtype.is_float();
        Ok(Part {
            loss: r.results[0].data[0],
            outputs: r.results.remove(1),
            inputs: float_input.then(|| r.d_args.remove(0)),
            params: r.stage,
            held_once: r.own,
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
                // Empty slots of uneven depth hold no layer.
                let layers = g
                    .data
                    .chunks(n)
                    .enumerate()
                    .map(|(l, c)| (global_layer(l, lead, shard), c))
                    .filter(|&(l, _)| (l as u64) < m.pipeline.layers)
                    .map(|(l, c)| (l, Tensor::new(DType::F32, shape.to_vec(), c.to_vec())))
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

/// One rank's gradients: the parameters of its stages, by model layer, and its part of those
/// every rank holds.
struct Part {
    loss: f32,
    outputs: Tensor,
    inputs: Option<Tensor>,
    params: LayerGrads,
    held_once: Vec<(String, Tensor)>,
}

/// [`Interp::split`]'s parts of a VJP's results.
struct VjpResults {
    results: Vec<Tensor>,
    d_args: Vec<Tensor>,
    own: Vec<(String, Tensor)>,
    stage: LayerGrads,
}

/// Adds `grads` of the parameters of `f` to the accumulators of the same names.
fn add_by_name(acc: &mut [(String, Tensor)], f: &crate::ir::Func, grads: Vec<Tensor>) {
    for (p, g) in f.params.iter().zip(grads) {
        let name = &f.values[p.value].name;
        if let Some((_, a)) = acc.iter_mut().find(|(n, _)| n == name) {
            *a = kernels::binary(BinaryOp::Add, a, &g, &g.shape);
        }
    }
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
/// gradients from rank 0 (the first), every layer's parameters from the rank that holds it,
/// and the parameters every rank holds summed over the ranks from `+0` in rank order, as the
/// runtime sums them (`ppc_runtime::comm::sum_across_pipeline`).
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
    let held_once = first
        .held_once
        .iter()
        .enumerate()
        .map(|(i, (name, t))| {
            let mut sum = Tensor::splat(DType::F32, t.shape.clone(), 0.0);
            for part in &parts {
                let g = &part.held_once[i].1;
                sum = kernels::binary(BinaryOp::Add, &sum, g, &g.shape);
            }
            (name.clone(), sum)
        })
        .collect();
    Ok(Grads {
        outputs: last.outputs.clone(),
        inputs: first.inputs.clone(),
        params,
        held_once,
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
