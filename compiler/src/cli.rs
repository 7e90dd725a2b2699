//! The `ppc` command line: arguments and help text. [`run`] takes the arguments and two writers
//! and returns the exit status, so tests drive the real command in-process and read what a
//! user would read. The commands themselves are in `commands/`; a command that fails prints
//! [`commands::shown`]'s text for its error. Values that do not parse are [`ArgError`]s, which
//! clap shows after `invalid value ... for ...: `.

use crate::commands;
use crate::lower::Numerics;
use crate::passes::{self, Options, Remat};
use crate::timetable::Kind;
use clap::{Args, Parser, Subcommand, ValueEnum};
use ppc_dialect::{DType, Module, Overrides};
use ppc_runtime::manifest::Target;
use ppc_runtime::run_options::{ParamsFile, RunOptions};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "ppc",
    version,
    about = "ppc: a compiler for GSPMD-style pipeline-parallel models",
    long_about = "ppc reads a model file (one stage's compute and the pipeline's shape), vectorizes the stage \
                  over a stage axis (split over MPI ranks with --ranks), wraps it in the GPipe loop, lowers it \
                  through MLIR to CPU code, and runs, \
                  checks or explains the result.\n\n\
                  Typical use:\n  ppc check examples/mlp.ppc\n  ppc run examples/mlp.ppc\n  \
                  ppc compile examples/mlp.ppc -o mlp && ./mlp --bench 20\n  \
                  ppc compile examples/mlp.ppc --target-cpu x86-64-v4 -o mlp   (for AVX-512 nodes)\n  \
                  ppc compile examples/mlp.ppc --ranks 2 -o mlp2 && mpirun.mpich -n 2 ./mlp2\n  \
                  ppc compile examples/mlp.ppc --emit=gpipe-loop\n  \
                  ppc verify examples/mlp.ppc --repeats 2 --poison-bubbles\n  \
                  ppc schedule examples/mlp.ppc --svg schedule.svg"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Parse and verify a model file; print diagnostics.
    #[command(after_help = check_help())]
    Check(ModelArgs),
    /// Print a model file in canonical form (ppc fmt of its own output is unchanged; comments
    /// are not kept).
    Fmt {
        #[command(flatten)]
        model: ModelArgs,
        /// Rewrite the file in place instead of printing it.
        #[arg(short, long)]
        write: bool,
    },
    /// Compile the pipelined forward pass and run it on seeded synthetic microbatches (or
    /// --input); print shapes, a checksum, step time, throughput and the bubble fraction.
    /// `--backend interp` runs the model as written, without pipelining, in the interpreter.
    Run {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        #[command(flatten)]
        io: RunOptions,
        #[command(flatten)]
        codegen: CodegenArgs,
    },
    /// Run the passes; print the IR after one of them (--emit), the compile report (--report),
    /// or write a standalone executable (-o).
    Compile(CompileArgs),
    /// Compile the pipeline, run it and the sequential model on the same seeded inputs, and
    /// compare. The last line is JSON; exit status 0 only when they agree.
    Verify(VerifyArgs),
    /// Draw the generated loop's time × stage grid: which microbatch each stage holds at each
    /// iteration, bubbles marked. With --schedule (or `schedule = ...` in the model file's
    /// `pipeline` block), a training schedule's timetable instead.
    Schedule {
        #[command(flatten)]
        model: ModelArgs,
        /// Also write the grid as an SVG picture.
        #[arg(long, value_name = "OUT")]
        svg: Option<PathBuf>,
        /// Draw the timetable of a training schedule for the model's stages and microbatches:
        /// which forward (F), input gradient (B) and weight gradient (W) each stage runs at
        /// each tick, its bubble beside the published formula, and the stage inputs it keeps.
        /// `ppc compile --train --schedule` compiles each (zb-h1 as 1F1B's loop over ticks
        /// with each weight gradient a tick after its input gradient). With `repeats` > 1,
        /// 1f1b is drawn as compiled (interleaved 1F1B, as --train draws it).
        #[arg(long, value_enum, value_name = "SCHEDULE")]
        schedule: Option<crate::timetable::Kind>,
        /// Draw the compiled training step instead (with --schedule, that schedule's): the
        /// forward (F), backward (B) and weight gradient (W, zb-h1) each stage runs at each tick, read off the generated
        /// program by the proof that checks it, with the bubble counted from those calls.
        #[arg(long)]
        train: bool,
    },
    /// Turn text files into token streams for training language models (`--data`,
    /// `--val-data`): one token per byte (256 ids) by default, the ids of a Hugging Face
    /// tokenizer.json with --tokenizer, or of a byte-level BPE trained on the texts with
    /// --train-bpe N. The files' tokens are concatenated; the last --val-fraction of them go to
    /// DIR/val.bin, the rest to DIR/train.bin. Prints the vocabulary to compile with.
    #[command(after_help = tokenize_help())]
    Tokenize(TokenizeArgs),
    /// Generate text with a trained language model (a --save checkpoint or a --params file):
    /// its forward pass, JIT-compiled for one sequence, continues --prompt, in bytes or through
    /// the --tokenizer its data was made with; greedy, or drawn with --temperature, --top-k and
    /// --top-p.
    Sample(SampleArgs),
}

/// What `ppc tokenize` takes.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Text files: read as bytes, or with --tokenizer or --train-bpe as UTF-8 text, each file
    /// one document encoded whole.
    #[arg(required = true)]
    pub texts: Vec<PathBuf>,
    /// The directory to write train.bin and val.bin into (made if missing).
    #[arg(short, long, value_name = "DIR")]
    pub out: PathBuf,
    /// The share of the tokens held out for validation.
    #[arg(long, default_value_t = 0.1, value_parser = fraction)]
    pub val_fraction: f64,
    /// How the files store ids: u16 (nanoGPT's; vocabularies up to 65,536 ids) or u32
    /// (training executables then need --token-dtype u32). Default: u16 when the vocabulary
    /// fits it, else u32.
    #[arg(long, value_enum, value_name = "DTYPE")]
    pub token_dtype: Option<ppc_runtime::tokens::TokenDType>,
    /// Encode with this Hugging Face tokenizer.json (GPT-2's, Llama's, one's own) as
    /// transformers' `tokenizer(text)` does, with the tokenizer's own special tokens (Llama's
    /// begin-of-text id starts each file).
    #[arg(long, value_name = "FILE", conflicts_with = "train_bpe")]
    pub tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE of N ids (the 256 byte ids and N - 256 merges, as GPT-2's; N
    /// from 257 to 1,048,576) on the texts, write it as DIR/tokenizer.json, and encode with it.
    #[arg(long, value_name = "N", value_parser = bpe_size)]
    pub train_bpe: Option<u32>,
}

/// What `ppc sample` takes.
#[derive(Args, Debug)]
pub struct SampleArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The trained weights: a checkpoint (`--save`) or a parameter file (`--dump-params`).
    #[arg(long, value_name = "FILE")]
    pub params: PathBuf,
    /// The text to continue.
    #[arg(long)]
    pub prompt: String,
    /// Encode the prompt and decode the output with this Hugging Face tokenizer.json (the
    /// one the training data was made with). Default: one token per byte (256 ids). The
    /// model's vocabulary (its logits' last axis) must hold the tokenizer's ids; ids above
    /// them (padding, as GPT-2's 50,257 are padded to 50,304) are never chosen.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// How many tokens to generate.
    #[arg(long, default_value_t = 200)]
    pub tokens: u32,
    /// 0 takes the most likely token each time (the lower id of equals); above 0, draws from
    /// the softmax of the logits divided by it, seeded by --seed. Default: 0, or 1 with --top-k
    /// or --top-p.
    #[arg(long, value_name = "T", value_parser = non_negative)]
    pub temperature: Option<f64>,
    /// Draw from the K most likely tokens only (ties to the lower id); 1 is greedy.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    /// Nucleus sampling: draw from the fewest most likely tokens whose probabilities (at
    /// --temperature, after --top-k) sum to at least P, in (0, 1].
    #[arg(long, value_name = "P", value_parser = share)]
    pub top_p: Option<f64>,
    /// The seed of the draws: the same seed, the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub codegen: CodegenArgs,
}

/// A share in (0, 1).
fn fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a fraction between 0 and 1")),
    }
}

/// A share in (0, 1].
fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a probability above 0 and at most 1")),
    }
}

/// A finite number, 0 or more.
fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a number of 0 or more")),
    }
}

/// The most ids `--train-bpe` makes (1,048,576): four times the largest published vocabulary
/// (Gemma's 262,144). Larger ones take long to train and give logits too large to train with.
const MAX_BPE_IDS: u32 = 1 << 20;

/// A byte-level BPE's size: the 256 byte ids and at least one merge, at most [`MAX_BPE_IDS`].
fn bpe_size(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of ids"))?;
    if n <= 256 {
        return Err(format!(
            "{n} ids: a byte-level BPE starts from the 256 byte ids and adds merges, so it needs at least 257"
        ));
    }
    if n > MAX_BPE_IDS {
        return Err(format!(
            "{n} ids: more than 1,048,576, four times the largest published vocabulary (Gemma's 262,144)"
        ));
    }
    Ok(n)
}

/// What `ppc compile` takes.
#[derive(Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the IR after this pass, or `mlir` (the lowered MLIR module), `llvm` (the LLVM
    /// dialect after the CPU pipeline; with --target cuda, the host program's), `asm` (the
    /// machine code for --target-cpu) or `ptx` (the GPU kernels of --target cuda). Default:
    /// after the last pass.
    #[arg(long, value_parser = emit_name)]
    pub emit: Option<String>,
    /// What runs the loop nests: `cpu` (vectorized, on the rank's threads) or `cuda` (PTX
    /// kernels on the rank's NVIDIA GPU, GEMMs in cuBLAS; the executable needs the CUDA
    /// driver, and the host code still runs on --target-cpu).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub target: Device,
    /// With --target cuda: the GPU architecture the kernels are compiled for (sm_80 A100,
    /// sm_90 H100/H200).
    #[arg(long, value_name = "ARCH", default_value = "sm_90", value_parser = gpu_arch)]
    pub gpu_arch: String,
    /// The CPU the executable's generated code is compiled for: x86-64-v3 (AVX2, FMA; the
    /// default, every x86-64 server since 2015), x86-64-v4 (AVX-512), x86-64-v2, x86-64, or
    /// native (this machine: its every feature becomes a requirement). Build for the oldest
    /// CPU among the nodes that will run it; the runtime's GEMMs use AVX-512 at run time
    /// wherever a node has it. The executable checks its CPU at start and names what is
    /// missing instead of crashing.
    #[arg(long, value_name = "CPU", default_value = crate::target::DEFAULT_CPU, value_parser = target_cpu)]
    pub target_cpu: Target,
    /// Print where compile time goes (each pass, MLIR, LLVM, the link) to stderr.
    #[arg(long)]
    pub time_passes: bool,
    /// Write a standalone executable here (needs only libc and libmpich at run time; try
    /// `PATH --help`).
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Write the IR after every pass to DIR/NN-<pass>.ppc.
    #[arg(long, value_name = "DIR")]
    pub print_after_all: Option<PathBuf>,
    /// Print a report of the generated pipeline instead of IR.
    #[arg(long, value_enum)]
    pub report: Option<ReportFormat>,
    /// Compile the training step instead of the forward pass: the pipeline, the model's
    /// loss, the backward pipeline (passes `loss` and `autodiff`); with -o, an executable
    /// that trains (try `PATH --help`).
    #[arg(long)]
    pub train: bool,
    /// With --train: D pipelines side by side (data × pipeline parallel), run as
    /// `mpirun.mpich -n D·R` (R = --ranks); each trains on its own batches and their
    /// gradients are averaged once per step, in a fixed order.
    #[arg(long, value_name = "D", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub replicas: u64,
    #[command(flatten)]
    pub pass: PassArgs,
    #[command(flatten)]
    pub codegen: CodegenArgs,
}

/// What `ppc verify` takes.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// `interp`: the pipelined IR in the interpreter must equal the sequential model bit for
    /// bit. `cpu`: the compiled program must match both within the dtype's tolerance (bit
    /// for bit with --exact).
    #[arg(long, value_enum, default_value_t = Backend::Interp)]
    pub backend: Backend,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub params: ParamsFile,
    /// Testing verify itself: add 1 to element N (row-major) of the result under test
    /// before comparing, which must then fail.
    #[arg(long, value_name = "N", hide = true)]
    pub perturb: Option<usize>,
    /// Check the training step's gradients instead of the forward pass: `interp`, the
    /// pipelined program's outputs, input gradient and `@layer` parameters' gradients (for a
    /// seeded cotangent of the outputs) against the sequential model's, bit for bit, on
    /// every rank count; `@embed`'s and `@head`'s parameters' within 1e-5, since the
    /// pipelined program sums their gradient over every microbatch in one reduction or
    /// matrix product and the sequential model microbatch by microbatch (the same sum in
    /// another order). `cpu`: the compiled training step's loss and gradients against the
    /// interpreter's, within the dtype's tolerance (bit for bit with --exact). A
    /// gradient's difference is measured against the largest gradient of any parameter
    /// (normwise over the whole gradient), as one whose exact value is zero is rounding
    /// alone.
    #[arg(long)]
    pub grad: bool,
    #[command(flatten)]
    pub pass: PassArgs,
    #[command(flatten)]
    pub codegen: CodegenArgs,
}

/// The model file and command-line overrides of its settings.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// The model file (.ppc).
    pub file: PathBuf,
    /// Override a named dimension: --dim d=512 (repeatable).
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = dim_override)]
    pub dims: Vec<(String, u64)>,
    /// Override the number of pipeline stages.
    #[arg(long)]
    pub stages: Option<u64>,
    /// Override the number of microbatches.
    #[arg(long)]
    pub microbatches: Option<u64>,
    /// Override the number of circular repeats (layer r·S+s runs on stage s in repeat r).
    #[arg(long)]
    pub repeats: Option<u64>,
    /// Override how many layers each stage runs per repeat (replaces `layers` or
    /// `layers_per_stage` of the pipeline block).
    #[arg(long, conflicts_with = "layers")]
    pub layers_per_stage: Option<u64>,
    /// Override the model's depth (replaces `layers` or `layers_per_stage`); any count: the
    /// last stages run fewer layers when the stages do not divide it.
    #[arg(long)]
    pub layers: Option<u64>,
    /// Split the stage axis over this many MPI ranks (must divide the stages); executables
    /// built with it run under `mpirun -n RANKS`.
    #[arg(long)]
    pub ranks: Option<u64>,
    /// Store every f32 tensor of the model in this dtype instead (bf16 or f16; math stays f32).
    #[arg(long, value_parser = float_dtype)]
    pub dtype: Option<DType>,
}

impl ModelArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            dims: self.dims.clone(),
            stages: self.stages,
            microbatches: self.microbatches,
            repeats: self.repeats,
            ranks: self.ranks,
            layers_per_stage: self.layers_per_stage,
            layers: self.layers,
            float_dtype: self.dtype,
        }
    }
}

#[derive(Args, Debug)]
pub struct PassArgs {
    /// Fill bubble slots with NaN instead of zeros (results must not change).
    #[arg(long)]
    pub poison_bubbles: bool,
    /// Training: what the backward recomputes. `stage` (GPipe's choice): keep each
    /// iteration's stage input and recompute the stage in the backward loop, the least memory;
    /// `tick` (`--schedule 1f1b` without repeats only): as `stage`, but recompute in the tick before the
    /// backward, holding one microbatch's activations per stage for a tick, so that with one
    /// stage per rank forward and backward ticks cost the same and ranks do not wait on each
    /// other; `none`: keep every activation the backward reads, so no matmul runs twice (see
    /// `--report=json` for the memory of each).
    #[arg(long, value_enum, default_value_t = Remat::Stage)]
    pub remat: Remat,
    /// Training: the order of each stage's forwards and backwards. `gpipe`: every forward,
    /// then every backward (each stage keeps all M microbatches' inputs); `1f1b`: one forward,
    /// one backward, in one loop over ticks (stage s keeps at most S-s inputs; with `repeats`
    /// R > 1, interleaved 1F1B: a bubble of (S-1)/(R·M+S-1), stage s keeps R·S+S-2s group
    /// inputs); `zb-h1`: 1F1B with each backward's weight gradient a tick after its input
    /// gradient, in the stage's forward tick (one microbatch's activations more per stage;
    /// not with repeats). The same gradients, bit for bit. `ppc schedule --schedule` draws them. Default: the model
    /// file's `schedule = ...` in its `pipeline` block, else gpipe.
    #[arg(long = "schedule", value_enum)]
    pub train_schedule: Option<Kind>,
}

impl PassArgs {
    /// The options for compiling `m`: the schedule is `--schedule`'s, else the model file's.
    pub fn options(&self, train: bool, m: &Module) -> Options {
        Options {
            poison_bubbles: self.poison_bubbles,
            train,
            remat: self.remat,
            schedule: self.train_schedule.unwrap_or_else(|| Kind::of(m)),
        }
    }
}

/// How code is generated.
#[derive(Args, Debug)]
pub struct CodegenArgs {
    /// Compute as the interpreter does: matmuls as loops in its order, libm's exp and tanh,
    /// IEEE's gradual underflow. Slow, and bit-identical to the interpreter. Default: the tuned
    /// GEMM and vectorized exp/tanh, subnormals counted as zero on the CPU (as XLA's CPU backend
    /// does), within 1e-5 (f32) of it.
    #[arg(long)]
    pub exact: bool,
    /// LLVM optimization level of the generated code (0-3). Executables: 0 none, 1 and 2 a short
    /// pipeline for the loops MLIR writes (vectorizing for --target-cpu), 3 LLVM's full -O3.
    /// The JIT of `ppc run`/`verify`: LLVM's level.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub opt_level: u8,
    /// Executables: the object files their code is cut into, by function, and optimized and
    /// compiled in parallel threads (1: the module whole). Each function's machine code is the
    /// same either way.
    #[arg(long, value_name = "N", default_value_t = crate::lower::partition::PARTITIONS as u8,
          value_parser = clap::value_parser!(u8).range(1..=16))]
    pub codegen_partitions: u8,
}

impl CodegenArgs {
    pub fn numerics(&self) -> Numerics {
        if self.exact {
            Numerics::Exact
        } else {
            Numerics::Fast
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Compiled through MLIR and JIT-compiled for this CPU.
    Cpu,
    /// The reference interpreter (the definition of every op).
    Interp,
    /// Compiled for `--target cuda` (GPU 0, sm_90 kernels) into a scratch executable, run in
    /// one process; needs a CUDA driver and GPU.
    Cuda,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Interp => "interp",
            Backend::Cuda => "cuda",
        }
    }
}

/// What runs the generated loop nests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ReportFormat {
    Json,
}

/// A command-line value that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    #[error("expected NAME=VALUE, as in --dim d=512")]
    NotNameValue,
    #[error("`{0}` is not a non-negative integer")]
    NotCount(String),
    #[error("unknown pass `{name}`; passes: {}, then mlir, llvm, asm and ptx", .passes.join(", "))]
    UnknownPass {
        name: String,
        passes: Vec<&'static str>,
    },
    #[error(
        "`{0}` is not a GPU architecture: expected sm_NN, as in sm_90 (H100, H200) or sm_80 (A100)"
    )]
    NotGpuArch(String),
    #[error("`{0}` is not a floating-point dtype (f32, bf16, f16)")]
    NotFloat(String),
}

fn dim_override(s: &str) -> Result<(String, u64), ArgError> {
    let (name, value) = s.split_once('=').ok_or(ArgError::NotNameValue)?;
    let v = value
        .trim()
        .parse::<u64>()
        .map_err(|_| ArgError::NotCount(value.to_string()))?;
    Ok((name.trim().to_string(), v))
}

fn emit_name(s: &str) -> Result<String, ArgError> {
    if matches!(s, "mlir" | "llvm" | "asm" | "ptx") {
        return Ok(s.to_string());
    }
    passes::find(s)
        .map(|p| p.name.to_string())
        .ok_or_else(|| ArgError::UnknownPass {
            name: s.to_string(),
            passes: passes::PASSES.iter().map(|p| p.name).collect(),
        })
}

/// `sm_NN` or `sm_NNa`, as NVIDIA names architectures (and LLVM's NVPTX backend takes them).
fn gpu_arch(s: &str) -> Result<String, ArgError> {
    let digits = s
        .strip_prefix("sm_")
        .map(|d| d.trim_end_matches('a'))
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    match digits {
        Some(_) => Ok(s.to_string()),
        None => Err(ArgError::NotGpuArch(s.to_string())),
    }
}

fn target_cpu(s: &str) -> Result<Target, crate::target::UnknownCpu> {
    crate::target::resolve(s)
}

fn float_dtype(s: &str) -> Result<DType, ArgError> {
    match DType::from_name(s) {
        Some(d) if d.is_float() => Ok(d),
        _ => Err(ArgError::NotFloat(s.to_string())),
    }
}

/// `ppc check --help`'s closing text: where the language is described, and its ops.
fn check_help() -> String {
    format!(
        "The model language (file parts, types, expressions, every op, losses, optimizers) is described in docs/language.md.\n\n{}",
        ppc_dialect::model_rules::user_ops_note()
    )
}

/// `ppc tokenize --help`'s closing text: the three vocabularies, with examples.
fn tokenize_help() -> &'static str {
    "Examples:\n  \
     ppc tokenize notes.txt -o data                                   (bytes: --dim vocab=256)\n  \
     ppc tokenize notes.txt -o data --tokenizer gpt2/tokenizer.json   (GPT-2's 50,257 ids)\n  \
     ppc tokenize notes.txt -o data --train-bpe 4096                  (writes data/tokenizer.json)\n\n\
     Sample with the same tokenizer: ppc sample MODEL --params CKPT --tokenizer data/tokenizer.json. \
     docs/tokenizers.md is the guide."
}

/// Runs `ppc` with `args` (the first is the program name); returns the exit status: 0 on
/// success, 1 for errors in the model or its run, 2 for bad command-line usage.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let text = e.render().to_string();
            let _ = if e.use_stderr() {
                err.write_all(text.as_bytes())
            } else {
                out.write_all(text.as_bytes())
            };
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match commands::dispatch(cli.command, out, err) {
        Ok(code) => code,
        Err(e) => {
            let _ = err.write_all(commands::shown(&e).as_bytes());
            1
        }
    }
}
