//! `ppc verify`: the pipelined or compiled program against the sequential model, and the
//! training step's gradients against the interpreter's.

use super::loaded::*;
use crate::backend::{self};
use crate::cli::{Backend, CodegenArgs, ModelArgs, PassArgs, VerifyArgs};
use crate::compare::{compare, tolerance};
use crate::passes::Remat;
use crate::report::{self};
use anyhow::{anyhow, bail, Context};
use ppc_dialect::interp::{forward_on_ranks, param_source, Interp};
use ppc_dialect::ir::{Pipeline, Setting};
use ppc_runtime::manifest::{Arg, Manifest, Role};
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::Tensor;
use std::io::Write;
use std::time::Instant;

/// `ppc verify`: the pipelined program (interpreted or compiled) against the sequential model,
/// or with `--grad` the training step's gradients.
pub fn verify_command(
    a: VerifyArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<i32> {
    let VerifyArgs {
        model,
        backend,
        seed,
        params,
        perturb,
        pass,
        codegen,
        grad,
    } = a;
    let model = with_model_of(model, params.file.as_deref(), err)?;
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
        bail!("--remat chooses what the backward recomputes: add --grad");
    }
    verify(&model, &check, &pass, &codegen, out, err)
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
) -> anyhow::Result<i32> {
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
    let opts = pass.options(false, &l.module);
    l.compile(&opts, None, None)?;
    let p = l.module.pipeline;
    let dtype = l.module.output_type().dtype;
    let poison = if pass.poison_bubbles {
        ", poisoned bubbles"
    } else {
        ""
    };
    writeln!(
        err,
        "verify: {} stages, {} microbatches, {} repeats, {} layers, {dtype} (seed {seed}{poison})",
        p.stages, p.microbatches, p.repeats, p.layers
    )?;
    let source = param_source(&l.module, seed, params.as_deref())?;
    let mut interp = Interp::with_params(&l.module, seed, source.clone());
    let inputs = interp.synthetic_inputs();
    let t = Instant::now();
    let want = interp.sequential(&inputs)?;
    writeln!(
        err,
        "sequential model (interp): {:.3} s",
        t.elapsed().as_secs_f64()
    )?;
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
    )?;
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
            )?;
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
                .context("reading the GPU's result")?;
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
    let json = serde_json::json!({
        "backend": backend.name(),
        "dtype": dtype.name(),
        "poison_bubbles": pass.poison_bubbles, "seed": seed,
        "max_abs_diff": vs_seq.max_abs, "max_rel_diff": vs_seq.max_rel,
        "max_rel_diff_vs_interp_pipeline": vs_interp.max_rel,
        "tolerance": tol, "bit_exact": vs_seq.bit_exact, "ok": ok, "worst": worst,
    });
    let settings = [
        Setting::Stages,
        Setting::Microbatches,
        Setting::Repeats,
        Setting::Layers,
    ];
    verdict(out, json, &p, &settings, ok)
}

/// Prints a verdict's JSON line with the pipeline settings it was checked at; the exit status
/// is 0 only when the check passed.
fn verdict(
    out: &mut dyn Write,
    mut json: serde_json::Value,
    p: &Pipeline,
    settings: &[Setting],
    ok: bool,
) -> anyhow::Result<i32> {
    report::with_settings(&mut json, p, settings);
    writeln!(out, "{json}")?;
    Ok(if ok { 0 } else { 1 })
}

/// `--perturb N` (testing verify itself): element `N` of the result under test plus one.
fn perturbed(got: &mut Tensor, at: Option<usize>) -> anyhow::Result<()> {
    let Some(i) = at else { return Ok(()) };
    let n = got.data.len();
    let v = got
        .data
        .get_mut(i)
        .ok_or_else(|| anyhow!("--perturb {i}: the result has {n} elements"))?;
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
) -> anyhow::Result<i32> {
    let mut l = load(model)?;
    if check.backend == Backend::Cpu {
        one_process(&l, "ppc verify --grad --backend cpu")?;
    }
    let opts = pass.options(true, &l.module);
    l.compile(&opts, None, None)?;
    let (m, seed) = (&l.module, check.seed);
    let source = param_source(m, seed, check.params.as_deref())?;
    let inputs = ppc_dialect::interp::synthetic_inputs(m, seed);
    let mut pairs: Vec<Pair> = match check.backend {
        Backend::Cuda => bail!("`ppc verify --grad --backend cuda` is not built yet: training executables compiled with --target cuda run the step on the GPU, and scripts/gpu-check.sh compares their losses with the CPU's"),
        Backend::Interp => {
            let d = ppc_dialect::grad::synthetic_cotangent(m, seed);
            let mut interp = Interp::with_params(m, seed, source.clone());
            let want = interp.sequential_vjp(&inputs, &d)?;
            let got = ppc_dialect::grad::pipeline_vjp_on_ranks(m, seed, &source, &inputs, &d)?;
            grad_pairs(&want, &got, tolerance(ppc_dialect::DType::F32))
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
            let manifest = &jit.program.manifest;
            let args = manifest.args.iter().filter(|a| a.role == Role::Param);
            let tol = if codegen.exact {
                0.0
            } else {
                tolerance(m.output_type().dtype)
            };
            let mut pairs = vec![Pair {
                what: "loss".to_string(),
                want: Tensor::scalar(ppc_dialect::DType::F32, f64::from(want.loss)),
                got: Tensor::scalar(ppc_dialect::DType::F32, f64::from(got.loss)),
                tol,
                gradient: false,
            }];
            for (a, g) in args.zip(got.grads) {
                let name = &a.name;
                let w = want
                    .grads
                    .of(name)
                    .ok_or_else(|| anyhow!("no gradient of `{name}`"))?;
                let g = model_layers(g, a, manifest);
                pairs.push(Pair {
                    what: format!("gradient of {name}"),
                    want: Tensor::new(g.dtype, g.shape.clone(), w),
                    got: g,
                    tol,
                    gradient: true,
                });
            }
            pairs
        }
    };
    // Testing: the first result compared (the outputs, or the loss) made wrong.
    perturbed(&mut pairs[0].got, check.perturb)?;
    let grad_scale = gradient_scale(&pairs);
    let mut ok = true;
    let mut worst: Option<(String, f64)> = None;
    for pair in &pairs {
        let c = compare(&pair.want, &pair.got);
        let rel = if pair.gradient && c.max_abs > 0.0 {
            c.max_abs / grad_scale
        } else {
            c.max_rel
        };
        let good = if pair.tol == 0.0 {
            c.bit_exact
        } else {
            rel <= pair.tol
        };
        ok &= good;
        if worst.as_ref().is_none_or(|(_, r)| rel > *r) {
            worst = Some((pair.what.clone(), rel));
        }
        if !good {
            writeln!(err, "{}: differs (normwise {rel:e})", pair.what)?;
        }
    }
    let p = m.pipeline;
    let (worst_what, worst_rel) = worst.unwrap_or_default();
    let max_tol = pairs.iter().map(|p| p.tol).fold(0.0, f64::max);
    let json = serde_json::json!({
        "backend": check.backend.name(),
        "grad": true, "dtype": m.output_type().dtype.name(),
        "poison_bubbles": pass.poison_bubbles, "seed": seed, "compared": pairs.len(),
        "max_rel_diff": worst_rel, "worst": worst_what, "tolerance": max_tol, "ok": ok,
    });
    let settings = [
        Setting::Stages,
        Setting::Microbatches,
        Setting::Repeats,
        Setting::Layers,
        Setting::Ranks,
    ];
    verdict(out, json, &p, &settings, ok)
}

/// A compiled program's gradient of parameter `a`, its stage slots (`[S, k, ...]`, or
/// `[R, S, k, ...]` for a circular pipeline) put in model layer order as `[L, ...]`, the empty
/// slots of uneven depth left out; a parameter held once as it is.
fn model_layers(g: Tensor, a: &Arg, m: &Manifest) -> Tensor {
    if a.layer_axes == 0 {
        return g;
    }
    let inner = &a.shape[a.layer_axes..];
    let n: usize = inner.iter().product();
    let mut by_layer: Vec<(u64, &[f32])> = m
        .layer_ids(a, 0)
        .into_iter()
        .zip(g.data.chunks(n))
        .filter(|(l, _)| *l < m.layers)
        .collect();
    by_layer.sort_by_key(|(l, _)| *l);
    let mut shape = vec![by_layer.len()];
    shape.extend(inner);
    let data = by_layer.into_iter().flat_map(|(_, d)| d.to_vec()).collect();
    Tensor::new(g.dtype, shape, data)
}

/// One comparison of `ppc verify --grad`: a result against its reference.
struct Pair {
    what: String,
    want: Tensor,
    got: Tensor,
    /// 0: bit for bit; else the largest normwise difference accepted.
    tol: f64,
    /// A parameter's gradient: its difference is measured against the whole gradient's
    /// scale ([`gradient_scale`]), not this tensor's own.
    gradient: bool,
}

/// The largest magnitude of any parameter's reference gradient: the scale against which each
/// gradient's difference is measured, normwise over the model's whole gradient as one vector.
/// A tensor's own largest value would be no scale where its exact gradient is zero: with a
/// `layernorm` over an axis along which a parameter is constant (`wpe` under a norm over the
/// batch axis), the loss does not depend on it, its computed gradient is the rounding left
/// by cancelling sums, and two summation orders leave different rounding.
fn gradient_scale(pairs: &[Pair]) -> f64 {
    pairs
        .iter()
        .filter(|p| p.gradient)
        .flat_map(|p| p.want.data.iter())
        .filter(|v| v.is_finite())
        .fold(f64::MIN_POSITIVE, |s, &v| s.max(f64::from(v).abs()))
}

/// The outputs', input gradients' and every layer's parameter gradients' comparisons: exact,
/// but for the parameters of `@embed` and `@head`, whose gradients the pipelined program sums
/// over all microbatches at once (one reduction or GEMM over every microbatch's rows) and the
/// sequential model microbatch by microbatch, a different order of the same sum: within
/// `held_once_tol`.
fn grad_pairs(
    want: &ppc_dialect::grad::Grads,
    got: &ppc_dialect::grad::Grads,
    held_once_tol: f64,
) -> Vec<Pair> {
    let pair = |what: String, want: &Tensor, got: &Tensor, tol, gradient| Pair {
        what,
        want: want.clone(),
        got: got.clone(),
        tol,
        gradient,
    };
    let mut pairs = vec![pair(
        "outputs".to_string(),
        &want.outputs,
        &got.outputs,
        0.0,
        false,
    )];
    if let (Some(w), Some(g)) = (&want.inputs, &got.inputs) {
        pairs.push(pair("input gradient".to_string(), w, g, 0.0, false));
    }
    for ((name, w), (_, g)) in want.params.iter().zip(&got.params) {
        for (l, (w, g)) in w.iter().zip(g).enumerate() {
            let what = format!("gradient of {name} in layer {l}");
            pairs.push(pair(what, w, g, 0.0, true));
        }
    }
    for (name, w) in &want.held_once {
        if let Some((_, g)) = got.held_once.iter().find(|(n, _)| n == name) {
            let what = format!("gradient of {name}");
            pairs.push(pair(what, w, g, held_once_tol, true));
        }
    }
    pairs
}
