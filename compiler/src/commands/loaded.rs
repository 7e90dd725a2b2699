//! A model file loaded and checked, and how a command fails: what every command shares.
//!
//! Commands return `anyhow::Result`: a library's typed error (with `.context(...)` where the
//! command knows more, such as which file), or a message of the command's own (`bail!`).
//! Diagnostics come already rendered with file:line:col ([`Rendered`]), and a pass that breaks
//! the IR is an [`InvalidIr`]. [`shown`] is the text a failed command prints.

use crate::backend::{self, Source};
use crate::cli::{CodegenArgs, ModelArgs};
use crate::passes::Options;
use crate::pipeline::{checked, compile, frontend, PipelineError};
use anyhow::{bail, Context};
use ppc_dialect::diag::render;
use ppc_dialect::span::Span;
use ppc_dialect::{Diagnostic, Module};
use ppc_runtime::Tensor;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Diagnostics rendered with file, line and column (by [`render`]): shown as they are.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Rendered(pub String);

/// A pass produced IR the verifier rejects: a compiler bug, shown after the verifier's
/// diagnostics.
#[derive(Debug, thiserror::Error)]
#[error(
    "internal compiler error: `{pass}` produced invalid IR; please report this with the model file"
)]
pub struct InvalidIr {
    pub pass: &'static str,
    pub diagnostics: Rendered,
}

/// The text a failed command prints: rendered diagnostics as they are, anything else as
/// `error: ` and the error with its causes, on one line of its own.
pub fn shown(e: &anyhow::Error) -> String {
    if let Some(r) = e.downcast_ref::<Rendered>() {
        return r.0.clone();
    }
    if let Some(ice) = e.downcast_ref::<InvalidIr>() {
        return format!("{}error: {ice}\n", ice.diagnostics);
    }
    format!("error: {e:#}\n")
}

/// A model file, loaded and checked.
pub(super) struct Loaded {
    pub(super) path: String,
    pub(super) text: String,
    pub(super) module: Module,
}

pub(super) fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    load_with(args, frontend)
}

/// `args` with the dimensions and depth a parameter file or checkpoint records of its model
/// (`ppc.dims`, `ppc.pipeline`'s `layers`) where the command line gives none and they differ
/// from the model file's, said on `err`: `ppc sample --params ckpt` needs no `--dim` repeated.
pub(super) fn with_model_of(
    mut args: ModelArgs,
    params: Option<&std::path::Path>,
    err: &mut dyn std::io::Write,
) -> anyhow::Result<ModelArgs> {
    let Some(path) = params else { return Ok(args) };
    let meta = ppc_runtime::safetensors::read_metadata(path).unwrap_or_default();
    let recorded = |key: &str| {
        (meta.iter().find(|(k, _)| k == key))
            .map_or(Vec::new(), |(_, v)| ppc_runtime::safetensors::pairs(v))
    };
    let module = load(&args)?.module;
    let mut taken = Vec::new();
    for (name, value) in recorded("ppc.dims") {
        let (Ok(value), Some(ours)) = (value.parse::<u64>(), module.dim(&name)) else {
            continue;
        };
        if value != ours && !args.dims.iter().any(|(n, _)| *n == name) {
            taken.push(format!("--dim {name}={value}"));
            args.dims.push((name, value));
        }
    }
    let layers = recorded("ppc.pipeline")
        .into_iter()
        .find(|(k, _)| k == "layers");
    if let Some(Ok(layers)) = layers.map(|(_, v)| v.parse::<u64>()) {
        let given = args.layers.is_some() || args.layers_per_stage.is_some();
        if !given && layers != module.pipeline.layers {
            taken.push(format!("--layers {layers}"));
            args.layers = Some(layers);
        }
    }
    if !taken.is_empty() {
        writeln!(
            err,
            "{} was made with {}: using them",
            path.display(),
            taken.join(" ")
        )?;
    }
    Ok(args)
}

/// A model file, checked and kept as written: calls not inlined (`ppc fmt`).
pub(super) fn load_as_written(args: &ModelArgs) -> anyhow::Result<Loaded> {
    load_with(args, checked)
}

fn load_with(
    args: &ModelArgs,
    read: fn(&str, &ppc_dialect::Overrides) -> Result<Module, ppc_dialect::Diagnostics>,
) -> anyhow::Result<Loaded> {
    let path = args.file.display().to_string();
    let bytes = std::fs::read(&args.file).with_context(|| format!("cannot read {path}"))?;
    let text = String::from_utf8(bytes).map_err(|e| not_utf8(&path, &e))?;
    match read(&text, &args.overrides()) {
        Ok(module) => Ok(Loaded { path, text, module }),
        Err(d) => Err(Rendered(render(&path, &text, &d)).into()),
    }
}

/// A model file that is not UTF-8: the line and column of the first bad byte.
pub(super) fn not_utf8(path: &str, e: &std::string::FromUtf8Error) -> Rendered {
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
    Rendered(render(path, &text, &[d]))
}

impl Loaded {
    pub(super) fn fail(&self, d: &[Diagnostic]) -> Rendered {
        Rendered(render(&self.path, &self.text, d))
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
    ) -> anyhow::Result<()> {
        compile(&mut self.module, opts, until, dump).map_err(|e| match e {
            PipelineError::Pass(_, d) => self.fail(&d).into(),
            PipelineError::Invalid(pass, d) => InvalidIr {
                pass,
                diagnostics: self.fail(&d),
            }
            .into(),
            PipelineError::Io(path, e) => {
                anyhow::Error::new(e).context(format!("cannot write {path}"))
            }
        })
    }

    /// The compiled module as a `--target cuda` executable for sm_90, in a scratch directory
    /// (removed when the returned guard drops).
    pub(super) fn cuda_executable(
        &self,
        codegen: &CodegenArgs,
        err: &mut dyn Write,
    ) -> anyhow::Result<(backend::TempDir, std::path::PathBuf)> {
        cuda_codegen(codegen)?;
        let t = Instant::now();
        let dir = backend::TempDir::new().map_err(|d| self.fail(&d))?;
        let exe = dir.path().join("model");
        let target = crate::target::resolve("native")?;
        let gpu = backend::Gpu {
            arch: "sm_90".into(),
            kernels_on_cpu: false,
        };
        let how = backend::Codegen {
            numerics: codegen.numerics(),
            target: &target,
            gpu: Some(&gpu),
            opt_level: codegen.opt_level.into(),
            partitions: codegen.codegen_partitions.into(),
        };
        backend::executable(&self.module, &self.source(), &how, 1, &exe)
            .map_err(|d| self.fail(&d))?;
        writeln!(
            err,
            "compiled {} for cuda in {:.2} s",
            self.path,
            t.elapsed().as_secs_f64()
        )?;
        Ok((dir, exe))
    }

    pub(super) fn jit(&self, codegen: &CodegenArgs) -> Result<crate::lower::mlir::Jit, Rendered> {
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
pub(super) fn one_process(l: &Loaded, what: &str) -> anyhow::Result<()> {
    let r = l.module.pipeline.ranks;
    if r == 1 {
        return Ok(());
    }
    bail!(
        "`{what}` runs the program in one process, but it is split over {r} ranks\n  \
         = build an executable and launch it with MPI: \
         `ppc compile {} --ranks {r} -o model && mpirun.mpich -n {r} ./model`",
        l.path
    )
}

/// Refuses what the CUDA backend does not do.
pub(super) fn cuda_codegen(codegen: &CodegenArgs) -> anyhow::Result<()> {
    if codegen.exact {
        bail!("--exact is the CPU's bit-exact mode; --target cuda computes with CUDA's own math (within the dtype's tolerance)");
    }
    Ok(())
}

/// Runs a scratch executable with `flags`, passing on what it prints; its exit status.
pub(super) fn run_executable(
    exe: &Path,
    flags: &[std::ffi::OsString],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<i32> {
    let o = std::process::Command::new(exe)
        .args(flags)
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    out.write_all(&o.stdout)?;
    err.write_all(&o.stderr)?;
    Ok(o.status.code().unwrap_or(1))
}

pub(super) fn shape_of(t: &Tensor) -> String {
    format!("{}{:?}", t.dtype, t.shape)
}
