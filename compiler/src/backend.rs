//! The backends: lower the pipelined module through MLIR, then JIT it for `ppc run` (this
//! CPU), or compile it for the `--target-cpu` and link it with the runtime into a standalone
//! executable for `ppc compile -o`. With `--target cuda` ([`Gpu`]) the loop nests become PTX
//! kernels embedded in the executable, launched by its host code through the runtime.

use crate::lower::machine::{self, Output};
use crate::lower::{self, mlir, Lowered, Numerics};
use crate::timing;
use ppc_dialect::{Diagnostic, Diagnostics, Module};
use ppc_runtime::files::write_atomic;
use ppc_runtime::manifest::Target;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the backend needs besides the module: where it came from and how to build it.
pub struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

/// `--target cuda`: the GPU architecture kernels are compiled for (`sm_90`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub arch: String,
    /// The kernels run as CPU loops ([`jit_gpu_program_on_cpu`], tests).
    pub kernels_on_cpu: bool,
}

/// How machine code is made: numerics, the CPU of the host code, the GPU of the kernels (none:
/// everything on the CPU), LLVM's optimization level, the partitions an executable's code is
/// compiled in (`partition.rs`).
pub struct Codegen<'a> {
    pub numerics: Numerics,
    pub target: &'a Target,
    pub gpu: Option<&'a Gpu>,
    pub opt_level: usize,
    pub partitions: usize,
}

fn lower(
    m: &Module,
    src: &Source,
    numerics: Numerics,
    target: Option<&Target>,
    gpu: Option<&Gpu>,
    executable: Option<u64>,
) -> Result<Lowered, Diagnostics> {
    let opts = lower::Options {
        numerics,
        executable: executable.is_some(),
        replicas: executable.unwrap_or(1),
        target: target.cloned(),
        gpu: gpu.map(|g| g.arch.clone()),
        gpu_kernels_on_cpu: gpu.is_some_and(|g| g.kernels_on_cpu),
    };
    lower::lower(m, &opts, src.file, src.text).map_err(|d| vec![d])
}

/// The MLIR module (`--emit=mlir`), verified by MLIR, with its model-file locations.
pub fn emit_mlir(
    m: &Module,
    src: &Source,
    numerics: Numerics,
    gpu: Option<&Gpu>,
) -> Result<String, Diagnostics> {
    use melior::ir::operation::{OperationLike, OperationPrintingFlags};
    let l = lower(m, src, numerics, None, gpu, None)?;
    let ctx = mlir::context();
    let module = mlir::parse(&ctx, &l.mlir, src.text)?;
    let flags = OperationPrintingFlags::new().enable_debug_info(true, false);
    module
        .as_operation()
        .to_string_with_flags(flags)
        .map_err(|e| vec![Diagnostic::plain(format!("cannot print MLIR: {e}"))])
}

/// The LLVM dialect after the CPU pipeline, or with `gpu` the host program's after the CUDA
/// pipelines, its kernels PTX inside (`--emit=llvm`).
pub fn emit_llvm(
    m: &Module,
    src: &Source,
    numerics: Numerics,
    gpu: Option<&Gpu>,
) -> Result<String, Diagnostics> {
    let l = lower(m, src, numerics, None, gpu, None)?;
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &l.mlir, src.text)?;
    to_llvm_dialect(&ctx, &mut module, gpu, src)?;
    Ok(module.as_operation().to_string())
}

/// Runs the CPU pipeline on `module`, or with `gpu` the CUDA pipeline (kernels to PTX) and
/// then the host pipeline.
fn to_llvm_dialect(
    ctx: &melior::Context,
    module: &mut melior::ir::Module,
    gpu: Option<&Gpu>,
    src: &Source,
) -> Result<(), Diagnostics> {
    match gpu {
        None => timing::phase("MLIR CPU pipeline", || {
            mlir::lower_to_llvm(ctx, module, src.text)
        }),
        Some(g) => {
            let pipeline = mlir::cuda_pipeline(&g.arch, &libdevice().map_err(|d| vec![d])?);
            timing::phase("MLIR CUDA pipeline (kernels to PTX)", || {
                mlir::run_pipeline(ctx, module, &pipeline, "CUDA", src.text)
            })?;
            timing::phase("MLIR CUDA host pipeline", || {
                mlir::run_pipeline(ctx, module, mlir::CUDA_HOST_PIPELINE, "CUDA host", src.text)
            })
        }
    }
}

/// JIT-compiles the pipeline for this process.
pub fn jit(
    m: &Module,
    src: &Source,
    numerics: Numerics,
    opt_level: usize,
) -> Result<mlir::Jit, Diagnostics> {
    let l = lower(m, src, numerics, None, None, None)?;
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &l.mlir, src.text)?;
    mlir::lower_to_llvm(&ctx, &mut module, src.text)?;
    mlir::jit(&module, l.manifest, opt_level)
}

/// The `--target cuda` program with its kernels run as CPU loops, JIT-compiled for this CPU:
/// what the GPU lowering changes in the host program (what the host computes, scalars passed
/// to kernels by value, 16-bit GEMM calls, split reductions) can be checked against the
/// interpreter on a machine without a GPU. The kernels' PTX is ptxas's to check.
pub fn jit_gpu_program_on_cpu(
    m: &Module,
    src: &Source,
    numerics: Numerics,
    opt_level: usize,
) -> Result<mlir::Jit, Diagnostics> {
    let gpu = Gpu {
        arch: "sm_90".into(),
        kernels_on_cpu: true,
    };
    let l = lower(m, src, numerics, None, Some(&gpu), None)?;
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &l.mlir, src.text)?;
    mlir::lower_to_llvm_by(
        &ctx,
        &mut module,
        mlir::GPU_PROGRAM_ON_CPU_PIPELINE,
        src.text,
    )?;
    mlir::jit(&module, l.manifest, opt_level)
}

/// The machine code of the pipeline for `target`, as assembly text (`--emit=asm`).
pub fn emit_asm(
    m: &Module,
    src: &Source,
    numerics: Numerics,
    target: &Target,
    opt_level: usize,
) -> Result<String, Diagnostics> {
    let how = Codegen {
        numerics,
        target,
        gpu: None,
        opt_level,
        partitions: 1,
    };
    let (_dir, files) = machine_code(m, src, &how, None)?;
    let asm = &files[0];
    std::fs::read_to_string(asm).map_err(|e| {
        vec![Diagnostic::plain(format!(
            "cannot read {}: {e}",
            asm.display()
        ))]
    })
}

/// The PTX of every kernel of the program for `gpu` (`--emit=ptx`), module by module, each
/// after a `// ppc kernel module NAME` line.
pub fn emit_ptx(
    m: &Module,
    src: &Source,
    numerics: Numerics,
    gpu: &Gpu,
) -> Result<String, Diagnostics> {
    let l = lower(m, src, numerics, None, Some(gpu), None)?;
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &l.mlir, src.text)?;
    let pipeline = mlir::cuda_pipeline(&gpu.arch, &libdevice().map_err(|d| vec![d])?);
    mlir::run_pipeline(&ctx, &mut module, &pipeline, "CUDA", src.text)?;
    let mut out = String::new();
    for (name, ptx) in mlir::ptx_modules(&module) {
        out.push_str(&format!("// ppc kernel module {name}\n{ptx}\n"));
    }
    Ok(out)
}

/// CUDA's library of math functions for kernels (`libdevice.10.bc`): under
/// `$PPC_CUDA_TOOLKIT`, else under `tools/cuda-nvcc` of the checkout ppc was built in (where
/// `scripts/setup.sh` unpacks PyPI's `nvidia-cuda-nvcc-cu12`), else under `/usr/local/cuda`.
pub fn libdevice() -> Result<PathBuf, Diagnostic> {
    const IN_TOOLKIT: &str = "nvvm/libdevice/libdevice.10.bc";
    let mut roots: Vec<PathBuf> = std::env::var_os("PPC_CUDA_TOOLKIT")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Ok(exe) = std::env::current_exe() {
        roots.extend(
            exe.ancestors()
                .skip(1)
                .take(4)
                .map(|d| d.join("tools/cuda-nvcc/nvidia/cuda_nvcc")),
        );
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots
        .iter()
        .map(|r| r.join(IN_TOOLKIT))
        .find(|p| p.exists())
        .ok_or_else(|| {
            Diagnostic::plain("--target cuda needs CUDA's libdevice.10.bc and found none")
                .with_note("run scripts/setup.sh (it unpacks PyPI's nvidia-cuda-nvcc-cu12 into tools/cuda-nvcc), or set PPC_CUDA_TOOLKIT to a folder with nvvm/libdevice/libdevice.10.bc")
        })
}

/// Lowers, translates to LLVM IR and compiles it for `target`, into a file of a new scratch
/// directory (removed when the returned `TempDir` drops): objects (`machine::compile`) for an executable of
/// `replicas` pipelines (its module also has `main` and the packed entry the runtime calls),
/// or, with `None`, assembly. With `gpu`, the kernels are PTX inside that object.
fn machine_code(
    m: &Module,
    src: &Source,
    how: &Codegen,
    replicas: Option<u64>,
) -> Result<(TempDir, Vec<PathBuf>), Diagnostics> {
    let Codegen {
        numerics,
        target,
        gpu,
        opt_level,
        partitions,
    } = *how;
    let executable = replicas.is_some();
    let kind = if executable {
        Output::Object
    } else {
        Output::Assembly
    };
    let mut l = timing::phase("lower-mlir", || {
        lower(m, src, numerics, Some(target), gpu, replicas)
    })?;
    let ctx = mlir::context();
    let mut module = timing::phase("MLIR parse and verify", || {
        mlir::parse(&ctx, &l.mlir, src.text)
    })?;
    to_llvm_dialect(&ctx, &mut module, gpu, src)?;
    if gpu.is_some() {
        l.manifest.kernels = mlir::kernel_sources(&module);
    }
    let llvm = machine::Context::new();
    let mut ir = timing::phase("translate to LLVM IR", || {
        mlir::llvm_ir(&ctx, &module, &llvm, src.text)
    })?;
    if executable {
        llvm.link(&mut ir, &lower::executable_ir(&l.manifest))?;
    }
    let dir = TempDir::new()?;
    let out = dir.0.join(if executable { "model.o" } else { "model.s" });
    let files = machine::compile(ir, target, opt_level, partitions, kind, &out)?;
    Ok((dir, files))
}

/// The runtime library executables link: `$PPC_EXE_LIB`, or `libppc_exe.a` beside the `ppc`
/// binary (cargo puts both in `target/<profile>/`).
pub fn runtime_library() -> Result<PathBuf, Diagnostic> {
    if let Some(p) = std::env::var_os("PPC_EXE_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Diagnostic::plain(format!("cannot locate the ppc binary: {e}")))?;
    let mut dirs = exe.ancestors().skip(1).take(3);
    dirs.find_map(|d| Some(d.join("libppc_exe.a")).filter(|p| p.exists())).ok_or_else(|| {
        Diagnostic::plain("cannot find the runtime library libppc_exe.a next to ppc")
            .with_note("build it with `cargo build --release -p ppc-exe` (or `make build`), or set PPC_EXE_LIB")
    })
}

/// The C compiler's arguments for the fastest linker at hand: LLVM's lld (the MLP's 30 MB
/// runtime archive in 0.07 s), else binutils' gold (0.17 s; the default BFD linker took twice
/// that).
fn fast_linker() -> Vec<String> {
    let llvm = crate::lower::machine::tools_dir();
    if llvm.join("ld.lld").exists() {
        vec!["-fuse-ld=lld".into(), format!("-B{}", llvm.display())]
    } else {
        vec!["-fuse-ld=gold".into()]
    }
}

/// Builds a standalone executable at `out` for `target`: object code from MLIR through LLVM,
/// linked with the runtime by the system C compiler. The file appears only when the link
/// succeeded.
pub fn executable(
    m: &Module,
    src: &Source,
    how: &Codegen,
    replicas: u64,
    out: &Path,
) -> Result<(), Diagnostics> {
    let lib = runtime_library().map_err(|d| vec![d])?;
    let (dir, objects) = machine_code(m, src, how, Some(replicas))?;
    let linked = dir.0.join("model");
    let status = timing::phase("link", || {
        Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(fast_linker())
            .args(&objects)
            .arg(&lib)
            .args([
                "-lmpich",
                "-lomp",
                "-lm",
                "-lpthread",
                "-ldl",
                "-lgcc_s",
                "-lrt",
                "-o",
            ])
            .arg(&linked)
            .output()
    })
    .map_err(|e| {
        vec![Diagnostic::plain(format!(
            "cannot run the C compiler to link: {e}"
        ))]
    })?;
    if !status.status.success() {
        return Err(vec![Diagnostic::plain(format!(
            "linking failed:\n{}",
            String::from_utf8_lossy(&status.stderr)
        ))]);
    }
    let bytes = std::fs::read(&linked).map_err(|e| {
        vec![Diagnostic::plain(format!(
            "cannot read the linked executable: {e}"
        ))]
    })?;
    write_atomic(out, &bytes).map_err(|e| {
        vec![Diagnostic::plain(format!(
            "cannot write {}: {e}",
            out.display()
        ))]
    })?;
    set_executable(out).map_err(|e| {
        vec![Diagnostic::plain(format!(
            "cannot make {} executable: {e}",
            out.display()
        ))]
    })
}

/// A scratch directory, removed with everything in it when dropped (also on errors).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn new() -> Result<TempDir, Diagnostics> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "ppc-build-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).map_err(|e| {
            vec![Diagnostic::plain(format!(
                "cannot create {}: {e}",
                d.display()
            ))]
        })?;
        Ok(TempDir(d))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn set_executable(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p)?.permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm)
}
