//! A model file loaded and checked, and how a command fails: what every command shares.

use crate::backend::{self, Source};
use crate::cli::{CodegenArgs, ModelArgs};
use crate::passes::Options;
use crate::pipeline::{checked, compile, frontend, PipelineError};
use ppc_dialect::diag::render;
use ppc_dialect::span::Span;
use ppc_dialect::{Diagnostic, Module};
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

pub(super) fn io(e: std::io::Error) -> Failure {
    Failure(format!("error: {e}\n"))
}

/// A model file, loaded and checked.
pub(super) struct Loaded {
    pub(super) path: String,
    pub(super) text: String,
    pub(super) module: Module,
}

pub(super) fn load(args: &ModelArgs) -> Result<Loaded, Failure> {
    load_with(args, frontend)
}

/// A model file, checked and kept as written: calls not inlined (`ppc fmt`).
pub(super) fn load_as_written(args: &ModelArgs) -> Result<Loaded, Failure> {
    load_with(args, checked)
}

fn load_with(
    args: &ModelArgs,
    read: fn(&str, &ppc_dialect::Overrides) -> Result<Module, ppc_dialect::Diagnostics>,
) -> Result<Loaded, Failure> {
    let path = args.file.display().to_string();
    let bytes = std::fs::read(&args.file)
        .map_err(|e| Failure(format!("error: cannot read {path}: {e}\n")))?;
    let text = String::from_utf8(bytes).map_err(|e| not_utf8(&path, &e))?;
    match read(&text, &args.overrides()) {
        Ok(module) => Ok(Loaded { path, text, module }),
        Err(d) => Err(Failure(render(&path, &text, &d))),
    }
}

/// A model file that is not UTF-8: the line and column of the first bad byte.
pub(super) fn not_utf8(path: &str, e: &std::string::FromUtf8Error) -> Failure {
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
    pub(super) fn fail(&self, d: &[Diagnostic]) -> Failure {
        Failure(render(&self.path, &self.text, d))
    }

    pub(super) fn source(&self) -> Source<'_> {
        Source {
            file: &self.path,
            text: &self.text,
        }
    }

    pub(super) fn compile(
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
    pub(super) fn cuda_executable(
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

    pub(super) fn jit(&self, codegen: &CodegenArgs) -> Result<crate::lower::mlir::Jit, Failure> {
        backend::jit(
            &self.module,
            &self.source(),
            codegen.numerics(),
            codegen.opt_level.into(),
        )
        .map_err(|d| self.fail(&d))
    }
}

/// The JIT runs the program in this one process; a program split over ranks needs MPI.
pub(super) fn one_process(l: &Loaded, what: &str) -> Result<(), Failure> {
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
pub(super) fn cuda_codegen(codegen: &CodegenArgs) -> Result<(), Failure> {
    if codegen.exact {
        return Err(Failure(
            "error: --exact is the CPU's bit-exact mode; --target cuda computes with CUDA's own math (within the dtype's tolerance)\n".into(),
        ));
    }
    Ok(())
}

/// Runs a scratch executable with `flags`, passing on what it prints; its exit status.
pub(super) fn run_executable(
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

pub(super) fn shape_of(t: &Tensor) -> String {
    format!("{}{:?}", t.dtype, t.shape)
}
