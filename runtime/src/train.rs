//! Training with a compiled training step (`ppc compile --train`): the data, the step loop and
//! its progress, the optimizer, checkpoints.
//!
//! The batches are [`crate::data`]'s. With `--val-data`, every `--val-every` steps (and after
//! the last) the run reports the mean loss of [`VAL_BATCHES`] fixed batches of it, the same
//! batches each time, so that the numbers compare.
//!
//! With `--replicas D` (`ppc compile`), D pipelines train side by side, replica `j` on batch
//! `step·D + j`; after the microbatch loop their gradients are summed once, in replica order
//! (the same bits on every run), and averaged, so every replica applies the same update.
//!
//! Checkpoints (`--save`, `--resume`) are [`crate::checkpoint`]'s. A run that stops says why
//! with a [`TrainError`], which wraps the errors of the parts it uses.

use crate::accuracy::Accuracy;
use crate::checkpoint::{resume, save, CheckpointError};
use crate::data::Data;
use crate::exec::{bench, CallError, Program, Staging};
use crate::files::WriteError;
use crate::gpu_update::GpuUpdate;
use crate::manifest::{Arg, Role};
use crate::memref::HostBuffer;
use crate::optim::Optimizer;
use crate::params::ParamError;
use crate::run_options::TrainOptions;
use crate::safetensors::FileError;
use crate::tensor::{DType, Tensor};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

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
    #[error(transparent)]
    Tokens(#[from] crate::tokens::TokenError),
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
    /// A class id in `--data`'s targets that no output row has (and not the loss's
    /// `ignore_index`).
    #[error(
        "{}: target {value} at row {row} (element {element} of it) is not one of this model's {classes} classes{}",
        .path.display(),
        .ignore.map_or(String::new(), |i| format!(" nor its ignore_index {i}"))
    )]
    TargetClass {
        path: PathBuf,
        row: usize,
        element: usize,
        value: i32,
        classes: usize,
        ignore: Option<i32>,
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

impl TrainError {
    /// Whether every rank of the job stops with this error at the same step, so that the job
    /// can end without an abort: a diverged loss, which every rank learns with the shared loss.
    pub fn met_by_every_rank(&self) -> bool {
        matches!(self, TrainError::Diverged { .. })
    }
}

/// Batches of `--val-data` a validation averages over.
pub const VAL_BATCHES: u64 = 4;

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
    let source = program.param_source_of(opts.params.as_deref(), opts.seed)?;
    let mut params = program.params(&source)?;
    if let (Some(path), 0) = (&opts.params, crate::comm::rank()) {
        writeln!(
            err,
            "fine-tuning the weights of {} (fresh optimizer state)",
            path.display()
        )?;
    }
    let mut optimizer = Optimizer::new(opts.optimizer, &params);
    if let Some(path) = &opts.resume {
        optimizer = resume(path, m, &params_args, opts.optimizer, &mut params)?;
        if crate::comm::rank() == 0 {
            writeln!(
                err,
                "resumed from {} at step {} (its optimizer settings, but those given here)",
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
    // The last rank holds the model's outputs, and so the loss; every rank learns it each
    // step (`shared_loss`), and rank 0 (of the first replica) reports it, as users read rank
    // 0's log.
    let speaks = crate::comm::rank() == 0 && crate::comm::replica() == 0;
    let mut data = Data::training(program, opts, (speaks && !opts.json).then_some(&mut *err))?;
    let mut bufs = Buffers::new(program)?;
    // A CUDA program updates its weights with its own kernels, where they stay.
    let mut gpu = (program.updates_on_gpu() && !opts.host_optimizer)
        .then(|| GpuUpdate::new(&optimizer, &params));
    let staging = match gpu {
        Some(_) => Staging::KeptWithGradients,
        None => Staging::Kept,
    };
    let first = optimizer.step;
    let mut losses = Vec::new();
    let started = Instant::now();
    let terminal = speaks && !opts.json && std::io::stderr().is_terminal();
    let val = match &opts.val_data {
        Some(path) => Some(Data::file(program, path, opts, "val")?),
        None => None,
    };
    if speaks {
        for (d, path) in [(Some(&data), &opts.data), (val.as_ref(), &opts.val_data)] {
            if let Some(note) = d.zip(path.as_ref()).and_then(|(d, p)| d.note(m, p)) {
                writeln!(err, "{note}")?;
            }
        }
    }
    // Replica `j` of `D` trains on batch `step·D + j`; the step's gradient is their mean.
    let (replicas, replica) = (m.replicas, crate::comm::replica() as u64);
    let batch_of = |step: u64| step * replicas + replica;
    let clip = f64::from(optimizer.config.grad_clip);
    let step_once = |bufs: &mut Buffers,
                     params: &mut Vec<HostBuffer>,
                     optimizer: &mut Optimizer,
                     gpu: &mut Option<GpuUpdate>,
                     data: &Data,
                     step: u64|
     -> Result<(f32, Option<Accuracy>), TrainError> {
        let (input, target) = data.batch(m, batch_of(step))?;
        let targets = m.cross_entropy.then(|| target.to_tensor());
        let mut loss = bufs.run(program, input, target, params, staging)?;
        let accuracy = targets.map(|t| shared_accuracy(bufs.accuracy(m, &t), replicas > 1));
        if gpu.is_some() {
            // What the host sums comes back from the GPU.
            bufs.fetch_grads(program, replicas > 1);
        }
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
        let updating = crate::trace::start();
        if let Some(gpu) = gpu {
            let scale = match clip > 0.0 {
                true => {
                    let grads = bufs.grads_by_param_mut();
                    crate::gpu_update::clip_scale(program, &params_args, grads, clip)?
                }
                false => 1.0,
            };
            gpu.step(program, optimizer, params, bufs.grads_by_param_mut(), scale)?;
        } else {
            if clip > 0.0 {
                bufs.clip(m, &params_args, clip);
            }
            let grads: Vec<&[f32]> = bufs
                .grads_by_param()
                .map(|g| g.f32s().expect("invariant: gradients are f32"))
                .collect();
            optimizer.update(params, &grads);
        }
        crate::trace::record(crate::trace::Kind::Optimizer, step as i64, updating);
        Ok((loss, accuracy))
    };
    if opts.trace.is_some() {
        crate::trace::enable();
    }
    // Time spent labelling synthetic batches, which steps and the ETA leave out.
    let mut labelling = 0.0;
    for s in 0..u64::from(opts.steps) {
        let step = first + s;
        if let Some(took) = data.prepare(program, &mut bufs, batch_of(step))? {
            labelling += took;
            if speaks && !opts.json {
                let end = if terminal && s > 0 { "\n" } else { "" };
                writeln!(err, "{end}{}", labelled(batch_of(step), took))?;
            }
        }
        let t = Instant::now();
        let (loss, accuracy) = step_once(
            &mut bufs,
            &mut params,
            &mut optimizer,
            &mut gpu,
            &data,
            step,
        )?;
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
            let acc = accuracy.map_or(String::new(), |a| format!(",\"accuracy\":{:e}", a.share()));
            writeln!(
                out,
                "{{\"step\":{},\"loss\":{loss:e}{acc},\"step_s\":{took:e}}}",
                step + 1
            )?;
        } else {
            let eta = (started.elapsed().as_secs_f64() - labelling) / done as f64
                * (u64::from(opts.steps) - done) as f64;
            let acc = accuracy.map_or(String::new(), |a| {
                format!("  accuracy {:.1}%", 100.0 * a.share())
            });
            let line = format!(
                "step {}/{}  loss {loss:.6}{acc}  {}  {took:.3} s/step  ETA {eta:.0} s",
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
        let due = done % u64::from(opts.val_every) == 0 || done == u64::from(opts.steps);
        if let (Some(val), true) = (&val, due) {
            let (loss, accuracy) = validate(program, val, &mut bufs, &mut params, staging)?;
            if !speaks {
            } else if opts.json {
                let acc = accuracy.map_or(String::new(), |a| {
                    format!(",\"val_accuracy\":{:e}", a.share())
                });
                writeln!(out, "{{\"step\":{},\"val_loss\":{loss:e}{acc}}}", step + 1)?;
            } else {
                let end = if terminal { "\n" } else { "" };
                let acc = accuracy.map_or(String::new(), |a| {
                    format!(", accuracy {:.2}%", 100.0 * a.share())
                });
                writeln!(
                    err,
                    "{end}step {}  validation loss {loss:.6}{acc}",
                    step + 1
                )?;
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
    if let Some(gpu) = &mut gpu {
        gpu.fetch(program, &mut optimizer, &mut params);
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
        // The batches the bench's steps train on, labelled first, so that no timed step labels
        // one (and no batch they do not use is labelled: at d = 1024 a labelling takes seconds).
        let calls = u64::from(n.max(1) + crate::exec::BENCH_WARMUP);
        let used = (step + 1..=step + calls).take(crate::data::SYNTHETIC_BATCHES as usize);
        for s in used {
            if let Some(took) = data.prepare(program, &mut bufs, batch_of(s))? {
                if speaks && !opts.json {
                    writeln!(err, "{}", labelled(batch_of(s), took))?;
                }
            }
        }
        bench(m, flops, n, out, &mut || {
            step += 1;
            step_once(
                &mut bufs,
                &mut params,
                &mut bench_opt,
                &mut gpu,
                &data,
                step,
            )
            .map(|_| ())
        })?;
        // The GPU's copies no newer than the host's: the program is ready for another run.
        if let Some(gpu) = &mut gpu {
            gpu.fetch(program, &mut bench_opt, &mut params);
        }
    }
    Ok(Trained { losses, optimizer })
}

/// What is said when synthetic batch `batch` was labelled, in `took` seconds.
fn labelled(batch: u64, took: f64) -> String {
    let all = crate::data::SYNTHETIC_BATCHES;
    format!(
        "labelled synthetic batch {}/{all} in {took:.2} s",
        batch % all + 1
    )
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
    let loss = bufs.run(program, input, target, params, Staging::Kept)?;
    bufs.share_held_by_all();
    Ok(StepOutput {
        loss,
        outputs: bufs.output.to_tensor(),
        grads: bufs.grads_by_param().map(HostBuffer::to_tensor).collect(),
    })
}

/// The buffers of one call of the training step besides the parameters.
pub(crate) struct Buffers {
    pub(crate) output: HostBuffer,
    loss: HostBuffer,
    grads: Vec<HostBuffer>,
    /// For each parameter, the index of its gradient (the one of the same name).
    grad_of: Vec<usize>,
    /// For each gradient, whether the pipeline's ranks sum it: a parameter every rank holds
    /// (one of `@embed`'s or `@head`'s, which has no layer axes), on more than one rank.
    summed_across_ranks: Vec<bool>,
}

impl Buffers {
    pub(crate) fn new(program: &Program) -> Result<Buffers, TrainError> {
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
        let summed_across_ranks = of(Role::Grad)
            .map(|g| m.ranks > 1 && of(Role::Param).any(|p| p.name == g.name && p.layer_axes == 0))
            .collect();
        Ok(Buffers {
            output: zeros(m.output()),
            loss: zeros(m.arg(Role::Loss).expect("invariant: checked above")),
            grads: of(Role::Grad).map(zeros).collect(),
            grad_of,
            summed_across_ranks,
        })
    }

    /// Clips the gradients to the global norm `max` ([`crate::clip`]).
    fn clip(&mut self, m: &crate::manifest::Manifest, params: &[&Arg], max: f64) {
        let mut grads: Vec<&mut [f32]> = self
            .grads_by_param_mut()
            .into_iter()
            .map(|g| g.f32s_mut().expect("invariant: gradients are f32"))
            .collect();
        crate::clip::clip(m, params, &mut grads, max);
    }

    /// Brings the gradients the GPU kept back to the host: those the pipeline's ranks sum, or
    /// (`all`) every one.
    fn fetch_grads(&mut self, program: &Program, all: bool) {
        let names = (program.manifest.args.iter()).filter(|a| a.role == Role::Grad);
        let summed = &self.summed_across_ranks;
        for ((g, a), &summed) in self.grads.iter_mut().zip(names).zip(summed) {
            if all || summed {
                program.fetch(Role::Grad, &a.name, g);
            }
        }
    }

    /// The gradient of each parameter, in the manifest's order of parameters.
    fn grads_by_param_mut(&mut self) -> Vec<&mut HostBuffer> {
        let mut by_grad: Vec<Option<&mut HostBuffer>> = self.grads.iter_mut().map(Some).collect();
        (self.grad_of.iter())
            .map(|&g| {
                by_grad[g]
                    .take()
                    .expect("invariant: one gradient per parameter")
            })
            .collect()
    }

    /// Sums the gradients of the parameters every rank holds over the pipeline's ranks
    /// ([`crate::comm::sum_across_pipeline`]), so every copy takes the same update; on one
    /// rank touches nothing (a gradient kept on the GPU stays there).
    fn share_held_by_all(&mut self) {
        for (g, &summed) in self.grads.iter_mut().zip(&self.summed_across_ranks) {
            if summed {
                crate::comm::sum_across_pipeline(
                    g.f32s_mut().expect("invariant: gradients are f32"),
                );
            }
        }
    }

    fn grads_by_param(&self) -> impl Iterator<Item = &HostBuffer> {
        self.grad_of.iter().map(|&g| &self.grads[g])
    }

    /// Runs the step, a CUDA program's arguments staged as `staging` says; returns the loss.
    pub(crate) fn run(
        &mut self,
        program: &Program,
        mut input: HostBuffer,
        mut target: HostBuffer,
        params: &mut [HostBuffer],
        staging: Staging,
    ) -> Result<f32, CallError> {
        let (mut params, mut grads) = (params.iter_mut(), self.grads.iter_mut());
        let (mut i, mut t, mut o, mut l) = (
            Some(&mut input),
            Some(&mut target),
            Some(&mut self.output),
            Some(&mut self.loss),
        );
        let bufs = crate::exec::bind(&program.manifest.args, |a| match a.role {
            Role::Input => i.take(),
            Role::Target => t.take(),
            Role::Param => params.next(),
            Role::Output => o.take(),
            Role::Loss => l.take(),
            Role::Grad => grads.next(),
            _ => None,
        })?;
        program.call_staged(bufs, staging)?;
        Ok(self.loss.to_tensor().data[0])
    }

    /// Runs the step without its gradients where the program has that entry
    /// ([`Program::evaluate`]: the forward and the loss, a third of the step's work), else the
    /// whole step; returns the loss.
    pub(crate) fn evaluate(
        &mut self,
        program: &Program,
        mut input: HostBuffer,
        mut target: HostBuffer,
        params: &mut [HostBuffer],
        staging: Staging,
    ) -> Result<f32, CallError> {
        let (loss, output) = (&mut self.loss, &mut self.output);
        if !program.evaluate(&mut input, &mut target, params, loss, output)? {
            return self.run(program, input, target, params, staging);
        }
        Ok(self.loss.to_tensor().data[0])
    }

    /// The accuracy of the outputs of the last call against its class-id `targets`.
    fn accuracy(&self, m: &crate::manifest::Manifest, targets: &Tensor) -> Accuracy {
        let classes = *m
            .output()
            .shape
            .last()
            .expect("invariant: outputs have axes");
        let ids: Vec<i32> = (0..targets.len()).map(|i| targets.int(i)).collect();
        match self.output.f32s() {
            Some(logits) => Accuracy::of(logits, classes, &ids, m.ignore_index),
            None => Accuracy::of(&self.output.to_tensor().data, classes, &ids, m.ignore_index),
        }
    }
}

/// The mean loss of the first [`VAL_BATCHES`] batches of `val` (the step without the update,
/// and without the gradients where the program can leave them out), and their accuracy for a
/// classifier.
fn validate(
    program: &Program,
    val: &Data,
    bufs: &mut Buffers,
    params: &mut [HostBuffer],
    staging: Staging,
) -> Result<(f32, Option<Accuracy>), TrainError> {
    let m = &program.manifest;
    let (mut sum, mut accuracy) = (0.0f64, m.cross_entropy.then(Accuracy::default));
    for b in 0..VAL_BATCHES {
        let (input, target) = val.batch(m, b)?;
        let targets = m.cross_entropy.then(|| target.to_tensor());
        let loss = bufs.evaluate(program, input, target, params, staging)?;
        sum += f64::from(shared_loss(loss));
        if let (Some(a), Some(t)) = (&mut accuracy, targets) {
            *a = *a + shared_accuracy(bufs.accuracy(m, &t), false);
        }
    }
    Ok(((sum / VAL_BATCHES as f64) as f32, accuracy))
}

/// A step's accuracy on every rank: the last rank's counts (the rank that holds the outputs),
/// summed over the replicas' batches where `replicas`.
fn shared_accuracy(a: Accuracy, replicas: bool) -> Accuracy {
    let all = crate::comm::gather_pipeline_f64(&[a.hits as f64, a.rows as f64]);
    let last = all.len() - 2;
    let mut counts = [all[last] as f32, all[last + 1] as f32];
    if replicas {
        crate::comm::sum_across_replicas(&mut counts);
    }
    Accuracy {
        hits: counts[0] as u64,
        rows: counts[1] as u64,
    }
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
