//! Training: compiled gradients against the interpreter's, and executables that train (the
//! loss falls on the synthetic task) and resume from checkpoints byte for byte.

use crate::common::{json_losses, load, path, ppc, root};
use crate::grad::train_opts;
use ppc::backend;
use ppc::compare::{compare, tolerance};
use ppc::lower::Numerics;
use ppc::passes::Remat;
use ppc::pipeline::compile;
use ppc_dialect::interp::{synthetic_targets, Interp};
use ppc_dialect::Overrides;
use ppc_runtime::manifest::Role;
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::{DType, Tensor};

#[test]
fn compiled_gradients_match_the_interpreter() {
    for remat in [Remat::Stage, Remat::None] {
        // O0: LLVM's O2 takes ~45 s on a training step (see `ppc verify --grad`).
        compiled_gradients_match(remat, |m, src| backend::jit(m, src, Numerics::Fast, 0));
    }
}

/// The training step of the examples under `remat`, compiled by `jit`, against the
/// interpreter's: loss, gradients and outputs within the f32 tolerance.
pub(crate) fn compiled_gradients_match(
    remat: Remat,
    jit: impl Fn(
        &ppc_dialect::Module,
        &backend::Source,
    ) -> Result<ppc::lower::mlir::Jit, ppc_dialect::Diagnostics>,
) {
    let mlp_dims = vec![("d".to_string(), 32), ("h".to_string(), 64)];
    for (file, over) in [
        ("examples/tiny.ppc", Overrides::default()),
        (
            "examples/mlp.ppc",
            Overrides {
                dims: mlp_dims,
                repeats: Some(2),
                ..Overrides::default()
            },
        ),
        (
            "examples/transformer.ppc",
            Overrides {
                dims: vec![("t".to_string(), 8), ("dh".to_string(), 8)],
                ..Overrides::default()
            },
        ),
        // Big enough that the attention's chains run per batch entry (`lower/batch_split.rs`;
        // `cpu::attention_runs_as_one_loop_over_its_entries...` counts them).
        (
            "examples/transformer.ppc",
            Overrides {
                dims: [("b", 4), ("t", 32), ("heads", 4), ("dh", 8)]
                    .map(|(n, v)| (n.to_string(), v))
                    .to_vec(),
                ..Overrides::default()
            },
        ),
        // One layer per stage, no layer loop: under `--remat none` the stage returns views
        // (a reshape it tapes), which the pipeline loop reads after the stage's region.
        (
            "examples/transformer.ppc",
            Overrides {
                dims: [("b", 4), ("t", 32), ("heads", 4), ("dh", 8)]
                    .map(|(n, v)| (n.to_string(), v))
                    .to_vec(),
                layers: Some(4),
                ..Overrides::default()
            },
        ),
    ] {
        let what = format!("{file} --remat={}", remat.name());
        let text = std::fs::read_to_string(root().join(file)).expect("example");
        let mut m = load(&text, &over);
        compile(&mut m, &train_opts(true, remat), None, None).expect("compiles for training");
        let seed = 5;
        let mut interp = Interp::new(&m, seed);
        let inputs = interp.synthetic_inputs();
        let t = synthetic_targets(&m, seed);
        let want = interp.train_step(&inputs, &t).expect("interpreter");
        let src = backend::Source { file, text: &text };
        let jit = jit(&m, &src).expect("JIT");
        let program = &jit.program;
        let mut params = program
            .params(&ppc_runtime::init::Source::Seeded(seed))
            .expect("params");
        let (x, y) = (
            HostBuffer::from_tensor(&inputs),
            HostBuffer::from_tensor(&t),
        );
        let got = ppc_runtime::train::step(program, x, y, &mut params).expect("runs");
        let param_args: Vec<_> = program
            .manifest
            .args
            .iter()
            .filter(|a| a.role == Role::Param)
            .collect();
        let got_loss = got.loss;
        let rel = (f64::from(got_loss) - f64::from(want.loss)).abs() / f64::from(want.loss).abs();
        assert!(
            rel <= 1e-5,
            "{what}: loss {got_loss} vs the interpreter's {}",
            want.loss
        );
        for (a, got) in param_args.iter().zip(&got.grads) {
            let (_, per_layer) = want
                .grads
                .params
                .iter()
                .find(|(n, _)| *n == a.name)
                .expect("a gradient of the same name");
            let w: Vec<f32> = per_layer.iter().flat_map(|t| t.data.clone()).collect();
            assert!(
                got.data.iter().all(|v| v.is_finite()),
                "{what}: gradient of {} is not finite",
                a.name
            );
            let want = Tensor::new(got.dtype, got.shape.clone(), w);
            let err = compare(&want, got).max_rel;
            assert!(
                err <= tolerance(DType::F32),
                "{what}: gradient of {}: normwise error {err:e}",
                a.name
            );
        }
        let c = compare(&want.grads.outputs, &got.outputs);
        assert!(c.max_rel <= tolerance(DType::F32), "{what}: outputs");
        // The step without its gradients (`ppc_evaluate`, which labels the synthetic task and
        // validates; CPU programs only): the step's loss and outputs, bit for bit.
        let (mut x, mut y) = (
            HostBuffer::from_tensor(&inputs),
            HostBuffer::from_tensor(&t),
        );
        let (mut loss, mut outputs) = (HostBuffer::zeros(DType::F32, &[]), program.output_buffer());
        let ran = program
            .evaluate(&mut x, &mut y, &mut params, &mut loss, &mut outputs)
            .expect("evaluates");
        assert_eq!(
            ran,
            program.manifest.gpu.is_none(),
            "{what}: an evaluate entry"
        );
        if ran {
            assert_eq!(
                loss.to_tensor().data[0].to_bits(),
                got_loss.to_bits(),
                "{what}: the evaluated loss"
            );
            let bits = |t: &Tensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&outputs.to_tensor()) == bits(&got.outputs),
                "{what}: the evaluated outputs differ from the step's"
            );
        }
    }
}

/// Mean of the first and of the last `n` losses of a `--json` run's output.
fn first_and_last(stdout: &str, n: usize) -> (f64, f64) {
    let losses = json_losses(stdout);
    assert!(losses.len() >= 2 * n, "too few steps: {stdout}");
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    (mean(&losses[..n]), mean(&losses[losses.len() - n..]))
}

#[test]
fn executables_train_and_resume_byte_identically() {
    let dir = std::env::temp_dir().join(format!("ppc-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let mlp = [
        path("examples/mlp.ppc"),
        "--dim".into(),
        "d=32".into(),
        "--dim".into(),
        "h=64".into(),
    ];
    let transformer = [path("examples/transformer.ppc")];
    for (name, model, lr) in [
        ("mlp", &mlp[..], "3e-3"),
        ("transformer", &transformer[..], "1e-3"),
    ] {
        let exe = dir.join(name);
        let mut args: Vec<&str> = vec!["compile"];
        args.extend(model.iter().map(String::as_str));
        let exe_s = exe.display().to_string();
        args.extend(["--train", "-o", &exe_s]);
        let (code, _, err) = ppc(&args);
        assert_eq!(code, 0, "{name}: {err}");
        let run = |extra: &[&str]| {
            let o = std::process::Command::new(&exe)
                .args(["--json", "--lr", lr])
                .args(extra)
                .output()
                .expect("runs");
            assert!(
                o.status.success(),
                "{name} {extra:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            String::from_utf8(o.stdout).expect("utf-8")
        };
        let trace = dir.join(format!("{name}.trace.json"));
        let out = run(&["--steps", "60", "--trace", &trace.display().to_string()]);
        // The examples' pipelines: 4 stages, 8 microbatches.
        assert_training_trace(&trace, 60, 4 + 8 - 1);
        let (first, last) = first_and_last(&out, 8);
        assert!(
            last < 0.7 * first,
            "{name}: the loss went from {first} to {last}"
        );
        // 6 steps at once, or 3, a checkpoint, and 3 more: the same bytes.
        let ckpt = |n: &str| {
            dir.join(format!("{name}-{n}.safetensors"))
                .display()
                .to_string()
        };
        run(&["--steps", "6", "--save", &ckpt("whole")]);
        run(&["--steps", "3", "--save", &ckpt("half")]);
        run(&[
            "--steps",
            "3",
            "--resume",
            &ckpt("half"),
            "--save",
            &ckpt("resumed"),
        ]);
        let read = |n: &str| std::fs::read(ckpt(n)).expect("checkpoint");
        assert!(
            read("whole") == read("resumed"),
            "{name}: resuming changed the weights"
        );
        assert!(
            read("half") != read("whole"),
            "{name}: training did not change the checkpoint"
        );
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// A training run's trace: `steps` steps, each holding the forward loop's `iterations`
/// iterations (numbered from 0, as `ppc schedule` does), then the backward loop's (numbered by
/// the forward iteration each takes back: from the last down to 0), then the optimizer update.
fn assert_training_trace(trace: &std::path::Path, steps: usize, iterations: usize) {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace).expect("trace")).expect("JSON");
    let mut spans: Vec<(String, f64, f64)> = j["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 0)
        .map(|e| {
            let ts = e["ts"].as_f64().expect("ts");
            let name = e["name"].as_str().expect("name").to_string();
            (name, ts, ts + e["dur"].as_f64().expect("dur"))
        })
        .collect();
    spans.sort_by(|a, b| a.1.total_cmp(&b.1));
    let step_spans: Vec<&(String, f64, f64)> =
        spans.iter().filter(|s| s.0.starts_with("step ")).collect();
    assert_eq!(step_spans.len(), steps);
    let forward: Vec<String> = (0..iterations).map(|i| format!("iteration {i}")).collect();
    let backward = (0..iterations)
        .rev()
        .map(|i| format!("backward iteration {i}"));
    let want: Vec<String> = forward
        .into_iter()
        .chain(backward)
        .chain(["optimizer update".to_string()])
        .collect();
    for s in step_spans {
        let inside: Vec<&String> = spans
            .iter()
            .filter(|o| {
                (o.0.contains("iteration") || o.0 == "optimizer update")
                    && s.1 <= o.1 + 1.0
                    && o.2 <= s.2 + 1.0
            })
            .map(|o| &o.0)
            .collect();
        assert_eq!(inside, want.iter().collect::<Vec<_>>(), "{}", s.0);
    }
}

/// The model file's `train { ... }` block sets the executable's optimizer; its command line
/// overrides it.
#[test]
fn the_train_block_sets_the_optimizer_and_the_command_line_overrides_it() {
    let dir = std::env::temp_dir().join(format!("ppc-train-block-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let tiny = std::fs::read_to_string(root().join("examples/tiny.ppc")).expect("tiny");
    let with_block = tiny.replace(
        "input f32[b, d]\n",
        "input f32[b, d]\ntrain { optimizer = sgd, lr = 0.05 }\n",
    );
    assert_ne!(with_block, tiny);
    let losses = |text: &str, name: &str, flags: &[&str]| {
        let (model, exe) = (dir.join(format!("{name}.ppc")), dir.join(name));
        std::fs::write(&model, text).expect("model");
        let (m, e) = (model.display().to_string(), exe.display().to_string());
        let (code, _, err) = ppc(&["compile", &m, "--train", "-o", &e]);
        assert_eq!(code, 0, "{err}");
        let o = std::process::Command::new(&exe)
            .args(["--steps", "20", "--json"])
            .args(flags)
            .output()
            .expect("runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).expect("utf-8")
    };
    let from_block = losses(&with_block, "block", &[]);
    let from_flags = losses(&tiny, "plain", &["--optimizer", "sgd", "--lr", "0.05"]);
    let default = losses(&tiny, "plain", &[]);
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.split(",\"step_s\"").next().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(
        strip(&from_block),
        strip(&from_flags),
        "the block is SGD at lr 0.05"
    );
    assert_ne!(strip(&from_block), strip(&default), "AdamW by default");
    let overridden = losses(
        &with_block,
        "block",
        &["--optimizer", "adamw", "--lr", "0.001"],
    );
    assert_eq!(strip(&overridden), strip(&default), "the command line wins");
    // Every optimizer setting is an option; a bad value or an unknown option is exit status 2.
    let exe = dir.join("block");
    let run = |args: &[&str]| {
        std::process::Command::new(&exe)
            .args(args)
            .output()
            .expect("runs")
    };
    let help = String::from_utf8(run(&["--help"]).stdout).expect("utf-8");
    for key in ppc_runtime::optim::SETTINGS {
        assert!(
            help.contains(&format!("--{} <", key.replace('_', "-"))),
            "{key}:\n{help}"
        );
    }
    for (args, says) in [
        (
            &["--lr", "x"][..],
            "`lr` needs a non-negative number, got `x`",
        ),
        (
            &["--optimizer", "lamb"][..],
            "`optimizer` is `sgd` or `adamw`, not `lamb`",
        ),
        (
            &["--learning-rate", "1"][..],
            "unexpected argument '--learning-rate'",
        ),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// The tapes the forward loop writes for the backward (`[11 iterations, 4 stages, ...]` for
/// the MLP without rematerialization) are written slice by slice before anything reads them:
/// no fill before the loop. The weight-gradient accumulators, which the backward loop adds
/// into, still start at zero.
#[test]
fn tapes_are_not_filled_before_the_loop_writes_them() {
    let mlp = path("examples/mlp.ppc");
    let (code, mlir, err) = ppc(&["compile", &mlp, "--train", "--remat", "none", "--emit=mlir"]);
    assert_eq!(code, 0, "{err}");
    let fills_of = |memref: &str| {
        mlir.lines()
            .filter(|l| l.contains("linalg.fill") && l.contains(memref))
            .count()
    };
    assert_eq!(fills_of("memref<11x4x"), 0, "a tape is filled");
    assert_eq!(fills_of("memref<4x256x1024xf32>"), 1, "the gradient of w1");
    assert_eq!(fills_of("memref<4x1024x256xf32>"), 1, "the gradient of w2");
}

/// The synthetic task labels each of its 8 batches when training first reaches it: nothing
/// before `--steps 0` ends, one labelling before the first step, eight at most; `--bench`
/// labels the batches its steps use, before it times them, each by a forward pass. (That the
/// batches do not depend on when they are labelled, `executables_train_and_resume_…` shows: a
/// resumed run labels its batches at other steps than the run it continues.)
#[test]
fn the_synthetic_task_labels_each_batch_when_training_first_reaches_it() {
    let dir = std::env::temp_dir().join(format!("ppc-labels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let exe = dir.join("mlp");
    let (model, exe_s) = (path("examples/mlp.ppc"), exe.display().to_string());
    let (code, _, err) = ppc(&[
        "compile", &model, "--dim", "d=32", "--dim", "h=64", "--train", "-o", &exe_s,
    ]);
    assert_eq!(code, 0, "{err}");
    let labelled_by = |args: &[&str]| {
        let o = std::process::Command::new(&exe)
            .args(args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{args:?}: {err}");
        let lines: Vec<String> = err
            .lines()
            .filter(|l| l.starts_with("labelled synthetic batch"))
            .map(String::from)
            .collect();
        (lines, err)
    };
    let labelled = |steps: &str| labelled_by(&["--steps", steps]);
    let (none, err) = labelled("0");
    assert!(none.is_empty(), "{err}");
    assert!(err.contains("when training first reaches it"), "{err}");
    let (one, err) = labelled("1");
    assert_eq!(one.len(), 1, "{err}");
    assert!(
        one[0].starts_with("labelled synthetic batch 1/8 in "),
        "{err}"
    );
    let (all, err) = labelled("12");
    let expected: Vec<String> = (1..=8)
        .map(|b| format!("labelled synthetic batch {b}/8"))
        .collect();
    let got: Vec<&str> = all.iter().map(|l| &l[..l.find(" in ").unwrap()]).collect();
    assert_eq!(got, expected, "{err}");
    // `--bench 1` after no step labels the batches of its two warm-up steps and its timed one
    // (steps 2 to 4), and no other.
    let (bench, err) = labelled_by(&["--steps", "0", "--bench", "1"]);
    let got: Vec<&str> = bench
        .iter()
        .map(|l| &l[..l.find(" in ").unwrap()])
        .collect();
    let expected: Vec<String> = (2..=4)
        .map(|b| format!("labelled synthetic batch {b}/8"))
        .collect();
    assert_eq!(got, expected, "{err}");
    // The labels come from the step without its gradients (`ppc_evaluate`, a third of the
    // step's work), which the executable defines; `compiled_gradients_match` shows that it
    // gives the step's outputs, bit for bit.
    let o = std::process::Command::new("nm")
        .args(["--defined-only", &exe_s])
        .output()
        .expect("nm runs");
    let symbols = String::from_utf8_lossy(&o.stdout);
    assert!(
        symbols
            .lines()
            .any(|l| l.ends_with(" _mlir_ciface_ppc_evaluate")),
        "the executable has no forward-only entry"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A classifier's training reports accuracy beside the loss, the same on 1 and 2 ranks: at the
/// first step, the share of rows whose largest logit (of the initial weights, as the
/// interpreter computes them) is the target; `--val-data` reports one too.
#[test]
fn training_reports_the_accuracy_of_its_outputs() {
    use crate::mpirun::{build, launch, scratch};
    use ppc_runtime::safetensors;
    let dir = scratch("accuracy");
    let dims = Overrides {
        dims: vec![("b".into(), 2)],
        ..Overrides::default()
    };
    let text = std::fs::read_to_string(root().join("examples/gpt2.ppc")).expect("model");
    let mut m = load(&text, &dims);
    compile(&mut m, &ppc::passes::Options::default(), None, None).expect("compiles");
    let inputs = Interp::new(&m, 3).synthetic_inputs();
    let logits = Interp::new(&m, 0).forward(&inputs).expect("interp");
    let classes = *logits.shape.last().expect("classes");
    // Targets: the argmax of every third row, another class elsewhere.
    let rows = logits.len() / classes;
    let argmax = |r: usize| {
        let row = &logits.data[r * classes..(r + 1) * classes];
        let best = row.iter().cloned().fold(f32::MIN, f32::max);
        row.iter().position(|&v| v == best).expect("a largest") as i32
    };
    let targets: Vec<i32> = (0..rows)
        .map(|r| match r % 3 {
            0 => argmax(r),
            _ => (argmax(r) + 1) % classes as i32,
        })
        .collect();
    let want = (0..rows).filter(|r| r % 3 == 0).count() as f64 / rows as f64;
    let mut target_shape = inputs.shape.clone();
    target_shape.truncate(logits.shape.len() - 1);
    let data = dir.join("data.safetensors");
    let target = Tensor::from_ints(target_shape, targets);
    safetensors::write(
        &data,
        &[
            ("input", &HostBuffer::from_tensor(&inputs)),
            ("target", &HostBuffer::from_tensor(&target)),
        ],
    )
    .expect("data");
    let data = data.display().to_string();
    for ranks in [1u64, 2] {
        let exe = dir.join(format!("gpt2_{ranks}"));
        build("examples/gpt2.ppc", &exe, ranks, &["--train", "--exact"]);
        let args = [
            "--steps",
            "1",
            "--json",
            "--data",
            &data,
            "--val-data",
            &data,
        ];
        let l = launch(&exe, Some(ranks), &args, &[]);
        assert_eq!(l.code, 0, "{}", l.stderr);
        let lines: Vec<serde_json::Value> = (l.stdout.lines())
            .map(|s| serde_json::from_str(s).expect("JSON"))
            .collect();
        assert_eq!(
            lines[0]["accuracy"].as_f64(),
            Some(want),
            "{ranks} ranks: {}",
            l.stdout
        );
        let val = lines[1]["val_accuracy"].as_f64().expect("val_accuracy");
        assert!((0.0..=1.0).contains(&val), "{}", l.stdout);
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// Fine-tuning: `--params FILE` starts a training run from a file's weights with fresh
/// optimizer state at step 1. The weights the seed draws, dumped and read back, train to the
/// same bytes as the seed; a checkpoint's weights start where the checkpoint left them (the
/// first loss is the loss the checkpoint's run would have had next); a file of another model
/// is refused, naming its problems, and nothing trains.
#[test]
fn training_executables_fine_tune_from_a_parameter_file() {
    use crate::mpirun::{build, launch, scratch};
    let dir = scratch("fine-tune");
    let exe = dir.join("gpt2");
    build("examples/gpt2.ppc", &exe, 1, &["--train"]);
    let file = |name: &str| dir.join(name).display().to_string();
    let run = |args: &[&str]| {
        let l = launch(&exe, None, args, &[]);
        assert_eq!(l.code, 0, "{args:?}: {}", l.stderr);
        (json_losses(&l.stdout), l.stderr)
    };
    let (drawn, _) = run(&["--steps", "3", "--json", "--seed", "5"]);
    let dumped = file("seed5.safetensors");
    let (code, _, err) = ppc(&[
        "run",
        &path("examples/gpt2.ppc"),
        "--dim",
        "b=2",
        "--seed",
        "5",
        "--steps",
        "1",
        "--dump-params",
        &dumped,
    ]);
    assert_eq!(code, 0, "{err}");
    // The seed still draws the synthetic task's batches.
    let (tuned, said) = run(&["--steps", "3", "--json", "--seed", "5", "--params", &dumped]);
    assert_eq!(drawn, tuned, "the seed's weights, read from a file");
    assert!(said.contains("fine-tuning the weights of"), "{said}");
    // One microbatch of data, four times: every step trains on the same batch in whatever
    // order the epoch draws. Four steps with a checkpoint after two: fine-tuning from it
    // starts with fresh moments, so its first loss is the third step's (the same weights on
    // the same batch), and its next differs.
    let ids = |seed| {
        let one = ppc_runtime::Rng::stream(seed, "fine-tune", 0)
            .fill(ppc_runtime::Init::Uniform(0.0, 256.0), 2 * 32);
        let ints = one.repeat(4).into_iter().map(|v| v as i32);
        HostBuffer::from_tensor(&Tensor::from_ints(vec![4, 2, 32], ints))
    };
    let data = file("batch.safetensors");
    ppc_runtime::safetensors::write(
        std::path::Path::new(&data),
        &[("input", &ids(1)), ("target", &ids(2))],
    )
    .expect("data");
    let ckpt = file("two.safetensors");
    let (four, _) = run(&["--steps", "4", "--json", "--data", &data]);
    run(&["--steps", "2", "--json", "--data", &data, "--save", &ckpt]);
    let (from_ckpt, _) = run(&["--steps", "2", "--json", "--data", &data, "--params", &ckpt]);
    assert_eq!(from_ckpt[0], four[2], "the checkpoint's weights");
    assert_ne!(
        from_ckpt[1], four[3],
        "fresh optimizer state, not the checkpoint's"
    );
    // Another model's weights: said in one line (the dimensions it records), no step.
    let other = dir.join("other");
    build("examples/llama.ppc", &other, 1, &["--train"]);
    let llama_params = file("llama.safetensors");
    let l = launch(
        &other,
        None,
        &["--steps", "1", "--save", &llama_params],
        &[],
    );
    assert_eq!(l.code, 0, "{}", l.stderr);
    let l = launch(
        &exe,
        None,
        &["--steps", "1", "--json", "--params", &llama_params],
        &[],
    );
    assert_ne!(l.code, 0);
    assert!(l.stdout.is_empty(), "nothing trains: {}", l.stdout);
    assert!(
        l.stderr
            .contains("llama.safetensors was made with --dim heads=4"),
        "one line naming the dimensions: {}",
        l.stderr
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// A token stream is read a window at a time: training on a 4 GiB `train.bin` (sparse: its
/// ids are 0) peaks within a few MB of training on a 2,000-token one, where reading it whole
/// took 12.6 GB; `/dev/zero` (no length) is too short, said at once.
#[test]
fn a_token_stream_costs_no_memory_for_its_size() {
    use crate::mpirun::{build, scratch};
    let dir = scratch("token-memory");
    let exe = dir.join("gpt2");
    build("examples/gpt2.ppc", &exe, 1, &["--train"]);
    let peak_kb = |data: &std::path::Path| {
        let o = std::process::Command::new("/usr/bin/time")
            .args(["-f", "peak %M"])
            .arg(&exe)
            .args(["--steps", "2", "--json", "--data"])
            .arg(data)
            .output()
            .expect("GNU time (scripts/setup.sh installs it)");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        let line = err.lines().rev().find_map(|l| l.strip_prefix("peak "));
        line.and_then(|kb| kb.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no peak RSS in {err}"))
    };
    let small = dir.join("small.bin");
    std::fs::write(&small, vec![0u8; 4000]).expect("small");
    let big = dir.join("big.bin");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(4 << 30))
        .expect("a sparse 4 GiB file");
    let (a, b) = (peak_kb(&small), peak_kb(&big));
    assert!(
        b < a + 16 * 1024,
        "peak RSS {b} KB on 4 GiB of tokens, {a} KB on 4 KB"
    );
    let zero = dir.join("zero.bin");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("link");
    let o = std::process::Command::new("timeout")
        .args(["20"])
        .arg(&exe)
        .args(["--steps", "1", "--data"])
        .arg(&zero)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("0 tokens, but a sequence needs 33"), "{err}");
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// `--data` in a safetensors file: every row once an epoch, in a seeded order of the epoch's
/// own (`data.rs`'s unit tests), the same rows a step after a resume too; a class id the
/// outputs do not have is refused before training, naming the row; a file smaller than a
/// step is said.
#[test]
fn safetensors_data_is_shuffled_each_epoch_and_bad_labels_are_refused() {
    use crate::mpirun::{build, launch, scratch};
    let dir = scratch("epochs");
    let exe = dir.join("gpt2");
    build("examples/gpt2.ppc", &exe, 1, &["--train"]);
    // Rows whose targets are their index: a step's targets say which rows it read.
    let write = |name: &str, rows: usize, bad: Option<i32>| {
        let x = Tensor::from_ints(vec![rows, 2, 32], (0..rows * 64).map(|i| (i % 256) as i32));
        let mut t: Vec<i32> = (0..rows * 64).map(|i| (i / 64) as i32).collect();
        if let Some(v) = bad {
            t[3 * 64 + 5] = v;
        }
        let t = Tensor::from_ints(vec![rows, 2, 32], t);
        let path = dir.join(name);
        ppc_runtime::safetensors::write(
            &path,
            &[
                ("input", &HostBuffer::from_tensor(&x)),
                ("target", &HostBuffer::from_tensor(&t)),
            ],
        )
        .expect("data");
        path.display().to_string()
    };
    // Training and resuming over epochs gives the bytes of one run (the order is the step's).
    let data = write("rows.safetensors", 6, None);
    let ckpt = dir.join("ckpt.safetensors").display().to_string();
    let run = |args: &[&str]| {
        let l = launch(&exe, None, args, &[]);
        assert_eq!(l.code, 0, "{}", l.stderr);
        json_losses(&l.stdout)
    };
    let whole = run(&["--steps", "5", "--json", "--data", &data]);
    let first = run(&["--steps", "2", "--json", "--data", &data, "--save", &ckpt]);
    let rest = run(&["--steps", "3", "--json", "--data", &data, "--resume", &ckpt]);
    assert_eq!(whole, [first, rest].concat());
    // A class id of 256 classes at row 3, element 5: refused, nothing trains.
    let bad = write("bad.safetensors", 12, Some(300));
    let l = launch(&exe, None, &["--steps", "1", "--json", "--data", &bad], &[]);
    assert_ne!(l.code, 0);
    assert!(l.stdout.is_empty(), "{}", l.stdout);
    assert!(
        l.stderr.contains(
            "target 300 at row 3 (element 5 of it) is not one of this model's 256 classes"
        ),
        "{}",
        l.stderr
    );
    // -1 without ignore_index is no class either.
    let minus = write("minus.safetensors", 12, Some(-1));
    let l = launch(&exe, None, &["--steps", "1", "--data", &minus], &[]);
    assert!(l.stderr.contains("target -1 at row 3"), "{}", l.stderr);
    // Fewer rows than a step's 4 microbatches: said, and it trains.
    let small = write("small.safetensors", 3, None);
    let l = launch(&exe, None, &["--steps", "1", "--data", &small], &[]);
    assert_eq!(l.code, 0, "{}", l.stderr);
    assert!(
        l.stderr
            .contains("holds 3 rows (microbatches), fewer than the 4 a step takes"),
        "{}",
        l.stderr
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// A checkpoint knows its model: it records the dimensions, the pipeline and the run's
/// optimizer settings. `--resume` goes on with the recorded settings (no flag repeated gives
/// the bytes of one run); a file of other dimensions is refused in one line naming them; and
/// `ppc sample` and `ppc run` take the recorded dimensions and depth.
#[test]
fn a_checkpoint_knows_its_model() {
    use crate::mpirun::{build, launch, scratch};
    let dir = scratch("knows");
    let exe = dir.join("gpt2");
    build(
        "examples/gpt2.ppc",
        &exe,
        1,
        &["--train", "--dim", "t=16", "--layers", "8"],
    );
    let ckpt = dir.join("c.safetensors").display().to_string();
    let run = |args: &[&str]| {
        let l = launch(&exe, None, args, &[]);
        assert_eq!(l.code, 0, "{args:?}: {}", l.stderr);
        json_losses(&l.stdout)
    };
    let flags = [
        "--lr",
        "3e-3",
        "--warmup-steps",
        "3",
        "--weight-decay",
        "0.05",
    ];
    let mut whole_args = vec!["--steps", "4", "--json"];
    whole_args.extend(flags);
    let whole = run(&whole_args);
    let mut first_args = vec!["--steps", "2", "--json", "--save", &ckpt];
    first_args.extend(flags);
    let first = run(&first_args);
    let rest = run(&["--steps", "2", "--json", "--resume", &ckpt]);
    assert_eq!(
        whole,
        [first, rest].concat(),
        "resumed with the recorded settings"
    );
    // Another model's dimensions: one line, naming them.
    let other = dir.join("other");
    build("examples/gpt2.ppc", &other, 1, &["--train"]);
    for flag in ["--params", "--resume"] {
        let l = launch(&other, None, &["--steps", "1", flag, &ckpt], &[]);
        assert_ne!(l.code, 0);
        let line = l.stderr.lines().find(|l| l.contains("was made with"));
        let line = line.unwrap_or_else(|| panic!("{flag}: {}", l.stderr));
        assert!(
            line.contains("--dim t=16") && line.contains("this model has t=32"),
            "{line}"
        );
    }
    // ppc sample and ppc run read the checkpoint's model: no --dim, no --layers repeated.
    let gpt2 = path("examples/gpt2.ppc");
    let (code, out, err) = ppc(&[
        "sample", &gpt2, "--params", &ckpt, "--prompt", "a", "--tokens", "3",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("c.safetensors was made with --dim t=16 --layers 8: using them"),
        "{err}"
    );
    let (code, _, err) = ppc(&[
        "run",
        &gpt2,
        "--backend",
        "interp",
        "--params",
        &ckpt,
        "--steps",
        "1",
    ]);
    assert_eq!(code, 0, "{err}");
    std::fs::remove_dir_all(dir).expect("cleanup");
}
