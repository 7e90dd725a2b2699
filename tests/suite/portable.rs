//! Portability: executables built for the x86-64-v3 baseline hold no AVX-512 outside the
//! runtime's run-time-dispatched kernels and compute bit for bit what the interpreter does,
//! bf16 and f16 included, whatever CPU runs the tests; the AVX2 GEMM path (AVX-512 hidden
//! with `PPC_CPU_DISABLE`) matches the interpreter and trains to the same bytes as the native
//! dispatch; a CPU that lacks a feature the code was compiled for gets a message naming it, on
//! every rank.

use crate::common::{load, path, ppc};
use crate::cpu::{build, run, scratch, small_dims};
use ppc_dialect::interp::Interp;
use ppc_dialect::{DType, Overrides};
use ppc_runtime::safetensors;
use std::path::Path;
use std::process::Command;

/// The interpreter's pipelined output for `model` with small dims, `dtype` and `seed`.
fn interpreted(model: &str, dtype: DType, seed: u64) -> ppc_runtime::Tensor {
    let text = std::fs::read_to_string(path(model)).expect("model");
    let mut ov = Overrides::default();
    for pair in small_dims(model).chunks(2) {
        let (k, v) = pair[1].split_once('=').expect("N=V");
        ov.dims.push((k.into(), v.parse().expect("number")));
    }
    ov.float_dtype = (dtype != DType::F32).then_some(dtype);
    let mut m = load(&text, &ov);
    ppc::pipeline::compile(&mut m, &ppc::passes::Options::default(), None, None).expect("compiles");
    let mut interp = Interp::new(&m, seed);
    let inputs = interp.synthetic_inputs();
    interp.forward(&inputs).expect("interp")
}

/// The CPU and features the manifest embedded in `exe` records, as `CPU f1,f2,...`.
fn manifest_target(exe: &Path) -> String {
    let bytes = std::fs::read(exe).expect("executable");
    let text = String::from_utf8_lossy(&bytes);
    let start = text
        .find("{\"ppc_manifest\":")
        .expect("an embedded manifest");
    let manifest = &text[start..];
    let end = manifest.find('\0').expect("NUL-terminated");
    let m = ppc_runtime::manifest::Manifest::parse(&manifest[..end]).expect("a manifest");
    let t = m.target.expect("a target");
    format!("{} {}", t.cpu, t.features.join(","))
}

/// Functions of `exe` whose code names a `zmm` register (an AVX-512 instruction).
fn functions_using_zmm(exe: &Path) -> Vec<String> {
    let o = Command::new("objdump")
        .args(["-d", "-C", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .expect("objdump runs (binutils)");
    assert!(o.status.success(), "objdump failed");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut current = String::new();
    let mut found: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.ends_with(">:") {
            current = line.to_string();
        } else if line.contains("%zmm") && found.last() != Some(&current) {
            found.push(current.clone());
        }
    }
    found
}

/// Kernels that the runtime (or a library it uses) runs only after checking the CPU has AVX-512.
fn dispatched_at_run_time(function: &str) -> bool {
    [
        "kernel_target_avx512",
        "core::core_arch::x86::avx512",
        "ppc_runtime::small_m::",
        "ppc_runtime::small_m_bt::",
        "ppc_runtime::sgemm::zmm::kernel",
    ]
    .iter()
    .any(|k| function.contains(k))
}

#[test]
fn baseline_executables_hold_no_avx512_and_match_the_interpreter_in_every_dtype() {
    let dir = scratch("portable");
    let cases = [
        ("examples/tiny.ppc", DType::F32),
        ("examples/tiny.ppc", DType::F16),
        ("examples/mlp.ppc", DType::BF16),
        ("examples/transformer.ppc", DType::BF16),
        ("examples/transformer.ppc", DType::F16),
    ];
    for (model, dtype) in cases {
        let what = format!("{model} {dtype}");
        let d = dtype.to_string();
        let mut extra = vec!["--target-cpu", "x86-64-v3", "--exact"];
        if dtype != DType::F32 {
            extra.extend(["--dtype", d.as_str()]);
        }
        let exe = build(model, &dir, &extra);
        let target = manifest_target(&exe);
        assert!(
            target.starts_with("x86-64-v3 ") && target.contains(",avx2,"),
            "{what}: the manifest should record the target and its features: {target}"
        );
        assert!(!target.contains("avx512"), "{what}: {target}");
        let stray: Vec<String> = functions_using_zmm(&exe)
            .into_iter()
            .filter(|f| !dispatched_at_run_time(f))
            .collect();
        assert!(
            stray.is_empty(),
            "{what}: AVX-512 outside the dispatched kernels: {stray:?}"
        );

        let out = dir.join("out.safetensors");
        let (code, _, err) = run(
            &exe,
            &["--seed", "3", "--output", &out.display().to_string()],
        );
        assert_eq!(code, 0, "{what}: {err}");
        let got = safetensors::read_tensor(&out, "output")
            .expect("output")
            .to_tensor();
        crate::passes::assert_bits_eq(&interpreted(model, dtype, 3), &got, &what);
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn generated_code_for_the_baseline_has_no_avx512_and_no_conversion_calls() {
    for model in [
        "examples/tiny.ppc",
        "examples/mlp.ppc",
        "examples/transformer.ppc",
    ] {
        for (cpu, dtype) in [
            ("x86-64-v3", "bf16"),
            ("x86-64-v3", "f16"),
            ("x86-64", "bf16"),
        ] {
            let file = path(model);
            let mut args = vec!["compile", file.as_str(), "--emit=asm", "--opt-level", "0"];
            args.extend(["--target-cpu", cpu, "--dtype", dtype]);
            args.extend(small_dims(model));
            let (code, asm, err) = ppc(&args);
            assert_eq!(code, 0, "{model} {cpu} {dtype}: {err}");
            assert!(asm.contains("ppc_forward"), "{model}: not the model's code");
            assert!(
                !asm.contains("zmm"),
                "{model} {cpu} {dtype}: AVX-512 in generated code"
            );
            // bf16 conversions are integer arithmetic: no libgcc helper, no BF16 instruction.
            assert!(
                !asm.contains("truncsfbf2") && !asm.contains("cvtneps2bf16"),
                "{model} {cpu} {dtype}: bf16 conversion not expanded"
            );
            if cpu == "x86-64-v3" {
                // F16C converts f16 in hardware on every x86-64-v3 CPU.
                assert!(
                    !asm.contains("hf2"),
                    "{model} {cpu} {dtype}: f16 through libgcc"
                );
            }
        }
    }
}

#[test]
fn generated_code_is_vectorized_for_the_target() {
    // LLVM vectorizes only when it knows the target: AVX2's ymm registers for x86-64-v3.
    let file = path("examples/mlp.ppc");
    let (code, asm, err) = ppc(&["compile", &file, "--emit=asm", "--target-cpu", "x86-64-v3"]);
    assert_eq!(code, 0, "{err}");
    let vector = asm.lines().filter(|l| l.contains("ymm")).count();
    assert!(vector > 100, "only {vector} lines use ymm registers");
}

/// The GEMMs as on an AVX2 node (no few-row AVX-512 kernel), called from both pool threads
/// at once.
#[test]
fn the_portable_gemm_path_matches_the_interpreter() {
    let dir = scratch("portable-gemm");
    for model in ["examples/mlp.ppc", "examples/transformer.ppc"] {
        let exe = build(model, &dir, &[]);
        let out = dir.join("out.safetensors");
        let o = Command::new(&exe)
            .args(["--seed", "4", "--output", &out.display().to_string()])
            .env(
                "PPC_CPU_DISABLE",
                "avx512f,avx512bw,avx512cd,avx512dq,avx512vl",
            )
            .env("PPC_NUM_THREADS", "2")
            .output()
            .expect("runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got = safetensors::read_tensor(&out, "output")
            .expect("output")
            .to_tensor();
        let c = ppc::compare::compare(&interpreted(model, DType::F32, 4), &got);
        assert!(
            c.max_rel <= ppc::compare::tolerance(DType::F32),
            "{model}: max_rel {}",
            c.max_rel
        );
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// bf16 values are converted and selected as integers: LLVM legalizes vector `bfloat` selects
/// and conversions through `__truncsfbf2` on CPUs without AVX512-BF16, which the JIT on an AVX2
/// node then cannot find (seen under `qemu-x86_64 -cpu Haswell`).
#[test]
fn bf16_values_are_never_float_typed_in_selects_or_conversions() {
    let (code, mlir, err) = ppc(&[
        "compile",
        &path("examples/transformer.ppc"),
        "--dtype",
        "bf16",
        "--emit=mlir",
    ]);
    assert_eq!(code, 0, "{err}");
    for line in mlir.lines() {
        let typed_bf16 = line.contains(": bf16") || line.contains("to bf16");
        assert!(
            !(typed_bf16
                && (line.contains("arith.select")
                    || line.contains("arith.truncf")
                    || line.contains("arith.extf"))),
            "{line}"
        );
    }
}

#[test]
fn a_cpu_without_a_needed_feature_gets_a_message_on_every_rank() {
    let dir = scratch("wrong-cpu");
    let exe = build(
        "examples/tiny.ppc",
        &dir,
        &["--target-cpu", "x86-64-v4", "--ranks", "2"],
    );
    let o = Command::new("mpirun.mpich")
        .args(["-n", "2"])
        .arg(&exe)
        .env("PPC_CPU_DISABLE", "avx512bw")
        .output()
        .expect("mpirun.mpich starts");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    // What this host lacks of x86-64-v4 (every AVX-512 feature on an AVX2 machine), and the
    // hidden avx512bw, in the target's order.
    let host = ppc_runtime::cpu::host_features();
    let lacking: Vec<&str> = ppc_runtime::cpu::features_of("x86-64-v4")
        .expect("a known level")
        .into_iter()
        .filter(|f| *f == "avx512bw" || !host.contains(f))
        .collect();
    let needs = format!("needs {},", lacking.join(", "));
    for rank in 0..2 {
        let line = err
            .lines()
            .find(|l| l.contains(&format!("(rank {rank} of 2): error:")))
            .unwrap_or_else(|| panic!("rank {rank} said nothing:\n{err}"));
        assert!(
            line.contains("`x86-64-v4`") && line.contains(&needs),
            "{line}\nexpected: {needs}"
        );
    }
    // One process, no mpirun: the same check, exit status 1.
    let exe = build("examples/tiny.ppc", &dir, &["--target-cpu", "x86-64-v3"]);
    let o = Command::new(&exe)
        .env("PPC_CPU_DISABLE", "fma,avx2")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("needs avx2, fma,") && err.contains("--target-cpu"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn native_records_the_build_machine_and_unknown_cpus_are_refused() {
    let dir = scratch("native");
    let exe = build("examples/tiny.ppc", &dir, &["--target-cpu", "native"]);
    let target = manifest_target(&exe);
    assert!(target.starts_with("native sse,sse2,"), "{target}");
    let (code, _, err) = run(&exe, &[]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = ppc(&[
        "compile",
        &path("examples/tiny.ppc"),
        "--target-cpu",
        "pentium9",
        "-o",
        "x",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unknown CPU `pentium9`") && err.contains("x86-64-v3"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn what_the_jit_says_reaches_the_user() {
    use ppc::lower::mlir;
    // A lowered module, as `lower-mlir` writes them: with the CPU pipeline's transform script.
    let text = format!(
        r#"module attributes {{transform.with_named_sequence}} {{
  func.func private @ppc_nowhere(memref<*xf32>) attributes {{llvm.emit_c_interface}}
  func.func @ppc_forward(%input: memref<2xf32>, %output: memref<2xf32>) attributes {{llvm.emit_c_interface}} {{
    %u = memref.cast %input : memref<2xf32> to memref<*xf32>
    func.call @ppc_nowhere(%u) : (memref<*xf32>) -> ()
    return
  }}
{}}}"#,
        ppc::lower::emit::TRANSFORM_SCRIPT
    );
    let arg = |role, name: &str| ppc_runtime::manifest::Arg {
        role,
        name: name.into(),
        dtype: DType::F32,
        shape: vec![2],
        init: ppc_runtime::Init::Zeros,
        layer_axes: 0,
        shard_axis: None,
    };
    let manifest = ppc_runtime::manifest::Manifest {
        model: String::new(),
        stages: 1,
        microbatches: 1,
        repeats: 1,
        layers: 1,
        ranks: 1,
        replicas: 1,
        flops: 0,
        calls_per_slot: 1,
        target: None,
        gpu: None,
        flush_to_zero: true,
        args: vec![
            arg(ppc_runtime::manifest::Role::Input, "x"),
            arg(ppc_runtime::manifest::Role::Output, "y"),
        ],
        evaluate: vec![],
        groups: vec![],
        kernels: Vec::new(),
        train: vec![],
        cross_entropy: false,
        ignore_index: None,
        dims: Vec::new(),
    };
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &text, "").expect("parses");
    mlir::lower_to_llvm(&ctx, &mut module, "").expect("lowers");
    let Err(d) = mlir::jit(&module, manifest, 0) else {
        panic!("a call to a function nothing defines must not JIT")
    };
    let said = &d[0].message;
    assert!(
        said.contains("could not compile") && said.contains("ppc_nowhere"),
        "{said}"
    );
}

/// Training executables for the baseline: no AVX-512 outside the dispatched kernels, and on the
/// AVX2 path (AVX-512 hidden, 2 threads) they train as they do here, in f32, bf16 and f16 (and
/// interleaved 1F1B in bf16): the same losses and the same checkpoint bytes.
#[test]
fn training_executables_for_the_baseline_train_alike_on_the_portable_path() {
    let dir = scratch("portable-train");
    // Interleaved 1F1B in bf16 on one stage: its masked cotangents in bf16, the repeat's
    // weights as views, its gradients added into their slice.
    let interleaved = ["--schedule", "1f1b", "--repeats", "2", "--stages", "1"];
    let cases: [(&str, DType, &[&str]); 4] = [
        ("examples/mlp.ppc", DType::F32, &[]),
        ("examples/mlp.ppc", DType::BF16, &[]),
        ("examples/transformer.ppc", DType::F16, &[]),
        ("examples/mlp.ppc", DType::BF16, &interleaved),
    ];
    for (model, dtype, extra) in cases {
        let what = format!("{model} {dtype} {extra:?}");
        let d = dtype.to_string();
        let mut flags = vec!["--train", "--target-cpu", "x86-64-v3", "--dtype", &d];
        flags.extend(extra);
        let exe = build(model, &dir, &flags);
        let stray: Vec<String> = functions_using_zmm(&exe)
            .into_iter()
            .filter(|f| !dispatched_at_run_time(f))
            .collect();
        assert!(
            stray.is_empty(),
            "{what}: AVX-512 outside the dispatched kernels: {stray:?}"
        );
        let train = |name: &str, portable: bool| {
            let ckpt = dir.join(format!("{name}.safetensors"));
            let mut cmd = Command::new(&exe);
            // SGD: weights linear in the gradients (AdamW's first steps move each weight by
            // about ±lr whatever the gradient's size, so a tiny gradient's sign decides).
            cmd.args(["--steps", "3", "--json", "--optimizer", "sgd"]);
            cmd.args(["--save", &ckpt.display().to_string()]);
            if portable {
                cmd.env(
                    "PPC_CPU_DISABLE",
                    "avx512f,avx512bw,avx512cd,avx512dq,avx512vl",
                )
                .env("PPC_NUM_THREADS", "2");
            }
            let o = cmd.output().expect("runs");
            assert!(
                o.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let losses = crate::common::json_losses(&String::from_utf8_lossy(&o.stdout));
            (losses, std::fs::read(&ckpt).expect("checkpoint"))
        };
        let ((want_loss, want), (got_loss, got)) = (train("here", false), train("portable", true));
        assert_eq!(want_loss.len(), 3, "{what}");
        assert_eq!(want_loss, got_loss, "{what}: losses");
        assert!(
            want == got,
            "{what}: the AVX2 path wrote another checkpoint"
        );
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}
