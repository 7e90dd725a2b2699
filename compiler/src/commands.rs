//! What each `ppc` command does. Errors come back as a [`Failure`] holding the text to print:
//! rendered diagnostics with file:line:col, or a one-line `error:` message.

use crate::backend::{self, Source};
use crate::cli::{Backend, CodegenArgs, Command, Device, ModelArgs, PassArgs, ReportFormat};
use crate::compare::{compare, tolerance};

use crate::passes::{Options, Remat};
use crate::pipeline::{compile, frontend, PipelineError};
use crate::report::{self, report};
use crate::schedule::Schedule;
use ppc_dialect::diag::render;
use ppc_dialect::interp::{forward_on_ranks, param_source, param_specs, Interp};
use ppc_dialect::ir::Setting;
use ppc_dialect::span::Span;
use ppc_dialect::{print, Diagnostic, Module};
use ppc_runtime::exec::{drive, write_summary, OUTPUT_TENSOR};
use ppc_runtime::files::write_atomic;
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::run_options::RunOptions;
use ppc_runtime::Tensor;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// A failed command: the text to show the user.
pub struct Failure(pub String);

impl From<String> for Failure {
    fn from(s: String) -> Failure {
        Failure(format!("error: {s}\n"))
    }
}

fn io(e: std::io::Error) -> Failure {
    Failure(format!("error: {e}\n"))
}

/// A model file, loaded and checked.
struct Loaded {
    path: String,
    text: String,
    module: Module,
}

fn load(args: &ModelArgs) -> Result<Loaded, Failure> {
    let path = args.file.display().to_string();
    let bytes = std::fs::read(&args.file)
        .map_err(|e| Failure(format!("error: cannot read {path}: {e}\n")))?;
    let text = String::from_utf8(bytes).map_err(|e| not_utf8(&path, &e))?;
    match frontend(&text, &args.overrides()) {
        Ok(module) => Ok(Loaded { path, text, module }),
        Err(d) => Err(Failure(render(&path, &text, &d))),
    }
}

/// What the training step keeps for its backward under each `--remat`, from the program each
/// generates (`compiled` is the one for `pass.remat`).
fn kept_by_remat(
    model: &ModelArgs,
    pass: &PassArgs,
    compiled: &Module,
) -> Result<serde_json::Value, Failure> {
    let mut by = serde_json::Map::new();
    for remat in [Remat::Stage, Remat::None] {
        let bytes = if remat == pass.remat {
            crate::report::kept_activation_bytes(compiled)
        } else {
            let mut other = load(model)?;
            let opts = Options {
                remat,
                ..pass.options(true)
            };
            other.compile(&opts, None, None)?;
            crate::report::kept_activation_bytes(&other.module)
        };
        by.insert(remat.name().into(), bytes.into());
    }
    Ok(by.into())
}

/// A model file that is not UTF-8: the line and column of the first bad byte.
fn not_utf8(path: &str, e: &std::string::FromUtf8Error) -> Failure {
    let at = e.utf8_error().valid_up_to();
    let bytes = e.as_bytes();
    // Up to `at` the lossy text is the file itself; the bad byte becomes U+FFFD there.
    let text = String::from_utf8_lossy(bytes);
    let d = Diagnostic::error(
        format!(
            "the model file is not UTF-8: byte 0x{:02x} is not a valid character here",
            bytes[at]
        ),
        Span::new(at, at + char::REPLACEMENT_CHARACTER.len_utf8()),
        "first invalid byte",
    )
    .with_note("model files are UTF-8 text; re-save the file in that encoding");
    Failure(render(path, &text, &[d]))
}

impl Loaded {
    fn fail(&self, d: &[Diagnostic]) -> Failure {
        Failure(render(&self.path, &self.text, d))
    }

    fn source(&self) -> Source<'_> {
        Source {
            file: &self.path,
            text: &self.text,
        }
    }

    fn compile(
        &mut self,
        opts: &Options,
        until: Option<&str>,
        dump: Option<&Path>,
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

    /// The compiled module as a `--target cuda` executable for sm_90, in a scratch directory
    /// (removed when the returned guard drops).
    fn cuda_executable(
        &self,
        codegen: &CodegenArgs,
        err: &mut dyn Write,
    ) -> Result<(backend::TempDir, std::path::PathBuf), Failure> {
        cuda_codegen(codegen)?;
        let t = Instant::now();
        let dir = backend::TempDir::new().map_err(|d| self.fail(&d))?;
        let exe = dir.path().join("model");
        let target =
            crate::target::resolve("native").map_err(|e| Failure(format!("error: {e}\n")))?;
        let gpu = backend::Gpu {
            arch: "sm_90".into(),
        };
        let how = backend::Codegen {
            numerics: codegen.numerics(),
            target: &target,
            gpu: Some(&gpu),
            opt_level: codegen.opt_level.into(),
        };
        backend::executable(&self.module, &self.source(), &how, 1, &exe)
            .map_err(|d| self.fail(&d))?;
        writeln!(
            err,
            "compiled {} for cuda in {:.2} s",
            self.path,
            t.elapsed().as_secs_f64()
        )
        .map_err(io)?;
        Ok((dir, exe))
    }

    fn jit(&self, codegen: &CodegenArgs) -> Result<crate::lower::mlir::Jit, Failure> {
        backend::jit(
            &self.module,
            &self.source(),
            codegen.numerics(),
            codegen.opt_level.into(),
        )
        .map_err(|d| self.fail(&d))
    }
}

pub fn dispatch(cmd: Command, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32, Failure> {
    match cmd {
        Command::Check(model) => {
            let l = load(&model)?;
            let p = l.module.pipeline;
            writeln!(
                out,
                "ok: {} ({} stages, {} layers, {} microbatches, {} repeats)",
                l.path, p.stages, p.layers, p.microbatches, p.repeats
            )
            .map_err(io)?;
        }
        Command::Fmt { model, write } => {
            let l = load(&model)?;
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
            io: args,
            ..
        } => run_interp(&load(&model)?, &args, out, err)?,
        Command::Run {
            model,
            backend: Backend::Cuda,
            io: args,
            codegen,
        } => {
            let mut l = load(&model)?;
            one_process(&l, "ppc run")?;
            l.compile(&Options::default(), None, None)?;
            let (_dir, exe) = l.cuda_executable(&codegen, err)?;
            return run_executable(&exe, &args.to_args(), out, err);
        }
        Command::Run {
            model,
            backend: Backend::Cpu,
            io: args,
            codegen,
        } => {
            let mut l = load(&model)?;
            one_process(&l, "ppc run")?;
            let t = Instant::now();
            l.compile(&Options::default(), None, None)?;
            let jit = l.jit(&codegen)?;
            writeln!(
                err,
                "compiled {} in {:.2} s",
                l.path,
                t.elapsed().as_secs_f64()
            )
            .map_err(io)?;
            let opts = RunOptions {
                backend: "cpu JIT".into(),
                ..args
            };
            drive(&jit.program, &opts, out, err)?;
        }
        Command::Compile {
            model,
            emit,
            output,
            print_after_all,
            report: fmt,
            pass,
            codegen,
            target_cpu: target,
            target: device,
            gpu_arch,
            time_passes,
            train,
            replicas,
        } => {
            let gpu = (device == Device::Cuda).then(|| backend::Gpu {
                arch: gpu_arch.clone(),
            });
            if gpu.is_some() {
                cuda_codegen(&codegen)?;
                if emit.as_deref() == Some("asm") {
                    return Err(Failure(
                        "error: --emit=asm shows the CPU program; with --target cuda, --emit=mlir shows the program, --emit=llvm the host's LLVM dialect and --emit=ptx its kernels\n".into(),
                    ));
                }
            }
            if gpu.is_none() && emit.as_deref() == Some("ptx") {
                return Err(Failure(
                    "error: --emit=ptx prints the GPU kernels: add --target cuda\n".into(),
                ));
            }
            if pass.remat != Remat::Stage && !train {
                return Err(Failure(
                    "error: --remat chooses what the training step's backward recomputes: add --train\n"
                        .into(),
                ));
            }
            let timer = time_passes.then(crate::timing::start);
            let mut l = crate::timing::phase("parse and check", || load(&model))?;
            let opts = pass.options(train);
            let lowering = matches!(emit.as_deref(), Some("mlir" | "llvm" | "asm" | "ptx"))
                || output.is_some()
                || fmt.is_some();
            l.compile(
                &opts,
                if lowering { None } else { emit.as_deref() },
                print_after_all.as_deref(),
            )?;
            let numerics = codegen.numerics();
            if let Some(path) = &output {
                let t = Instant::now();
                let opt = codegen.opt_level.into();
                if replicas > 1 && !train {
                    return Err(Failure(
                        "error: --replicas runs pipelines side by side for training: add --train\n"
                            .into(),
                    ));
                }
                let src = l.source();
                let how = backend::Codegen {
                    numerics,
                    target: &target,
                    gpu: gpu.as_ref(),
                    opt_level: opt,
                };
                backend::executable(&l.module, &src, &how, replicas, path)
                    .map_err(|d| l.fail(&d))?;
                writeln!(
                    err,
                    "wrote {} in {:.2} s",
                    path.display(),
                    t.elapsed().as_secs_f64()
                )
                .map_err(io)?;
            }
            let text = match (fmt, emit.as_deref()) {
                (Some(ReportFormat::Json), _) => {
                    let mut r = report(&l.module)?;
                    if train {
                        r["training"]["kept_activation_bytes_per_rank_by_remat"] =
                            kept_by_remat(&model, &pass, &l.module)?;
                    }
                    format!("{r}\n")
                }
                (None, Some("mlir")) => {
                    backend::emit_mlir(&l.module, &l.source(), numerics, gpu.as_ref())
                        .map_err(|d| l.fail(&d))?
                }
                (None, Some("ptx")) => {
                    let g = gpu.as_ref().expect("checked above: --emit=ptx needs a GPU");
                    backend::emit_ptx(&l.module, &l.source(), numerics, g)
                        .map_err(|d| l.fail(&d))?
                }
                (None, Some("llvm")) => {
                    backend::emit_llvm(&l.module, &l.source(), numerics, gpu.as_ref())
                        .map_err(|d| l.fail(&d))?
                }
                (None, Some("asm")) => {
                    let opt = codegen.opt_level.into();
                    backend::emit_asm(&l.module, &l.source(), numerics, &target, opt)
                        .map_err(|d| l.fail(&d))?
                }
                (None, _) if output.is_none() => print(&l.module),
                (None, _) => String::new(),
            };
            out.write_all(text.as_bytes()).map_err(io)?;
            if let Some(t) = timer {
                err.write_all(crate::timing::table(&t.finish()).as_bytes())
                    .map_err(io)?;
            }
        }
        Command::Verify {
            model,
            backend,
            seed,
            params,
            perturb,
            pass,
            codegen,
            grad,
        } => {
            let check = Check {
                backend,
                seed,
                params: params.file,
                perturb,
            };
            if grad {
                return verify_grad(&model, &check, &pass, &codegen, out, err);
            }
            if pass.remat != Remat::Stage {
                return Err(Failure(
                    "error: --remat chooses what the backward recomputes: add --grad\n".into(),
                ));
            }
            return verify(&model, &check, &pass, &codegen, out, err);
        }
        Command::Schedule { model, svg } => {
            let mut l = load(&model)?;
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

/// The JIT runs the program in this one process; a program split over ranks needs MPI.
fn one_process(l: &Loaded, what: &str) -> Result<(), Failure> {
    let r = l.module.pipeline.ranks;
    if r == 1 {
        return Ok(());
    }
    Err(Failure(format!(
        "error: `{what}` runs the program in one process, but it is split over {r} ranks\n  \
         = build an executable and launch it with MPI: \
         `ppc compile {} --ranks {r} -o model && mpirun.mpich -n {r} ./model`\n",
        l.path
    )))
}

/// Refuses what the CUDA backend does not do.
fn cuda_codegen(codegen: &CodegenArgs) -> Result<(), Failure> {
    if codegen.exact {
        return Err(Failure(
            "error: --exact is the CPU's bit-exact mode; --target cuda computes with CUDA's own math (within the dtype's tolerance)\n".into(),
        ));
    }
    Ok(())
}

/// Runs a scratch executable with `flags`, passing on what it prints; its exit status.
fn run_executable(
    exe: &Path,
    flags: &[std::ffi::OsString],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, Failure> {
    let o = std::process::Command::new(exe)
        .args(flags)
        .output()
        .map_err(|e| Failure(format!("error: cannot run {}: {e}\n", exe.display())))?;
    out.write_all(&o.stdout).map_err(io)?;
    err.write_all(&o.stderr).map_err(io)?;
    Ok(o.status.code().unwrap_or(1))
}

/// `ppc run --backend interp`: the model as written, each microbatch through every layer.
fn run_interp(
    l: &Loaded,
    args: &RunOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), Failure> {
    if args.bench.is_some() || args.trace.is_some() {
        return Err(Failure(
            "error: --bench and --trace need the cpu backend\n".into(),
        ));
    }
    let p = l.module.pipeline;
    let source = param_source(&l.module, args.seed, args.params.file.as_deref())?;
    if let Some(path) = &args.dump_params {
        ppc_runtime::params::dump(&source, &param_specs(&l.module), path)?;
        writeln!(err, "wrote {}", path.display()).map_err(io)?;
    }
    let mut interp = Interp::with_params(&l.module, args.seed, source);
    let inputs = match &args.input {
        None => interp.synthetic_inputs(),
        Some(path) => {
            let want = interp.synthetic_inputs();
            ppc_runtime::exec::read_input(path, want.dtype, &want.shape)?.to_tensor()
        }
    };
    let mut result = None;
    let start = Instant::now();
    let steps = args.steps.max(1);
    for step in 0..steps {
        if steps > 1 {
            writeln!(err, "step {}/{steps}", step + 1).map_err(io)?;
        }
        result = Some(interp.sequential(&inputs)?);
    }
    let secs = start.elapsed().as_secs_f64() / f64::from(steps);
    let y = result.expect("invariant: at least one step ran");
    let step = format!("{secs:.4} s (interp, sequential, seed {})", args.seed);
    write_summary(
        out,
        &l.path,
        [p.stages, p.microbatches, p.repeats, p.layers],
        &shape_of(&inputs),
        &y,
        &step,
    )
    .map_err(io)?;
    if let Some(path) = &args.output {
        ppc_runtime::safetensors::write(path, &[(OUTPUT_TENSOR, &HostBuffer::from_tensor(&y))])?;
        writeln!(err, "wrote {}", path.display()).map_err(io)?;
    }
    Ok(())
}

/// What `ppc verify` compares, and with which numbers.
struct Check {
    backend: Backend,
    seed: u64,
    params: Option<std::path::PathBuf>,
    perturb: Option<usize>,
}

/// `ppc verify`: the pipelined program (interpreted or compiled) against the sequential model.
fn verify(
    model: &ModelArgs,
    check: &Check,
    pass: &PassArgs,
    codegen: &CodegenArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, Failure> {
    let Check {
        backend,
        seed,
        ref params,
        perturb,
    } = *check;
    let mut l = load(model)?;
    if backend != Backend::Interp {
        one_process(&l, &format!("ppc verify --backend {}", backend.name()))?;
    }
    l.compile(&pass.options(false), None, None)?;
    let p = l.module.pipeline;
    let dtype = l.module.input.dtype;
    let poison = if pass.poison_bubbles {
        ", poisoned bubbles"
    } else {
        ""
    };
    writeln!(
        err,
        "verify: {} stages, {} microbatches, {} repeats, {} layers, {dtype} (seed {seed}{poison})",
        p.stages, p.microbatches, p.repeats, p.layers
    )
    .map_err(io)?;
    let source = param_source(&l.module, seed, params.as_deref())?;
    let mut interp = Interp::with_params(&l.module, seed, source.clone());
    let inputs = interp.synthetic_inputs();
    let t = Instant::now();
    let want = interp.sequential(&inputs)?;
    writeln!(
        err,
        "sequential model (interp): {:.3} s",
        t.elapsed().as_secs_f64()
    )
    .map_err(io)?;
    let t = Instant::now();
    // A program split over ranks runs with one interpreter thread per rank.
    let piped = match p.ranks {
        1 => interp.forward(&inputs)?,
        _ => forward_on_ranks(&l.module, seed, &source, &inputs)?,
    };
    writeln!(
        err,
        "pipelined program (interp, {} rank{}): {:.3} s",
        p.ranks,
        if p.ranks == 1 { "" } else { "s" },
        t.elapsed().as_secs_f64()
    )
    .map_err(io)?;
    let (mut got, tol) = match backend {
        Backend::Interp => (piped.clone(), 0.0),
        Backend::Cpu => {
            let t = Instant::now();
            let jit = l.jit(codegen)?;
            let mut x = HostBuffer::from_tensor(&inputs);
            let mut params = jit.program.params(&source)?;
            let mut y = jit.program.output_buffer();
            jit.program.run(&mut x, &mut params, &mut y)?;
            writeln!(
                err,
                "pipelined program (cpu, compile and run): {:.3} s",
                t.elapsed().as_secs_f64()
            )
            .map_err(io)?;
            let exact = codegen.exact;
            (y.to_tensor(), if exact { 0.0 } else { tolerance(dtype) })
        }
        Backend::Cuda => {
            // The executable draws the same inputs and parameters from the seed.
            let (dir, exe) = l.cuda_executable(codegen, err)?;
            let file = dir.path().join("output.safetensors");
            let mut flags: Vec<std::ffi::OsString> = vec![
                "--seed".into(),
                seed.to_string().into(),
                "--output".into(),
                file.clone().into(),
            ];
            if let Some(p) = params {
                flags.extend(["--params".into(), p.clone().into_os_string()]);
            }
            let mut said = Vec::new();
            let code = run_executable(&exe, &flags, &mut said, err)?;
            if code != 0 {
                return Ok(code);
            }
            let y = ppc_runtime::safetensors::read_tensor(&file, ppc_runtime::exec::OUTPUT_TENSOR)
                .map_err(|e| Failure(format!("error: reading the GPU's result: {e}\n")))?;
            (y.to_tensor(), tolerance(dtype))
        }
    };
    perturbed(&mut got, perturb)?;
    let (vs_seq, vs_interp) = (compare(&want, &got), compare(&piped, &got));
    // Where the result is furthest from the sequential model, as an index into the output.
    let worst = vs_seq.worst.map(|i| {
        let at = ppc_runtime::tensor::unflatten(i, &want.shape);
        serde_json::json!({ "index": at, "want": want.data[i], "got": got.data[i] })
    });
    let ok = if tol == 0.0 {
        vs_seq.bit_exact && vs_interp.bit_exact
    } else {
        vs_seq.max_rel <= tol && vs_interp.max_rel <= tol
    };
    let mut json = serde_json::json!({
        "backend": backend.name(),
        "dtype": dtype.name(),
        "poison_bubbles": pass.poison_bubbles, "seed": seed,
        "max_abs_diff": vs_seq.max_abs, "max_rel_diff": vs_seq.max_rel,
        "max_rel_diff_vs_interp_pipeline": vs_interp.max_rel,
        "tolerance": tol, "bit_exact": vs_seq.bit_exact, "ok": ok, "worst": worst,
    });
    report::with_settings(
        &mut json,
        &p,
        &[
            Setting::Stages,
            Setting::Microbatches,
            Setting::Repeats,
            Setting::Layers,
        ],
    );
    writeln!(out, "{json}").map_err(io)?;
    Ok(if ok { 0 } else { 1 })
}

/// `--perturb N` (testing verify itself): element `N` of the result under test plus one.
fn perturbed(got: &mut Tensor, at: Option<usize>) -> Result<(), Failure> {
    let Some(i) = at else { return Ok(()) };
    let n = got.data.len();
    let v = got.data.get_mut(i).ok_or_else(|| {
        Failure(format!(
            "error: --perturb {i}: the result has {n} elements\n"
        ))
    })?;
    *v += 1.0;
    Ok(())
}

/// `ppc verify --grad`: the training step's gradients, pipelined against sequential (interp)
/// or compiled against interpreted (cpu).
fn verify_grad(
    model: &ModelArgs,
    check: &Check,
    pass: &PassArgs,
    codegen: &CodegenArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, Failure> {
    let mut l = load(model)?;
    if check.backend == Backend::Cpu {
        one_process(&l, "ppc verify --grad --backend cpu")?;
    }
    let opts = pass.options(true);
    l.compile(&opts, None, None)?;
    let (m, seed) = (&l.module, check.seed);
    let source = param_source(m, seed, check.params.as_deref())?;
    let inputs = ppc_dialect::interp::synthetic_inputs(m, seed);
    // Each check gives (what, reference, result) triples, the reference first.
    let (mut pairs, tol): (Vec<(String, Tensor, Tensor)>, f64) = match check.backend {
        Backend::Cuda => return Err(Failure("error: `ppc verify --grad --backend cuda` is not built yet: training executables compiled with --target cuda run the step on the GPU, and scripts/gpu-check.sh compares their losses with the CPU's\n".into())),
        Backend::Interp => {
            let d = ppc_dialect::grad::synthetic_cotangent(m, seed);
            let mut interp = Interp::with_params(m, seed, source.clone());
            let want = interp.sequential_vjp(&inputs, &d)?;
            let got = ppc_dialect::grad::pipeline_vjp_on_ranks(m, seed, &source, &inputs, &d)?;
            (grad_pairs(&want, &got), 0.0)
        }
        Backend::Cpu => {
            let targets = ppc_dialect::interp::synthetic_targets(m, seed);
            let want =
                Interp::with_params(m, seed, source.clone()).train_step(&inputs, &targets)?;
            // LLVM's O1/O2 pipeline spends ~45 s on a training step (IndVarSimplify after
            // unrolling its many small loops), and this check is about meaning: no LLVM passes.
            let jit =
                backend::jit(m, &l.source(), codegen.numerics(), 0).map_err(|d| l.fail(&d))?;
            let mut params = jit.program.params(&source)?;
            let (x, t) = (
                HostBuffer::from_tensor(&inputs),
                HostBuffer::from_tensor(&targets),
            );
            let got = ppc_runtime::train::step(&jit.program, x, t, &mut params)?;
            let names = jit.program.specs().into_iter().map(|s| s.name);
            let mut pairs = vec![(
                "loss".to_string(),
                Tensor::scalar(ppc_dialect::DType::F32, want.loss),
                Tensor::scalar(ppc_dialect::DType::F32, got.loss),
            )];
            for (name, g) in names.zip(got.grads) {
                let (_, layers) = want
                    .grads
                    .params
                    .iter()
                    .find(|(n, _)| *n == name)
                    .ok_or_else(|| Failure(format!("error: no gradient of `{name}`\n")))?;
                let w: Vec<f32> = layers.iter().flat_map(|t| t.data.iter().copied()).collect();
                pairs.push((
                    format!("gradient of {name}"),
                    Tensor::new(g.dtype, g.shape.clone(), w),
                    g,
                ));
            }
            let tol = if codegen.exact {
                0.0
            } else {
                tolerance(m.input.dtype)
            };
            (pairs, tol)
        }
    };
    // Testing: the first result compared (the outputs, or the loss) made wrong.
    perturbed(&mut pairs[0].2, check.perturb)?;
    let mut ok = true;
    let mut worst: Option<(String, f64)> = None;
    for (what, want, got) in &pairs {
        let c = compare(want, got);
        let good = if tol == 0.0 {
            c.bit_exact
        } else {
            c.max_rel <= tol
        };
        ok &= good;
        if worst.as_ref().is_none_or(|(_, r)| c.max_rel > *r) {
            worst = Some((what.clone(), c.max_rel));
        }
        if !good {
            writeln!(err, "{what}: differs (normwise {:e})", c.max_rel).map_err(io)?;
        }
    }
    let p = m.pipeline;
    let (worst_what, worst_rel) = worst.unwrap_or_default();
    let mut json = serde_json::json!({
        "backend": check.backend.name(),
        "grad": true, "dtype": m.input.dtype.name(),
        "poison_bubbles": pass.poison_bubbles, "seed": seed, "compared": pairs.len(),
        "max_rel_diff": worst_rel, "worst": worst_what, "tolerance": tol, "ok": ok,
    });
    report::with_settings(
        &mut json,
        &p,
        &[
            Setting::Stages,
            Setting::Microbatches,
            Setting::Repeats,
            Setting::Layers,
            Setting::Ranks,
        ],
    );
    writeln!(out, "{json}").map_err(io)?;
    Ok(if ok { 0 } else { 1 })
}

/// The outputs', input gradients' and every layer's parameter gradients' (reference, result).
fn grad_pairs(
    want: &ppc_dialect::grad::Grads,
    got: &ppc_dialect::grad::Grads,
) -> Vec<(String, Tensor, Tensor)> {
    let mut pairs = vec![
        (
            "outputs".to_string(),
            want.outputs.clone(),
            got.outputs.clone(),
        ),
        (
            "input gradient".to_string(),
            want.inputs.clone(),
            got.inputs.clone(),
        ),
    ];
    for ((name, w), (_, g)) in want.params.iter().zip(&got.params) {
        for (l, (w, g)) in w.iter().zip(g).enumerate() {
            pairs.push((
                format!("gradient of {name} in layer {l}"),
                w.clone(),
                g.clone(),
            ));
        }
    }
    pairs
}

fn shape_of(t: &Tensor) -> String {
    format!("{}{:?}", t.dtype, t.shape)
}
