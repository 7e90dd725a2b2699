//! The CPU backend: lower the pipelined module through MLIR, then JIT it for `ppc run` or link
//! it with the runtime into a standalone executable for `ppc compile -o`.

use crate::lower::{self, mlir, Gemm, Lowered};
use ppc_dialect::{Diagnostic, Diagnostics, Module};
use ppc_runtime::files::write_atomic;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the backend needs besides the module: where it came from and how to build it.
pub struct Source<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

pub fn lower(
    m: &Module,
    src: &Source,
    gemm: Gemm,
    executable: bool,
) -> Result<Lowered, Diagnostics> {
    lower::lower(m, &lower::Options { gemm, executable }, src.file, src.text).map_err(|d| vec![d])
}

/// The MLIR module (`--emit=mlir`), verified by MLIR, with its model-file locations.
pub fn emit_mlir(m: &Module, src: &Source, gemm: Gemm) -> Result<String, Diagnostics> {
    use melior::ir::operation::{OperationLike, OperationPrintingFlags};
    let l = lower(m, src, gemm, false)?;
    let ctx = mlir::context();
    let module = mlir::parse(&ctx, &l.mlir, src.text)?;
    let flags = OperationPrintingFlags::new().enable_debug_info(true, false);
    module
        .as_operation()
        .to_string_with_flags(flags)
        .map_err(|e| vec![Diagnostic::plain(format!("cannot print MLIR: {e}"))])
}

/// The LLVM dialect after the CPU pipeline (`--emit=llvm`).
pub fn emit_llvm(m: &Module, src: &Source, gemm: Gemm) -> Result<String, Diagnostics> {
    let l = lower(m, src, gemm, false)?;
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &l.mlir, src.text)?;
    mlir::lower_to_llvm(&ctx, &mut module, src.text)?;
    Ok(module.as_operation().to_string())
}

/// JIT-compiles the pipeline for this process.
pub fn jit(
    m: &Module,
    src: &Source,
    gemm: Gemm,
    opt_level: usize,
) -> Result<mlir::Jit, Diagnostics> {
    let l = lower(m, src, gemm, false)?;
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &l.mlir, src.text)?;
    mlir::lower_to_llvm(&ctx, &mut module, src.text)?;
    mlir::jit(&module, l.manifest, opt_level)
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

/// Builds a standalone executable at `out`: object code from MLIR, linked with the runtime by
/// the system C compiler. The file appears only when the link succeeded.
pub fn executable(
    m: &Module,
    src: &Source,
    gemm: Gemm,
    opt_level: usize,
    out: &Path,
) -> Result<(), Diagnostics> {
    let lib = runtime_library().map_err(|d| vec![d])?;
    let l = lower(m, src, gemm, true)?;
    let ctx = mlir::context();
    let mut module = mlir::parse(&ctx, &l.mlir, src.text)?;
    mlir::lower_to_llvm(&ctx, &mut module, src.text)?;
    let dir = tempdir()?;
    let obj = dir.join("model.o");
    mlir::object_file(&module, opt_level, &obj.display().to_string())?;
    let linked = dir.join("model");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg(&obj)
        .arg(&lib)
        .args([
            "-lmpich",
            "-lm",
            "-lpthread",
            "-ldl",
            "-lgcc_s",
            "-lrt",
            "-o",
        ])
        .arg(&linked)
        .output()
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
    })?;
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}

fn tempdir() -> Result<PathBuf, Diagnostics> {
    let d = std::env::temp_dir().join(format!(
        "ppc-build-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d).map_err(|e| {
        vec![Diagnostic::plain(format!(
            "cannot create {}: {e}",
            d.display()
        ))]
    })?;
    Ok(d)
}

fn set_executable(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p)?.permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm)
}
