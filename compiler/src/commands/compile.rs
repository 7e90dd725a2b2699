//! `ppc compile`.

use super::loaded::*;
use crate::backend::{self};
use crate::cli::{CompileArgs, Device, ModelArgs, PassArgs, ReportFormat};
use crate::passes::{Options, Remat};
use crate::report::report;
use crate::timetable::Kind;
use anyhow::bail;
use ppc_dialect::{print, Module};
use std::io::Write;
use std::time::Instant;

/// `ppc compile`: the IR after a pass, the lowered module (`--emit`), a report or an executable.
pub fn compile_command(
    a: CompileArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let CompileArgs {
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
    } = a;
    let gpu = (device == Device::Cuda).then(|| backend::Gpu {
        arch: gpu_arch.clone(),
        kernels_on_cpu: false,
    });
    if gpu.is_some() {
        cuda_codegen(&codegen)?;
        if emit.as_deref() == Some("asm") {
            bail!("--emit=asm shows the CPU program; with --target cuda, --emit=mlir shows the program, --emit=llvm the host's LLVM dialect and --emit=ptx its kernels");
        }
    }
    if gpu.is_none() && emit.as_deref() == Some("ptx") {
        bail!("--emit=ptx prints the GPU kernels: add --target cuda");
    }
    if pass.remat != Remat::Stage && !train {
        bail!("--remat chooses what the training step's backward recomputes: add --train");
    }
    let timer = time_passes.then(crate::timing::start);
    let mut l = crate::timing::phase("parse and check", || load(&model))?;
    let opts = pass.options(train, &l.module);
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
            bail!("--replicas runs pipelines side by side for training: add --train");
        }
        let src = l.source();
        let how = backend::Codegen {
            numerics,
            target: &target,
            gpu: gpu.as_ref(),
            opt_level: opt,
            partitions: codegen.codegen_partitions.into(),
        };
        backend::executable(&l.module, &src, &how, replicas, path).map_err(|d| l.fail(&d))?;
        writeln!(
            err,
            "wrote {} in {:.2} s",
            path.display(),
            t.elapsed().as_secs_f64()
        )?;
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
        (None, Some("mlir")) => backend::emit_mlir(&l.module, &l.source(), numerics, gpu.as_ref())
            .map_err(|d| l.fail(&d))?,
        (None, Some("ptx")) => {
            let g = gpu.as_ref().expect("checked above: --emit=ptx needs a GPU");
            backend::emit_ptx(&l.module, &l.source(), numerics, g).map_err(|d| l.fail(&d))?
        }
        (None, Some("llvm")) => backend::emit_llvm(&l.module, &l.source(), numerics, gpu.as_ref())
            .map_err(|d| l.fail(&d))?,
        (None, Some("asm")) => {
            let opt = codegen.opt_level.into();
            backend::emit_asm(&l.module, &l.source(), numerics, &target, opt)
                .map_err(|d| l.fail(&d))?
        }
        (None, _) if output.is_none() => print(&l.module),
        (None, _) => String::new(),
    };
    out.write_all(text.as_bytes())?;
    if let Some(t) = timer {
        err.write_all(crate::timing::table(&t.finish()).as_bytes())?;
    }
    Ok(())
}

/// What the training step keeps for its backward under each `--remat`, from the program each
/// generates (`compiled` is the one for `pass.remat`).
fn kept_by_remat(
    model: &ModelArgs,
    pass: &PassArgs,
    compiled: &Module,
) -> anyhow::Result<serde_json::Value> {
    let mut by = serde_json::Map::new();
    // `tick` exists for 1F1B's parity order only (not on circular pipelines).
    let one_f_one_b =
        pass.options(true, compiled).schedule == Kind::OneFOneB && compiled.pipeline.repeats == 1;
    let remats = [Remat::Stage, Remat::Tick, Remat::None];
    for remat in remats
        .into_iter()
        .filter(|&r| r != Remat::Tick || one_f_one_b)
    {
        let bytes = if remat == pass.remat {
            crate::report::kept_activation_bytes(compiled)
        } else {
            let mut other = load(model)?;
            let opts = Options {
                remat,
                ..pass.options(true, &other.module)
            };
            other.compile(&opts, None, None)?;
            crate::report::kept_activation_bytes(&other.module)
        };
        by.insert(remat.name().into(), bytes.into());
    }
    Ok(by.into())
}
