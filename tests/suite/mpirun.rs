//! Executables under `mpirun.mpich`: the stage axis split over 1, 2 and 4 ranks gives the same
//! output file byte for byte (every example, f32 and bf16, linear and circular), each rank sees
//! the world size it was launched with, and every fault (wrong rank count, bad input on rank 0,
//! a rank that dies) ends the whole job promptly with a message and a non-zero exit.

use crate::common::{json_losses, path, ppc};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The launcher: MPICH's, named explicitly (a mismatched `mpirun` gives N silent singletons).
const MPIRUN: &str = "mpirun.mpich";
/// No launch may take longer than this; `timeout` kills it, and the test fails.
const LIMIT: Duration = Duration::from_secs(60);

pub(crate) fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ppc-mpi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn small_dims(model: &str) -> Vec<&'static str> {
    match model {
        "examples/mlp.ppc" => vec!["--dim", "b=2", "--dim", "d=32", "--dim", "h=64"],
        "examples/transformer.ppc" => vec!["--dim", "b=2", "--dim", "t=4"],
        _ => vec!["--dim", "b=2"],
    }
}

/// `ppc compile MODEL -o exe --ranks R` with small dimensions and `extra` flags. LLVM at O0
/// except for the MLP: optimizing the transformer takes seconds, and the test is about meaning.
pub(crate) fn build(model: &str, exe: &Path, ranks: u64, extra: &[&str]) {
    let (file, exe_s, r) = (path(model), exe.display().to_string(), ranks.to_string());
    let mut args = vec!["compile", &file, "-o", &exe_s, "--ranks", &r];
    if model != "examples/mlp.ppc" {
        args.extend(["--opt-level", "0"]);
    }
    args.extend(small_dims(model));
    args.extend(extra);
    let (code, out, err) = ppc(&args);
    assert_eq!(code, 0, "ppc {args:?}\n{out}\n{err}");
}

pub(crate) struct Launch {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    took: Duration,
}

/// `mpirun.mpich -n RANKS exe ARGS` (or plain `exe ARGS` with `ranks: None`) under `timeout`.
pub(crate) fn launch(
    exe: &Path,
    ranks: Option<u64>,
    args: &[&str],
    env: &[(&str, &str)],
) -> Launch {
    launch_with(&[], exe, ranks, args, env)
}

/// As [`launch`], with `flags` for `mpirun.mpich` (e.g. `-prepend-rank`: each line of output
/// begins with `[RANK] `).
fn launch_with(
    flags: &[&str],
    exe: &Path,
    ranks: Option<u64>,
    args: &[&str],
    env: &[(&str, &str)],
) -> Launch {
    let mut cmd = Command::new("timeout");
    cmd.arg(LIMIT.as_secs().to_string());
    if let Some(n) = ranks {
        cmd.arg(MPIRUN).args(flags).args(["-n", &n.to_string()]);
    }
    cmd.arg(exe).args(args).envs(env.iter().copied());
    let start = Instant::now();
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {MPIRUN} (install mpich): {e}"));
    let l = Launch {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        took: start.elapsed(),
    };
    assert_ne!(
        l.code, 124,
        "{exe:?} {args:?} hung: killed after {LIMIT:?}\n{}",
        l.stderr
    );
    l
}

/// Rank 0's benchmark line.
pub fn bench_json(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in\n{stdout}"));
    serde_json::from_str(line).expect("valid JSON")
}

/// For each configuration, the outputs of 1, 2 and 4 ranks (those dividing the stages) are
/// the same bytes, and each rank reports the world size it was launched with.
pub(crate) fn identical_across_ranks(model: &str, stages: u64) {
    let dir = scratch(&model.replace(['/', '.'], "_"));
    for extra in [
        &[][..],
        &["--repeats", "2"],
        &["--dtype", "bf16"],
        &["--dtype", "bf16", "--repeats", "2"],
    ] {
        let mut first: Option<Vec<u8>> = None;
        for ranks in [1u64, 2, 4]
            .into_iter()
            .filter(|r| stages.is_multiple_of(*r))
        {
            let what = format!("{model} {extra:?} on {ranks} ranks");
            let exe = dir.join(format!("model_{ranks}"));
            build(model, &exe, ranks, extra);
            let out = dir.join(format!("out_{ranks}.safetensors"));
            let out_s = out.display().to_string();
            let l = launch(
                &exe,
                Some(ranks),
                &["--seed", "11", "--output", &out_s, "--bench", "1"],
                &[],
            );
            assert_eq!(l.code, 0, "{what}\n{}\n{}", l.stdout, l.stderr);
            let j = bench_json(&l.stdout);
            assert_eq!(j["ranks"], ranks, "{what}: {j}");
            let per_rank = j["per_rank"].as_array().expect("per_rank");
            assert_eq!(per_rank.len() as u64, ranks, "{what}: {j}");
            for (i, r) in per_rank.iter().enumerate() {
                assert_eq!(r["rank"], i, "{what}: {j}");
                assert_eq!(
                    r["world_size"], ranks,
                    "{what}: rank {i} saw another world: {j}"
                );
                assert!(
                    r["exchange_wait_s"].as_f64().is_some_and(|w| w >= 0.0),
                    "{what}: {j}"
                );
            }
            let bytes = std::fs::read(&out).expect("the last rank wrote --output");
            match &first {
                None => first = Some(bytes),
                Some(want) => assert!(*want == bytes, "{what}: output differs from 1 rank's"),
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A layer whose dimensions are pipeline settings (`ranks` and `stages_per_rank` among them,
/// so each rank count is another model): on 1, 2 and 4 ranks, linear and circular, the
/// executable writes the interpreter's sequential result, byte for byte.
#[test]
fn pipeline_settings_as_layer_dimensions_match_the_interpreter_on_1_2_and_4_ranks() {
    let model = "tests/models/settings_as_dims.ppc";
    let dir = scratch("settings_as_dims");
    for repeats in ["1", "2"] {
        for ranks in [1u64, 2, 4] {
            let what = format!("{model} --repeats {repeats} on {ranks} ranks");
            let exe = dir.join("model");
            build(model, &exe, ranks, &["--repeats", repeats, "--exact"]);
            let out = dir.join("out.safetensors");
            let out_s = out.display().to_string();
            let l = launch(&exe, Some(ranks), &["--seed", "3", "--output", &out_s], &[]);
            assert_eq!(l.code, 0, "{what}\n{}", l.stderr);
            let want = dir.join("want.safetensors");
            let (file, want_s, r) = (path(model), want.display().to_string(), ranks.to_string());
            let args = [
                "run",
                &file,
                "--backend",
                "interp",
                "--seed",
                "3",
                "--output",
                &want_s,
            ];
            let mut args = args.to_vec();
            args.extend(["--ranks", &r, "--repeats", repeats, "--dim", "b=2"]);
            let (code, _, err) = ppc(&args);
            assert_eq!(code, 0, "{what}: {err}");
            assert!(
                std::fs::read(&out).expect("output") == std::fs::read(&want).expect("want"),
                "{what}: the executable and the interpreter disagree"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Under mpirun the trace has one process per rank, each with the whole loop.
#[test]
fn traces_cover_every_rank() {
    let dir = scratch("trace");
    let exe = dir.join("model");
    build("examples/mlp.ppc", &exe, 2, &[]);
    let trace = dir.join("trace.json");
    let l = launch(
        &exe,
        Some(2),
        &["--steps", "2", "--trace", &trace.display().to_string()],
        &[],
    );
    assert_eq!(l.code, 0, "{}", l.stderr);
    crate::cli_runs::assert_trace(&trace, 2, 2, 4 + 8 - 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// f16 executables, and an input file read by rank 0: the same bytes on 1, 2 and 4 ranks; each
/// rank's compute and waiting add up to its step, and the bubble it measured is the loop's.
#[test]
fn f16_and_input_files_are_byte_identical_across_ranks() {
    use ppc_runtime::{memref::HostBuffer, safetensors, DType, Tensor};
    let model = "examples/mlp.ppc";
    let dir = scratch("f16_input");
    let input = dir.join("in.safetensors");
    let x = Tensor::new(
        DType::F16,
        vec![8, 2, 32],
        (0..512).map(|i| (i as f32 * 0.37).sin()).collect(),
    );
    safetensors::write(&input, &[("input", &HostBuffer::from_tensor(&x))]).expect("input");
    let input_s = input.display().to_string();
    let (file, report_args) = (path(model), small_dims(model));
    let mut args = vec!["compile", file.as_str(), "--report=json", "--dtype", "f16"];
    args.extend(report_args);
    let (_, report, _) = ppc(&args);
    let report: serde_json::Value = serde_json::from_str(&report).expect("report");
    let mut first: Option<Vec<u8>> = None;
    for ranks in [1u64, 2, 4] {
        let exe = dir.join(format!("model_{ranks}"));
        build(model, &exe, ranks, &["--dtype", "f16"]);
        let out = dir.join(format!("out_{ranks}.safetensors"));
        let out_s = out.display().to_string();
        let l = launch(
            &exe,
            Some(ranks),
            &["--input", &input_s, "--output", &out_s, "--bench", "2"],
            &[],
        );
        assert_eq!(l.code, 0, "{ranks} ranks: {}", l.stderr);
        let j = bench_json(&l.stdout);
        for r in j["per_rank"].as_array().expect("per_rank") {
            let f = |k: &str| r[k].as_f64().expect("number");
            let (step, compute, wait) = (f("median_step_s"), f("compute_s"), f("exchange_wait_s"));
            assert!(
                (compute + wait - step).abs() <= 1e-12 * step.max(1.0),
                "{j}"
            );
            assert!(wait >= 0.0 && (ranks > 1 || wait == 0.0), "{j}");
            assert_eq!(
                r["measured_bubble"], report["bubble_fraction"],
                "{ranks} ranks: {j}"
            );
        }
        let bytes = std::fs::read(&out).expect("output");
        match &first {
            None => first = Some(bytes),
            Some(want) => assert!(
                *want == bytes,
                "{ranks} ranks: output differs from 1 rank's"
            ),
        }
    }
    // The file's input is the one used: `ppc run` on it writes the same bytes.
    let jit = dir.join("jit.safetensors");
    let jit_s = jit.display().to_string();
    let mut args = vec!["run", file.as_str(), "--dtype", "f16", "--input", &input_s];
    args.extend(["--output", jit_s.as_str()]);
    args.extend(small_dims(model));
    let (code, _, err) = ppc(&args);
    assert_eq!(code, 0, "{err}");
    let want = std::fs::read(&jit).expect("jit output");
    assert!(
        first == Some(want),
        "the executables did not compute on the input file"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tiny_is_byte_identical_on_1_and_2_ranks() {
    identical_across_ranks("examples/tiny.ppc", 2);
}

#[test]
fn mlp_is_byte_identical_on_1_2_and_4_ranks() {
    identical_across_ranks("examples/mlp.ppc", 4);
}

#[test]
fn transformer_is_byte_identical_on_1_2_and_4_ranks() {
    identical_across_ranks("examples/transformer.ppc", 4);
}

/// Asserts a fault ended the job: non-zero exit, promptly, and `message` on stderr `times` times.
fn assert_ends(l: &Launch, message: &str, times: usize, what: &str) {
    assert_ne!(l.code, 0, "{what}: exit 0\n{}", l.stderr);
    assert!(
        l.took < Duration::from_secs(20),
        "{what}: took {:?}",
        l.took
    );
    assert_eq!(
        l.stderr.matches(message).count(),
        times,
        "{what}: expected {message:?} {times} times in\n{}",
        l.stderr
    );
}

#[test]
fn faults_end_the_whole_job_promptly() {
    let dir = scratch("faults");
    let exe = dir.join("model");
    build("examples/mlp.ppc", &exe, 2, &[]);
    let mismatch = "compiled for 2 ranks (ppc compile --ranks 2) but launched on";
    // 3 ranks do not divide the 4 stages; 4 do, but the program was built for 2.
    for n in [3, 4] {
        let l = launch(&exe, Some(n), &[], &[]);
        assert_ends(&l, mismatch, n as usize, &format!("launched on {n} ranks"));
    }
    let l = launch(&exe, None, &[], &[]);
    assert_ends(&l, mismatch, 1, "launched without mpirun");

    let missing = dir.join("missing.safetensors").display().to_string();
    let l = launch(&exe, Some(2), &["--input", &missing], &[]);
    assert_ends(&l, "(rank 0 of 2): error: cannot read", 1, "missing input");
    let bad = dir.join("bad.safetensors");
    std::fs::write(&bad, b"not a safetensors file").expect("write");
    let bad_s = bad.display().to_string();
    let l = launch(&exe, Some(2), &["--input", &bad_s], &[]);
    assert_ends(&l, "is not a valid safetensors file", 1, "malformed input");

    let out = dir.join("out.safetensors");
    let out_s = out.display().to_string();
    for dying in ["0", "1"] {
        let l = launch(
            &exe,
            Some(2),
            &["--steps", "3", "--output", &out_s],
            &[("PPC_FAULT_RANK", dying)],
        );
        assert_ends(&l, "dying on purpose", 1, &format!("rank {dying} dies"));
        assert!(
            !out.exists(),
            "rank {dying} died, yet an output was written"
        );
    }

    let (code, _, err) = ppc(&[
        "compile",
        &path("examples/mlp.ppc"),
        "--ranks",
        "3",
        "-o",
        &exe.display().to_string(),
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("3 ranks do not divide 4 stages"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A diverging run stops on every rank at the same step: each of 4 ranks says so, none is
/// aborted or left waiting, and rank 0 (not the last rank, which computes the loss) printed
/// every finite loss before it.
#[test]
fn diverging_training_stops_every_rank_at_the_same_step() {
    let dir = scratch("diverge");
    let exe = dir.join("mlp_4");
    build("examples/mlp.ppc", &exe, 4, &["--train"]);
    let args = [
        "--steps",
        "20",
        "--json",
        "--optimizer",
        "sgd",
        "--lr",
        "1e30",
    ];
    let l = launch_with(&["-prepend-rank"], &exe, Some(4), &args, &[]);
    assert_ends(&l, ": the loss is ", 4, "diverging on 4 ranks");
    assert!(
        !l.stderr.contains("MPI_Abort"),
        "every rank knew: none had to abort the job\n{}",
        l.stderr
    );
    let said: Vec<&str> = l
        .stderr
        .lines()
        .filter(|x| x.contains("error: step "))
        .collect();
    for rank in 0..4 {
        assert!(
            said.iter()
                .any(|x| x.contains(&format!("(rank {rank} of 4)"))),
            "rank {rank} did not say it stopped:\n{}",
            l.stderr
        );
    }
    let steps: std::collections::BTreeSet<Option<&str>> = said
        .iter()
        .map(|x| x.split("error: step ").nth(1)?.split(':').next())
        .collect();
    assert_eq!(
        steps.len(),
        1,
        "ranks stopped at different steps:\n{}",
        l.stderr
    );
    let stopped: usize = steps
        .into_iter()
        .next()
        .flatten()
        .and_then(|s| s.parse().ok())
        .expect("a step number");
    let printed: Vec<&str> = l
        .stdout
        .lines()
        .filter(|x| x.contains("\"loss\""))
        .collect();
    assert!(
        printed.iter().all(|x| x.starts_with("[0] ")),
        "a rank other than 0 printed a loss:\n{}",
        l.stdout
    );
    let losses = json_losses(&l.stdout.replace("[0] ", ""));
    assert!(
        stopped > 1,
        "diverged at once, nothing to compare:\n{}",
        l.stderr
    );
    assert_eq!(
        losses.len(),
        stopped - 1,
        "one line per step before:\n{}",
        l.stdout
    );
    assert!(losses.iter().all(|x| x.is_finite()), "{losses:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Training under mpirun: N steps on 1, 2 and 4 ranks write the same checkpoint bytes (linear
/// and circular), a checkpoint resumes on another rank count to the same bytes as a run without
/// a break, and the transformer's loss falls on 2 ranks.
#[test]
fn training_checkpoints_are_byte_identical_on_1_2_and_4_ranks_and_resume_on_any() {
    let dir = scratch("train");
    for extra in [&[][..], &["--repeats", "2"]] {
        let ckpt = |name: &str| {
            dir.join(format!("{name}.safetensors"))
                .display()
                .to_string()
        };
        let mut exes = Vec::new();
        for ranks in [1u64, 2, 4] {
            let exe = dir.join(format!("mlp_{ranks}"));
            let mut flags = vec!["--train"];
            flags.extend(extra);
            build("examples/mlp.ppc", &exe, ranks, &flags);
            let whole = ckpt(&format!("whole_{ranks}"));
            let l = launch(&exe, Some(ranks), &["--steps", "4", "--save", &whole], &[]);
            assert_eq!(l.code, 0, "{extra:?} on {ranks} ranks\n{}", l.stderr);
            exes.push((ranks, exe));
        }
        let read = |p: String| std::fs::read(p).expect("checkpoint");
        let want = read(ckpt("whole_1"));
        for ranks in [2, 4] {
            assert!(
                read(ckpt(&format!("whole_{ranks}"))) == want,
                "{extra:?}: {ranks} ranks wrote other bytes"
            );
        }
        // 2 steps on 4 ranks, then 2 more on 2 ranks.
        let (half, resumed) = (ckpt("half"), ckpt("resumed"));
        let l = launch(&exes[2].1, Some(4), &["--steps", "2", "--save", &half], &[]);
        assert_eq!(l.code, 0, "{}", l.stderr);
        let l = launch(
            &exes[1].1,
            Some(2),
            &["--steps", "2", "--resume", &half, "--save", &resumed],
            &[],
        );
        assert_eq!(l.code, 0, "{}", l.stderr);
        assert!(
            read(resumed) == want,
            "{extra:?}: resuming on another rank count changed the weights"
        );
    }
    let exe = dir.join("transformer_2");
    build("examples/transformer.ppc", &exe, 2, &["--train"]);
    let saved = dir.join("transformer.safetensors").display().to_string();
    let args = ["--steps", "40", "--json", "--lr", "2e-3", "--save", &saved];
    let l = launch(&exe, Some(2), &args, &[]);
    assert_eq!(l.code, 0, "{}", l.stderr);
    let losses = json_losses(&l.stdout);
    assert_eq!(
        losses.len(),
        40,
        "one line per step, from the last rank only:\n{}",
        l.stdout
    );
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&losses[..8]), mean(&losses[32..]));
    assert!(
        last < 0.8 * first,
        "transformer on 2 ranks: loss {first} -> {last}"
    );
    // Resumed on 4 ranks, it goes on from where it was, not from the start.
    let exe4 = dir.join("transformer_4");
    build("examples/transformer.ppc", &exe4, 4, &["--train"]);
    let args = ["--steps", "8", "--json", "--lr", "2e-3", "--resume", &saved];
    let l = launch(&exe4, Some(4), &args, &[]);
    assert_eq!(l.code, 0, "{}", l.stderr);
    let resumed = json_losses(&l.stdout);
    assert!(
        l.stdout.contains("\"step\":41"),
        "the step count goes on:\n{}",
        l.stdout
    );
    assert!(
        mean(&resumed) < 0.8 * first,
        "resumed on 4 ranks: loss {}",
        mean(&resumed)
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// Data × pipeline parallel: 2 replicas of a 2-rank pipeline, 8 microbatches each, train like
/// one pipeline on the same 16 microbatches (up to summation order), and the same bits on
/// every run.
#[test]
fn replicas_train_like_one_pipeline_on_all_their_microbatches() {
    use ppc_runtime::memref::HostBuffer;
    use ppc_runtime::{Init, Rng, Tensor};
    let dir = scratch("replicas");
    // 64 rows of [b=2, d=32] inputs, targets half of them.
    let x = Rng::stream(5, "data", 0).fill(Init::Normal(1.0), 64 * 2 * 32);
    let y: Vec<f32> = x.iter().map(|v| 0.5 * v).collect();
    let buf = |v: Vec<f32>| {
        HostBuffer::from_tensor(&Tensor::new(ppc_runtime::DType::F32, vec![64, 2, 32], v))
    };
    let data = dir.join("data.safetensors");
    ppc_runtime::safetensors::write(&data, &[("input", &buf(x)), ("target", &buf(y))])
        .expect("data");
    let data_s = data.display().to_string();
    let (replicated, single) = (dir.join("replicated"), dir.join("single"));
    build(
        "examples/mlp.ppc",
        &replicated,
        2,
        &["--train", "--replicas", "2"],
    );
    build(
        "examples/mlp.ppc",
        &single,
        1,
        &["--train", "--microbatches", "16"],
    );
    let ckpt = |n: &str| dir.join(format!("{n}.safetensors")).display().to_string();
    let train = |exe: &Path, ranks, name: &str| {
        let args = [
            "--steps",
            "3",
            "--data",
            &data_s,
            "--json",
            "--save",
            &ckpt(name),
        ];
        let l = launch(exe, Some(ranks), &args, &[]);
        assert_eq!(l.code, 0, "{name}: {}", l.stderr);
        let losses = json_losses(&l.stdout);
        assert_eq!(
            losses.len(),
            3,
            "{name}: one line per step, from one rank:\n{}",
            l.stdout
        );
        losses
    };
    let a = train(&replicated, 4, "a");
    train(&replicated, 4, "b");
    let one = train(&single, 1, "one");
    for (r, s) in a.iter().zip(&one) {
        assert!(
            (r - s).abs() <= 1e-5 * s.abs(),
            "losses {a:?} against one pipeline's {one:?}"
        );
    }
    let read = |n: &str| std::fs::read(ckpt(n)).expect("checkpoint");
    assert!(
        read("a") == read("b"),
        "two runs of the replicas wrote different bytes"
    );
    let tensors = |n: &str| ppc_runtime::safetensors::decode(&read(n)).expect("safetensors");
    for ((name, r), (_, s)) in tensors("a").iter().zip(&tensors("one")) {
        let (r, s) = (r.to_tensor(), s.to_tensor());
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for (p, q) in r.data.iter().zip(&s.data) {
            num += f64::from(p - q).powi(2);
            den += f64::from(*q).powi(2);
        }
        assert!(
            num.sqrt() <= 1e-4 * den.sqrt().max(1e-30),
            "{name}: the replicas' weights drift from one pipeline's"
        );
    }
    // A launch on the wrong process count says how to launch it.
    let l = launch(&replicated, Some(2), &["--steps", "1"], &[]);
    assert_ne!(l.code, 0);
    assert!(
        l.stderr.contains("2 replicas of 2 ranks") && l.stderr.contains("-n 4"),
        "{}",
        l.stderr
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}
