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
//! Checkpoints (`--save`, `--resume`) are [`crate::checkpoint`]'s. A run that stops says why
//! with a [`TrainError`], which wraps the errors of the parts it uses.

use crate::checkpoint::{resume, save, CheckpointError};
use crate::exec::{bench, CallError, Program};
use crate::files::WriteError;
use crate::init::{self, Source};
use crate::manifest::{Arg, Role};
use crate::memref::HostBuffer;
use crate::optim::Optimizer;
use crate::params::ParamError;
use crate::run_options::TrainOptions;
use crate::safetensors::{self, FileError};
use crate::tensor::{DType, Tensor};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

/// The teacher of the synthetic task is the model drawn with `seed + TEACHER_SEED_OFFSET`.
pub const TEACHER_SEED_OFFSET: u64 = 1_000_003;
/// Input batches the synthetic task cycles through.
pub const SYNTHETIC_BATCHES: u64 = 8;

/// Why training stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("this program is a forward pass: compile it with `ppc compile --train`")]
    ForwardProgram,
    #[error("the program has no gradient for parameter `{param}`")]
    NoGradient { param: String },
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(transparent)]
    File(#[from] FileError),
    /// A `--data` tensor is not `[N, ...]` of the model's per-microbatch shape `want`.
    #[error(
        "{}: tensor `{tensor}` is {dtype}{shape:?}, but this model trains on [N, {}] ({want_dtype} per microbatch)",
        .path.display(),
        .want.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    )]
    DataShape {
        path: PathBuf,
        tensor: String,
        dtype: DType,
        shape: Vec<usize>,
        want: Vec<usize>,
        want_dtype: DType,
    },
    #[error("{}: {inputs} inputs but {targets} targets", .path.display())]
    DataRows {
        path: PathBuf,
        inputs: usize,
        targets: usize,
    },
    /// `step` counts from 1.
    #[error("step {step}: the loss is {loss}: lower the learning rate (--lr)")]
    Diverged { step: u64, loss: f32 },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Trace(#[from] WriteError),
    /// Writing the progress or the losses failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

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
) -> Result<Trained, TrainError> {
    let m = &program.manifest;
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
            )?;
        }
    }
    // Norm gains and biases are not decayed.
    optimizer.decays = params_args
        .iter()
        .map(|a| crate::optim::decays(a))
        .collect();
    let data = Data::new(program, opts)?;
    let mut bufs = Buffers::new(program)?;
    let first = optimizer.step;
    let mut losses = Vec::new();
    let started = Instant::now();
    // The last rank holds the model's outputs, and so the loss; every rank learns it each
    // step (`shared_loss`), and rank 0 (of the first replica) reports it, as users read rank
    // 0's log.
    let speaks = crate::comm::rank() == 0 && crate::comm::replica() == 0;
    let terminal = speaks && !opts.json && std::io::stderr().is_terminal();
    let mut step_once = |params: &mut Vec<HostBuffer>,
                         optimizer: &mut Optimizer,
                         step: u64|
     -> Result<f32, TrainError> {
        // Replica `j` of `D` trains on batch `step·D + j`; the step's gradient is their mean.
        let (replicas, replica) = (m.replicas, crate::comm::replica() as u64);
        let (input, target) = data.batch(m, step * replicas + replica);
        let mut loss = bufs.run(program, input, target, params)?;
        bufs.share_held_by_all();
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
        let loss = shared_loss(loss);
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
            return Err(TrainError::Diverged {
                step: step + 1,
                loss,
            });
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
            )?;
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
                write!(err, "\r{line}")?;
            } else {
                writeln!(err, "{line}")?;
            }
        }
    }
    if terminal {
        writeln!(err)?;
    }
    if let Some(path) = &opts.trace {
        crate::trace::write(path)?;
        if crate::comm::rank() == 0 {
            writeln!(err, "wrote {}", path.display())?;
        }
    }
    if let Some(path) = &opts.save {
        if save(path, m, &params_args, &params, &optimizer)? {
            writeln!(err, "wrote {}", path.display())?;
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
) -> Result<StepOutput, TrainError> {
    let mut bufs = Buffers::new(program)?;
    let loss = bufs.run(program, input, target, params)?;
    bufs.share_held_by_all();
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
    /// For each gradient, whether every rank of the pipeline holds its parameter (one of
    /// `@embed`'s or `@head`'s, which has no layer axes).
    held_by_all: Vec<bool>,
}

impl Buffers {
    fn new(program: &Program) -> Result<Buffers, TrainError> {
        let m = &program.manifest;
        if !m.trains() {
            return Err(TrainError::ForwardProgram);
        }
        let zeros = |a: &Arg| HostBuffer::zeros(a.dtype, &a.shape);
        let of = |role| m.args.iter().filter(move |a: &&Arg| a.role == role);
        let grad_names: Vec<&str> = of(Role::Grad).map(|a| a.name.as_str()).collect();
        let grad_of = of(Role::Param)
            .map(|p| {
                grad_names
                    .iter()
                    .position(|g| *g == p.name)
                    .ok_or_else(|| TrainError::NoGradient {
                        param: p.name.clone(),
                    })
            })
            .collect::<Result<_, _>>()?;
        let held_by_all = of(Role::Grad)
            .map(|g| of(Role::Param).any(|p| p.name == g.name && p.layer_axes == 0))
            .collect();
        Ok(Buffers {
            output: zeros(m.output()),
            loss: zeros(m.arg(Role::Loss).expect("invariant: checked above")),
            grads: of(Role::Grad).map(zeros).collect(),
            grad_of,
            held_by_all,
        })
    }

    /// Sums the gradients of the parameters every rank holds over the pipeline's ranks
    /// ([`crate::comm::sum_across_pipeline`]), so every copy takes the same update.
    fn share_held_by_all(&mut self) {
        for (g, &all) in self.grads.iter_mut().zip(&self.held_by_all) {
            if all {
                crate::comm::sum_across_pipeline(
                    g.f32s_mut().expect("invariant: gradients are f32"),
                );
            }
        }
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
    ) -> Result<f32, CallError> {
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
            .ok_or_else(|| CallError::MissingBuffer {
                name: a.name.clone(),
            })?;
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
    fn new(program: &Program, opts: &TrainOptions) -> Result<Data, TrainError> {
        let m = &program.manifest;
        let (input, target) = (m.input(), m.arg(Role::Target).expect("invariant: training"));
        let mb = input.shape[0];
        match &opts.data {
            Some(path) => {
                let read = |name: &str, a: &Arg| -> Result<Tensor, TrainError> {
                    let b = safetensors::read_tensor(path, name)?;
                    if b.shape.len() != a.shape.len()
                        || b.shape[1..] != a.shape[1..]
                        || b.shape[0] == 0
                    {
                        return Err(TrainError::DataShape {
                            path: path.clone(),
                            tensor: name.to_string(),
                            dtype: b.dtype,
                            shape: b.shape,
                            want: a.shape[1..].to_vec(),
                            want_dtype: a.dtype,
                        });
                    }
                    Ok(b.to_tensor())
                };
                let (x, y) = (read("input", input)?, read("target", target)?);
                if x.shape[0] != y.shape[0] {
                    return Err(TrainError::DataRows {
                        path: path.clone(),
                        inputs: x.shape[0],
                        targets: y.shape[0],
                    });
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
                        input.init,
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

/// The step's loss on every rank: the last rank's (the others hold 0; losses are never
/// negative), a loss that is not finite as infinity, so that every rank stops together when
/// training diverges.
fn shared_loss(loss: f32) -> f32 {
    let sent = if loss.is_finite() {
        f64::from(loss)
    } else {
        f64::INFINITY
    };
    match crate::comm::max(sent) {
        v if v.is_finite() => v as f32,
        _ if !loss.is_finite() => loss,
        _ => f32::INFINITY,
    }
}
