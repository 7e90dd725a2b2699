//! The CPU backend: the lowered MLIR (snapshots; verified by MLIR), JIT runs of every example
//! against the interpreter, and standalone executables from `ppc compile -o` with their
//! command-line errors. JIT at opt level 0 here: these tests check meaning, not speed.

use crate::common::{examples, json_last_line, load, path, ppc};
use ppc_dialect::interp::Interp;
use ppc_dialect::Overrides;
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::{safetensors, DType};
use std::path::PathBuf;
use std::process::Command;

pub(crate) fn small_dims(file: &str) -> Vec<&'static str> {
    let mut v = vec!["--dim", "b=2"];
    if file.ends_with("transformer.ppc") {
        v.extend(["--dim", "t=4"]);
    }
    if file.ends_with("mlp.ppc") {
        v.extend(["--dim", "d=32", "--dim", "h=64"]);
    }
    v
}

/// How often `marker` occurs in `ppc compile ARGS --emit=mlir`.
fn in_mlir(args: &[&str], marker: &str) -> usize {
    let mut all = vec!["compile"];
    all.extend(args);
    all.push("--emit=mlir");
    let (code, out, err) = ppc(&all);
    assert_eq!(code, 0, "{err}");
    out.matches(marker).count()
}

/// The stage-parallel loops (`lower/stage_split.rs`) of `ppc compile ARGS --emit=mlir`.
fn stage_parallel_loops(args: &[&str]) -> usize {
    in_mlir(args, "ppc.parallel_over = \"stages\"")
}

#[test]
fn small_stages_run_in_parallel_and_large_masked_ones_in_turn() {
    // The transformer example's stage input is [4 stages, b, t, d] = 8 K floats, too few for a
    // parallel loop per op: each call of a stage function (the forward's, the training step's
    // forward and backward, and the forward of the step without its gradients) is one loop
    // over the stages, every op inside on one stage.
    let transformer = path("examples/transformer.ppc");
    assert_eq!(stage_parallel_loops(&[&transformer]), 1);
    assert_eq!(stage_parallel_loops(&[&transformer, "--train"]), 3);
    assert_eq!(
        stage_parallel_loops(&[&transformer, "--train", "--remat", "none"]),
        3
    );
    // The backward's stage function masks every result it returns: its bubble stages skip it.
    // The forward's are read (shifted to the next stage), so they are computed.
    let skips = |extra: &[&str]| {
        in_mlir(
            &[&[transformer.as_str()], extra].concat(),
            "ppc.skips_bubbles",
        )
    };
    assert_eq!(skips(&[]), 0);
    assert_eq!(skips(&["--train"]), 1);
    assert_eq!(skips(&["--train", "--remat", "none"]), 1);
    // Bigger stages share each loop nest among the threads: the MLP (16 K floats) and the
    // transformer at b=8 t=128 (2 M). The transformer's backward, whose results are masked,
    // runs its stages in turn, a bubble stage skipping its body; its forward goes op by op.
    let mlp = path("examples/mlp.ppc");
    assert_eq!(stage_parallel_loops(&[&mlp]), 0);
    assert_eq!(stage_parallel_loops(&[&mlp, "--train"]), 0);
    let big = [
        "--dim", "b=8", "--dim", "t=128", "--dim", "heads=8", "--dim", "dh=32",
    ];
    // (parallel loops over stages, loops over stages in turn, those whose body skips bubbles)
    let in_turn = |extra: &[&str]| {
        let mut args = vec!["compile", transformer.as_str(), "--emit=mlir"];
        args.extend(big.iter().chain(extra));
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        let lines: Vec<&str> = out.lines().collect();
        let loops: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains("ppc.in_turn_over = \"stages\""))
            .collect();
        // A stage's body (outlined) ends with the `scf.if` on its mask.
        let skipping = loops.iter().filter(|&&i| {
            lines[i.saturating_sub(4)..i]
                .iter()
                .any(|l| l.contains("ppc.skips_bubbles"))
        });
        let parallel = out.matches("ppc.parallel_over = \"stages\"").count();
        (parallel, loops.len(), skipping.count())
    };
    assert_eq!(in_turn(&[]), (0, 0, 0));
    assert_eq!(in_turn(&["--train"]), (0, 1, 1));
    assert_eq!(in_turn(&["--train", "--remat", "none"]), (0, 1, 1));
    // The GPU keeps its own mapping of loop nests onto blocks and threads.
    assert_eq!(stage_parallel_loops(&[&transformer, "--target", "cuda"]), 0);
    let cuda = [
        &[transformer.as_str(), "--target", "cuda", "--train"],
        &big[..],
    ]
    .concat();
    assert_eq!(in_mlir(&cuda, "ppc.in_turn_over"), 0);
}

/// `ppc compile ARGS --emit=mlir` of the transformer at b=4 t=32 heads=4 dh=8 (4 stages: 64
/// entries of [32, 32] attention scores, 64 K in all; stage inputs of 16 K, not split by
/// stage): how many of its parallel loops run over batch entries (`lower/batch_split.rs`).
fn entry_loops(extra: &[&str]) -> usize {
    attention_mlir(extra)
        .matches("ppc.parallel_over = \"entries\"")
        .count()
}

/// The MLIR of the transformer example at [`ATTENTION_SHAPE`], with `extra` arguments.
fn attention_mlir(extra: &[&str]) -> String {
    let transformer = path("examples/transformer.ppc");
    let mut args = vec!["compile", transformer.as_str(), "--emit=mlir"];
    args.extend(ATTENTION_SHAPE);
    args.extend(extra);
    let (code, out, err) = ppc(&args);
    assert_eq!(code, 0, "{err}");
    out
}

const ATTENTION_SHAPE: [&str; 8] = [
    "--dim", "b=4", "--dim", "t=32", "--dim", "heads=4", "--dim", "dh=8",
];

#[test]
fn attention_runs_as_one_loop_over_its_entries_and_matches_the_interpreter() {
    // Scores, scale, causal mask, softmax and values: one loop over (stage, batch, head); the
    // MLP's up-projection, bias, GELU and down-projection: one over (stage, batch). In the
    // training step also the forward's again where the backward recomputes it, and those of
    // the forward of the step without its gradients (`ppc_evaluate`).
    assert_eq!(entry_loops(&[]), 2);
    assert_eq!(entry_loops(&["--layers-per-stage", "3"]), 2);
    assert_eq!(entry_loops(&["--train"]), 6);
    assert_eq!(entry_loops(&["--train", "--remat", "none"]), 4);
    // The GPU maps each loop nest onto blocks and threads itself.
    assert_eq!(entry_loops(&["--target", "cuda"]), 0);
    // The example's shape is split by stage instead (too small for a loop per op).
    let transformer = path("examples/transformer.ppc");
    let (_, out, _) = ppc(&["compile", &transformer, "--emit=mlir"]);
    assert!(!out.contains("ppc.parallel_over = \"entries\""));
    // With 8 batch rows the MLP's entries take two of them each (its weights are broadcast
    // along the batch, so each GEMM packs them once for both): two `[32, 128]` hidden blocks.
    let two_rows = "memref<1x2x32x128xf32>";
    assert!(!attention_mlir(&[]).contains(two_rows));
    assert!(attention_mlir(&["--dim", "b=8"]).contains(two_rows));
    // Bubble entries skip the chain: poisoned bubbles change nothing; bf16; circular repeats.
    let configs: [&[&str]; 5] = [
        &[],
        &["--poison-bubbles"],
        &["--dim", "b=8", "--poison-bubbles"],
        &["--dtype", "bf16"],
        &["--repeats", "2", "--microbatches", "5"],
    ];
    for extra in configs {
        let mut args = vec!["verify", transformer.as_str(), "--backend", "cpu"];
        args.extend(ATTENTION_SHAPE);
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
        let j = json_last_line(&out);
        assert_eq!(j["ok"], true, "{args:?}: {j}");
    }
}

#[test]
fn the_same_model_compiles_to_the_same_mlir_every_time() {
    // The training step has elementwise ops with several buffers they may write over; which
    // one must not follow a hash order (four compiles: a random pick differs with odds 7/8).
    // A circular step on 4 ranks adds several gradients into views of their accumulators
    // (`Walker::sum_chains`), which must be made in one order.
    let (transformer, mlp) = (path("examples/transformer.ppc"), path("examples/mlp.ppc"));
    let circular = ["--train", "--repeats", "2", "--ranks", "4"];
    for (model, flags) in [(&transformer, &["--train"][..]), (&mlp, &circular[..])] {
        let mut args = vec!["compile", model.as_str(), "--emit=mlir"];
        args.extend(flags);
        let first = ppc(&args).1;
        for _ in 0..3 {
            assert!(
                ppc(&args).1 == first,
                "{model} {flags:?}: the MLIR changed between two compiles"
            );
        }
    }
}

#[test]
fn emitted_mlir_is_verified_and_stable() {
    for name in ["tiny", "mlp"] {
        // A path relative to the test's working directory (tests/), so snapshots do not depend
        // on where the checkout is.
        let (code, out, err) = ppc(&["compile", &format!("../examples/{name}.ppc"), "--emit=mlir"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("llvm.emit_c_interface") && out.contains("func.func @ppc_forward("));
        insta::assert_snapshot!(format!("mlir_{name}"), out);
    }
    // The transformer's module is long (1,200 lines): checked by MLIR's verifier, not snapshotted.
    // Fast numerics: tanh written out in arith (vectorizable), big loop nests marked parallel.
    let transformer = path("examples/transformer.ppc");
    let (code, out, err) = ppc(&["compile", &transformer, "--emit=mlir"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("math.tanh") && out.contains("memref.load"));
    assert!(out.contains("ppc.parallel_2") && out.contains("tile_using_forall"));
    // Exact numerics: libm's tanh, as the interpreter calls it.
    let (code, out, err) = ppc(&["compile", &transformer, "--emit=mlir", "--exact"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("math.tanh"));
    let (code, out, err) = ppc(&["compile", &path("examples/tiny.ppc"), "--emit=llvm"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("llvm.func @_mlir_ciface_ppc_forward") && !out.contains("linalg."),
        "not lowered to LLVM"
    );
}

/// `ppc compile ARGS --emit=llvm`: the LLVM dialect after the CPU pipeline.
fn llvm_dialect(args: &[&str]) -> String {
    let mut all = vec!["compile"];
    all.extend(args);
    all.push("--emit=llvm");
    let (code, out, err) = ppc(&all);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

#[test]
fn the_stage_body_is_one_function_whatever_the_layer_count() {
    // The pipeline loop calls the stage's body, a function LLVM may not inline; the layers are
    // a loop inside it, so 2 and 8 layers per stage give the same code. The example's stages
    // are split over the threads (`stage_split.rs`): that function is the parallel loop, and
    // each stage's body in it one more function, called once per stage.
    let transformer = path("examples/transformer.ppc");
    let functions = |llvm: &str| llvm.matches("llvm.func @ppc_stage").count();
    let mut lines = Vec::new();
    for layers in ["2", "8"] {
        let llvm = llvm_dialect(&[&transformer, "--layers-per-stage", layers]);
        assert_eq!(functions(&llvm), 2, "{layers} layers");
        assert_eq!(llvm.matches("llvm.call @ppc_stage_0(").count(), 1);
        let stage = llvm
            .lines()
            .find(|l| l.contains("llvm.func @ppc_stage("))
            .expect("the stage function");
        assert!(stage.contains("passthrough = [\"noinline\"]"), "{stage}");
        assert_eq!(llvm.matches("llvm.call @ppc_stage(").count(), 1);
        lines.push(llvm.lines().count());
    }
    assert_eq!(
        lines[0], lines[1],
        "the code grows with the layers per stage"
    );
    // Where stages are not split (the MLP's are large enough to split op by op), and each of
    // the training step's stage functions (forward; backward) and the forward of the step
    // without its gradients (`ppc_evaluate`).
    let mlp = path("examples/mlp.ppc");
    assert_eq!(functions(&llvm_dialect(&[&mlp])), 1);
    assert_eq!(functions(&llvm_dialect(&[&mlp, "--train"])), 3);
    // The GPU keeps its own mapping of loop nests onto blocks and threads.
    let (code, cuda, err) = ppc(&["compile", &transformer, "--target", "cuda", "--emit=mlir"]);
    assert_eq!(code, 0, "{err}");
    assert!(!cuda.contains("ppc.outline"));
}

#[test]
fn mlir_locations_point_into_the_model_file() {
    let file = path("examples/tiny.ppc");
    let (_, mlir, _) = ppc(&["compile", &file, "--emit=mlir"]);
    // The matmul of @layer's line 8 (`%y = matmul %x, %w`) keeps its place after inlining.
    assert!(
        mlir.contains(&format!("loc(\"{file}\":8:3)")),
        "no model-file locations in the MLIR:\n{mlir}"
    );
}

#[test]
fn every_example_runs_on_the_cpu_and_matches_the_interpreter() {
    for ex in examples() {
        let ex = ex.display().to_string();
        let configs: [&[&str]; 4] = [
            &[],
            &["--repeats", "2", "--poison-bubbles"],
            &["--dtype", "bf16"],
            &[
                "--dtype",
                "f16",
                "--stages",
                "2",
                "--microbatches",
                "2",
                "--repeats",
                "2",
            ],
        ];
        for extra in configs {
            for exact in [true, false] {
                let mut args = vec![
                    "verify",
                    ex.as_str(),
                    "--backend",
                    "cpu",
                    "--opt-level",
                    "0",
                ];
                if exact {
                    args.push("--exact");
                }
                args.extend(small_dims(&ex));
                args.extend(extra);
                let (code, out, err) = ppc(&args);
                assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
                let j = json_last_line(&out);
                assert_eq!(j["ok"], true, "{args:?}: {j}");
                if exact {
                    // The interpreter's order and math: the compiled program is bit-identical.
                    assert_eq!(j["bit_exact"], true, "{args:?}: {j}");
                }
            }
        }
    }
}

/// A scratch directory for one test.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ppc-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Builds an executable of `model` (small dims) with the given extra compile flags.
pub(crate) fn build(model: &str, dir: &std::path::Path, extra: &[&str]) -> PathBuf {
    let exe = dir.join("model");
    let file = path(model);
    let mut args = vec!["compile", file.as_str(), "-o"];
    let exe_s = exe.display().to_string();
    args.push(&exe_s);
    args.extend(small_dims(model));
    args.extend(extra);
    let (code, out, err) = ppc(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(exe.exists());
    exe
}

pub(crate) fn run(exe: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(exe)
        .args(args)
        .output()
        .expect("the executable starts");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn executables_match_the_interpreter_and_read_inputs() {
    let dir = scratch("exe");
    for (model, extra) in [
        ("examples/mlp.ppc", &["--exact", "--repeats", "2"][..]),
        (
            "examples/transformer.ppc",
            &["--exact", "--dtype", "bf16"][..],
        ),
    ] {
        let exe = build(model, &dir, extra);
        // Seeded synthetic inputs: the output equals the interpreter's pipelined result.
        let out = dir.join("out.safetensors");
        let (code, stdout, err) = run(
            &exe,
            &["--seed", "5", "--output", &out.display().to_string()],
        );
        assert_eq!(code, 0, "{err}");
        assert!(stdout.contains("checksum") && stdout.contains("bubble"));
        let text = std::fs::read_to_string(path(model)).expect("model");
        let mut ov = Overrides::default();
        for pair in small_dims(model).chunks(2) {
            let (k, v) = pair[1].split_once('=').expect("N=V");
            ov.dims.push((k.into(), v.parse().expect("number")));
        }
        ov.repeats = extra.contains(&"--repeats").then_some(2);
        ov.float_dtype = extra.contains(&"bf16").then_some(DType::BF16);
        let mut m = load(&text, &ov);
        ppc::pipeline::compile(&mut m, &ppc::passes::Options::default(), None, None)
            .expect("compiles");
        let mut interp = Interp::new(&m, 5);
        let inputs = interp.synthetic_inputs();
        let want = interp.forward(&inputs).expect("interp");
        let got = safetensors::read_tensor(&out, "output")
            .expect("output file")
            .to_tensor();
        crate::passes::assert_bits_eq(&want, &got, model);

        // --input: other numbers in, the interpreter's answer for them out.
        let other = Interp::new(&m, 9).synthetic_inputs();
        let input = dir.join("in.safetensors");
        safetensors::write(&input, &[("input", &HostBuffer::from_tensor(&other))])
            .expect("write input");
        let (code, _, err) = run(
            &exe,
            &[
                "--seed",
                "5",
                "--input",
                &input.display().to_string(),
                "--output",
                &out.display().to_string(),
            ],
        );
        assert_eq!(code, 0, "{err}");
        let got = safetensors::read_tensor(&out, "output")
            .expect("output file")
            .to_tensor();
        crate::passes::assert_bits_eq(&interp.forward(&other).expect("interp"), &got, model);

        // `ppc run --output` with the same model and seed writes the very same bytes.
        let jit_out = dir.join("jit.safetensors");
        let file = path(model);
        let mut args = vec!["run", file.as_str(), "--seed", "5", "--opt-level", "0"];
        let jit_s = jit_out.display().to_string();
        args.extend(["--output", jit_s.as_str()]);
        args.extend(small_dims(model));
        args.extend(extra);
        let (code, _, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = run(
            &exe,
            &["--seed", "5", "--output", &out.display().to_string()],
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            std::fs::read(&jit_out).expect("jit output"),
            std::fs::read(&out).expect("exe output"),
            "{model}: ppc run and the executable disagree"
        );

        // --bench prints one JSON line with the median step time and the useful rate.
        let (code, stdout, err) = run(&exe, &["--bench", "3"]);
        assert_eq!(code, 0, "{err}");
        let j = json_last_line(&stdout);
        assert!(
            j["median_step_s"].as_f64().is_some_and(|t| t > 0.0)
                && j["useful_gflops"].as_f64().is_some()
        );
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn executables_reject_bad_arguments_and_inputs() {
    let dir = scratch("exe-errors");
    let exe = build("examples/tiny.ppc", &dir, &[]);
    let (code, out, _) = run(&exe, &["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--input <FILE>") && out.contains("--bench <N>"));
    let (code, _, err) = run(&exe, &["--frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("unexpected argument '--frobnicate'"), "{err}");
    let (code, _, err) = run(&exe, &["--steps", "many"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("invalid value 'many' for '--steps <N>'"),
        "{err}"
    );
    // The summary reports warm steps (the median, as --bench does) and the cold one apart.
    let (code, out, _) = run(&exe, &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains(", median of 4 warm steps (cpu executable"),
        "{out}"
    );
    assert!(
        out.contains("first step  ") && out.contains("(cold"),
        "{out}"
    );
    let (code, out, _) = run(&exe, &["--steps", "1"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(", one cold step (") && !out.contains("first step"),
        "{out}"
    );
    let (code, _, err) = run(&exe, &["--input", "/no/such/file.safetensors"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read /no/such/file.safetensors"),
        "{err}"
    );
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}").expect("write");
    let (code, _, err) = run(&exe, &["--input", &garbage.display().to_string()]);
    assert_eq!(code, 1);
    assert!(err.contains("not a valid safetensors file"), "{err}");
    let wrong = dir.join("wrong.safetensors");
    let t = ppc_runtime::Tensor::splat(DType::F32, vec![3, 4, 2], 1.0);
    safetensors::write(&wrong, &[("input", &HostBuffer::from_tensor(&t))]).expect("write");
    let (code, _, err) = run(&exe, &["--input", &wrong.display().to_string()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("is f32[3, 4, 2], but this model takes f32[3, 2, 4]"),
        "{err}"
    );
    let unnamed = dir.join("unnamed.safetensors");
    safetensors::write(&unnamed, &[("x", &HostBuffer::from_tensor(&t))]).expect("write");
    let (code, _, err) = run(&exe, &["--input", &unnamed.display().to_string()]);
    assert_eq!(code, 1);
    assert!(err.contains("has no tensor `input` (it has: x)"), "{err}");
    // A failed run writes no output file.
    let out = dir.join("never.safetensors");
    let (code, _, _) = run(
        &exe,
        &[
            "--input",
            &wrong.display().to_string(),
            "--output",
            &out.display().to_string(),
        ],
    );
    assert_eq!(code, 1);
    assert!(!out.exists());
    std::fs::remove_dir_all(dir).expect("cleanup");
}
