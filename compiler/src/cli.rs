//! The `ppc` command line. [`run`] takes the arguments and two writers and returns the exit code,
//! so tests drive the real command in-process and read what a user would read.

use crate::files::write_atomic;
use crate::passes::{self, Options};
use crate::pipeline::{compile, frontend, PipelineError};
use crate::report::report;
use crate::schedule::Schedule;
use clap::{Args, Parser, Subcommand, ValueEnum};
use ppc_dialect::diag::render;
use ppc_dialect::interp::Interp;
use ppc_dialect::{print, Diagnostic, Module, Overrides};
use ppc_runtime::Tensor;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "ppc",
    version,
    about = "ppc: a compiler for GSPMD-style pipeline-parallel models",
    long_about = "ppc reads a model file (one stage's compute and the pipeline's shape), vectorizes the stage \
                  over a stage axis, wraps it in the GPipe loop, and runs or explains the result.\n\n\
                  Typical use:\n  ppc check examples/mlp.ppc\n  ppc run examples/mlp.ppc\n  \
                  ppc compile examples/mlp.ppc --emit=gpipe-loop\n  ppc verify examples/mlp.ppc --repeats 2 --poison-bubbles\n  \
                  ppc schedule examples/mlp.ppc --svg schedule.svg"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Parse and verify a model file; print diagnostics.
    Check(ModelArgs),
    /// Print a model file in canonical form (ppc fmt of its own output is unchanged).
    Fmt {
        #[command(flatten)]
        model: ModelArgs,
        /// Rewrite the file in place instead of printing it.
        #[arg(short, long)]
        write: bool,
    },
    /// Run the model as written (each microbatch through all layers, no pipelining) on seeded
    /// synthetic inputs and print shapes, a checksum and the time.
    Run {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long, value_enum, default_value_t = Backend::Interp)]
        backend: Backend,
        /// Seed of the generator that draws parameters and inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// How many times to run the forward pass.
        #[arg(long, default_value_t = 1)]
        steps: u32,
    },
    /// Run the passes and print the IR after one of them, or the compile report.
    Compile {
        #[command(flatten)]
        model: ModelArgs,
        /// Print the IR after this pass (default: after the last one).
        #[arg(long, value_parser = pass_name)]
        emit: Option<String>,
        /// Write the IR after every pass to DIR/NN-<pass>.ppc.
        #[arg(long, value_name = "DIR")]
        print_after_all: Option<PathBuf>,
        /// Print a report of the generated pipeline instead of IR.
        #[arg(long, value_enum)]
        report: Option<ReportFormat>,
        #[command(flatten)]
        pass: PassArgs,
    },
    /// Compile the pipeline, run it and the sequential model on the same seeded inputs, and
    /// compare. The last line is JSON; exit status 0 only when they agree.
    Verify {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long, value_enum, default_value_t = Backend::Interp)]
        backend: Backend,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[command(flatten)]
        pass: PassArgs,
    },
    /// Draw the generated loop's time × stage grid: which microbatch each stage holds at each
    /// iteration, bubbles marked.
    Schedule {
        #[command(flatten)]
        model: ModelArgs,
        /// Also write the grid as an SVG picture.
        #[arg(long, value_name = "OUT")]
        svg: Option<PathBuf>,
    },
}

/// The model file and command-line overrides of its settings.
#[derive(Args, Debug)]
struct ModelArgs {
    /// The model file (.ppc).
    file: PathBuf,
    /// Override a named dimension: --dim d=512 (repeatable).
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = dim_override)]
    dims: Vec<(String, u64)>,
    /// Override the number of pipeline stages.
    #[arg(long)]
    stages: Option<u64>,
    /// Override the number of microbatches.
    #[arg(long)]
    microbatches: Option<u64>,
    /// Override the number of circular repeats (layer r·S+s runs on stage s in repeat r).
    #[arg(long)]
    repeats: Option<u64>,
}

#[derive(Args, Debug)]
struct PassArgs {
    /// Fill bubble slots with NaN instead of zeros (results must not change).
    #[arg(long)]
    poison_bubbles: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    /// The reference interpreter (the definition of every op).
    Interp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ReportFormat {
    Json,
}

fn dim_override(s: &str) -> Result<(String, u64), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or("expected NAME=VALUE, as in --dim d=512")?;
    let v = value
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("`{value}` is not a non-negative integer"))?;
    Ok((name.trim().to_string(), v))
}

fn pass_name(s: &str) -> Result<String, String> {
    passes::find(s).map(|p| p.name.to_string()).ok_or_else(|| {
        let names: Vec<&str> = passes::PASSES.iter().map(|p| p.name).collect();
        format!("unknown pass `{s}`; passes: {}", names.join(", "))
    })
}

/// A failed command: what to tell the user (already rendered).
struct Failure(String);

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure(format!("error: {s}\n"))
    }
}

struct Loaded {
    path: String,
    text: String,
    module: Module,
}

impl ModelArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            dims: self.dims.clone(),
            stages: self.stages,
            microbatches: self.microbatches,
            repeats: self.repeats,
        }
    }

    fn load(&self) -> Result<Loaded, Failure> {
        let path = self.file.display().to_string();
        let text = std::fs::read_to_string(&self.file)
            .map_err(|e| Failure(format!("error: cannot read {path}: {e}\n")))?;
        match frontend(&text, &self.overrides()) {
            Ok(module) => Ok(Loaded { path, text, module }),
            Err(d) => Err(Failure(render(&path, &text, &d))),
        }
    }
}

impl Loaded {
    fn fail(&self, d: &[Diagnostic]) -> Failure {
        Failure(render(&self.path, &self.text, d))
    }

    fn compile(
        &mut self,
        opts: &Options,
        until: Option<&str>,
        dump: Option<&std::path::Path>,
    ) -> Result<(), Failure> {
        compile(&mut self.module, opts, until, dump).map_err(|e| match e {
            PipelineError::Pass(_, d) => self.fail(&d),
            PipelineError::Invalid(pass, d) => {
                let mut f = self.fail(&d);
                f.0.push_str(&format!("error: internal compiler error: `{pass}` produced invalid IR; please report this with the model file\n"));
                f
            }
            PipelineError::Io(path, e) => Failure(format!("error: cannot write {path}: {e}\n")),
        })
    }
}

/// Runs `ppc` with `args` (the first is the program name); returns the exit status.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let text = e.render().to_string();
            let _ = if e.use_stderr() {
                err.write_all(text.as_bytes())
            } else {
                out.write_all(text.as_bytes())
            };
            return code;
        }
    };
    match dispatch(cli.command, out, err) {
        Ok(code) => code,
        Err(Failure(msg)) => {
            let _ = err.write_all(msg.as_bytes());
            1
        }
    }
}

fn dispatch(cmd: Command, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32, Failure> {
    let io = |e: std::io::Error| Failure(format!("error: {e}\n"));
    match cmd {
        Command::Check(model) => {
            let l = model.load()?;
            let p = l.module.pipeline;
            writeln!(
                out,
                "ok: {} ({} stages, {} layers, {} microbatches, {} repeats)",
                l.path, p.stages, p.layers, p.microbatches, p.repeats
            )
            .map_err(io)?;
        }
        Command::Fmt { model, write } => {
            let l = model.load()?;
            let text = print(&l.module);
            if write {
                write_atomic(&model.file, text.as_bytes())
                    .map_err(|e| Failure(format!("error: cannot write {}: {e}\n", l.path)))?;
            } else {
                out.write_all(text.as_bytes()).map_err(io)?;
            }
        }
        Command::Run {
            model,
            backend: Backend::Interp,
            seed,
            steps,
        } => {
            let l = model.load()?;
            let p = l.module.pipeline;
            let mut interp = Interp::new(&l.module, seed);
            let inputs = interp.synthetic_inputs();
            let mut result = None;
            let start = Instant::now();
            for step in 0..steps.max(1) {
                if steps > 1 {
                    writeln!(err, "step {}/{}", step + 1, steps).map_err(io)?;
                }
                result = Some(interp.sequential(&inputs)?);
            }
            let secs = start.elapsed().as_secs_f64() / f64::from(steps.max(1));
            let y = result.expect("invariant: at least one step ran");
            writeln!(out, "model     {}", l.path).map_err(io)?;
            writeln!(
                out,
                "pipeline  {} stages x {} layers/stage x {} repeats = {} layers, {} microbatches",
                p.stages,
                p.layers_per_stage(),
                p.repeats,
                p.layers,
                p.microbatches
            )
            .map_err(io)?;
            writeln!(out, "input     {}", shape_of(&inputs)).map_err(io)?;
            writeln!(out, "output    {}", shape_of(&y)).map_err(io)?;
            writeln!(out, "checksum  {:.6e}", y.checksum()).map_err(io)?;
            writeln!(
                out,
                "time      {secs:.4} s per step (interp backend, sequential, seed {seed})"
            )
            .map_err(io)?;
        }
        Command::Compile {
            model,
            emit,
            print_after_all,
            report: fmt,
            pass,
        } => {
            let mut l = model.load()?;
            let opts = Options {
                poison_bubbles: pass.poison_bubbles,
            };
            let until = if fmt.is_some() { None } else { emit.as_deref() };
            l.compile(&opts, until, print_after_all.as_deref())?;
            match fmt {
                Some(ReportFormat::Json) => {
                    let r = report(&l.module)?;
                    writeln!(out, "{r}").map_err(io)?;
                }
                None => out.write_all(print(&l.module).as_bytes()).map_err(io)?,
            }
        }
        Command::Verify {
            model,
            backend: Backend::Interp,
            seed,
            pass,
        } => {
            let mut l = model.load()?;
            let opts = Options {
                poison_bubbles: pass.poison_bubbles,
            };
            l.compile(&opts, None, None)?;
            let p = l.module.pipeline;
            writeln!(
                err,
                "verify: {} stages, {} microbatches, {} repeats, {} layers (seed {seed}{})",
                p.stages,
                p.microbatches,
                p.repeats,
                p.layers,
                if pass.poison_bubbles {
                    ", poisoned bubbles"
                } else {
                    ""
                }
            )
            .map_err(io)?;
            let mut interp = Interp::new(&l.module, seed);
            let inputs = interp.synthetic_inputs();
            let t0 = Instant::now();
            let want = interp.sequential(&inputs)?;
            writeln!(err, "sequential model: {:.3} s", t0.elapsed().as_secs_f64()).map_err(io)?;
            let t1 = Instant::now();
            let got = interp.forward(&inputs)?;
            writeln!(
                err,
                "pipelined program (interp): {:.3} s",
                t1.elapsed().as_secs_f64()
            )
            .map_err(io)?;
            let cmp = compare(&want, &got);
            writeln!(out, "{}", serde_json::json!({
                "backend": "interp",
                "stages": p.stages, "microbatches": p.microbatches, "repeats": p.repeats, "layers": p.layers,
                "poison_bubbles": pass.poison_bubbles, "seed": seed,
                "max_abs_diff": cmp.max_abs, "max_rel_diff": cmp.max_rel, "bit_exact": cmp.bit_exact, "ok": cmp.bit_exact,
            })).map_err(io)?;
            return Ok(if cmp.bit_exact { 0 } else { 1 });
        }
        Command::Schedule { model, svg } => {
            let mut l = model.load()?;
            l.compile(&Options::default(), None, None)?;
            let s = Schedule::of(&l.module)?;
            out.write_all(s.text().as_bytes()).map_err(io)?;
            if let Some(path) = svg {
                write_atomic(&path, s.svg().as_bytes()).map_err(|e| {
                    Failure(format!("error: cannot write {}: {e}\n", path.display()))
                })?;
                writeln!(err, "wrote {}", path.display()).map_err(io)?;
            }
        }
    }
    Ok(0)
}

fn shape_of(t: &Tensor) -> String {
    format!("{}{:?}", t.dtype, t.shape)
}

/// How far apart two results are.
pub struct Comparison {
    pub max_abs: f64,
    pub max_rel: f64,
    /// Same shape and the same bits everywhere (NaN included).
    pub bit_exact: bool,
}

/// Compares `got` with the reference `want`. A NaN on one side only counts as infinitely far.
pub fn compare(want: &Tensor, got: &Tensor) -> Comparison {
    if want.shape != got.shape {
        return Comparison {
            max_abs: f64::INFINITY,
            max_rel: f64::INFINITY,
            bit_exact: false,
        };
    }
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    for (&a, &b) in want.data.iter().zip(&got.data) {
        let d = if a.is_nan() != b.is_nan() {
            f64::INFINITY
        } else if a.is_nan() {
            0.0
        } else {
            (f64::from(a) - f64::from(b)).abs()
        };
        max_abs = max_abs.max(d);
        max_rel = max_rel.max(if d == 0.0 {
            0.0
        } else {
            d / f64::from(a).abs().max(f64::MIN_POSITIVE)
        });
    }
    let bit_exact = want
        .data
        .iter()
        .zip(&got.data)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    Comparison {
        max_abs,
        max_rel,
        bit_exact,
    }
}
