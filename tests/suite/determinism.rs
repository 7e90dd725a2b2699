//! The same bytes whatever runs them: at the examples' real shapes, forward outputs (f32 and
//! bf16) and the checkpoints of 10 training steps (GPT-2's also in bf16) are identical on 1, 2 and 3 threads and on 1, 2 and 4
//! ranks, with the runtime's native GEMM dispatch and with the AVX2-only path forced
//! (`PPC_CPU_DISABLE` hides AVX-512, so an AVX-512 machine runs what an AVX2 machine runs), and
//! a checkpoint resumed on another rank count reproduces the run without a break. An
//! executable for the x86-64 baseline gives the same bytes again with AVX2 and FMA hidden too
//! (the runtime's portable GEMM path). The GEMMs' sums do not depend on how a product is cut
//! (`runtime/src/sgemm.rs`), so no thread count, rank count or CPU changes a bit; nor does
//! compiling an executable's code in partitions (`compiler/src/lower/partition.rs`).

use crate::common::path;
use crate::mpirun::{launch, scratch};
use std::path::{Path, PathBuf};

/// AVX-512 hidden: the runtime's AVX2 kernels, as an AVX2-only node runs them.
const AVX2_ONLY: &str = "avx512f,avx512bw,avx512cd,avx512dq,avx512vl";

/// One way to run an executable: its rank count, threads per rank and hidden CPU features.
struct Run<'a> {
    ranks: u64,
    threads: u64,
    disable: Option<&'a str>,
}

/// The runs every configuration is compared over: 1 rank on 1, 2 and 3 threads; 2 and 4
/// ranks on 1 to 3 threads each; each again with AVX-512 hidden and `OPENBLAS_CORETYPE=Haswell`,
/// as an AVX2-only node runs them. Where this CPU has no AVX-512 to hide, those runs differ from
/// the others only by the environment, so 1, 2 and 4 ranks (on 1, 3 and 2 threads) cover it.
fn runs() -> Vec<Run<'static>> {
    let all = [(1, 1), (1, 2), (1, 3), (2, 1), (2, 3), (4, 1), (4, 2)];
    let hidden: &[(u64, u64)] = match std::is_x86_feature_detected!("avx512f") {
        true => &all,
        false => &[(1, 1), (2, 3), (4, 2)],
    };
    let run = |disable| {
        move |&(ranks, threads): &(u64, u64)| Run {
            ranks,
            threads,
            disable,
        }
    };
    (all.iter().map(run(None)))
        .chain(hidden.iter().map(run(Some(AVX2_ONLY))))
        .collect()
}

/// `ppc compile MODEL -o DIR/NAME` with `flags`, at the model file's own dimensions.
fn build(model: &str, dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let (file, exe_s) = (path(model), exe.display().to_string());
    let mut args = vec!["compile", file.as_str(), "-o", exe_s.as_str()];
    args.extend(flags);
    let (code, out, err) = crate::common::ppc(&args);
    assert_eq!(code, 0, "ppc {args:?}\n{out}\n{err}");
    exe
}

/// Runs `exe` (built for `run.ranks` ranks) as `run` says with `args`, and returns the bytes
/// of the file it writes at `out`.
fn bytes_of(exe: &Path, run: &Run, args: &[&str], out: &Path) -> Vec<u8> {
    let threads = run.threads.to_string();
    let mut env = vec![("PPC_NUM_THREADS", threads.as_str())];
    if let Some(hidden) = run.disable {
        // As an AVX2 node runs it; OpenBLAS's Haswell kernels too, should anything link it
        // again (executables do not today).
        env.push(("PPC_CPU_DISABLE", hidden));
        env.push(("OPENBLAS_CORETYPE", "Haswell"));
    }
    let ranks = (run.ranks > 1).then_some(run.ranks);
    let l = launch(exe, ranks, args, &env);
    let what = format!(
        "{exe:?} {args:?} on {} ranks × {} threads, hidden {:?}",
        run.ranks, run.threads, run.disable
    );
    assert_eq!(l.code, 0, "{what}\n{}\n{}", l.stdout, l.stderr);
    std::fs::read(out).unwrap_or_else(|e| panic!("{what}: no {out:?}: {e}"))
}

/// Forward outputs of the examples, and the checkpoints after 10 training steps (GPipe,
/// `--schedule 1f1b` under `--remat stage` and `tick`, and `zb-h1`, the same bytes as each
/// other; circular GPipe and interleaved 1F1B, likewise), are the same bytes in every run of
/// [`runs`]; so is the transformer's training at a
/// shape where one rank lowers its backward differently from two and four.
#[test]
fn outputs_and_checkpoints_are_the_same_bytes_on_any_threads_ranks_and_dispatch() {
    let dir = scratch("determinism");
    let out = dir.join("out.safetensors");
    let out_s = out.display().to_string();
    let forward = ["--seed", "5", "--output", out_s.as_str()];
    let training = ["--seed", "5", "--steps", "10", "--save", out_s.as_str()];
    // The transformer also at a shape whose stage input on one rank is 16 K floats: its
    // backward's stages run in turn, each op on every thread, where 2 and 4 ranks (8 K and 4 K)
    // run them in parallel, one per thread (`lower/stage_split.rs`).
    let larger = [
        "--dim", "b=4", "--dim", "t=32", "--dim", "heads=4", "--dim", "dh=8",
    ];
    // The MLP with two layers per stage: its backward's layer loop computes each weight
    // gradient's GEMM in its slice of the carried gradient (`lower/plan.rs`), under GPipe and
    // ZB-H1 (on 4 ranks a `call_if` that adds into the accumulators in its test).
    let layered = ["--layers-per-stage", "2"];
    let models: [(&str, &[&str]); 6] = [
        ("examples/mlp.ppc", &[]),
        ("examples/mlp.ppc", &layered),
        ("examples/transformer.ppc", &[]),
        ("examples/transformer.ppc", &larger),
        ("examples/gpt2.ppc", &[]),
        ("examples/llama.ppc", &[]),
    ];
    for (model, dims) in models {
        let mut gpipe = None;
        for (mode, args) in [
            ("forward", &forward[..]),
            ("bf16", &forward[..]),
            ("train", &training[..]),
            ("train_bf16", &training[..]),
            ("1f1b", &training[..]),
            ("1f1b_tick", &training[..]),
            ("zb-h1", &training[..]),
            ("circular", &training[..]),
            ("interleaved", &training[..]),
        ] {
            // 1F1B on the MLP and GPT-2 (ends, a tied embedding) only, with `--remat tick`
            // (its recomputation's residuals carried in place) on GPT-2, and ZB-H1 on the
            // transformer (two layers per stage: its layer loop cut into B's and W's), to bound
            // CI's time; the larger transformer trains under GPipe only.
            let one_f_one_b = ["examples/mlp.ppc", "examples/gpt2.ppc"].contains(&model);
            let skip = match mode {
                _ if dims == layered => !["train", "zb-h1"].contains(&mode),
                _ if !dims.is_empty() => mode != "train",
                "1f1b" => !one_f_one_b,
                "1f1b_tick" => model != "examples/gpt2.ppc",
                // GPT-2's tied embedding: its gradient's two uses, on one rank or on two, in
                // bf16 (`passes/autodiff.rs`'s `add`).
                "train_bf16" => model != "examples/gpt2.ppc",
                "zb-h1" => model != "examples/transformer.ppc",
                // A circular pipeline on the MLP: on 4 ranks one stage each, which picks its
                // repeat's weights as views and adds its gradients into their slice in place.
                "circular" | "interleaved" => model != "examples/mlp.ppc",
                _ => false,
            };
            if skip {
                continue;
            }
            let exes: Vec<(u64, PathBuf)> = [1u64, 2, 4]
                .into_iter()
                .map(|ranks| {
                    let r = ranks.to_string();
                    let mut flags = vec!["--ranks", r.as_str()];
                    flags.extend(dims);
                    match mode {
                        "train" => flags.push("--train"),
                        "train_bf16" => flags.extend(["--train", "--dtype", "bf16"]),
                        "1f1b" => flags.extend(["--train", "--schedule", "1f1b"]),
                        "1f1b_tick" => {
                            flags.extend(["--train", "--schedule", "1f1b", "--remat", "tick"])
                        }
                        "zb-h1" => flags.extend(["--train", "--schedule", "zb-h1"]),
                        "circular" => flags.extend(["--train", "--repeats", "2"]),
                        "interleaved" => {
                            flags.extend(["--train", "--schedule", "1f1b", "--repeats", "2"])
                        }
                        "bf16" => flags.extend(["--dtype", "bf16"]),
                        _ => {}
                    }
                    (
                        ranks,
                        build(model, &dir, &format!("{mode}_{ranks}"), &flags),
                    )
                })
                .collect();
            let exe_for = |ranks: u64| &exes.iter().find(|(r, _)| *r == ranks).expect("built").1;
            let mut first: Option<Vec<u8>> = None;
            for run in runs() {
                let got = bytes_of(exe_for(run.ranks), &run, args, &out);
                match &first {
                    None => first = Some(got),
                    Some(want) => assert!(
                        *want == got,
                        "{model} {dims:?} {mode}: {} ranks × {} threads (hidden {:?}) wrote other bytes \
                         than 1 rank × 1 thread",
                        run.ranks,
                        run.threads,
                        run.disable
                    ),
                }
            }
            // The 1F1B and ZB-H1 steps give GPipe's checkpoint; interleaved 1F1B circular
            // GPipe's.
            match mode {
                "train" | "circular" => gpipe = first.clone(),
                "1f1b" | "1f1b_tick" | "zb-h1" | "interleaved" => {
                    assert!(
                        first == gpipe,
                        "{model} {dims:?} {mode}: the checkpoint is not GPipe's"
                    )
                }
                _ => {}
            }
            if mode == "train" {
                // 5 steps on 4 ranks, then 5 more on 2 ranks with 3 threads each.
                let half = dir.join("half.safetensors").display().to_string();
                let four = Run {
                    ranks: 4,
                    threads: 1,
                    disable: None,
                };
                let args = ["--seed", "5", "--steps", "5", "--save", half.as_str()];
                bytes_of(exe_for(4), &four, &args, Path::new(&half));
                let two = Run {
                    ranks: 2,
                    threads: 3,
                    disable: Some(AVX2_ONLY),
                };
                let args = [
                    "--seed",
                    "5",
                    "--steps",
                    "5",
                    "--resume",
                    half.as_str(),
                    "--save",
                    out_s.as_str(),
                ];
                let resumed = bytes_of(exe_for(2), &two, &args, &out);
                assert!(
                    first.as_ref() == Some(&resumed),
                    "{model} {dims:?}: resuming on another rank count changed the checkpoint"
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// An executable for the x86-64 baseline runs the runtime's portable GEMM (scalar fused
/// multiply-adds) where AVX2 and FMA are hidden, and its AVX2 kernels where they are not: the
/// same bytes, forward and after training steps.
#[test]
fn the_portable_gemm_path_gives_the_bytes_of_the_vector_kernels() {
    let dir = scratch("determinism-portable");
    let out = dir.join("out.safetensors");
    let out_s = out.display().to_string();
    for (flags, args) in [
        (&[][..], &["--seed", "2", "--output", out_s.as_str()][..]),
        (
            &["--train"][..],
            &["--steps", "2", "--save", out_s.as_str()][..],
        ),
    ] {
        let mut all = vec!["--target-cpu", "x86-64"];
        all.extend(flags);
        let exe = build("examples/mlp.ppc", &dir, "baseline", &all);
        let run = |disable| Run {
            ranks: 1,
            threads: 2,
            disable,
        };
        let native = bytes_of(&exe, &run(None), args, &out);
        let hidden = format!("{AVX2_ONLY},avx2,fma");
        let portable = bytes_of(&exe, &run(Some(&hidden)), args, &out);
        assert!(
            native == portable,
            "mlp {flags:?}: the portable GEMM path wrote other bytes"
        );
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// An executable's code compiled in partitions, in parallel (the default), computes what the
/// module compiled whole computes: the same checkpoint bytes after training steps, from
/// executables that differ (so the cut happened).
#[test]
fn code_compiled_in_partitions_gives_the_bytes_of_the_whole_module() {
    let dir = scratch("determinism-partitions");
    let out = dir.join("ckpt.safetensors");
    let out_s = out.display().to_string();
    let args = ["--steps", "3", "--save", out_s.as_str()];
    let run = Run {
        ranks: 1,
        threads: 2,
        disable: None,
    };
    let whole = build(
        "examples/transformer.ppc",
        &dir,
        "whole",
        &["--train", "--codegen-partitions", "1"],
    );
    let parts = build("examples/transformer.ppc", &dir, "parts", &["--train"]);
    let read = |p: &Path| std::fs::read(p).expect("executable");
    assert!(
        read(&whole) != read(&parts),
        "the default compiled the training step whole: nothing was compared"
    );
    assert!(
        bytes_of(&whole, &run, &args, &out) == bytes_of(&parts, &run, &args, &out),
        "the partitioned executable trained to other bytes"
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}
