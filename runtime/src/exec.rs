//! Running a compiled pipeline: buffers from the manifest, a call into generated code, and the
//! driver that `ppc run` and generated executables share (seeded or file inputs, steps, timing,
//! the printed summary, the benchmark line, safetensors output).
//!
//! In a program sharded over ranks every rank runs the same driver: rank 0 alone reads or draws
//! the inputs (the others pass zeros, which their stages never select), each rank draws the
//! weights of its own stages, and the last rank, which holds the last stage, prints the summary
//! and writes `--output`. With `--bench`, rank 0 prints one JSON line for the whole job.
//!
//! A run that stops says why with a [`RunError`], which wraps the errors of the parts it uses
//! (parameter files, safetensors files, the call's arguments, the trace file).

use crate::comm;
use crate::cuda::resident::Access;
use crate::files::WriteError;
use crate::init::{self, Layers, Shard, Source};
use crate::manifest::{Manifest, Role};
use crate::memref::HostBuffer;
use crate::params::{ParamError, ParamFile, Spec};
use crate::run_options::RunOptions;
use crate::safetensors::{self, FileError};
use crate::tensor::{DType, Tensor};
use std::ffi::c_void;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Buffers that do not fit the generated code's arguments.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("the program takes {want} arguments, got {got}")]
    Arity { want: usize, got: usize },
    #[error("argument `{name}` must be {dtype}{shape:?}, got {got_dtype}{got_shape:?}")]
    Argument {
        name: String,
        dtype: DType,
        shape: Vec<usize>,
        got_dtype: DType,
        got_shape: Vec<usize>,
    },
    #[error("missing buffer for argument `{name}`")]
    MissingBuffer { name: String },
}

/// Why a forward run ([`drive`]) stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(transparent)]
    File(#[from] FileError),
    /// `--input`'s tensor is not what the model takes (`want`: `[microbatches, ...input]`).
    #[error(
        "{}: tensor `{}` is {dtype}{shape:?}, but this model takes {want_dtype}{want_shape:?} ([microbatches, ...input])",
        .path.display(),
        INPUT_TENSOR
    )]
    InputShape {
        path: PathBuf,
        dtype: DType,
        shape: Vec<usize>,
        want_dtype: DType,
        want_shape: Vec<usize>,
    },
    /// `--input`'s `target` tensor cannot be scored against the outputs.
    #[error("{}: {why}", .path.display())]
    Target { path: PathBuf, why: String },
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Trace(#[from] WriteError),
    /// Writing the summary or the progress failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// MLIR's packed calling convention: one array of pointers to the arguments.
pub type PackedFn = unsafe extern "C" fn(*mut *mut c_void);

/// Generated code for one manifest.
pub struct Program {
    pub manifest: Manifest,
    entry: PackedFn,
    /// `ppc_evaluate`, where the manifest lists its arguments.
    evaluate: Option<PackedFn>,
    /// A CUDA training step's optimizer entries (`gpu_update.rs`).
    update: Option<UpdateEntries>,
    /// A CUDA program's arguments on the GPU.
    resident: crate::cuda::resident::Resident,
}

/// A CUDA training step's optimizer entries: AdamW's update, SGD's, the gradients' sums of
/// squares ([`crate::gpu_update`]).
#[derive(Clone, Copy)]
struct UpdateEntries {
    adamw: PackedFn,
    sgd: PackedFn,
    squares: PackedFn,
}

/// Where a CUDA program's arguments stay for a call ([`crate::cuda::resident`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// With the program, from call to call; results come back after the call.
    Kept,
    /// As `Kept`, but the gradients stay on the GPU, for the optimizer's update there.
    KeptWithGradients,
    /// For this call only: a teacher's weights, which must not take the trained ones' place.
    Once,
}

impl Program {
    /// # Safety
    /// `entry` must be the packed C-interface wrapper (`_mlir__mlir_ciface_...`) of an entry
    /// function whose memref arguments are exactly the manifest's arguments, in order.
    pub unsafe fn new(manifest: Manifest, entry: PackedFn) -> Program {
        Program {
            manifest,
            entry,
            evaluate: None,
            update: None,
            resident: Default::default(),
        }
    }

    /// The program with its optimizer entries, where it is a CUDA training step (else it has
    /// none, and they are never called).
    ///
    /// # Safety
    /// `adamw`, `sgd` and `squares` must be the packed C-interface wrappers of entry functions
    /// whose memref arguments are exactly [`crate::gpu_update::args`]' for AdamW and SGD and
    /// [`crate::gpu_update::squares_args`]', in order.
    pub unsafe fn with_update(
        mut self,
        adamw: PackedFn,
        sgd: PackedFn,
        squares: PackedFn,
    ) -> Program {
        if crate::gpu_update::built(&self.manifest) {
            self.update = Some(UpdateEntries {
                adamw,
                sgd,
                squares,
            });
        }
        self
    }

    /// Whether the optimizer's update can run as this program's kernels, its weights, moments
    /// and gradients kept on the GPU (`gpu_update.rs`).
    pub fn updates_on_gpu(&self) -> bool {
        self.update.is_some()
    }

    /// Runs the optimizer's update of `kind` on `bufs`, one per argument of
    /// [`crate::gpu_update::args`], in order; everything it writes stays on the GPU.
    pub(crate) fn update(
        &self,
        kind: crate::optim::Kind,
        bufs: Vec<&mut HostBuffer>,
    ) -> Result<(), CallError> {
        let entries = self.update.expect("invariant: called where updates_on_gpu");
        let entry = match kind {
            crate::optim::Kind::AdamW => entries.adamw,
            crate::optim::Kind::Sgd => entries.sgd,
        };
        let args = crate::gpu_update::args(&self.manifest, kind);
        let access = |role| Access {
            reads: true,
            writes: !matches!(role, Role::Grad | Role::Hyper),
            keeps: true,
        };
        self.call_entry(&args, entry, bufs, &self.resident, &access)
    }

    /// Computes the sums of squares of `grads` (one per parameter, in order) into `squares`
    /// ([`crate::gpu_update::squares_args`]).
    pub(crate) fn squares<'b>(
        &self,
        mut grads: Vec<&'b mut HostBuffer>,
        squares: &'b mut HostBuffer,
    ) -> Result<(), CallError> {
        let entries = self.update.expect("invariant: called where updates_on_gpu");
        let args = crate::gpu_update::squares_args(&self.manifest);
        grads.push(squares);
        let access = |role| Access {
            reads: role == Role::Grad,
            writes: role == Role::Squares,
            keeps: false,
        };
        self.call_entry(&args, entries.squares, grads, &self.resident, &access)
    }

    /// Brings argument `role` `name` of a CUDA program back into `buf` where the GPU holds
    /// newer contents than the host (a result kept there); else leaves `buf` as it is.
    pub fn fetch(&self, role: Role, name: &str, buf: &mut HostBuffer) {
        if self.manifest.gpu.is_some() {
            self.resident.fetch(role, name, buf);
        }
    }

    /// Bytes a CUDA program copied to the GPU and back so far.
    pub fn bytes_moved(&self) -> (u64, u64) {
        self.resident.bytes_moved()
    }

    /// The program with its training step's evaluation, where the manifest lists its
    /// arguments (else it has none, and `evaluate` is never called).
    ///
    /// # Safety
    /// `evaluate` must be the packed C-interface wrapper of an entry function whose memref
    /// arguments are exactly the manifest's `evaluate` arguments, in order.
    pub unsafe fn with_evaluate(mut self, evaluate: PackedFn) -> Program {
        if !self.manifest.evaluate.is_empty() {
            self.evaluate = Some(evaluate);
        }
        self
    }

    /// Runs the training step without its gradients, `loss, output = f(input, target,
    /// params)` (`params` as the step takes them); `Ok(false)` where the program has no such
    /// entry and nothing ran.
    pub fn evaluate(
        &self,
        input: &mut HostBuffer,
        target: &mut HostBuffer,
        params: &mut [HostBuffer],
        loss: &mut HostBuffer,
        output: &mut HostBuffer,
    ) -> Result<bool, CallError> {
        let Some(entry) = self.evaluate else {
            return Ok(false);
        };
        let names = self.manifest.args.iter().filter(|a| a.role == Role::Param);
        let mut params: Vec<(&str, Option<&mut HostBuffer>)> = names
            .map(|a| a.name.as_str())
            .zip(params.iter_mut().map(Some))
            .collect();
        let (mut input, mut target) = (Some(input), Some(target));
        let (mut loss, mut output) = (Some(loss), Some(output));
        let bufs = bind(&self.manifest.evaluate, |a| match a.role {
            Role::Input => input.take(),
            Role::Target => target.take(),
            Role::Param => (params.iter_mut())
                .find(|(name, _)| *name == a.name)
                .and_then(|(_, b)| b.take()),
            Role::Loss => loss.take(),
            Role::Output => output.take(),
            _ => None,
        })?;
        let args = &self.manifest.evaluate;
        self.call_entry(args, entry, bufs, &self.resident, &step_access)?;
        Ok(true)
    }

    /// This rank's parameters from `source`, in manifest order.
    pub fn params(&self, source: &Source) -> Result<Vec<HostBuffer>, ParamError> {
        let rank = comm::rank();
        self.manifest
            .args
            .iter()
            .filter(|a| a.role == Role::Param)
            .map(|a| {
                let shard = a.shard_axis.map(|axis| Shard {
                    axis,
                    full: self.manifest.stages as usize,
                    offset: rank * a.shape[axis],
                });
                let layers = match a.layer_axes {
                    0 => Layers::One(0),
                    axes => Layers::Stacked {
                        axes,
                        shard,
                        model_layers: self.manifest.layers,
                    },
                };
                init::param_from(source, &a.name, a.dtype, &a.shape, layers, a.init)
                    .map(|t| HostBuffer::from_tensor(&t))
            })
            .collect()
    }

    /// The model's parameters as files hold them (see [`crate::params`]).
    pub fn specs(&self) -> Vec<Spec> {
        self.manifest
            .args
            .iter()
            .filter(|a| a.role == Role::Param)
            .map(|a| Spec {
                name: a.name.clone(),
                shape: a.shape[a.layer_axes..].to_vec(),
                layers: (a.layer_axes > 0).then_some(self.manifest.layers),
                dtype: a.dtype,
                init: a.init,
            })
            .collect()
    }

    /// Where this run's parameters come from: `--params FILE`, checked against the model, or
    /// the seeded generator.
    pub fn param_source(&self, opts: &RunOptions) -> Result<Source, ParamError> {
        self.param_source_of(opts.params.file.as_deref(), opts.seed)
    }

    /// Parameters read from `file`, checked against the model, or drawn from `seed`.
    pub fn param_source_of(
        &self,
        file: Option<&std::path::Path>,
        seed: u64,
    ) -> Result<Source, ParamError> {
        match file {
            None => Ok(Source::Seeded(seed)),
            Some(path) => match ParamFile::open(path, &self.specs()) {
                Ok(f) => Ok(Source::File(Arc::new(f))),
                Err(e) => Err(crate::params::other_dims(path, &self.manifest.dims).unwrap_or(e)),
            },
        }
    }

    /// Seeded synthetic input microbatches.
    pub fn synthetic_input(&self, seed: u64) -> HostBuffer {
        let a = self.manifest.input();
        HostBuffer::from_tensor(&init::synthetic_inputs(
            seed,
            a.dtype,
            a.init,
            &a.shape[1..],
            a.shape[0],
        ))
    }

    /// The rank that holds the last stage, whose output is the result.
    pub fn output_rank(&self) -> usize {
        self.manifest.ranks as usize - 1
    }

    /// A zeroed output buffer.
    pub fn output_buffer(&self) -> HostBuffer {
        let a = self.manifest.output();
        HostBuffer::zeros(a.dtype, &a.shape)
    }

    /// Runs the pipeline once: `output = f(input, params)`.
    pub fn run(
        &self,
        input: &mut HostBuffer,
        params: &mut [HostBuffer],
        output: &mut HostBuffer,
    ) -> Result<(), CallError> {
        let mut params = params.iter_mut();
        let (mut input, mut output) = (Some(input), Some(output));
        let bufs = bind(&self.manifest.args, |a| match a.role {
            Role::Input => input.take(),
            Role::Param => params.next(),
            Role::Output => output.take(),
            _ => None,
        })?;
        self.call(bufs)
    }

    /// Calls the generated code on `bufs`, one per manifest argument, in order (checked).
    pub fn call(&self, bufs: Vec<&mut HostBuffer>) -> Result<(), CallError> {
        self.call_staged(bufs, Staging::Kept)
    }

    /// [`Program::call`], a CUDA program's arguments staged as `staging` says.
    pub fn call_staged(
        &self,
        bufs: Vec<&mut HostBuffer>,
        staging: Staging,
    ) -> Result<(), CallError> {
        let (args, entry, access) = (&self.manifest.args, self.entry, &step_access);
        match staging {
            Staging::Kept => self.call_entry(args, entry, bufs, &self.resident, access),
            Staging::KeptWithGradients => {
                let access = |role| Access {
                    keeps: role == Role::Grad,
                    ..step_access(role)
                };
                self.call_entry(args, entry, bufs, &self.resident, &access)
            }
            Staging::Once => {
                let once = crate::cuda::resident::Resident::default();
                self.call_entry(args, entry, bufs, &once, access)
            }
        }
    }

    /// Calls `entry`, which takes `args`, on `bufs`, one per argument, in order (checked). A
    /// CUDA program's arguments are staged in `resident`: what `access` says each role reads
    /// goes in where the host changed it, what it writes comes back unless the GPU keeps it.
    fn call_entry(
        &self,
        args: &[crate::manifest::Arg],
        entry: PackedFn,
        mut bufs: Vec<&mut HostBuffer>,
        resident: &crate::cuda::resident::Resident,
        access: &dyn Fn(Role) -> Access,
    ) -> Result<(), CallError> {
        if bufs.len() != args.len() {
            return Err(CallError::Arity {
                want: args.len(),
                got: bufs.len(),
            });
        }
        for (a, b) in args.iter().zip(&bufs) {
            if b.dtype != a.dtype || b.shape != a.shape {
                return Err(CallError::Argument {
                    name: a.name.clone(),
                    dtype: a.dtype,
                    shape: a.shape.clone(),
                    got_dtype: b.dtype,
                    got_shape: b.shape.clone(),
                });
            }
        }
        // A CUDA program's kernels address only GPU memory: its arguments are kept there (in
        // host memory of their own where its kernels run as CPU loops, the tests).
        let gpu = self.manifest.gpu.is_some();
        let access: Vec<Access> = args.iter().map(|a| access(a.role)).collect();
        let mut descriptors: Vec<Vec<i64>> = if gpu {
            crate::cuda::bind_this_thread();
            resident.stage(args, &bufs, &access)
        } else {
            bufs.iter_mut().map(|b| b.descriptor()).collect()
        };
        let mut desc_ptrs: Vec<*mut i64> = descriptors.iter_mut().map(|d| d.as_mut_ptr()).collect();
        let mut packed: Vec<*mut c_void> = desc_ptrs
            .iter_mut()
            .map(|p| (p as *mut *mut i64).cast::<c_void>())
            .collect();
        crate::pool::bind_this_thread();
        if crate::trace::enabled() {
            crate::trace::name_groups(&self.manifest.groups);
        }
        let flush = self
            .manifest
            .flush_to_zero
            .then(crate::subnormals::FlushToZero::begin);
        // SAFETY: `Program::new`'s and `with_evaluate`'s contracts say `entry` takes exactly
        // these memrefs; each packed slot points to a pointer to a descriptor of a live buffer
        // with the checked dtype and shape, and all of them outlive the call.
        unsafe { entry(packed.as_mut_ptr()) };
        drop(flush);
        if gpu {
            resident.finish(args, &mut bufs, &access);
        }
        Ok(())
    }
}

/// How a step (forward, training, evaluation) uses its arguments: it reads its inputs and
/// weights and writes its results.
fn step_access(role: Role) -> Access {
    Access {
        reads: !role.is_result(),
        writes: role.is_result(),
        keeps: false,
    }
}

/// One buffer per argument of `args`, in order, as `take` gives them (`None`: none for it).
pub(crate) fn bind<'b>(
    args: &[crate::manifest::Arg],
    mut take: impl FnMut(&crate::manifest::Arg) -> Option<&'b mut HostBuffer>,
) -> Result<Vec<&'b mut HostBuffer>, CallError> {
    (args.iter())
        .map(|a| {
            take(a).ok_or_else(|| CallError::MissingBuffer {
                name: a.name.clone(),
            })
        })
        .collect()
}

/// The name of the input and output tensors in safetensors files.
pub const INPUT_TENSOR: &str = "input";
pub const OUTPUT_TENSOR: &str = "output";

/// The summary `ppc run` and executables print: what ran, on what shapes, the result's checksum
/// and the step time. `pipeline` is stages, microbatches, repeats, layers.
pub fn write_summary(
    out: &mut dyn Write,
    model: &str,
    pipeline: [u64; 4],
    input: &str,
    y: &Tensor,
    step: &str,
) -> std::io::Result<()> {
    let [s, mb, r, l] = pipeline;
    writeln!(out, "model       {model}")?;
    writeln!(
        out,
        "pipeline    {s} stages, {mb} microbatches, {r} repeats, {l} layers"
    )?;
    writeln!(out, "input       {input}")?;
    writeln!(out, "output      {}{:?}", y.dtype, y.shape)?;
    writeln!(out, "checksum    {:.6e}", y.checksum())?;
    writeln!(out, "step time   {step}")
}

/// Tensor `input` of the safetensors file `path`, which must be `dtype` of `shape`
/// (`[microbatches, ...input]`).
pub fn read_input(
    path: &std::path::Path,
    dtype: DType,
    shape: &[usize],
) -> Result<HostBuffer, RunError> {
    let b = safetensors::read_tensor(path, INPUT_TENSOR)?;
    if b.dtype != dtype || b.shape != shape {
        return Err(RunError::InputShape {
            path: path.to_path_buf(),
            dtype: b.dtype,
            shape: b.shape,
            want_dtype: dtype,
            want_shape: shape.to_vec(),
        });
    }
    Ok(b)
}

/// Runs `program` as `opts` says, printing the summary to `out` and progress to `err`.
pub fn drive(
    program: &Program,
    opts: &RunOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<HostBuffer, RunError> {
    let m = &program.manifest;
    let (rank, speaks) = (comm::rank(), comm::rank() == program.output_rank());
    // A file of any other length than one call's runs batch by batch: every rank reads its
    // header, and for a data set its body (to learn how many batches; the last rank, the
    // targets too). Rank 0 says what is wrong with it; the others go on as with one call's
    // input until rank 0's error ends the job. One call's input is read by rank 0 alone.
    if let Some(path) = &opts.input {
        let samples = match crate::samples::Samples::open(program, path) {
            Err(e) if rank == 0 => return Err(e),
            opened => opened.ok().flatten(),
        };
        if let Some(samples) = samples {
            let y = samples.run(program, opts, out, err)?;
            return Ok(HostBuffer::from_tensor(&y));
        }
    }
    let mut input = match &opts.input {
        _ if rank != 0 => HostBuffer::zeros(m.input().dtype, &m.input().shape),
        None => program.synthetic_input(opts.seed),
        Some(path) => read_input(path, m.input().dtype, &m.input().shape)?,
    };
    let source = program.param_source(opts)?;
    if let Some(path) = opts.dump_params.as_ref().filter(|_| rank == 0) {
        crate::params::dump(&source, &program.specs(), path, &m.metadata())?;
        writeln!(err, "wrote {}", path.display())?;
    }
    let mut params = program.params(&source)?;
    let mut output = program.output_buffer();
    let steps = opts.steps.max(1);
    let mut times = Vec::new();
    if opts.trace.is_some() {
        crate::trace::enable();
    }
    for step in 0..steps {
        let t = Instant::now();
        program.run(&mut input, &mut params, &mut output)?;
        times.push(t.elapsed().as_secs_f64());
        crate::trace::record(crate::trace::Kind::Step, i64::from(step), Some(t));
        if steps > 1 && speaks {
            writeln!(
                err,
                "step {}/{steps}: {:.4} s",
                step + 1,
                times[times.len() - 1]
            )?;
        }
    }
    if let Some(path) = &opts.trace {
        crate::trace::write(path)?;
        if rank == 0 {
            writeln!(err, "wrote {}", path.display())?;
        }
    }
    // The first step pages in weights and buffers; the others show the steady state, and
    // their median is what `--bench` reports too.
    let (cold, warm) = (times[0], &times[1..]);
    let (step_s, which) = match warm.len() {
        0 => (cold, "one cold step".to_string()),
        n => (
            median(warm),
            format!("median of {n} warm step{}", if n == 1 { "" } else { "s" }),
        ),
    };
    let y = output.to_tensor();
    let step = format!(
        "{step_s:.6} s, {which} ({}, {})",
        opts.backend,
        opts.origin()
    );
    let shape = |dtype, shape: &[usize]| format!("{dtype}{shape:?}");
    let input_shape = shape(m.input().dtype, &m.input().shape);
    if speaks {
        write_summary(
            out,
            &m.model,
            [m.stages, m.microbatches, m.repeats, m.layers],
            &input_shape,
            &y,
            &step,
        )?;
        if !warm.is_empty() {
            writeln!(
                out,
                "first step  {cold:.6} s (cold: pages in weights and buffers)"
            )?;
        }
        writeln!(
            out,
            "throughput  {:.1} microbatches/s, {:.2} GFLOP/s useful",
            m.microbatches as f64 / step_s,
            m.flops as f64 / step_s / 1e9
        )?;
        writeln!(
            out,
            "bubble      {:.1}% of the loop's layer slots idle",
            100.0 * m.bubble()
        )?;
    }
    if let Some(n) = opts.bench {
        bench(m, m.flops, n, out, &mut || {
            Ok::<(), RunError>(program.run(&mut input, &mut params, &mut output)?)
        })?;
    }
    if let (true, Some(path)) = (speaks, &opts.output) {
        safetensors::write(path, &[(OUTPUT_TENSOR, &output)])?;
        writeln!(err, "wrote {}", path.display())?;
    }
    Ok(output)
}

/// The untimed calls [`bench`] makes before it times.
pub const BENCH_WARMUP: u32 = 2;

/// Warms up (pages in weights, fills caches), times `n` calls of `step` on every rank, and
/// prints on rank 0 one JSON line: the job's median step (the slowest rank's), throughput
/// (`flops` per step; for a GPU program also without its copies between host and GPU), and per rank the time computing, the time waiting in exchanges and the
/// bubble the stage calls' masks met. Errors are `step`'s, or writing the line's.
pub fn bench<E: From<std::io::Error>>(
    m: &Manifest,
    flops: u64,
    n: u32,
    out: &mut dyn Write,
    step: &mut dyn FnMut() -> Result<(), E>,
) -> Result<(), E> {
    for _ in 0..BENCH_WARMUP {
        step()?;
    }
    comm::take_exchange_seconds();
    crate::bubble::take_measured_bubble(m.calls_per_slot);
    crate::cuda::resident::take_copy_seconds();
    let (mut steps, mut waits, mut copies) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n.max(1) {
        let s = Instant::now();
        step()?;
        steps.push(s.elapsed().as_secs_f64());
        waits.push(comm::take_exchange_seconds());
        copies.push(crate::cuda::resident::take_copy_seconds());
    }
    let bubble = crate::bubble::take_measured_bubble(m.calls_per_slot).unwrap_or(f64::NAN);
    let wait = median(&waits);
    let mine = [
        median(&steps),
        median(&steps) - wait,
        wait,
        bubble,
        comm::size() as f64,
        median(&copies),
    ];
    let Some(all) = comm::gather(&mine) else {
        return Ok(());
    };
    let ranks: Vec<&[f64]> = all.chunks(mine.len()).collect();
    let step = ranks.iter().map(|r| r[0]).fold(0.0, f64::max);
    // A GPU program's copies of arguments in and results out (zero on the CPU): JAX's figures
    // leave the host out, so the throughput without them is given too.
    let copies = ranks.iter().map(|r| r[5]).fold(0.0, f64::max);
    let number = |v: f64| {
        if v.is_finite() {
            format!("{v:e}")
        } else {
            "null".into()
        }
    };
    let per_rank: Vec<String> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "{{\"rank\":{i},\"median_step_s\":{},\"compute_s\":{},\"exchange_wait_s\":{},\"measured_bubble\":{},\"world_size\":{}}}",
                number(r[0]),
                number(r[1]),
                number(r[2]),
                number(r[3]),
                r[4]
            )
        })
        .collect();
    let formula = (m.stages - 1) as f64 / (m.repeats * m.microbatches + m.stages - 1) as f64;
    writeln!(
        out,
        "{{\"median_step_s\":{step:e},\"useful_gflops\":{:.3},\"host_copy_s\":{copies:e},\"useful_gflops_without_copies\":{:.3},\"microbatches_per_s\":{:.3},\"steps\":{},\"ranks\":{},\"bubble_fraction\":{formula},\"gemm_kernels\":\"{}\",\"per_rank\":[{}]}}",
        flops as f64 / step / 1e9,
        flops as f64 / (step - copies) / 1e9,
        m.microbatches as f64 / step,
        steps.len(),
        ranks.len(),
        crate::gemm::kernels(),
        per_rank.join(",")
    )?;
    Ok(())
}

/// The median of step times (the upper one of an even count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
