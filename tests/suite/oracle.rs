//! An independent oracle: `tests/oracle/oracle.py` computes every example in NumPy from what
//! the model file means, fed the same parameters (safetensors, ppc's naming) and inputs; ppc's
//! interpreter, JIT and executables must agree with it. Also: a parameter file written by a
//! Python script (stacked tensors) runs in an executable, dump → load is byte-identical, and a
//! bad parameter file is refused with every problem listed. Where JAX is installed
//! (`bench/.venv`, by `make bench`), the same check runs against JAX's gelu, softmax and the
//! benchmark's SPMD GPipe loop.

use crate::common::{load, path, ppc, root};
use ppc::compare::{compare, tolerance};
use ppc_dialect::interp::Interp;
use ppc_dialect::{DType, Overrides};
use ppc_runtime::{memref::HostBuffer, safetensors, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The NumPy interpreter that `scripts/setup.sh` installs.
fn numpy_python() -> PathBuf {
    let py = root().join("tests/oracle/.venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run scripts/setup.sh (make test does) to create it with NumPy",
        py.display()
    );
    py
}

fn oracle(python: &Path, args: &[&str]) {
    let o = Command::new(python)
        .arg(root().join("tests/oracle/oracle.py"))
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        o.status.success(),
        "oracle.py {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn dims(model: &str) -> Vec<&'static str> {
    match model {
        "mlp" => vec!["--dim", "b=2", "--dim", "d=32", "--dim", "h=64"],
        "transformer" => vec!["--dim", "b=2", "--dim", "t=4"],
        _ => vec!["--dim", "b=2"],
    }
}

/// `ppc run FILE --backend BACKEND ARGS... MORE...`: the exit status and standard error.
fn run_on(file: &str, backend: &str, args: &[&str], more: &[&str]) -> (i32, String) {
    let mut all = vec!["run", file, "--backend", backend];
    all.extend(args);
    all.extend(more);
    let (code, _, err) = ppc(&all);
    (code, err)
}

fn output(p: &Path) -> Tensor {
    safetensors::read_tensor(p, "output")
        .expect("output")
        .to_tensor()
}

/// Writes seeded inputs of `model` (with `dims` and `dtype`) to `path`.
fn write_inputs(model: &str, dtype: DType, path: &Path) {
    let text = std::fs::read_to_string(crate::common::path(&format!("examples/{model}.ppc")))
        .expect("model");
    let mut ov = Overrides {
        float_dtype: (dtype != DType::F32).then_some(dtype),
        ..Overrides::default()
    };
    for pair in dims(model).chunks(2) {
        let (k, v) = pair[1].split_once('=').expect("N=V");
        ov.dims.push((k.into(), v.parse().expect("number")));
    }
    let x = Interp::new(&load(&text, &ov), 17).synthetic_inputs();
    safetensors::write(path, &[("input", &HostBuffer::from_tensor(&x))]).expect("input");
}

#[test]
fn every_example_matches_numpy_in_the_interpreter_the_jit_and_executables() {
    let python = numpy_python();
    let jax = root().join("bench/.venv/bin/python");
    let with_jax = jax.exists()
        && Command::new(&jax)
            .args(["-c", "import jax"])
            .status()
            .is_ok_and(|s| s.success());
    if !with_jax {
        eprintln!(
            "SKIPPED the JAX half of the oracle: bench/.venv has no JAX (`make bench` installs it)"
        );
    }
    let dir = std::env::temp_dir().join(format!("ppc-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let f = |name: &str| dir.join(name).display().to_string();
    for model in ["tiny", "mlp", "transformer"] {
        for dtype in [DType::F32, DType::BF16] {
            let what = format!("{model} {dtype}");
            let file = path(&format!("examples/{model}.ppc"));
            let d = dtype.to_string();
            let mut common = dims(model);
            common.extend(["--dtype", d.as_str()]);
            write_inputs(model, dtype, &dir.join("in.safetensors"));
            let input = f("in.safetensors");
            // The seeded parameters, dumped; ppc's interpreter and JIT on them.
            let (params, jit_out) = (f("params.safetensors"), f("jit.safetensors"));
            let mut args = vec!["run", file.as_str(), "--input", &input];
            args.extend([
                "--dump-params",
                params.as_str(),
                "--output",
                jit_out.as_str(),
            ]);
            args.extend(&common);
            let (code, _, err) = ppc(&args);
            assert_eq!(code, 0, "{what}: {err}");
            let interp_out = f("interp.safetensors");
            let mut args = vec![
                "run",
                file.as_str(),
                "--backend",
                "interp",
                "--input",
                &input,
            ];
            args.extend(["--params", params.as_str(), "--output", interp_out.as_str()]);
            // Another seed: only parameters read from the file give the dumped run's numbers.
            args.extend(["--seed", "9"]);
            args.extend(&common);
            let (code, _, err) = ppc(&args);
            assert_eq!(code, 0, "{what}: {err}");
            // A user's script writes other parameters, stacked; an executable runs them.
            let mine = f("mine.safetensors");
            oracle(&python, &["restack", &params, &mine, "5"]);
            let exe = f("model");
            let mut args = vec![
                "compile",
                file.as_str(),
                "-o",
                exe.as_str(),
                "--opt-level",
                "0",
            ];
            args.extend(&common);
            let (code, _, err) = ppc(&args);
            assert_eq!(code, 0, "{what}: {err}");
            let exe_out = f("exe.safetensors");
            let (code, _, err) = crate::cpu::run(
                Path::new(&exe),
                &["--input", &input, "--params", &mine, "--output", &exe_out],
            );
            assert_eq!(code, 0, "{what}: {err}");

            let tol = tolerance(dtype);
            for (label, ppc_out, params) in [
                ("interpreter", &interp_out, &params),
                ("jit", &jit_out, &params),
                ("executable with the script's parameters", &exe_out, &mine),
            ] {
                let want = f("numpy.safetensors");
                oracle(&python, &[model, params, &input, &want]);
                let c = compare(&output(Path::new(&want)), &output(Path::new(ppc_out)));
                assert!(
                    c.max_rel <= tol,
                    "{what}, {label}: normwise {} > {tol} against NumPy",
                    c.max_rel
                );
                if with_jax {
                    let want = f("jax.safetensors");
                    oracle(&jax, &[model, params, &input, &want, "--jax"]);
                    let c = compare(&output(Path::new(&want)), &output(Path::new(ppc_out)));
                    assert!(
                        c.max_rel <= tol,
                        "{what}, {label}: normwise {} > {tol} against JAX",
                        c.max_rel
                    );
                }
            }
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// The language models (token ids in, logits out; tied embedding, rotary grouped-query
/// attention) against NumPy, in the interpreter and the JIT.
#[test]
fn language_models_match_numpy_in_the_interpreter_and_the_jit() {
    let python = numpy_python();
    let dir = std::env::temp_dir().join(format!("ppc-oracle-lm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let f = |name: &str| dir.join(name).display().to_string();
    for model in ["gpt2", "llama"] {
        let file = path(&format!("examples/{model}.ppc"));
        write_inputs(model, DType::F32, &dir.join("in.safetensors"));
        let (input, params) = (f("in.safetensors"), f("params.safetensors"));
        let (jit_out, interp_out, want) = (
            f("jit.safetensors"),
            f("interp.safetensors"),
            f("numpy.safetensors"),
        );
        let dump = [
            "--input",
            &input,
            "--dump-params",
            &params,
            "--output",
            &jit_out,
        ];
        let (code, err) = run_on(&file, "cpu", &dump, &dims(model));
        assert_eq!(code, 0, "{model}: {err}");
        let load = [
            "--input",
            &input,
            "--params",
            &params,
            "--output",
            &interp_out,
            "--seed",
            "9",
        ];
        let (code, err) = run_on(&file, "interp", &load, &dims(model));
        assert_eq!(code, 0, "{model}: {err}");
        oracle(&python, &[model, &params, &input, &want]);
        let want = output(Path::new(&want));
        assert_eq!(
            want.shape.last(),
            Some(&256),
            "{model}: logits over the vocabulary"
        );
        for (label, got) in [("interpreter", &interp_out), ("jit", &jit_out)] {
            let c = compare(&want, &output(Path::new(got)));
            let tol = tolerance(DType::F32);
            assert!(
                c.max_rel <= tol,
                "{model}, {label}: normwise {} > {tol} against NumPy",
                c.max_rel
            );
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// One training step of the language models against JAX: `jax.value_and_grad` of the
/// oracle's own models (the NumPy functions on `jax.numpy`) and the mean cross-entropy. The
/// interpreter's loss within 1e-5 and every parameter's gradient within 1e-4 (normwise).
#[test]
fn language_model_gradients_match_jax() {
    let python = numpy_python();
    let has_jax = Command::new(&python)
        .args(["-c", "import jax"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_jax,
        "{} has no JAX: run scripts/setup.sh (make test does)",
        python.display()
    );
    let dir = std::env::temp_dir().join(format!("ppc-oracle-grad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let f = |name: &str| dir.join(name).display().to_string();
    for model in ["gpt2", "llama"] {
        let text = std::fs::read_to_string(path(&format!("examples/{model}.ppc"))).expect("model");
        let mut m = load(&text, &Overrides::default());
        let opts = crate::grad::train_opts(false, ppc::passes::Remat::Stage);
        ppc::pipeline::compile(&mut m, &opts, None, None).expect("compiles for training");
        let seed = 7;
        let mut interp = Interp::new(&m, seed);
        let inputs = interp.synthetic_inputs();
        let targets = ppc_dialect::interp::synthetic_targets(&m, seed);
        let step = interp
            .train_step(&inputs, &targets)
            .expect("a training step");
        let (params, input, target, out) =
            (f("params.st"), f("input.st"), f("target.st"), f("jax.st"));
        let specs = ppc_dialect::interp::param_specs(&m);
        let source = ppc_runtime::init::Source::Seeded(seed);
        ppc_runtime::params::dump(&source, &specs, Path::new(&params), &[]).expect("params");
        for (p, name, t) in [(&input, "input", &inputs), (&target, "target", &targets)] {
            safetensors::write(Path::new(p), &[(name, &HostBuffer::from_tensor(t))])
                .expect("write");
        }
        oracle(&python, &["grads", model, &params, &input, &target, &out]);
        let read = |name: &str| -> Tensor {
            safetensors::read_tensor(Path::new(&out), name)
                .unwrap_or_else(|e| panic!("{model}: {name}: {e}"))
                .to_tensor()
        };
        let want = f64::from(read("loss").data[0]);
        let rel = (f64::from(step.loss) - want).abs() / want.abs();
        assert!(
            rel <= 1e-5,
            "{model}: loss {} against JAX's {want}",
            step.loss
        );
        for spec in &specs {
            let names: Vec<String> = match spec.layers {
                Some(layers) => (0..layers)
                    .map(|l| format!("grad.{}", ppc_runtime::params::tensor_name(l, &spec.name)))
                    .collect(),
                None => vec![format!("grad.{}", spec.name)],
            };
            let want: Vec<f32> = names.iter().flat_map(|n| read(n).data).collect();
            let got = step
                .grads
                .of(&spec.name)
                .expect("a gradient of every parameter");
            let shape = vec![want.len()];
            let c = compare(
                &Tensor::new(DType::F32, shape.clone(), want),
                &Tensor::new(DType::F32, shape, got),
            );
            assert!(
                c.max_rel <= 1e-4,
                "{model}: gradient of {}: normwise {} against JAX",
                spec.name,
                c.max_rel
            );
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn dumped_parameters_load_back_byte_identical_on_every_backend() {
    let dir = std::env::temp_dir().join(format!("ppc-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let f = |name: &str| dir.join(name).display().to_string();
    let file = path("examples/transformer.ppc");
    let (params, a, b) = (f("p.safetensors"), f("a.safetensors"), f("b.safetensors"));
    let small = ["--dim", "b=2", "--dim", "t=4", "--dtype", "bf16"];
    // The inputs from a file and the loading runs on another seed, so that only parameters
    // read from the file can reproduce the dumping run's output.
    write_inputs("transformer", DType::BF16, &dir.join("in.safetensors"));
    let input = f("in.safetensors");
    // The compiled program's output on one process, which 2 ranks must reproduce byte for
    // byte (the interpreter's may differ in the last bit: it is compared within tolerance).
    let compiled = f("one-process.safetensors");
    for backend in ["cpu", "interp"] {
        let dump = [
            "--dump-params",
            &params,
            "--output",
            &a,
            "--input",
            &input,
            "--seed",
            "3",
        ];
        let (code, err) = run_on(&file, backend, &dump, &small);
        assert_eq!(code, 0, "{err}");
        let load = [
            "--params", &params, "--output", &b, "--input", &input, "--seed", "9",
        ];
        let (code, err) = run_on(&file, backend, &load, &small);
        assert_eq!(code, 0, "{err}");
        let (da, db) = (std::fs::read(&a).expect("a"), std::fs::read(&b).expect("b"));
        assert!(da == db, "{backend}: dump then load is not byte-identical");
        if backend == "cpu" {
            std::fs::copy(&a, &compiled).expect("keep the compiled output");
        }
        // And without --params the other seed does give other numbers.
        let (code, err) = run_on(
            &file,
            backend,
            &["--output", &b, "--input", &input, "--seed", "9"],
            &small,
        );
        assert_eq!(code, 0, "{err}");
        assert!(
            std::fs::read(&b).expect("b") != da,
            "{backend}: the seed does not matter"
        );
    }
    // Under mpirun, each rank reading its own layers: the same bytes as one process.
    let exe = f("model2");
    let mut args = vec![
        "compile",
        file.as_str(),
        "--ranks",
        "2",
        "-o",
        &exe,
        "--opt-level",
        "0",
    ];
    args.extend(small);
    let (code, _, err) = ppc(&args);
    assert_eq!(code, 0, "{err}");
    let c = f("c.safetensors");
    let o = Command::new("mpirun.mpich")
        .args(["-n", "2", &exe, "--params", &params, "--output", &c])
        .args(["--input", &input, "--seed", "9"])
        .output()
        .expect("mpirun");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        std::fs::read(&compiled).expect("one process") == std::fs::read(&c).expect("c"),
        "2 ranks"
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn a_bad_parameter_file_lists_every_problem_and_runs_nothing() {
    let dir = std::env::temp_dir().join(format!("ppc-badparams-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let file = path("examples/mlp.ppc");
    let small = ["--dim", "b=2", "--dim", "d=8", "--dim", "h=16"];
    let good = dir.join("good.safetensors");
    let mut args = vec!["run", file.as_str(), "--backend", "interp", "--dump-params"];
    let good_s = good.display().to_string();
    args.push(&good_s);
    args.extend(small);
    assert_eq!(ppc(&args).0, 0);
    let mut tensors = safetensors::decode(&std::fs::read(&good).expect("good")).expect("decode");
    tensors.retain(|(n, _)| n != "layers.2.w1"); // missing
    let i = tensors
        .iter()
        .position(|(n, _)| n == "layers.0.w2")
        .expect("w2");
    tensors[i].1 = HostBuffer::zeros(DType::F32, &[8, 16]); // wrong shape
    let j = tensors
        .iter()
        .position(|(n, _)| n == "layers.1.b1")
        .expect("b1");
    tensors[j].1 = HostBuffer::zeros(DType::I32, &[16]); // wrong dtype
    tensors.push((
        "layers.9.w1".into(),
        HostBuffer::zeros(DType::F32, &[8, 16]),
    )); // extra
    let bad = dir.join("bad.safetensors");
    let refs: Vec<(&str, &HostBuffer)> = tensors.iter().map(|(n, b)| (n.as_str(), b)).collect();
    safetensors::write(&bad, &refs).expect("write");
    let out = dir.join("never.safetensors");
    for backend in ["cpu", "interp"] {
        let (bad_s, out_s) = (bad.display().to_string(), out.display().to_string());
        let (code, err) = run_on(
            &file,
            backend,
            &["--params", &bad_s, "--output", &out_s],
            &small,
        );
        assert_eq!(code, 1, "{backend}: {err}");
        for problem in [
            "missing `layers.2.w1`",
            "`layers.0.w2` has shape [8, 16], the model needs [16, 8]",
            "`layers.1.b1` is i32, not a floating-point dtype",
            "`layers.9.w1` is not a parameter of this model",
        ] {
            assert!(err.contains(problem), "{backend}: no `{problem}` in\n{err}");
        }
        assert!(!out.exists(), "{backend}: a refused run wrote its output");
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}
