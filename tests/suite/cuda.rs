//! `--target cuda` without a GPU: every example's kernels (f32, bf16, f16; linear and circular;
//! one and two ranks; the training step) are PTX that NVIDIA's own assembler, `ptxas` from
//! PyPI's `nvidia-cuda-nvcc-cu12` (unpacked by `scripts/setup.sh`), accepts for sm_90; an
//! executable on a machine without a CUDA driver says so and exits non-zero; the CUDA program
//! with its kernels run as CPU loops computes what the interpreter does (the host's share of
//! the work, scalars passed by value, 16-bit GEMMs, split reductions). What only a GPU can
//! check is in `scripts/gpu-check.sh`.

use crate::common::{examples, load, ppc, root};
use crate::cpu::{build, run, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;

fn ptxas() -> PathBuf {
    let p = root().join("tools/cuda-nvcc/nvidia/cuda_nvcc/bin/ptxas");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup.sh",
        p.display()
    );
    p
}

/// `--emit=ptx` for `args`, split into its modules: (name, PTX).
fn kernels(args: &[&str]) -> Vec<(String, String)> {
    let mut argv = vec!["compile", "--target", "cuda", "--emit=ptx"];
    argv.extend(args);
    let (code, out, err) = ppc(&argv);
    assert_eq!(code, 0, "ppc {argv:?}: {err}");
    let modules: Vec<(String, String)> = out
        .split("// ppc kernel module ")
        .skip(1)
        .map(|m| {
            let (name, ptx) = m.split_once('\n').expect("a module header line");
            (name.to_string(), ptx.to_string())
        })
        .collect();
    assert!(!modules.is_empty(), "no kernels for {argv:?}");
    modules
}

/// Assembles each module with ptxas for sm_90; panics with ptxas's message on the first it
/// rejects.
fn assemble(what: &str, modules: &[(String, String)], dir: &Path) {
    for (i, (name, ptx)) in modules.iter().enumerate() {
        assert!(
            ptx.contains(".target sm_90") && ptx.contains(".entry"),
            "{what}: {name} is not an sm_90 kernel"
        );
        let file = dir.join(format!("k{i}.ptx"));
        std::fs::write(&file, ptx).expect("write ptx");
        let o = Command::new(ptxas())
            .args(["-arch=sm_90", "-o", "/dev/null"])
            .arg(&file)
            .output()
            .expect("ptxas runs");
        assert!(
            o.status.success(),
            "{what}: ptxas rejects module {name}:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn every_example_compiles_to_ptx_that_ptxas_accepts() {
    let mut configs: Vec<(String, Vec<&str>)> = Vec::new();
    let models = examples();
    for model in &models {
        for dtype in ["f32", "bf16", "f16"] {
            for repeats in ["1", "2"] {
                for ranks in ["1", "2"] {
                    let file = model.display().to_string();
                    let args = vec!["--dtype", dtype, "--repeats", repeats, "--ranks", ranks];
                    configs.push((file, args));
                }
            }
        }
    }
    assert_eq!(configs.len(), 12 * models.len(), "every example × 12");
    // The training step: backward kernels and the loss.
    for model in [
        "examples/mlp.ppc",
        "examples/transformer.ppc",
        "examples/gpt2.ppc",
    ] {
        let file = root().join(model).display().to_string();
        configs.push((file, vec!["--train", "--ranks", "2", "--dtype", "bf16"]));
    }
    let dir = scratch("ptxas");
    let total = std::sync::atomic::AtomicUsize::new(0);
    let dir = &dir;
    std::thread::scope(|s| {
        for (t, chunk) in configs.chunks(configs.len().div_ceil(2)).enumerate() {
            let total = &total;
            s.spawn(move || {
                let sub = dir.join(t.to_string());
                std::fs::create_dir_all(&sub).expect("scratch");
                for (file, args) in chunk {
                    let mut argv = vec![file.as_str()];
                    argv.extend(args);
                    let modules = kernels(&argv);
                    assemble(&format!("{argv:?}"), &modules, &sub);
                    total.fetch_add(modules.len(), std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    // Every loop nest with a parallel loop is a kernel: hundreds, not a handful.
    assert!(total.into_inner() > 1000);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn kernels_use_blocks_of_threads_and_load_bf16_as_16_bits() {
    let file = root().join("examples/mlp.ppc").display().to_string();
    let modules = kernels(&[file.as_str(), "--dtype", "bf16"]);
    // The innermost loop goes to threads: most kernels have 256-thread blocks.
    let wide = modules
        .iter()
        .filter(|(_, p)| p.contains(".maxntid 256, 1, 1"))
        .count();
    assert!(wide * 2 > modules.len(), "{wide} of {}", modules.len());
    // bf16 stays 16-bit in memory; math is f32 (ops.rs rounds by integer arithmetic).
    assert!(modules
        .iter()
        .any(|(_, p)| p.contains("ld.global.b16") || p.contains("ld.global.u16")));
}

/// A 16-bit GEMM writes its 16-bit result itself (cuBLAS rounds its f32 sums once), with no f32
/// scratch for a kernel to convert; what it computes is `cuda::the_gpu_program_with_cpu_kernels…`'s
/// and the runtime's `gemm::tests`' to check.
#[test]
fn sixteen_bit_gemms_write_their_result_in_sixteen_bits() {
    let file = root().join("examples/mlp.ppc").display().to_string();
    for dtype in ["bf16", "f16"] {
        let (code, mlir, err) = ppc(&[
            "compile",
            &file,
            "--dtype",
            dtype,
            "--target",
            "cuda",
            "--emit=mlir",
        ]);
        assert_eq!(code, 0, "{err}");
        let calls = |name: &str| mlir.matches(&format!("call @{name}(")).count();
        let rounded = format!("ppc_matmul_{dtype}_rounded");
        assert!(
            calls(&rounded) + calls(&format!("{rounded}_masked")) > 0,
            "{dtype}"
        );
        let into_f32 = format!("ppc_matmul_{dtype}");
        assert_eq!(
            calls(&into_f32) + calls(&format!("{into_f32}_masked")),
            0,
            "{dtype}"
        );
    }
}

#[test]
fn a_cuda_executable_without_a_driver_says_so_and_exits_nonzero() {
    let dir = scratch("cuda-exe");
    let exe = build("examples/tiny.ppc", &dir, &["--target", "cuda"]);
    let (code, out, err) = run(&exe, &["--steps", "1"]);
    if ppc_runtime::cuda::driver_present() {
        // A machine with a GPU: the run itself is scripts/gpu-check.sh's to judge.
        eprintln!("a CUDA driver is present: ran with exit status {code}");
    } else {
        assert_eq!(code, 1, "{out}\n{err}");
        assert!(err.contains("no CUDA driver"), "{err}");
        assert!(err.contains("--target cuda"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An ELF64 executable's sections: (name, type, file offset, size, linked section).
fn sections(elf: &[u8]) -> Vec<(String, u32, usize, u64, usize)> {
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap());
    assert_eq!(&elf[..5], b"\x7fELF\x02", "not an ELF64 file");
    let (table, entry, count, names) = (
        u64_at(0x28) as usize,
        u16_at(0x3a),
        u16_at(0x3c),
        u16_at(0x3e),
    );
    let header = |i: usize| table + i * entry;
    let strings = u64_at(header(names) + 0x18) as usize;
    (0..count)
        .map(|i| {
            let h = header(i);
            let name = c_string(elf, strings + u32_at(h) as usize);
            (
                name,
                u32_at(h + 4),
                u64_at(h + 0x18) as usize,
                u64_at(h + 0x20),
                u32_at(h + 0x28) as usize,
            )
        })
        .collect()
}

fn c_string(bytes: &[u8], at: usize) -> String {
    let end = at + bytes[at..].iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&bytes[at..end]).into_owned()
}

/// The names in an ELF64 executable's symbol table.
fn symbols(elf: &[u8]) -> Vec<String> {
    let all = sections(elf);
    let (_, _, offset, size, link) = all
        .iter()
        .find(|s| s.1 == 2)
        .expect("a symbol table")
        .clone();
    let strings = all[link].2;
    (offset..offset + size as usize)
        .step_by(24)
        .map(|sym| {
            c_string(
                elf,
                strings + u32::from_le_bytes(elf[sym..sym + 4].try_into().unwrap()) as usize,
            )
        })
        .collect()
}

/// Each kernel module is registered by a constructor that runs before `main`: in
/// `.init_array`, not in `.ctors`, which no current C runtime runs; and the variable that holds
/// its handle is one, also where the code is compiled in partitions (both faulted on the first
/// GPU run). The manifest names each module's model-file line, for errors and profiles.
#[test]
fn every_kernel_module_is_registered_before_main() {
    let dir = scratch("cuda-ctors");
    let read = |exe: &Path| std::fs::read(exe).expect("the executable");
    let size = |elf: &[u8], section: &str| {
        sections(elf)
            .into_iter()
            .find(|s| s.0 == section)
            .map(|s| s.3)
    };
    for sub in ["cpu", "cuda", "train"] {
        std::fs::create_dir_all(dir.join(sub)).expect("scratch dir");
    }
    let cpu = read(&build("examples/tiny.ppc", &dir.join("cpu"), &[]));
    let cuda = read(&build(
        "examples/tiny.ppc",
        &dir.join("cuda"),
        &["--target", "cuda"],
    ));
    let modules = kernels(&[crate::common::path("examples/tiny.ppc").as_str()]).len() as u64;
    assert_eq!(
        size(&cuda, ".ctors"),
        None,
        "constructors in .ctors never run"
    );
    assert_eq!(
        size(&cuda, ".init_array").unwrap() - size(&cpu, ".init_array").unwrap(),
        8 * modules,
        "one .init_array entry per kernel module"
    );
    // The manifest says where each module comes from, in the order they register: the
    // layer's `tanh` (line 9) is one of them.
    let marker = b"{\"ppc_manifest\"";
    let start = cuda
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("the embedded manifest");
    let end = start + cuda[start..].iter().position(|&b| b == 0).unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&cuda[start..end]).unwrap();
    let sources: Vec<&str> = manifest["kernels"]
        .as_array()
        .expect("kernels")
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(sources.len() as u64, modules, "{sources:?}");
    assert!(
        sources.iter().all(|s| s.contains("tiny.ppc:")),
        "{sources:?}"
    );
    assert!(
        sources.iter().any(|s| s.ends_with("tiny.ppc:9:3")),
        "{sources:?}"
    );
    let train = read(&build(
        "examples/transformer.ppc",
        &dir.join("train"),
        &["--target", "cuda", "--train"],
    ));
    let names = symbols(&train);
    assert!(
        names.iter().any(|n| n.starts_with("ppc.part.")),
        "compiled in partitions"
    );
    let handles: Vec<&String> = names.iter().filter(|n| n.ends_with("_module")).collect();
    let distinct: std::collections::HashSet<&str> = handles
        .iter()
        .map(|n| n.trim_start_matches("ppc.part."))
        .collect();
    assert!(!handles.is_empty());
    assert_eq!(
        handles.len(),
        distinct.len(),
        "a module handle defined in two partitions"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cuda_options_are_checked() {
    let file = root().join("examples/tiny.ppc").display().to_string();
    let (code, _, err) = ppc(&["compile", &file, "--emit=ptx"]);
    assert_eq!(code, 1);
    assert!(err.contains("add --target cuda"), "{err}");
    let (code, _, err) = ppc(&[
        "compile",
        &file,
        "--target",
        "cuda",
        "--exact",
        "--emit=ptx",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("--exact"), "{err}");
    let (code, _, err) = ppc(&["compile", &file, "--target", "cuda", "--emit=asm"]);
    assert_eq!(code, 1);
    assert!(err.contains("--emit=ptx"), "{err}");
    let (code, _, err) = ppc(&["run", &file, "--backend", "cuda", "--exact"]);
    assert_eq!(code, 1);
    assert!(err.contains("--exact"), "{err}");
    let (code, _, err) = ppc(&["compile", &file, "--target", "cuda", "--gpu-arch", "90"]);
    assert_eq!(code, 2);
    assert!(err.contains("sm_NN"), "{err}");
    if !ppc_runtime::cuda::driver_present() {
        // `ppc run --backend cuda` runs a scratch executable: the same clear error.
        let (code, _, err) = ppc(&["run", &file, "--backend", "cuda"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("no CUDA driver"), "{err}");
    }
}

#[test]
fn the_last_parallel_loop_goes_to_threads_and_up_to_two_before_it_to_the_grid() {
    use ppc::lower::gpu_map::tiling;
    let t = tiling(&[2, 4, 16, 1000], &["parallel"; 4]).expect("a kernel");
    // 250 threads: the largest divisor of 1000 up to 256, so that every tile is full.
    assert_eq!(
        (t.block, t.thread_loop, t.threads),
        (vec![0, 1, 1, 250], 3, 250)
    );
    // Reductions run inside a thread; here one row per thread.
    let t = tiling(&[4, 16, 256], &["parallel", "parallel", "reduction"]).expect("a kernel");
    assert_eq!((t.block, t.thread_loop), (vec![1, 16, 0], 1));
    // Grid extents beyond y and z's 65535 stay loops inside the kernel.
    let t = tiling(&[70_000, 8], &["parallel"; 2]).expect("a kernel");
    assert_eq!(t.block, vec![0, 8]);
    // No parallel loop: the host computes it.
    assert_eq!(tiling(&[], &[]), None);
    assert_eq!(tiling(&[8], &["reduction"]), None);
}

#[test]
fn the_gpu_program_with_cpu_kernels_computes_what_the_interpreter_does() {
    use ppc_dialect::DType;
    for model in examples() {
        for (dtype, repeats) in [
            (DType::F32, 1),
            (DType::BF16, 1),
            (DType::F16, 1),
            (DType::F32, 2),
        ] {
            matches_the_interpreter_with_cpu_kernels(&model, dtype, repeats, &[("b", 2)]);
        }
    }
    // Rows that a block's threads share unevenly (`gpu_reduce.rs`): softmax rows of 48 (32
    // threads, half of them with two elements), layernorm rows of 96 (64 threads).
    let transformer = root().join("examples/transformer.ppc");
    let dims = [("b", 2), ("t", 48), ("heads", 3), ("dh", 32)];
    matches_the_interpreter_with_cpu_kernels(&transformer, DType::F32, 1, &dims);
}

/// `file` (under the repository's root, or absolute) with `ov`, through the passes `opts`: the
/// module and its CUDA program with its kernels as CPU loops, JIT-compiled at `opt_level`.
fn program_on_cpu_kernels(
    file: &str,
    ov: &ppc_dialect::Overrides,
    opts: &ppc::passes::Options,
    opt_level: usize,
) -> (ppc_dialect::Module, ppc::lower::mlir::Jit) {
    let text = std::fs::read_to_string(root().join(file)).expect("example");
    let mut m = load(&text, ov);
    ppc::pipeline::compile(&mut m, opts, None, None).expect("compiles");
    let src = ppc::backend::Source { file, text: &text };
    let jit = ppc::backend::jit_gpu_program_on_cpu(&m, &src, ppc::lower::Numerics::Fast, opt_level)
        .expect("JIT");
    (m, jit)
}

/// The output of `program`'s forward pass on `inputs`, its weights seeded with `seed`.
fn forward(
    program: &ppc_runtime::exec::Program,
    inputs: &ppc_runtime::Tensor,
    seed: u64,
) -> ppc_runtime::Tensor {
    let mut x = ppc_runtime::memref::HostBuffer::from_tensor(inputs);
    let mut params = program
        .params(&ppc_runtime::init::Source::Seeded(seed))
        .expect("params");
    let mut y = program.output_buffer();
    program.run(&mut x, &mut params, &mut y).expect("runs");
    y.to_tensor()
}

/// `model` with `dims`, its CUDA program's kernels run as CPU loops, against the interpreter.
fn matches_the_interpreter_with_cpu_kernels(
    model: &Path,
    dtype: ppc_dialect::DType,
    repeats: u64,
    dims: &[(&str, u64)],
) {
    use ppc::compare::{compare, tolerance};
    use ppc_dialect::interp::Interp;
    use ppc_dialect::{DType, Overrides};
    let file = model.display().to_string();
    let mut ov = Overrides::default();
    ov.dims
        .extend(dims.iter().map(|&(name, size)| (name.to_string(), size)));
    ov.float_dtype = (dtype != DType::F32).then_some(dtype);
    ov.repeats = Some(repeats);
    let (m, jit) = program_on_cpu_kernels(&file, &ov, &ppc::passes::Options::default(), 1);
    let mut interp = Interp::new(&m, 3);
    let inputs = interp.synthetic_inputs();
    let want = interp.forward(&inputs).expect("interpreter");
    let c = compare(&want, &forward(&jit.program, &inputs, 3));
    assert!(
        c.max_rel <= tolerance(dtype),
        "{file} {dtype} repeats {repeats} {dims:?}: {:e}",
        c.max_rel
    );
}

#[test]
fn the_gpu_training_step_with_cpu_kernels_matches_the_interpreter() {
    for remat in [ppc::passes::Remat::Stage, ppc::passes::Remat::None] {
        crate::train::compiled_gradients_match(remat, |m, src| {
            ppc::backend::jit_gpu_program_on_cpu(m, src, ppc::lower::Numerics::Fast, 0)
        });
    }
}

/// The `llvm.alloca`s of the LLVM dialect `text` outside a function's entry block that do not
/// lie between an `llvm.intr.stacksave` and its `llvm.intr.stackrestore`, and how many
/// `llvm.alloca`s it has in all.
fn unscoped_allocas(text: &str) -> (Vec<String>, usize) {
    let (mut unscoped, mut all) = (Vec::new(), 0);
    let (mut function, mut in_entry, mut saved) = (String::new(), true, 0i64);
    for line in text.lines().map(str::trim) {
        if line.starts_with("llvm.func") {
            function = line.split(['(', ' ']).nth(1).unwrap_or("?").to_string();
            (in_entry, saved) = (true, 0);
        } else if line.starts_with("^bb") {
            in_entry = false;
        }
        saved += i64::from(line.contains("llvm.intr.stacksave"));
        saved -= i64::from(line.contains("llvm.intr.stackrestore"));
        if line.contains("llvm.alloca") {
            all += 1;
            if !in_entry && saved <= 0 {
                unscoped.push(format!("{function}: {line}"));
            }
        }
    }
    (unscoped, all)
}

/// The host's kernel launches and runtime calls put their argument arrays and memref
/// descriptors on the stack; inside a loop, each iteration must give them back, or the stack
/// grows with every microbatch and layer. Forward and training, linear and circular, one and
/// two ranks.
#[test]
fn host_loops_give_their_stack_back_every_iteration() {
    let (transformer, mlp) = (
        crate::common::path("examples/transformer.ppc"),
        crate::common::path("examples/mlp.ppc"),
    );
    for (file, extra) in [
        (
            &transformer,
            &["--layers-per-stage", "2", "--dim", "b=2"][..],
        ),
        (&transformer, &["--train", "--dim", "b=2"][..]),
        (&mlp, &["--repeats", "2", "--ranks", "2"][..]),
    ] {
        let mut args = vec!["compile", file.as_str(), "--target", "cuda", "--emit=llvm"];
        args.extend(extra);
        let (code, llvm, err) = ppc(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let (unscoped, all) = unscoped_allocas(&llvm);
        assert!(all > 0, "{args:?}: no alloca at all: not the host program?");
        assert!(
            unscoped.is_empty(),
            "{args:?}: {} of {all} allocas grow the stack in a loop, e.g. {}",
            unscoped.len(),
            unscoped[0]
        );
    }
}

/// A CUDA program of 256 microbatches and 4 layers per stage, its kernels run as CPU loops on
/// a thread with 2 MiB of stack (what `ulimit -s 2048` gives a process): the host's loops do
/// not use it up (without the stack saved and restored per iteration they took several MiB).
#[test]
fn a_long_gpu_program_runs_in_two_mib_of_stack() {
    let run = || {
        let ov = ppc_dialect::Overrides {
            dims: vec![("b".into(), 1), ("t".into(), 2)],
            microbatches: Some(256),
            layers_per_stage: Some(4),
            ..Default::default()
        };
        let opts = ppc::passes::Options::default();
        let (m, jit) = program_on_cpu_kernels("examples/transformer.ppc", &ov, &opts, 0);
        let inputs = ppc_dialect::interp::Interp::new(&m, 1).synthetic_inputs();
        forward(&jit.program, &inputs, 1)
    };
    let y = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(run)
        .expect("a thread")
        .join()
        .expect("the program ran in 2 MiB of stack");
    assert!(y.data.iter().all(|v| v.is_finite()), "finite outputs");
}

/// The optimizer's kernels round every operation once, as the host does: `.rn` adds,
/// multiplies, divisions and roots, no fused multiply-add, no approximation. So the GPU's
/// update and sums of squares are the host's bits (`lower/update.rs`, `lower/grad_squares.rs`).
#[test]
fn the_update_kernels_round_every_operation_as_the_host_does() {
    let file = crate::common::path("examples/transformer.ppc");
    let modules = kernels(&[file.as_str(), "--train", "--dtype", "bf16"]);
    let updates: Vec<&(String, String)> = modules
        .iter()
        .filter(|(name, _)| name.starts_with("ppc_update_") || name.starts_with("ppc_grad_squares"))
        .collect();
    assert!(
        updates
            .iter()
            .any(|(n, _)| n.starts_with("ppc_update_adamw"))
            && updates.iter().any(|(n, _)| n.starts_with("ppc_update_sgd"))
            && updates
                .iter()
                .any(|(n, _)| n.starts_with("ppc_grad_squares")),
        "no update kernels in {:?}",
        modules.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for (name, ptx) in updates {
        let arithmetic = ptx
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter(|w| w.ends_with(".f32") || w.ends_with(".f64"))
            .filter(|w| {
                ["add.", "sub.", "mul.", "div.", "sqrt."]
                    .iter()
                    .any(|o| w.starts_with(o))
            });
        for op in arithmetic {
            assert!(op.contains(".rn."), "{name}: `{op}` is not rounded once");
        }
        for loose in [".approx", ".ftz", "rcp.", "rsqrt."] {
            assert!(!ptx.contains(loose), "{name}: `{loose}`");
        }
        assert!(!ptx.contains("fma."), "{name}: a fused multiply-add");
        if name.starts_with("ppc_update_adamw") {
            assert!(
                ptx.contains("sqrt.rn.f32"),
                "{name}: no correctly rounded root"
            );
            assert!(
                ptx.contains("div.rn.f32"),
                "{name}: no correctly rounded division"
            );
        }
    }
}

/// Training a CUDA program whose kernels run as CPU loops, its optimizer's update as its own
/// kernels against the host's update of the same program (`--host-optimizer`): the same losses
/// and the same checkpoint bytes (weights, moments, masters) after three steps, for AdamW and
/// SGD, weights in f32, bf16 and f16, clipped or not (the global norm from sums of squares on the
/// GPU), the MLP, the transformer and the language models. And the weights, gradients and
/// optimizer state stay with the program: a step copies in only its batch and
/// hyper-parameters, and back only its loss and outputs (and, to clip, a sum of squares per
/// slice).
#[test]
fn the_update_on_the_gpu_trains_to_the_hosts_bytes_and_keeps_the_weights_there() {
    use ppc_dialect::{DType, Overrides};
    use ppc_runtime::manifest::Role;
    use ppc_runtime::optim::{Config, Kind};
    let transformer_dims = [("b", 2), ("t", 8), ("heads", 2), ("dh", 8)]
        .map(|(n, v)| (n.to_string(), v))
        .to_vec();
    for (file, dims, dtype, kind, clip) in [
        (
            "examples/mlp.ppc",
            vec![("d".to_string(), 32), ("h".to_string(), 64)],
            DType::F32,
            Kind::AdamW,
            0.0,
        ),
        (
            "examples/mlp.ppc",
            vec![("d".to_string(), 32), ("h".to_string(), 64)],
            DType::F16,
            Kind::Sgd,
            0.0,
        ),
        (
            "examples/transformer.ppc",
            transformer_dims.clone(),
            DType::BF16,
            Kind::Sgd,
            0.0,
        ),
        (
            "examples/transformer.ppc",
            transformer_dims,
            DType::BF16,
            Kind::AdamW,
            1e-3,
        ),
        // The language models: embeddings (GPT-2's tied to its head), norm gains that do not
        // decay, bf16 weights with f32 masters.
        (
            "examples/gpt2.ppc",
            Vec::new(),
            DType::BF16,
            Kind::AdamW,
            0.0,
        ),
        (
            "examples/llama.ppc",
            Vec::new(),
            DType::BF16,
            Kind::AdamW,
            1.0,
        ),
    ] {
        let what = format!("{file} {dtype} {} clip {clip}", kind.name());
        let ov = Overrides {
            dims,
            float_dtype: (dtype != DType::F32).then_some(dtype),
            ..Overrides::default()
        };
        let opts = crate::grad::train_opts(false, ppc::passes::Remat::Stage);
        let (_, jit) = program_on_cpu_kernels(file, &ov, &opts, 0);
        let program = &jit.program;
        assert!(program.updates_on_gpu(), "{what}: no update entries");
        let dir = scratch("gpu-update");
        let mut config = Config::new(kind);
        config.grad_clip = clip;
        // Losses, checkpoint bytes and the bytes copied in and back.
        let train = |host_optimizer: bool, steps: u32| {
            let save = dir.join(format!("{host_optimizer}-{steps}.safetensors"));
            let opts = ppc_runtime::run_options::TrainOptions {
                steps,
                data: None,
                val_data: None,
                val_every: 100,
                token_dtype: Default::default(),
                save: Some(save.clone()),
                resume: None,
                params: None,
                seed: 3,
                json: true,
                bench: None,
                trace: None,
                host_optimizer,
                optimizer: config,
            };
            let before = program.bytes_moved();
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let trained = ppc_runtime::train::train(program, &opts, &mut out, &mut err)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let after = program.bytes_moved();
            let losses: Vec<u32> = trained.losses.iter().map(|l| l.to_bits()).collect();
            let bytes = std::fs::read(&save).expect("checkpoint");
            (losses, bytes, (after.0 - before.0, after.1 - before.1))
        };
        let (gpu_losses, gpu_checkpoint, _) = train(false, 3);
        let (host_losses, host_checkpoint, _) = train(true, 3);
        assert_eq!(gpu_losses, host_losses, "{what}: losses");
        assert!(
            gpu_checkpoint == host_checkpoint,
            "{what}: checkpoints differ"
        );
        // The third step's copies: the other two steps' and the end's are in both runs.
        let ((in2, out2), (in3, out3)) = (train(false, 2).2, train(false, 3).2);
        let bytes = |role| -> u64 {
            (program.manifest.args.iter())
                .filter(|a| a.role == role)
                .map(|a| a.shape.iter().product::<usize>() as u64 * a.dtype.size_bytes())
                .sum()
        };
        let hyper = 4 * ppc_runtime::gpu_update::hyper::COUNT as u64;
        assert_eq!(
            in3 - in2,
            bytes(Role::Input) + bytes(Role::Target) + hyper,
            "{what}: bytes copied in by a step"
        );
        // Clipping fetches one f64 sum of squares per (parameter, layer) slice.
        let slices: usize = (program.manifest.args.iter())
            .filter(|a| a.role == Role::Param)
            .map(ppc_runtime::clip::slices)
            .sum();
        let squares = if clip > 0.0 { 8 * slices as u64 } else { 0 };
        assert_eq!(
            out3 - out2,
            bytes(Role::Loss) + bytes(Role::Output) + squares,
            "{what}: bytes copied back by a step"
        );
    }
}

/// The gradients' sums of squares on the GPU (its kernels as CPU loops) are `clip.rs`'s bit for
/// bit: gradients of magnitudes from 2^-20 to 2^20, whose f64 sums change with the order of
/// their additions (checked: the plain element order gives other bits).
#[test]
fn the_gpu_sums_of_squares_are_the_hosts_bit_for_bit() {
    use ppc_runtime::clip::{slices, sum_of_squares};
    use ppc_runtime::manifest::Role;
    let ov = ppc_dialect::Overrides {
        // Slices of 64 K elements (`w1`, `w2`): 16 per lane.
        dims: [("b", 1), ("t", 8), ("heads", 4), ("dh", 32)]
            .map(|(n, v)| (n.to_string(), v))
            .to_vec(),
        ..Default::default()
    };
    let opts = crate::grad::train_opts(false, ppc::passes::Remat::Stage);
    let (_, jit) = program_on_cpu_kernels("examples/transformer.ppc", &ov, &opts, 0);
    let program = &jit.program;
    let params: Vec<&ppc_runtime::manifest::Arg> = (program.manifest.args.iter())
        .filter(|a| a.role == Role::Param)
        .collect();
    let mut state = 7u64;
    let mut grads: Vec<ppc_runtime::memref::HostBuffer> = params
        .iter()
        .map(|a| {
            let n: usize = a.shape.iter().product();
            let values = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let (e, f) = ((state >> 33) % 41, (state >> 8) & 0xFFFF);
                    let v = (1.0 + f as f32 / 65536.0) * 2f32.powi(e as i32 - 20);
                    if state & 1 == 0 {
                        v
                    } else {
                        -v
                    }
                })
                .collect();
            let t = ppc_runtime::Tensor::new(ppc_runtime::DType::F32, a.shape.clone(), values);
            ppc_runtime::memref::HostBuffer::from_tensor(&t)
        })
        .collect();
    let got =
        ppc_runtime::gpu_update::sums_of_squares(program, &params, grads.iter_mut().collect())
            .expect("runs");
    let mut order_matters = false;
    for ((a, g), got) in params.iter().zip(&grads).zip(&got) {
        let g = g.f32s().expect("f32");
        let n = g.len() / slices(a);
        let want: Vec<u64> = g.chunks(n).map(|s| sum_of_squares(s).to_bits()).collect();
        let got: Vec<u64> = got.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{}: sums of squares", a.name);
        let plain = g.chunks(n).map(|s| {
            s.iter()
                .fold(0.0f64, |t, &v| t + f64::from(v) * f64::from(v))
        });
        order_matters |= plain.zip(&want).any(|(p, &w)| p.to_bits() != w);
    }
    assert!(
        order_matters,
        "no sum depends on its order: the test cannot tell orders apart"
    );
}
