//! `ppc_main`: the entry point of executables written by `ppc compile -o`. The generated object
//! defines `main` (which calls `ppc_main`), `ppc_manifest` (the embedded manifest text) and the
//! packed entries `_mlir__mlir_ciface_ppc_forward`, `_mlir__mlir_ciface_ppc_evaluate` and a CUDA
//! training step's optimizer entries, `_mlir__mlir_ciface_ppc_update_{adamw,sgd}` and
//! `_mlir__mlir_ciface_ppc_grad_squares`.
//!
//! Every executable is an MPI program: `./model` is one rank, `mpirun.mpich -n R ./model` is R.
//! A program compiled with `--ranks R` must be launched on exactly R ranks; any error on any rank
//! ends the whole job (`MPI_Abort`) with a message and a non-zero exit, so nothing waits forever
//! for a rank that is gone. Errors are shown with their causes ([`Chain`]).
#![deny(unsafe_op_in_unsafe_fn)]

mod mpi_transport;

use clap::{CommandFactory, FromArgMatches, Parser};
use mpi::traits::Communicator;
use ppc_runtime::comm;
use ppc_runtime::error::Chain;
use ppc_runtime::exec::{drive, PackedFn, Program};
use ppc_runtime::manifest::Manifest;
use ppc_runtime::optim::Config;
use ppc_runtime::run_options::{optimizer_args, optimizer_settings, RunOptions, TrainOptions};
use ppc_runtime::train::train;
use std::ffi::{c_char, c_int, CStr};

extern "C" {
    fn ppc_manifest() -> *const c_char;
    fn _mlir__mlir_ciface_ppc_forward(args: *mut *mut std::ffi::c_void);
    fn _mlir__mlir_ciface_ppc_evaluate(args: *mut *mut std::ffi::c_void);
    fn _mlir__mlir_ciface_ppc_update_adamw(args: *mut *mut std::ffi::c_void);
    fn _mlir__mlir_ciface_ppc_update_sgd(args: *mut *mut std::ffi::c_void);
    fn _mlir__mlir_ciface_ppc_grad_squares(args: *mut *mut std::ffi::c_void);
}

/// A forward executable's command line: the run options `ppc run` takes too.
#[derive(Parser)]
#[command(
    about = "Runs the pipeline-parallel forward pass that ppc compiled into this executable, on as \
             many MPI ranks as it was compiled for (`ppc compile --ranks`; one by default). Rank 0 \
             reads the input; the last rank prints the summary and writes the output.",
    after_help = "Every rank checks at start that its CPU has the instruction-set features the code was \
                  compiled for (ppc compile --target-cpu) and ends the job with the names of the missing \
                  ones otherwise.\n\n\
                  Environment: PPC_NUM_THREADS (threads per rank; default: cores / ranks on this node), \
                  PPC_CPU_DISABLE=avx512f,... (treat these CPU features as absent: the runtime's kernels \
                  take their portable paths and the start-up check applies), PPC_FAULT_RANK=r (testing: \
                  rank r dies at start, to check that the job ends). Results are the same bytes whatever \
                  the thread count, rank count or CPU features (--bench names the GEMM kernels in use)."
)]
struct ForwardCli {
    #[command(flatten)]
    run: RunOptions,
}

/// A training executable's command line; the optimizer's settings are added from its table.
#[derive(Parser)]
#[command(
    about = "Trains the model that ppc compiled into this executable (`ppc compile --train`): each \
             step runs the pipeline forward over every microbatch, the model's loss, the pipeline \
             backward, and the optimizer on every parameter. Prints the loss per step with a \
             progress bar and ETA on a terminal, one line per step otherwise."
)]
struct TrainCli {
    #[command(flatten)]
    train: TrainOptions,
}

/// What the executable was asked to do.
enum Job {
    Forward(RunOptions),
    Train(TrainOptions),
}

/// The training options: the model file's `train` settings, then the command line's.
fn parse_train_args(
    args: &[String],
    prog: &str,
    model: &[(String, String)],
) -> Result<TrainOptions, (String, c_int)> {
    let cli = TrainCli::command().args(optimizer_args()).bin_name(prog);
    let matches = cli.try_get_matches_from(args).map_err(clap_exit)?;
    let mut o = TrainCli::from_arg_matches(&matches)
        .map_err(clap_exit)?
        .train;
    // A resumed run goes on with the checkpoint's settings, then the command line's.
    let mut settings = model.to_vec();
    if let Some(ckpt) = &o.resume {
        settings.extend(ppc_runtime::checkpoint::optimizer_settings(ckpt));
    }
    settings.extend(optimizer_settings(&matches));
    o.optimizer =
        Config::from_settings(&settings).map_err(|e| (format!("{prog}: error: {e}"), 2))?;
    Ok(o)
}

/// What clap says (help, or an error with usage) and the exit status that goes with it.
fn clap_exit(e: clap::Error) -> (String, c_int) {
    let code = if e.use_stderr() { 2 } else { 0 };
    (e.render().to_string(), code)
}

/// The forward run's options; `Err` holds what clap prints (help, or an error with usage) and
/// the exit status.
fn parse_args(args: &[String], prog: &str) -> Result<RunOptions, (String, c_int)> {
    let cli = ForwardCli::command().bin_name(prog);
    let matches = cli.try_get_matches_from(args).map_err(clap_exit)?;
    let mut o = ForwardCli::from_arg_matches(&matches)
        .map_err(clap_exit)?
        .run;
    o.backend = "cpu executable".into();
    Ok(o)
}

/// # Safety
/// Called once by the generated `main` with the process's `argc` and `argv`.
#[no_mangle]
pub unsafe extern "C" fn ppc_main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    ppc_runtime::heap::keep_freed_memory();
    let args: Vec<String> = std::env::args().collect();
    let prog = args.first().cloned().unwrap_or_else(|| "model".into());
    // SAFETY: the generated object defines `ppc_manifest` returning a NUL-terminated static string.
    let text = unsafe { CStr::from_ptr(ppc_manifest()) }
        .to_string_lossy()
        .into_owned();
    let manifest = match Manifest::parse(&text) {
        Ok(m) => m,
        Err(e) => {
            say(&format!(
                "{prog}: error: corrupt embedded manifest: {}",
                Chain(&e)
            ));
            return 1;
        }
    };
    let parsed = if manifest.trains() {
        parse_train_args(&args, &prog, &manifest.train).map(Job::Train)
    } else {
        parse_args(&args, &prog).map(Job::Forward)
    };
    let job = match parsed {
        Ok(j) => j,
        Err((text, 0)) => {
            println!("{}", text.trim_end());
            return 0;
        }
        Err((text, code)) => {
            say(text.trim_end());
            return code;
        }
    };
    // The pool's (OpenMP's) threads exist beside MPI, but only this thread calls it: "funneled".
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        say(&format!("{prog}: error: MPI is already initialized"));
        return 1;
    };
    let world = universe.world();
    let world_size = world.size() as usize;
    // Pipelines side by side only when the job has the compiled number of processes (`run`
    // says what is wrong otherwise).
    let replicas = manifest.replicas as usize;
    let fits = world_size == manifest.ranks as usize * replicas;
    let transport = mpi_transport::Mpi::new(world, if fits { replicas } else { 1 });
    comm::install(Box::new(transport));
    let code = run(&prog, manifest, &job, world_size);
    drop(universe); // MPI_Finalize
    code
}

/// The run on this rank, after MPI is up; errors on a job of several ranks abort it, except
/// those every rank meets at the same point (a diverged loss), after which each rank ends.
fn run(prog: &str, manifest: Manifest, job: &Job, world_size: usize) -> c_int {
    let t = comm::transport().expect("invariant: installed by ppc_main");
    let (rank, size) = (t.rank(), world_size);
    let who = match (size > 1, manifest.replicas > 1) {
        (_, true) => format!("{prog} (rank {rank} of replica {})", t.replica()),
        (true, false) => format!("{prog} (rank {rank} of {size})"),
        (false, false) => prog.to_string(),
    };
    if let Some(Err(e)) = manifest.target.as_ref().map(ppc_runtime::cpu::check) {
        // Before any generated code runs: it may hold instructions this CPU would trap on.
        say(&format!("{who}: error: {e}"));
        if size > 1 {
            abort_job(t);
        }
        return 1;
    }
    if (manifest.ranks * manifest.replicas) as usize != size {
        let (r, d) = (manifest.ranks, manifest.replicas);
        let n = r * d;
        let compiled = if d == 1 {
            format!(
                "{r} rank{} (ppc compile --ranks {r})",
                if r == 1 { "" } else { "s" }
            )
        } else {
            format!(
                "{d} replicas of {r} rank{} ({n} processes)",
                if r == 1 { "" } else { "s" }
            )
        };
        say(&format!(
            "{who}: error: compiled for {compiled} but launched on {size}; run it as `mpirun.mpich -n {n} {prog}`"
        ));
        if size > 1 {
            t.barrier(); // every rank has said it
            abort_job(t);
        }
        return 1;
    }
    if let Some(arch) = &manifest.gpu {
        // One GPU per rank: the launcher says which of the node's ranks this one is.
        let local = ppc_runtime::cuda::local_rank(|name| std::env::var(name).ok(), rank);
        match ppc_runtime::cuda::init(local, Some(arch)) {
            Ok(gpu) => {
                say(&format!("{who}: {gpu}"));
                ppc_runtime::cuda::abi::name_modules(manifest.kernels.clone());
            }
            Err(e) => {
                say(&format!("{who}: error: {e} (kernels compiled for {arch})"));
                if size > 1 {
                    abort_job(t);
                }
                return 1;
            }
        }
    }
    if std::env::var("PPC_FAULT_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        == Some(rank)
    {
        // Die while the other ranks already wait for this one in their first exchange.
        say(&format!("{who}: dying on purpose (PPC_FAULT_RANK={rank})"));
        std::thread::sleep(std::time::Duration::from_millis(300));
        std::process::abort();
    }
    if size > 1 && std::env::var_os("PPC_NUM_THREADS").is_none() {
        // Ranks on one node share its cores; MPICH's launcher says how many ranks are local.
        let local = std::env::var("MPI_LOCALNRANKS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(size);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ppc_runtime::pool::set_threads(cores / local.max(1));
    }
    let (entry, evaluate): (PackedFn, PackedFn) = (
        _mlir__mlir_ciface_ppc_forward,
        _mlir__mlir_ciface_ppc_evaluate,
    );
    let (adamw, sgd, squares): (PackedFn, PackedFn, PackedFn) = (
        _mlir__mlir_ciface_ppc_update_adamw,
        _mlir__mlir_ciface_ppc_update_sgd,
        _mlir__mlir_ciface_ppc_grad_squares,
    );
    // SAFETY: the object that defines the entries was compiled together with this manifest.
    let program = unsafe {
        Program::new(manifest, entry)
            .with_evaluate(evaluate)
            .with_update(adamw, sgd, squares)
    };
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut together = false;
    let done: Result<(), Box<dyn std::error::Error>> = match job {
        Job::Forward(opts) => {
            let mut opts = opts.clone();
            if program.manifest.gpu.is_some() {
                opts.backend = "cuda executable".into();
            }
            drive(&program, &opts, &mut out, &mut err)
                .map(|_| ())
                .map_err(Into::into)
        }
        Job::Train(opts) => train(&program, opts, &mut out, &mut err)
            .map(|_| ())
            .map_err(|e| {
                together = e.met_by_every_rank();
                e.into()
            }),
    };
    if let Some(table) = ppc_runtime::cuda::profile::report(30) {
        say(&format!("{who}: {table}"));
    }
    match done {
        Ok(()) => 0,
        Err(e) => {
            say(&format!("{who}: error: {}", Chain(e.as_ref())));
            // An error every rank met at once ends each rank in order, with its message.
            if size > 1 && !together {
                abort_job(t);
            }
            1
        }
    }
}

/// Ends every rank of the job with exit status 1. The pause lets the launcher forward the
/// message this rank just wrote: `MPI_Abort` tears the job down at once, and its output with it.
fn abort_job(t: &dyn comm::Transport) -> ! {
    std::thread::sleep(std::time::Duration::from_millis(200));
    t.abort(1)
}

/// One line on stderr in a single write, so that lines of different ranks do not interleave.
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}
