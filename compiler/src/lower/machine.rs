//! Machine code for a named CPU: LLVM IR through LLVM's own `opt` (the optimization pipeline)
//! and `llc` (instruction selection for `-mcpu`), from the LLVM that ppc was built against.
//!
//! The JIT compiles for the CPU it runs on; executables must not, since they run on other
//! nodes. What the tools print on failure becomes the diagnostic.

use ppc_dialect::{Diagnostic, Diagnostics};
use ppc_runtime::manifest::Target;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The platform executables are built for (the runtime and its MPI are x86-64 Linux).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// What `llc` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Object,
    Assembly,
}

/// Where the LLVM tools are: `$PPC_LLVM_BIN`, else the `bin/` of the LLVM ppc was built with.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("PPC_LLVM_BIN").map_or_else(
        || {
            let prefix = option_env!("MLIR_SYS_220_PREFIX").unwrap_or("/usr/lib/llvm-22");
            Path::new(prefix).join("bin")
        },
        PathBuf::from,
    )
}

fn tool(name: &str) -> PathBuf {
    tools_dir().join(name)
}

/// The `opt` pipeline for the loops MLIR writes, at levels 1 and 2: promote the memref
/// descriptors' allocas to registers, clean up, rotate the loops (MLIR writes them test-first;
/// the vectorizer recognizes reductions only in rotated loops: 1.05× on the transformer), hoist
/// invariant address arithmetic out of them, then LLVM's loop and SLP vectorizers with the
/// target's cost model. The loops need no
/// inlining, unrolling or interprocedural work: LLVM's whole `-O2` took the transformer 2.8 s
/// against 0.15 s for this list, and the program ran no faster (BENCHMARKS.md).
const LOOP_PIPELINE: &str = "function(sroa,early-cse<memssa>,instcombine,simplifycfg,\
loop(loop-rotate),loop-mssa(licm),loop-vectorize,slp-vectorizer,instcombine,simplifycfg)";

/// `opt`'s arguments for an optimization level: none at 0, the loop pipeline at 1 and 2,
/// LLVM's full `-O3` at 3.
fn opt_passes(opt_level: usize) -> String {
    match opt_level {
        0 => "-O0".into(),
        1 | 2 => format!("-passes={LOOP_PIPELINE}"),
        _ => "-O3".into(),
    }
}

/// Compiles the LLVM IR file `ir` for `target` at `opt_level` into `out`.
pub fn compile(
    ir: &Path,
    target: &Target,
    opt_level: usize,
    kind: Output,
    out: &Path,
) -> Result<(), Diagnostics> {
    let passes = opt_passes(opt_level);
    let o = format!("-O{opt_level}");
    let mcpu = format!("-mcpu={}", target.cpu);
    // MLIR's LLVM IR names no target: without one `opt` has no cost model for the CPU and,
    // among other things, does not vectorize.
    let triple = format!("-mtriple={TRIPLE}");
    let optimized = out.with_extension("opt.bc");
    crate::timing::phase("LLVM opt", || {
        run(Command::new(tool("opt"))
            .args([passes.as_str(), triple.as_str(), mcpu.as_str()])
            .arg(ir)
            .arg("-o")
            .arg(&optimized))
    })?;
    let filetype = match kind {
        Output::Object => "-filetype=obj",
        Output::Assembly => "-filetype=asm",
    };
    crate::timing::phase("LLVM llc", || {
        run(Command::new(tool("llc"))
            .args([
                o.as_str(),
                triple.as_str(),
                mcpu.as_str(),
                "-relocation-model=pic",
                filetype,
            ])
            .arg(&optimized)
            .arg("-o")
            .arg(out))
    })
}

fn run(cmd: &mut Command) -> Result<(), Diagnostics> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let output = cmd.output().map_err(|e| {
        vec![Diagnostic::plain(format!("cannot run {program}: {e}"))
            .with_note("ppc needs LLVM 22's opt and llc (Debian package llvm-22); set PPC_LLVM_BIN to the folder that holds them")]
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(vec![Diagnostic::plain(format!(
        "{program} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim_end()
    ))])
}
