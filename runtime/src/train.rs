//! Training with a compiled training step (`ppc compile --train`): the data, the step loop and
//! its progress, the optimizer, checkpoints.
//!
//! Data is the safetensors file of `--data` (tensors `input` `[N, ...input]` and `target`
//! `[N, ...target]`; step `s` takes rows `s·M, s·M + 1, ...` modulo N), or by default a seeded
//! task a model can learn: the same model with other weights (a *teacher*, drawn with seed
//! `seed + TEACHER_SEED_OFFSET`) labels a pool of seeded input batches (for
//! `softmax_cross_entropy`, the argmax of its logits).
//!
//! With `--replicas D` (`ppc compile`), D pipelines train side by side, replica `j` on batch
//! `step·D + j`; after the microbatch loop their gradients are summed once, in replica order
//! (the same bits on every run), and averaged, so every replica applies the same update.
//!
//! A checkpoint (`--save`, written atomically; `--resume`) is a safetensors file: the f32 master
//! weights as `layers.L.NAME` (the naming of `--params` files), the optimizer's moments as
//! `optim.m.layers.L.NAME` (and `optim.v.` for AdamW), and `optim.step`. Per-layer names do
//! not depend on how the stages are laid out, so a checkpoint resumes on any rank count.

use crate::exec::{bench, Program};
use crate::init::{self, global_layer, Shard, Source};
use crate::manifest::{Arg, Manifest, Role};
use crate::memref::HostBuffer;
use crate::optim::{Config, Kind, Optimizer};
use crate::params::tensor_name;
use crate::run_options::TrainOptions;
use crate::safetensors;
use crate::tensor::{DType, Tensor};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

/// The teacher of the synthetic task is the model drawn with `seed + TEACHER_SEED_OFFSET`.
pub const TEACHER_SEED_OFFSET: u64 = 1_000_003;
/// Input batches the synthetic task cycles through.
pub const SYNTHETIC_BATCHES: u64 = 8;

/// What a run did: the losses of its steps, in order, and the optimizer's final state.
pub struct Trained {
    pub losses: Vec<f32>,
    pub optimizer: Optimizer,
}

/// Trains with `program`'s training step as `opts` says: the loss per step on `err` (a
/// progress bar on a terminal) or as JSON lines on `out`, from the rank that holds the loss.
pub fn train(
    program: &Program,
    opts: &TrainOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Trained, String> {
    let m = &program.manifest;
    let io = |e: std::io::Error| e.to_string();
    let params_args: Vec<&Arg> = m.args.iter().filter(|a| a.role == Role::Param).collect();
    let mut params = program.params(&Source::Seeded(opts.seed))?;
    let mut optimizer = Optimizer::new(opts.optimizer, &params);
    if let Some(path) = &opts.resume {
        optimizer = resume(path, m, &params_args, opts.optimizer, &mut params)?;
        if crate::comm::rank() == 0 {
            writeln!(
                err,
                "resumed from {} at step {}",
                path.display(),
                optimizer.step
            )
            .map_err(io)?;
        }
    }
    let data = Data::new(program, opts)?;
    let mut bufs = Buffers::new(program)?;
    let first = optimizer.step;
    let mut losses = Vec::new();
    let started = Instant::now();
    // The last rank holds the model's outputs, and so the loss.
    let speaks = crate::comm::rank() == program.output_rank() && crate::comm::replica() == 0;
    let terminal = speaks && !opts.json && std::io::stderr().is_terminal();
    let mut step_once = |params: &mut Vec<HostBuffer>,
                         optimizer: &mut Optimizer,
                         step: u64|
     -> Result<f32, String> {
        // Replica `j` of `D` trains on batch `step·D + j`; the step's gradient is their mean.
        let (replicas, replica) = (m.replicas, crate::comm::replica() as u64);
        let (input, target) = data.batch(m, step * replicas + replica);
        let mut loss = bufs.run(program, input, target, params)?;
        if replicas > 1 {
            let d = replicas as f32;
            for g in &mut bufs.grads {
                let g = g.f32s_mut().expect("invariant: gradients are f32");
                crate::comm::sum_across_replicas(g);
                g.iter_mut().for_each(|v| *v /= d);
            }
            let mut l = [loss];
            crate::comm::sum_across_replicas(&mut l);
            loss = l[0] / d;
        }
        let grads: Vec<&[f32]> = bufs
            .grads_by_param()
            .map(|g| g.f32s().expect("invariant: gradients are f32"))
            .collect();
        let updating = crate::trace::start();
        optimizer.update(params, &grads);
        crate::trace::record(crate::trace::Kind::Optimizer, step as i64, updating);
        Ok(loss)
    };
    if opts.trace.is_some() {
        crate::trace::enable();
    }
    for s in 0..u64::from(opts.steps) {
        let t = Instant::now();
        let step = first + s;
        let loss = step_once(&mut params, &mut optimizer, step)?;
        crate::trace::record(crate::trace::Kind::Step, step as i64, Some(t));
        if !loss.is_finite() {
            return Err(format!(
                "step {}: the loss is {loss}: lower the learning rate (--lr)",
                step + 1
            ));
        }
        losses.push(loss);
        let took = t.elapsed().as_secs_f64();
        let done = s + 1;
        if !speaks {
        } else if opts.json {
            writeln!(
                out,
                "{{\"step\":{},\"loss\":{loss:e},\"step_s\":{took:e}}}",
                step + 1
            )
            .map_err(io)?;
        } else {
            let eta = started.elapsed().as_secs_f64() / done as f64
                * (u64::from(opts.steps) - done) as f64;
            let line = format!(
                "step {}/{}  loss {loss:.6}  {}  {took:.3} s/step  ETA {eta:.0} s",
                step + 1,
                first + u64::from(opts.steps),
                bar(done, u64::from(opts.steps)),
            );
            if terminal {
                write!(err, "\r{line}").map_err(io)?;
            } else {
                writeln!(err, "{line}").map_err(io)?;
            }
        }
    }
    if terminal {
        writeln!(err).map_err(io)?;
    }
    if let Some(path) = &opts.trace {
        crate::trace::write(path)?;
        if crate::comm::rank() == 0 {
            writeln!(err, "wrote {}", path.display()).map_err(io)?;
        }
    }
    if let Some(path) = &opts.save {
        if save(path, m, &params_args, &params, &optimizer)? {
            writeln!(err, "wrote {}", path.display()).map_err(io)?;
        }
    }
    if let Some(n) = opts.bench {
        // Forward, backward (about twice the forward's matmuls) and update.
        let flops = 3 * m.flops;
        let mut step = optimizer.step;
        let mut bench_opt = optimizer.clone();
        bench(m, flops, n, out, &mut || {
            step += 1;
            step_once(&mut params, &mut bench_opt, step).map(|_| ())
        })?;
    }
    Ok(Trained { losses, optimizer })
}

/// `[#####.....]`: `done` of `total`.
fn bar(done: u64, total: u64) -> String {
    let width = 20;
    let full = (done * width / total.max(1)) as usize;
    format!(
        "[{}{}]",
        "#".repeat(full),
        ".".repeat(width as usize - full)
    )
}

/// One call of a compiled training step: the loss, the outputs, and the f32 gradient of each
/// parameter, in the order of the manifest's parameters.
pub struct StepOutput {
    pub loss: f32,
    pub outputs: Tensor,
    pub grads: Vec<Tensor>,
}

/// Runs the training step of `program` once on `params` (which it does not change).
pub fn step(
    program: &Program,
    input: HostBuffer,
    target: HostBuffer,
    params: &mut [HostBuffer],
) -> Result<StepOutput, String> {
    let mut bufs = Buffers::new(program)?;
    let loss = bufs.run(program, input, target, params)?;
    Ok(StepOutput {
        loss,
        outputs: bufs.output.to_tensor(),
        grads: bufs.grads_by_param().map(HostBuffer::to_tensor).collect(),
    })
}

/// The buffers of one call of the training step besides the parameters.
struct Buffers {
    output: HostBuffer,
    loss: HostBuffer,
    grads: Vec<HostBuffer>,
    /// For each parameter, the index of its gradient (the one of the same name).
    grad_of: Vec<usize>,
}

impl Buffers {
    fn new(program: &Program) -> Result<Buffers, String> {
        let m = &program.manifest;
        if !m.trains() {
            return Err(
                "this program is a forward pass: compile it with `ppc compile --train`".into(),
            );
        }
        let zeros = |a: &Arg| HostBuffer::zeros(a.dtype, &a.shape);
        let of = |role| m.args.iter().filter(move |a: &&Arg| a.role == role);
        let grad_names: Vec<&str> = of(Role::Grad).map(|a| a.name.as_str()).collect();
        let grad_of = of(Role::Param)
            .map(|p| {
                grad_names.iter().position(|g| *g == p.name).ok_or_else(|| {
                    format!("the program has no gradient for parameter `{}`", p.name)
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Buffers {
            output: zeros(m.output()),
            loss: zeros(m.arg(Role::Loss).expect("invariant: checked above")),
            grads: of(Role::Grad).map(zeros).collect(),
            grad_of,
        })
    }

    fn grads_by_param(&self) -> impl Iterator<Item = &HostBuffer> {
        self.grad_of.iter().map(|&g| &self.grads[g])
    }

    /// Runs the step; returns the loss.
    fn run(
        &mut self,
        program: &Program,
        mut input: HostBuffer,
        mut target: HostBuffer,
        params: &mut [HostBuffer],
    ) -> Result<f32, String> {
        let mut bufs = Vec::new();
        let (mut params, mut grads) = (params.iter_mut(), self.grads.iter_mut());
        let (mut i, mut t, mut o, mut l) = (
            Some(&mut input),
            Some(&mut target),
            Some(&mut self.output),
            Some(&mut self.loss),
        );
        for a in &program.manifest.args {
            let b = match a.role {
                Role::Input => i.take(),
                Role::Target => t.take(),
                Role::Param => params.next(),
                Role::Output => o.take(),
                Role::Loss => l.take(),
                Role::Grad => grads.next(),
            }
            .ok_or_else(|| format!("missing buffer for argument `{}`", a.name))?;
            bufs.push(b);
        }
        program.call(bufs)?;
        Ok(self.loss.to_tensor().data[0])
    }
}

/// Batches of inputs and targets, `[M, ...]` each.
enum Data {
    /// Step `s` uses batch `s mod len`.
    Pool(Vec<(HostBuffer, HostBuffer)>),
    /// `[N, ...]` rows; step `s` uses rows `s·M + i mod N`.
    File { input: Tensor, target: Tensor },
}

impl Data {
    fn new(program: &Program, opts: &TrainOptions) -> Result<Data, String> {
        let m = &program.manifest;
        let (input, target) = (m.input(), m.arg(Role::Target).expect("invariant: training"));
        let mb = input.shape[0];
        match &opts.data {
            Some(path) => {
                let read = |name: &str, a: &Arg| -> Result<Tensor, String> {
                    let b = safetensors::read_tensor(path, name)?;
                    if b.shape.len() != a.shape.len()
                        || b.shape[1..] != a.shape[1..]
                        || b.shape[0] == 0
                    {
                        return Err(format!(
                            "{}: tensor `{name}` is {}{:?}, but this model trains on [N, {}] ({} per microbatch)",
                            path.display(),
                            b.dtype,
                            b.shape,
                            a.shape[1..].iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
                            a.dtype
                        ));
                    }
                    Ok(b.to_tensor())
                };
                let (x, y) = (read("input", input)?, read("target", target)?);
                if x.shape[0] != y.shape[0] {
                    return Err(format!(
                        "{}: {} inputs but {} targets",
                        path.display(),
                        x.shape[0],
                        y.shape[0]
                    ));
                }
                Ok(Data::File {
                    input: x,
                    target: y,
                })
            }
            None => {
                let teacher = program.params(&Source::Seeded(opts.seed + TEACHER_SEED_OFFSET))?;
                let mut bufs = Buffers::new(program)?;
                let mut teacher = teacher;
                let mut pool = Vec::new();
                for b in 0..SYNTHETIC_BATCHES {
                    let x = HostBuffer::from_tensor(&init::synthetic_inputs(
                        opts.seed.wrapping_mul(SYNTHETIC_BATCHES) + b,
                        input.dtype,
                        &input.shape[1..],
                        mb,
                    ));
                    let zero = HostBuffer::zeros(target.dtype, &target.shape);
                    bufs.run(program, x.clone(), zero, &mut teacher)?;
                    let y = bufs.output.to_tensor();
                    let t = match target.dtype {
                        DType::I32 => argmax_last(&y, target),
                        _ => Tensor::new(target.dtype, target.shape.clone(), y.data),
                    };
                    pool.push((x, HostBuffer::from_tensor(&t)));
                }
                Ok(Data::Pool(pool))
            }
        }
    }

    fn batch(&self, m: &crate::manifest::Manifest, step: u64) -> (HostBuffer, HostBuffer) {
        match self {
            Data::Pool(pool) => pool[(step % pool.len() as u64) as usize].clone(),
            Data::File { input, target } => {
                let target_arg = m.arg(Role::Target).expect("invariant: training");
                (rows(input, m.input(), step), rows(target, target_arg, step))
            }
        }
    }
}

/// The `M` rows of `t` that step `step` trains on, as argument `a` takes them.
fn rows(t: &Tensor, a: &Arg, step: u64) -> HostBuffer {
    let (mb, n) = (a.shape[0] as u64, t.shape[0] as u64);
    let inner: usize = a.shape[1..].iter().product();
    let data = (0..mb)
        .flat_map(|i| {
            let r = ((step * mb + i) % n) as usize;
            t.data[r * inner..(r + 1) * inner].to_vec()
        })
        .collect();
    HostBuffer::from_tensor(&Tensor::new(a.dtype, a.shape.clone(), data))
}

/// The index of the largest logit of each row (the last axis of `y`).
fn argmax_last(y: &Tensor, target: &Arg) -> Tensor {
    let classes = *y.shape.last().expect("invariant: logits have a class axis");
    let data = y
        .data
        .chunks(classes)
        .map(|row| {
            let best = (0..classes).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            best as f32
        })
        .collect();
    Tensor::new(DType::I32, target.shape.clone(), data)
}

/// The model layer of each of the `[layer axes...]` slices of parameter `a` on rank `rank`.
fn layer_ids(m: &Manifest, a: &Arg, rank: usize) -> Vec<u64> {
    let lead = &a.shape[..a.layer_axes];
    let shard = a.shard_axis.map(|axis| Shard {
        axis,
        full: m.stages as usize,
        offset: rank * a.shape[axis],
    });
    let count: usize = lead.iter().product();
    (0..count)
        .map(|l| global_layer(l, lead, shard) as u64)
        .collect()
}

/// Writes the checkpoint (on rank 0, which gathers every rank's stages); true where written.
fn save(
    path: &Path,
    m: &Manifest,
    params: &[&Arg],
    bufs: &[HostBuffer],
    opt: &Optimizer,
) -> Result<bool, String> {
    // Every replica holds the same weights: the first one writes them.
    if crate::comm::replica() != 0 {
        return Ok(false);
    }
    let mut named: Vec<(String, HostBuffer)> = Vec::new();
    for (i, a) in params.iter().enumerate() {
        let inner: Vec<usize> = a.shape[a.layer_axes..].to_vec();
        let n: usize = inner.iter().product();
        let mut add = |prefix: &str, data: &[f32]| {
            let local: Vec<f64> = data.iter().map(|&v| f64::from(v)).collect();
            // Every rank holds slices of the same shape, so rank `r`'s are chunk `r`.
            let Some(all) = crate::comm::gather(&local) else {
                return;
            };
            for (r, chunk) in all.chunks(local.len()).enumerate() {
                for (l, values) in layer_ids(m, a, r).into_iter().zip(chunk.chunks(n)) {
                    let values = values.iter().map(|&v| v as f32).collect();
                    let t = Tensor::new(DType::F32, inner.clone(), values);
                    let name = format!("{prefix}{}", tensor_name(l, &a.name));
                    named.push((name, HostBuffer::from_tensor(&t)));
                }
            }
        };
        add("", opt.weights(i, bufs));
        add("optim.m.", &opt.m[i]);
        if opt.config.kind == Kind::AdamW {
            add("optim.v.", &opt.v[i]);
        }
    }
    if crate::comm::rank() != 0 {
        return Ok(false);
    }
    // In one order whatever the rank count, so that the bytes are too.
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let step = Tensor::new(DType::I32, vec![], vec![opt.step as f32]);
    named.push(("optim.step".into(), HostBuffer::from_tensor(&step)));
    let refs: Vec<(&str, &HostBuffer)> = named.iter().map(|(n, b)| (n.as_str(), b)).collect();
    safetensors::write(path, &refs)?;
    Ok(true)
}

/// This rank's parameters and optimizer state from a checkpoint of [`save`], of any rank count.
fn resume(
    path: &Path,
    m: &Manifest,
    params: &[&Arg],
    config: Config,
    bufs: &mut [HostBuffer],
) -> Result<Optimizer, String> {
    let rank = crate::comm::rank();
    let read = |prefix: &str, a: &Arg| -> Result<Vec<f32>, String> {
        let inner: Vec<usize> = a.shape[a.layer_axes..].to_vec();
        let mut data = Vec::new();
        for l in layer_ids(m, a, rank) {
            let key = format!("{prefix}{}", tensor_name(l, &a.name));
            let t = safetensors::read_tensor(path, &key)?;
            if t.shape != inner {
                return Err(format!(
                    "{}: tensor `{key}` is {:?}, the model's is {inner:?}",
                    path.display(),
                    t.shape
                ));
            }
            data.extend(t.to_tensor().data);
        }
        Ok(data)
    };
    let mut opt = Optimizer::new(config, bufs);
    for (i, a) in params.iter().enumerate() {
        let weights = read("", a)?;
        opt.m[i] = read("optim.m.", a)?;
        if config.kind == Kind::AdamW {
            opt.v[i] = read("optim.v.", a)
                .map_err(|e| format!("{e} (a checkpoint of SGD cannot resume with AdamW)"))?;
        }
        let w = Tensor::new(a.dtype, a.shape.clone(), weights);
        bufs[i] = HostBuffer::from_tensor(&w);
        if a.dtype != DType::F32 {
            opt.master[i] = w.data;
        }
    }
    opt.step = safetensors::read_tensor(path, "optim.step")?
        .to_tensor()
        .data[0] as u64;
    Ok(opt)
}
