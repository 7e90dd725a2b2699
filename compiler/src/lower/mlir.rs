//! Everything that touches MLIR (through melior): parsing and verifying the lowered module with
//! MLIR diagnostics mapped back to the model file, the CPU pass pipeline, the JIT, and object
//! files for executables.
//!
//! This is the one module of the compiler allowed `unsafe`: registering runtime symbols with
//! the JIT and calling the code it produced.
#![allow(unsafe_code)]

use super::emit::Lines;
use super::ENTRY;
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
use ppc_runtime::exec::{PackedFn, Program};
use ppc_runtime::manifest::Manifest;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Once;

/// The CPU pipeline: loops from linalg, control flow, libm calls for math, then LLVM.
pub const CPU_PIPELINE: &str = "builtin.module(convert-linalg-to-loops,lower-affine,convert-scf-to-cf,convert-math-to-libm,\
expand-strided-metadata,lower-affine,finalize-memref-to-llvm,convert-to-llvm,reconcile-unrealized-casts)";

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
    let diags = Collector::attach(ctx);
    let pm = PassManager::new(ctx);
    parse_pass_pipeline(pm.as_operation_pass_manager(), CPU_PIPELINE)
        .map_err(|e| vec![Diagnostic::plain(format!("bad pass pipeline: {e}"))])?;
    pm.run(module)
        .map_err(|_| diags.take(source, "the CPU pass pipeline failed"))?;
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

/// JIT-compiles a module lowered to LLVM at `opt_level` (0–3).
pub fn jit(module: &Module, manifest: Manifest, opt_level: usize) -> Result<Jit, Diagnostics> {
    let engine = ExecutionEngine::new(module, opt_level, &[], false, false);
    // SAFETY: the lowered module declares the runtime's functions with their signatures.
    unsafe { register_runtime(&engine) };
    let ptr = engine.lookup(&format!("_mlir__mlir_ciface_{ENTRY}"));
    if ptr.is_null() {
        return Err(vec![Diagnostic::plain(
            "the JIT did not produce the entry point",
        )]);
    }
    // SAFETY: `ptr` is the packed wrapper MLIR generates for the C interface of `ENTRY`, whose
    // arguments are the manifest's, in order (both come from the same `lower` call).
    let program = unsafe {
        let entry: PackedFn = std::mem::transmute::<*mut (), PackedFn>(ptr);
        Program::new(manifest, entry)
    };
    Ok(Jit {
        program,
        _engine: engine,
    })
}

/// Makes the runtime functions generated code calls visible to `engine`.
///
/// # Safety
/// The lowered module must declare them with the signatures the runtime defines.
unsafe fn register_runtime(engine: &ExecutionEngine) {
    let gemm = ppc_runtime::gemm::symbols();
    for (name, ptr) in gemm.into_iter().chain(ppc_runtime::comm::symbols()) {
        // SAFETY: each is an `extern "C"` function of the runtime with its C-interface signature.
        unsafe { engine.register_symbol(name, ptr) };
    }
}

/// Stands in for `ppc_main` while generating an executable's object code.
extern "C" fn placeholder() -> i32 {
    1
}

/// Compiles a module lowered to LLVM into an object file at `path`.
pub fn object_file(module: &Module, opt_level: usize, path: &str) -> Result<(), Diagnostics> {
    let engine = ExecutionEngine::new(module, opt_level, &[], true, true);
    // Generating the object links it in-process too; the symbols the executable gets from the
    // runtime library must resolve here, though this copy of the code never runs.
    // SAFETY: the addresses are valid functions and are never called through the engine.
    unsafe {
        register_runtime(&engine);
        engine.register_symbol("ppc_main", placeholder as *mut ());
    }
    // Looking up a symbol makes the engine generate the code it then dumps.
    if engine
        .lookup(&format!("_mlir__mlir_ciface_{ENTRY}"))
        .is_null()
    {
        return Err(vec![Diagnostic::plain(
            "code generation produced no entry point",
        )]);
    }
    engine.dump_to_object_file(path);
    if !std::path::Path::new(path).exists() {
        return Err(vec![Diagnostic::plain(format!(
            "could not write the object file {path}"
        ))]);
    }
    Ok(())
}
