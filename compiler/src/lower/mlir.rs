//! Everything that touches MLIR (through melior): parsing and verifying the lowered module with
//! MLIR diagnostics mapped back to the model file, the CPU pass pipeline, the JIT, and the LLVM
//! IR that executables are compiled from (`machine.rs`).
//!
//! This is the one module of the compiler allowed `unsafe`: registering runtime symbols with
//! the JIT, calling the code it produced, translating to LLVM IR through MLIR's C API, and
//! catching what LLVM prints on the standard error while it JIT-compiles.
#![allow(unsafe_code)]

use super::machine;
use super::text::Lines;
use melior::dialect::DialectRegistry;
use melior::ir::operation::OperationLike;
use melior::ir::{BlockLike, Module};
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::{Context, ExecutionEngine};
use ppc_dialect::span::Span;
use ppc_dialect::{Diagnostic, Diagnostics};
use ppc_runtime::abi::{self, FORWARD as ENTRY};
use ppc_runtime::exec::{PackedFn, Program};
use ppc_runtime::manifest::Manifest;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Once;

/// The CPU pipeline: the module's transform script makes the marked loop nests parallel
/// (`scf.forall`, then OpenMP's parallel loop on the runtime's one thread pool); then loops from
/// linalg, libm calls for the remaining math, control flow, LLVM. `convert-scf-to-cf` comes
/// after `finalize-memref-to-llvm`, which must first lower the `memref.alloca_scope` that
/// OpenMP's loop bodies are wrapped in.
///
/// bf16 conversions and selects are integer arithmetic written by the lowering (`ops.rs`: round
/// to nearest even, NaN to the quiet NaN `0x7fc0`), so they need neither an AVX-512 BF16
/// instruction nor the `__truncsfbf2` that libgcc before 13 lacks, and round alike on every
/// CPU; `arith-expand{include-bf16}` covers any a pass might add. f16 conversions are F16C
/// instructions (every x86-64-v3 CPU) or libgcc's `__truncsfhf2`/`__extendhfsf2` (libgcc 12 and
/// later) below it: both IEEE round to nearest even.
pub const CPU_PIPELINE: &str = cpu_pipeline!("transform-interpreter,");

/// The CPU pipeline for a `--target cuda` program whose kernels run as CPU loops (tests): the
/// transform script, which maps loop nests onto GPU blocks, is left out.
pub const GPU_PROGRAM_ON_CPU_PIPELINE: &str = cpu_pipeline!("");

macro_rules! cpu_pipeline {
    ($transform:literal) => {
        concat!("builtin.module(", $transform, "symbol-dce,scf-forall-to-parallel,\
convert-scf-to-openmp,convert-linalg-to-loops,arith-expand{include-bf16=true},lower-affine,convert-math-to-libm,\
expand-strided-metadata,lower-affine,finalize-memref-to-llvm,convert-scf-to-cf,convert-to-llvm,reconcile-unrealized-casts)")
    };
}
use cpu_pipeline;

/// The CUDA pipeline's first half (`--target cuda`): the module's transform script maps each
/// tagged loop nest onto blocks and threads (`gpu_map.rs`); the kernels are outlined and
/// compiled to PTX for `arch` (math functions from CUDA's `libdevice`, inlined); the host code
/// keeps `gpu.launch_func`s and the PTX as `gpu.binary`s. [`CUDA_HOST_PIPELINE`] finishes it.
pub fn cuda_pipeline(arch: &str, libdevice: &std::path::Path) -> String {
    format!(
        "builtin.module(transform-interpreter,symbol-dce,convert-linalg-to-loops,\
gpu-launch-sink-index-computations,gpu-kernel-outlining,lower-affine,canonicalize,cse,\
nvvm-attach-target{{chip={arch} features=+ptx80 O=3 l={}}},\
gpu.module(expand-strided-metadata,lower-affine,arith-expand{{include-bf16=true}},convert-scf-to-cf,\
convert-gpu-to-nvvm,canonicalize,cse,reconcile-unrealized-casts),gpu-module-to-binary{{format=isa}})",
        libdevice.display()
    )
}

/// The host half of the CUDA pipeline: as the CPU's, but buffers come from the runtime's
/// allocator (`_mlir_memref_to_llvm_alloc`: CUDA managed memory) and launches become calls of
/// MLIR's GPU runtime interface (`mgpuLaunchKernel`, ...), which the runtime implements.
pub const CUDA_HOST_PIPELINE: &str = "builtin.module(arith-expand{include-bf16=true},lower-affine,\
convert-math-to-libm,expand-strided-metadata,lower-affine,finalize-memref-to-llvm{use-generic-functions=true},\
convert-scf-to-cf,gpu-to-llvm,convert-to-llvm,reconcile-unrealized-casts)";

/// Runs `pipeline` on `module`; MLIR's complaints become diagnostics on `source`.
///
/// Debug builds (the tests) verify the module after every pass, so that a pass that breaks it
/// is named; release builds verify it once, at the end: verifying after each of the CPU
/// pipeline's 13 passes took 0.2 of its 0.58 s on the d = 1024 training step (BENCHMARKS.md).
pub fn run_pipeline(
    ctx: &Context,
    module: &mut Module,
    pipeline: &str,
    what: &str,
    source: &str,
) -> Result<(), Diagnostics> {
    let diags = Collector::attach(ctx);
    let pm = PassManager::new(ctx);
    pm.enable_verifier(cfg!(debug_assertions));
    parse_pass_pipeline(pm.as_operation_pass_manager(), pipeline)
        .map_err(|e| vec![Diagnostic::plain(format!("bad pass pipeline: {e}"))])?;
    pm.run(module)
        .map_err(|_| diags.take(source, &format!("the {what} pass pipeline failed")))?;
    if !module.as_operation().verify() {
        let why = format!("the {what} pass pipeline left a module that does not verify");
        return Err(diags.take(source, &why));
    }
    Ok(())
}

/// The PTX of each kernel module (`gpu.binary` after [`cuda_pipeline`]), with its name.
/// Where each kernel module of a module after the CUDA pipeline comes from in the model file
/// (`file:line:col`, the location of the loop nest it was outlined from; `?` where MLIR lost
/// it), in the order of its `gpu.binary` ops, which is the order they register at start.
pub fn kernel_sources(module: &Module) -> Vec<String> {
    let mut out = Vec::new();
    let mut op = module.body().first_operation();
    while let Some(o) = op {
        if o.name().as_string_ref().as_str() == Ok("gpu.binary") {
            out.push(file_line_col(&o.location().to_string()));
        }
        op = o.next_in_block();
    }
    out
}

/// `loc("file":line:col)` (possibly inside a fused or call-site location) as `file:line:col`.
fn file_line_col(loc: &str) -> String {
    let Some(start) = loc.find("loc(\"") else {
        return "?".into();
    };
    let rest = &loc[start + 5..];
    let Some(end) = rest.find('"') else {
        return "?".into();
    };
    let (file, after) = (&rest[..end], &rest[end + 1..]);
    let numbers: String = after
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ':')
        .collect();
    format!("{file}{numbers}")
}

pub fn ptx_modules(module: &Module) -> Vec<(String, String)> {
    use melior::ir::attribute::AttributeLike;
    let mut out = Vec::new();
    let body = module.body();
    let mut op = body.first_operation();
    while let Some(o) = op {
        if o.name().as_string_ref().as_str() == Ok("gpu.binary") {
            let name = o
                .attribute("sym_name")
                .map(|a| a.to_string().trim_matches('"').to_string())
                .unwrap_or_default();
            if let Ok(objects) = o.attribute("objects") {
                // SAFETY: `objects` of a `gpu.binary` is an array of `#gpu.object`s; the
                // string returned points into the attribute, which lives as long as `module`,
                // and is copied at once.
                let ptx = unsafe {
                    let first = mlir_sys::mlirArrayAttrGetElement(objects.to_raw(), 0);
                    let s = mlir_sys::mlirGPUObjectAttrGetObject(first);
                    let bytes = std::slice::from_raw_parts(s.data.cast::<u8>(), s.length);
                    String::from_utf8_lossy(bytes)
                        .trim_end_matches('\0')
                        .to_string()
                };
                out.push((name, ptx));
            }
        }
        op = o.next_in_block();
    }
    out
}

/// An MLIR context with every dialect, pass and LLVM translation registered.
pub fn context() -> Context {
    static PASSES: Once = Once::new();
    PASSES.call_once(register_all_passes);
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let ctx = Context::new();
    ctx.append_dialect_registry(&registry);
    ctx.load_all_available_dialects();
    register_all_llvm_translations(&ctx);
    ctx
}

/// Collects MLIR's diagnostics, located in the model file where MLIR's location says.
struct Collector {
    messages: Rc<RefCell<Vec<(String, String)>>>,
}

impl Collector {
    fn attach(ctx: &Context) -> Collector {
        let messages: Rc<RefCell<Vec<(String, String)>>> = Rc::default();
        let sink = messages.clone();
        ctx.attach_diagnostic_handler(move |d| {
            sink.borrow_mut()
                .push((d.location().to_string(), d.to_string()));
            true
        });
        Collector { messages }
    }

    /// The collected messages as diagnostics on `source`, or `fallback` if MLIR said nothing.
    fn take(&self, source: &str, fallback: &str) -> Diagnostics {
        let lines = Lines::new(source);
        let msgs = std::mem::take(&mut *self.messages.borrow_mut());
        if msgs.is_empty() {
            return vec![Diagnostic::plain(fallback)];
        }
        msgs.into_iter()
            .map(|(loc, msg)| match span_of(&loc, &lines, source) {
                Some(span) => {
                    Diagnostic::error(format!("MLIR: {msg}"), span, "while lowering this")
                }
                None => Diagnostic::plain(format!("MLIR: {msg} (at {loc})")),
            })
            .collect()
    }
}

/// The span of `loc("file":line:col)` in `source`.
fn span_of(loc: &str, lines: &Lines, source: &str) -> Option<Span> {
    let tail = loc.rsplit("\":").next()?;
    let mut parts = tail.trim_end_matches(')').split(':');
    let (line, col): (usize, usize) = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
    let start = lines.offset(line, col).filter(|&o| o < source.len())?;
    let end = source[start..]
        .find('\n')
        .map_or(source.len(), |n| start + n);
    Some(Span::new(start, end))
}

/// The lowered module, parsed and verified by MLIR.
pub fn parse<'c>(ctx: &'c Context, text: &str, source: &str) -> Result<Module<'c>, Diagnostics> {
    // A debugging aid for compiler developers: the text MLIR is about to read.
    if let Some(path) = std::env::var_os("PPC_DUMP_MLIR") {
        let _ = std::fs::write(path, text);
    }
    let diags = Collector::attach(ctx);
    let module = Module::parse(ctx, text)
        .ok_or_else(|| diags.take(source, "MLIR could not parse the lowered module"))?;
    if !module.as_operation().verify() {
        return Err(diags.take(source, "the lowered module does not verify"));
    }
    Ok(module)
}

/// Runs the CPU pipeline on `module`, leaving only the LLVM dialect.
pub fn lower_to_llvm(ctx: &Context, module: &mut Module, source: &str) -> Result<(), Diagnostics> {
    lower_to_llvm_by(ctx, module, CPU_PIPELINE, source)
}

/// Runs `pipeline` (a CPU pipeline) on `module`, leaving only the LLVM dialect.
pub fn lower_to_llvm_by(
    ctx: &Context,
    module: &mut Module,
    pipeline: &str,
    source: &str,
) -> Result<(), Diagnostics> {
    run_pipeline(ctx, module, pipeline, "CPU", source)?;
    only_llvm_left(module)
}

/// Checks that only the LLVM dialect is left at the module's top level.
fn only_llvm_left(module: &Module) -> Result<(), Diagnostics> {
    // The execution engine crashes on anything but the LLVM dialect: check before handing over.
    let body = module.body();
    let mut op = body.first_operation();
    while let Some(o) = op {
        let name = o
            .name()
            .as_string_ref()
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !name.starts_with("llvm.") {
            return Err(vec![Diagnostic::plain(format!(
                "internal compiler error: `{name}` survived lowering to LLVM"
            ))]);
        }
        op = o.next_in_block();
    }
    Ok(())
}

/// A JIT-compiled pipeline, ready to run.
pub struct Jit {
    // Field order matters: the program's code lives in the engine, so it drops first.
    pub program: Program,
    _engine: ExecutionEngine,
}

/// JIT-compiles a module lowered to LLVM at `opt_level` (0–3), for this CPU.
pub fn jit(module: &Module, manifest: Manifest, opt_level: usize) -> Result<Jit, Diagnostics> {
    // The engine compiles lazily, at the first lookup; LLVM reports what goes wrong there (a
    // symbol nothing defines, say) on the standard error only.
    // The entries the manifest says the module defines: the step, and maybe its evaluation
    // and (a CUDA training step) its optimizer updates.
    let updates = ppc_runtime::gpu_update::built(&manifest);
    let wanted = [
        (ENTRY, true),
        (abi::EVALUATE, !manifest.evaluate.is_empty()),
        (ppc_runtime::gpu_update::ADAMW, updates),
        (ppc_runtime::gpu_update::SGD, updates),
        (ppc_runtime::gpu_update::SQUARES, updates),
    ];
    let ((engine, found), said) = capture_stderr(|| {
        let engine = ExecutionEngine::new(module, opt_level, &[], false, false);
        // SAFETY: the lowered module declares the runtime's functions with their signatures.
        unsafe { register_runtime(&engine) };
        let found: Vec<*mut ()> = (wanted.iter())
            .map(|&(name, defined)| match defined {
                true => engine.lookup(&format!("_mlir__mlir_ciface_{name}")),
                false => std::ptr::null_mut(),
            })
            .collect();
        (engine, found)
    });
    if wanted
        .iter()
        .zip(&found)
        .any(|((_, defined), p)| *defined && p.is_null())
    {
        let why = if said.trim().is_empty() {
            "LLVM gave no reason".to_string()
        } else {
            said.trim_end().to_string()
        };
        return Err(vec![Diagnostic::plain(format!(
            "the JIT could not compile the program:\n{why}"
        ))]);
    }
    if !said.trim().is_empty() {
        // Warnings from LLVM: not ours to hide.
        eprint!("{said}");
    }
    // SAFETY: each pointer is the packed wrapper MLIR generates for the C interface of the
    // entry of its name, which `lower` wrote with the arguments the runtime passes: the
    // manifest's (`ENTRY`), its `evaluate` (`abi::EVALUATE`), `gpu_update::args` (the updates)
    // and `gpu_update::squares_args`.
    let program = unsafe {
        let packed = |p: *mut ()| std::mem::transmute::<*mut (), PackedFn>(p);
        let mut program = Program::new(manifest, packed(found[0]));
        if !found[1].is_null() {
            program = program.with_evaluate(packed(found[1]));
        }
        if updates {
            program = program.with_update(packed(found[2]), packed(found[3]), packed(found[4]));
        }
        program
    };
    Ok(Jit {
        program,
        _engine: engine,
    })
}

/// Runs `f` with the process's standard error (file descriptor 2) going to a temporary file;
/// returns what was written there. One capture at a time: the descriptor is process-wide.
fn capture_stderr<T>(f: impl FnOnce() -> T) -> (T, String) {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::sync::Mutex;
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    extern "C" {
        fn dup(fd: i32) -> i32;
        fn dup2(from: i32, to: i32) -> i32;
        fn close(fd: i32) -> i32;
    }
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(mut file) = tempfile() else {
        return (f(), String::new());
    };
    let _ = std::io::stderr().flush();
    // SAFETY: plain descriptor calls on 2 and on descriptors this function owns; fd 2 is
    // restored before returning, and the saved copy closed.
    let saved = unsafe { dup(2) };
    if saved < 0 || unsafe { dup2(file.as_raw_fd(), 2) } < 0 {
        return (f(), String::new());
    }
    let result = f();
    let _ = std::io::stderr().flush();
    // SAFETY: `saved` is the descriptor `dup` returned above.
    unsafe {
        dup2(saved, 2);
        close(saved);
    }
    let mut said = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut said);
    (result, said)
}

/// An anonymous file in the temporary directory (removed as soon as it is open).
fn tempfile() -> std::io::Result<std::fs::File> {
    let path = std::env::temp_dir().join(format!(
        "ppc-stderr-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

/// The LLVM IR of a module lowered to the LLVM dialect, in `llvm`: handed to LLVM as it is, not
/// printed and parsed again (0.12 s of the d = 1024 training step's compile).
pub fn llvm_ir<'l>(
    ctx: &Context,
    module: &Module,
    llvm: &'l machine::Context,
    source: &str,
) -> Result<machine::Module<'l>, Diagnostics> {
    let diags = Collector::attach(ctx);
    // SAFETY: the translation creates a module in `llvm`, which outlives it, owned by the
    // result alone.
    unsafe {
        let translated =
            mlir_sys::mlirTranslateModuleToLLVMIR(module.as_operation().to_raw(), llvm.raw());
        if translated.is_null() {
            return Err(diags.take(source, "MLIR could not translate the module to LLVM IR"));
        }
        Ok(machine::Module::from_raw(llvm, translated))
    }
}

/// Makes the runtime functions generated code calls visible to `engine`.
///
/// # Safety
/// The lowered module must declare them with the signatures the runtime defines.
unsafe fn register_runtime(engine: &ExecutionEngine) {
    for f in ppc_runtime::abi::all() {
        // SAFETY: each is an `extern "C"` function of the runtime with the signature the table
        // declares.
        unsafe { engine.register_symbol(&f.symbol(), f.address()) };
    }
}
