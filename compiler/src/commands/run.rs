//! `ppc run`.

use super::loaded::*;
use crate::cli::{Backend, CodegenArgs, ModelArgs};
use crate::passes::Options;
use anyhow::bail;
use ppc_dialect::interp::{param_source, param_specs, Interp};
use ppc_runtime::exec::{drive, write_summary, OUTPUT_TENSOR};
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::run_options::RunOptions;
use std::io::Write;
use std::time::Instant;

/// `ppc run`: the forward pass in the interpreter, the JIT or a scratch CUDA executable.
pub fn run_command(
    model: ModelArgs,
    backend: Backend,
    args: RunOptions,
    codegen: CodegenArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<i32> {
    let model = with_model_of(model, args.params.file.as_deref(), err)?;
    match backend {
        Backend::Interp => run_interp(&load(&model)?, &args, out, err)?,
        Backend::Cuda => {
            let mut l = load(&model)?;
            one_process(&l, "ppc run")?;
            l.compile(&Options::default(), None, None)?;
            let (_dir, exe) = l.cuda_executable(&codegen, err)?;
            return run_executable(&exe, &args.to_args(), out, err);
        }
        Backend::Cpu => {
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
            )?;
            let opts = RunOptions {
                backend: "cpu JIT".into(),
                ..args
            };
            drive(&jit.program, &opts, out, err)?;
        }
    }
    Ok(0)
}

/// `ppc run --backend interp`: the model as written, each microbatch through every layer.
fn run_interp(
    l: &Loaded,
    args: &RunOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    if args.bench.is_some() || args.trace.is_some() {
        bail!("--bench and --trace need the cpu backend");
    }
    let p = l.module.pipeline;
    let source = param_source(&l.module, args.seed, args.params.file.as_deref())?;
    if let Some(path) = &args.dump_params {
        let dims: Vec<(String, u64)> = (l.module.dims.iter())
            .map(|d| (d.name.clone(), d.value))
            .collect();
        let pipeline = [p.stages, p.microbatches, p.repeats, p.layers];
        let metadata = ppc_runtime::params::model_metadata(&dims, pipeline);
        ppc_runtime::params::dump(&source, &param_specs(&l.module), path, &metadata)?;
        writeln!(err, "wrote {}", path.display())?;
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
            writeln!(err, "step {}/{steps}", step + 1)?;
        }
        result = Some(interp.sequential(&inputs)?);
    }
    let secs = start.elapsed().as_secs_f64() / f64::from(steps);
    let y = result.expect("invariant: at least one step ran");
    let step = format!("{secs:.4} s (interp, sequential, {})", args.origin());
    write_summary(
        out,
        &l.path,
        [p.stages, p.microbatches, p.repeats, p.layers],
        &shape_of(&inputs),
        &y,
        &step,
    )?;
    if let Some(path) = &args.output {
        ppc_runtime::safetensors::write(path, &[(OUTPUT_TENSOR, &HostBuffer::from_tensor(&y))])?;
        writeln!(err, "wrote {}", path.display())?;
    }
    Ok(())
}
