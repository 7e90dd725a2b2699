//! Language models: `@embed` and `@head` around the pipelined layers (`examples/gpt2.ppc`, with
//! a token embedding tied to its head, and `examples/llama.ppc`). The same bytes on 1, 2 and 4
//! ranks, interpreted and compiled; the tied embedding's copies stay equal; checkpoints hold
//! it once; the loss falls.

use crate::common::{json_losses, load, path, ppc, root};
use crate::grad::train_opts;
use crate::mpirun::{build, identical_across_ranks, launch, scratch};
use crate::passes::assert_bits_eq;
use ppc::passes::Remat;
use ppc::pipeline::compile;
use ppc_dialect::grad::{train_step_on_ranks, Step};
use ppc_dialect::interp::{synthetic_targets, Interp};
use ppc_dialect::Overrides;
use ppc_runtime::Tensor;

const MODELS: [&str; 2] = ["examples/gpt2.ppc", "examples/llama.ppc"];

/// One training step of `file` on `ranks` ranks, interpreted.
fn step(file: &str, ranks: u64) -> Step {
    let text = std::fs::read_to_string(root().join(file)).expect("model");
    let over = Overrides {
        ranks: Some(ranks),
        ..Overrides::default()
    };
    let mut m = load(&text, &over);
    compile(&mut m, &train_opts(true, Remat::Stage), None, None).expect("compiles");
    let inputs = Interp::new(&m, 3).synthetic_inputs();
    let targets = synthetic_targets(&m, 3);
    let source = ppc_runtime::init::Source::Seeded(3);
    train_step_on_ranks(&m, 3, &source, &inputs, &targets).expect("runs")
}

#[test]
fn interpreted_training_steps_are_the_same_bytes_on_1_2_and_4_ranks() {
    for file in MODELS {
        let one = step(file, 1);
        assert!(
            !one.grads.held_once.is_empty(),
            "{file}: no @embed or @head gradients"
        );
        for ranks in [2, 4] {
            let what = format!("{file} on {ranks} ranks");
            let got = step(file, ranks);
            assert_eq!(one.loss.to_bits(), got.loss.to_bits(), "{what}: loss");
            for ((name, w), (_, g)) in one.grads.params.iter().zip(&got.grads.params) {
                for (l, (w, g)) in w.iter().zip(g).enumerate() {
                    assert_bits_eq(w, g, &format!("{what}: gradient of {name} in layer {l}"));
                }
            }
            assert_eq!(one.grads.held_once.len(), got.grads.held_once.len());
            for ((name, w), (_, g)) in one.grads.held_once.iter().zip(&got.grads.held_once) {
                assert!(
                    w.data.iter().any(|v| *v != 0.0),
                    "{what}: the gradient of {name} is zero"
                );
                assert_bits_eq(w, g, &format!("{what}: gradient of {name}"));
            }
        }
    }
}

#[test]
fn gpt2_forward_is_byte_identical_on_1_2_and_4_ranks() {
    identical_across_ranks("examples/gpt2.ppc", 4);
}

/// Compiled training on 1, 2 and 4 ranks: the same losses and checkpoints, byte for byte (the
/// tied embedding's gradient summed across the first and the last rank, so its copies stay
/// equal: a checkpoint refuses copies that differ; the global gradient norm clipped alike);
/// parameters of `@embed` and `@head` held once in it; the loss falls on the synthetic task.
#[test]
fn compiled_training_is_the_same_bytes_on_1_2_and_4_ranks_and_learns() {
    let dir = scratch("lm");
    for file in MODELS {
        let name = file
            .trim_start_matches("examples/")
            .trim_end_matches(".ppc");
        let mut runs = Vec::new();
        for ranks in [1u64, 2, 4] {
            let what = format!("{file} on {ranks} ranks");
            let exe = dir.join(format!("{name}_{ranks}"));
            build(file, &exe, ranks, &["--train"]);
            let ckpt = dir.join(format!("{name}_{ranks}.safetensors"));
            let ckpt_s = ckpt.display().to_string();
            let args = [
                "--steps",
                "30",
                "--json",
                "--lr",
                "3e-3",
                "--grad-clip",
                "0.5",
                "--save",
                &ckpt_s,
            ];
            let l = launch(&exe, Some(ranks), &args, &[]);
            assert_eq!(l.code, 0, "{what}\n{}", l.stderr);
            let losses = json_losses(&l.stdout);
            assert_eq!(losses.len(), 30, "{what}: one line per step\n{}", l.stdout);
            runs.push((losses, std::fs::read(&ckpt).expect("checkpoint")));
        }
        let (losses, bytes) = &runs[0];
        for (i, (l, b)) in runs.iter().enumerate().skip(1) {
            assert_eq!(losses, l, "{file}: losses on rank count #{i}");
            assert!(bytes == b, "{file}: checkpoint on rank count #{i} differs");
        }
        let header = String::from_utf8_lossy(&bytes[..bytes.len().min(1 << 16)]).into_owned();
        let once = if file.contains("gpt2") {
            "wte"
        } else {
            "output"
        };
        assert!(
            header.contains(&format!("\"{once}\""))
                && !header.contains(&format!("layers.0.{once}")),
            "{file}: `{once}` is held once"
        );
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
        let (first, last) = (mean(&losses[..5]), mean(&losses[25..]));
        assert!(last < 0.9 * first, "{file}: loss {first} -> {last}");
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// Under `mpirun`, `@embed` (and its backward) runs on the first rank only, and `@head` and
/// the loss on the last only: in a trace of a training step, no other rank has a loop nest of
/// their lines, and those ranks do.
#[test]
fn the_ends_run_on_the_first_and_last_rank_only() {
    let file = "examples/gpt2.ppc";
    let text = std::fs::read_to_string(root().join(file)).expect("model");
    let lines: Vec<&str> = text.lines().collect();
    // 1-based lines of a function's body, and of the `loss` line.
    let body = |name: &str| -> Vec<u32> {
        let start = lines
            .iter()
            .position(|l| l.starts_with(&format!("func @{name}(")))
            .expect("defined");
        let end = start
            + lines[start..]
                .iter()
                .position(|l| *l == "}")
                .expect("closed");
        (start as u32 + 2..=end as u32).collect()
    };
    let loss = lines
        .iter()
        .position(|l| l.starts_with("loss "))
        .expect("loss") as u32
        + 1;
    let (embed, mut head) = (body("embed"), body("head"));
    head.push(loss);
    let dir = scratch("ends");
    let exe = dir.join("gpt2");
    build(file, &exe, 4, &["--train"]);
    let trace = dir.join("trace.json");
    let l = launch(
        &exe,
        Some(4),
        &["--steps", "1", "--trace", &trace.display().to_string()],
        &[],
    );
    assert_eq!(l.code, 0, "{}", l.stderr);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("JSON");
    let events = j["traceEvents"].as_array().expect("traceEvents");
    for rank in 0..4u64 {
        let nests: Vec<u32> = events
            .iter()
            .filter(|e| e["pid"] == rank && e["cat"] == "loop nest")
            .filter_map(|e| e["name"].as_str()?.rsplit_once(", line ")?.1.parse().ok())
            .collect();
        assert!(!nests.is_empty(), "rank {rank}: no loop nests");
        let runs = |part: &[u32]| nests.iter().any(|l| part.contains(l));
        assert_eq!(runs(&embed), rank == 0, "rank {rank}: @embed's loop nests");
        assert_eq!(
            runs(&head),
            rank == 3,
            "rank {rank}: @head's or the loss's loop nests"
        );
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// The tutorial's path on a real English text (the GPL, which every Debian system ships):
/// `ppc tokenize`, training on the token stream with validation, `ppc sample` from the
/// checkpoint (greedy and seeded draws are reproducible).
#[test]
fn a_language_model_trains_on_text_and_samples() {
    let dir = scratch("text");
    let d = |name: &str| dir.join(name).display().to_string();
    let text = "/usr/share/common-licenses/GPL-3";
    let (code, out, err) = ppc(&["tokenize", text, "-o", &d("data")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("train.bin") && out.contains("val.bin"),
        "{out}"
    );
    let exe = dir.join("gpt2");
    build("examples/gpt2.ppc", &exe, 2, &["--train"]);
    let (train, val, ckpt) = (
        d("data/train.bin"),
        d("data/val.bin"),
        d("gpt2.safetensors"),
    );
    let args = [
        "--data",
        &train,
        "--val-data",
        &val,
        "--val-every",
        "20",
        "--steps",
        "60",
        "--json",
        "--lr",
        "3e-3",
        "--save",
        &ckpt,
    ];
    let l = launch(&exe, Some(2), &args, &[]);
    assert_eq!(l.code, 0, "{}", l.stderr);
    let losses = json_losses(&l.stdout);
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    assert!(
        mean(&losses[50..]) < 0.7 * mean(&losses[..5]),
        "the loss on text falls: {losses:?}"
    );
    let vals: Vec<f64> = l
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["val_loss"].as_f64())
        .collect();
    assert_eq!(
        vals.len(),
        3,
        "validations at steps 20, 40, 60:\n{}",
        l.stdout
    );
    assert!(vals[2] < vals[0], "validation loss {vals:?}");
    let model = path("examples/gpt2.ppc");
    let sample = |extra: &[&str]| {
        let mut args = vec![
            "sample",
            &model,
            "--params",
            &ckpt,
            "--prompt",
            "the ",
            "--tokens",
            "24",
            "--opt-level",
            "0",
        ];
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("the "), "{out}");
        out
    };
    assert_eq!(sample(&[]), sample(&[]), "greedy sampling is deterministic");
    let warm = ["--temperature", "0.8", "--seed", "3"];
    assert_eq!(sample(&warm), sample(&warm), "a seeded draw repeats");
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// `loss softmax_cross_entropy, ignore_index = -1`: rows whose target is -1 (padding) count in
/// neither the sum nor the mean, checked against the cross-entropy of the step's own logits
/// computed here in f64; when every target is ignored the loss and the gradients are zero.
#[test]
fn ignored_targets_count_in_neither_the_sum_nor_the_mean() {
    let text = std::fs::read_to_string(root().join("examples/gpt2.ppc")).expect("model");
    let text = text.replace(
        "loss softmax_cross_entropy",
        "loss softmax_cross_entropy, ignore_index = -1",
    );
    assert!(text.contains("ignore_index"));
    let mut m = load(&text, &Overrides::default());
    compile(&mut m, &train_opts(true, Remat::Stage), None, None).expect("compiles");
    let mut interp = Interp::new(&m, 5);
    let inputs = interp.synthetic_inputs();
    let drawn = synthetic_targets(&m, 5);
    let ignoring = |every: usize| {
        let ids = (0..drawn.len()).map(|i| if i % every == 1 { -1 } else { drawn.int(i) });
        Tensor::from_ints(drawn.shape.clone(), ids)
    };
    let targets = ignoring(3);
    let step = interp.train_step(&inputs, &targets).expect("runs");
    let logits = &step.grads.outputs;
    let vocab = *logits.shape.last().expect("axes");
    let (mut sum, mut count) = (0.0f64, 0usize);
    for (i, row) in logits.data.chunks(vocab).enumerate() {
        let Ok(t) = usize::try_from(targets.int(i)) else {
            continue;
        };
        let top = row.iter().fold(f64::MIN, |a, &v| a.max(f64::from(v)));
        let lse = top
            + row
                .iter()
                .map(|&v| (f64::from(v) - top).exp())
                .sum::<f64>()
                .ln();
        sum += lse - f64::from(row[t]);
        count += 1;
    }
    let want = sum / count as f64;
    let got = f64::from(step.loss);
    assert!((got - want).abs() <= 1e-5 * want, "loss {got}, want {want}");
    let all_ignored = Tensor::from_ints(drawn.shape.clone(), vec![-1; drawn.len()]);
    let none = interp.train_step(&inputs, &all_ignored).expect("runs");
    assert_eq!(none.loss, 0.0);
    for (name, g) in &none.grads.held_once {
        assert!(g.data.iter().all(|v| *v == 0.0), "gradient of {name}");
    }
}

/// Uneven depth: 6 layers on 4 stages (the last stage runs none), 5 over 2 stages × 2 repeats:
/// pipelined ≡ sequential bit for bit with poisoned bubbles on 1, 2 and 4 ranks, gradients
/// too; compiled training is the same bytes on 1 and 2 ranks; the checkpoint holds the model's
/// layers only and runs as a parameter file.
#[test]
fn layers_that_the_stages_do_not_divide_leave_empty_slots() {
    let model = path("examples/gpt2.ppc");
    // The report's bubble counts the empty slots as idle: of the (M+S-1)·S·k layer slots of
    // the loop, M·L run a layer (6 layers on 4 stages of k = 2, M = 4; 5 on 2 stages of 2
    // in 2 repeats, M = 4).
    for (extra, m, l, s, k, iterations) in [
        (&["--layers", "6"][..], 4, 6, 4, 2, 7),
        (
            &["--layers", "5", "--stages", "2", "--repeats", "2"],
            4,
            5,
            2,
            2,
            9,
        ),
    ] {
        let mut args = vec!["compile", &model, "--report=json"];
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        let r: serde_json::Value = serde_json::from_str(&out).expect("report");
        let want = 1.0 - f64::from(m * l) / f64::from(iterations * s * k);
        let got = r["bubble_fraction"].as_f64().expect("bubble");
        assert!(
            (got - want).abs() < 1e-12,
            "{extra:?}: {got} against {want}"
        );
    }
    for extra in [
        &["--layers", "6"][..],
        &["--layers", "6", "--ranks", "2"],
        &["--layers", "6", "--ranks", "4"],
        &["--layers", "5", "--stages", "2", "--repeats", "2"],
        &["--layers", "3"],
    ] {
        let mut args = vec!["verify", &model, "--poison-bubbles"];
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
        assert_eq!(
            crate::common::json_last_line(&out)["max_abs_diff"],
            0.0,
            "{args:?}"
        );
        let mut args = vec!["verify", &model, "--grad"];
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
    }
    let dir = scratch("uneven");
    let mut runs = Vec::new();
    for ranks in [1u64, 2] {
        let exe = dir.join(format!("gpt2_{ranks}"));
        build(
            "examples/gpt2.ppc",
            &exe,
            ranks,
            &["--train", "--layers", "6"],
        );
        let ckpt = dir
            .join(format!("{ranks}.safetensors"))
            .display()
            .to_string();
        let l = launch(
            &exe,
            Some(ranks),
            &["--steps", "6", "--json", "--save", &ckpt],
            &[],
        );
        assert_eq!(l.code, 0, "{}", l.stderr);
        runs.push((
            json_losses(&l.stdout),
            std::fs::read(&ckpt).expect("checkpoint"),
        ));
        let bytes = &runs[runs.len() - 1].1;
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header = String::from_utf8_lossy(&bytes[8..8 + n]).into_owned();
        assert!(
            header.contains("layers.5.w1") && !header.contains("layers.6."),
            "6 layers"
        );
        let (code, out, err) = ppc(&["run", &model, "--layers", "6", "--params", &ckpt]);
        assert_eq!(code, 0, "the checkpoint as --params: {err}");
        // The summary names the file the weights came from, not a seed that drew none.
        let origin = format!("parameters from {ckpt}, inputs of seed 0)");
        assert!(out.contains(&origin), "{out}");
        // 6 layers on 4 stages of k = 2, M = 4: 24 of the 7·4·2 layer slots run a layer.
        assert!(
            out.contains("bubble      57.1% of the loop's layer slots idle"),
            "{out}"
        );
    }
    assert_eq!(runs[0], runs[1], "1 and 2 ranks");
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// A parameter the loss does not depend on has a gradient of rounding alone, which two
/// summation orders (all microbatches in one reduction, or one by one) leave different:
/// `wpe` under a `layernorm` over the batch axis, along which it is constant. `verify --grad`
/// measures each gradient against the whole gradient's scale, so it passes; measured against
/// its own largest value it failed (9.8% apart, interpreted; 61%, compiled).
#[test]
fn a_gradient_that_is_rounding_alone_verifies() {
    let text = std::fs::read_to_string(root().join("examples/gpt2.ppc")).expect("model");
    let sum = "  %x = add %tok, %wpe\n";
    assert!(text.contains(sum), "examples/gpt2.ppc's @embed changed");
    let normed = "  %x0 = add %tok, %wpe\n  %x = layernorm %x0, axis = 0, eps = 1e-5\n";
    let dir = scratch("rounding-alone");
    let file = dir.join("gpt2_ln_batch.ppc");
    std::fs::write(&file, text.replace(sum, normed)).expect("write");
    let file = file.display().to_string();
    for backend in ["interp", "cpu"] {
        let (code, out, err) = ppc(&["verify", "--grad", &file, "--backend", backend]);
        assert_eq!(code, 0, "{backend}: {out}{err}");
    }
}
