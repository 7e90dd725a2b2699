//! Machine code for a named CPU: LLVM IR through LLVM's optimization pipeline and instruction
//! selection for that CPU, in this process, through LLVM's C API (the LLVM that ppc links for
//! MLIR). The same passes and target machine as `opt` and `llc` give the same instructions, but
//! without starting two processes that each load and relocate LLVM's shared library and pass
//! bitcode between them: the MLP example's LLVM phases took 0.17 s as two tools, 0.09 s here
//! (BENCHMARKS.md).
//!
//! The JIT compiles for the CPU it runs on; executables must not, since they run on other
//! nodes. What LLVM reports on failure becomes the diagnostic.
#![allow(unsafe_code)] // LLVM's C API

use ppc_dialect::{Diagnostic, Diagnostics};
use ppc_runtime::manifest::Target;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

/// The platform executables are built for (the runtime and its MPI are x86-64 Linux).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// What to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Object,
    Assembly,
}

/// Where the LLVM tools are (the linker, `ld.lld`): `$PPC_LLVM_BIN`, else the `bin/` of the
/// LLVM ppc was built with.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("PPC_LLVM_BIN").map_or_else(
        || {
            let prefix = option_env!("MLIR_SYS_220_PREFIX").unwrap_or("/usr/lib/llvm-22");
            Path::new(prefix).join("bin")
        },
        PathBuf::from,
    )
}

/// The pipeline for the loops MLIR writes, at levels 1 and 2: promote the memref descriptors'
/// allocas to registers, clean up, rotate the loops (MLIR writes them test-first; the
/// vectorizer recognizes reductions only in rotated loops: 1.05× on the transformer), hoist
/// invariant address arithmetic out of them, then LLVM's loop and SLP vectorizers with the
/// target's cost model. The loops need no inlining, unrolling or interprocedural work: LLVM's
/// whole `-O2` took the transformer 2.8 s against 0.15 s for this list, and the program ran no
/// faster (BENCHMARKS.md).
/// `instcombine` without its fixpoint check, as LLVM's own `-O` pipelines run it: by name it
/// aborts the process when one run leaves more to combine (it did on a training step).
/// Then `mergefunc`: functions of the same code become one (the stage bodies a training step
/// and its evaluation share, a forward recomputed in the backward), so code generation, the
/// largest part of a compile, sees each once: the d = 1024 training step compiled in 1.82 s
/// against 1.95 s without it (BENCHMARKS.md).
const LOOP_PIPELINE: &str = "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,\
simplifycfg,loop(loop-rotate),loop-mssa(licm),loop-vectorize,slp-vectorizer,\
instcombine<no-verify-fixpoint>,simplifycfg),mergefunc";

/// The passes for an optimization level: none at 0, the loop pipeline at 1 and 2, LLVM's
/// full `-O3` at 3.
fn passes(opt_level: usize) -> &'static str {
    match opt_level {
        0 => "default<O0>",
        1 | 2 => LOOP_PIPELINE,
        _ => "default<O3>",
    }
}

/// Compiles `module` for `target` at `opt_level` into `out`, or for an object of a module of
/// several functions into one object for each of up to `partitions` partitions beside it
/// (`partition.rs`, compiled in parallel); returns the files written, to be linked together.
pub fn compile(
    module: Module<'_>,
    target: &Target,
    opt_level: usize,
    partitions: usize,
    kind: Output,
    out: &Path,
) -> Result<Vec<PathBuf>, Diagnostics> {
    init_x86();
    let whole = Part::new(target, module)?;
    let plan = match kind {
        Output::Object => {
            // Functions of the same code merge before the cut (`mergefunc` again in each
            // partition's pipeline merges what only optimization made alike): merged in a
            // partition only, a training step's copies were compiled up to twice.
            if opt_level > 0 {
                crate::timing::phase("LLVM mergefunc", || whole.run(MERGE))?;
            }
            // SAFETY: the module is alive and used by this thread only.
            unsafe { super::partition::plan(whole.module.0, partitions) }
        }
        Output::Assembly => None,
    };
    let Some(plan) = plan else {
        crate::timing::phase("LLVM opt", || whole.optimize(opt_level))?;
        crate::timing::phase("LLVM codegen", || whole.emit(kind, out))?;
        return Ok(vec![out.to_path_buf()]);
    };
    let outs: Vec<PathBuf> = (0..plan.len())
        .map(|p| out.with_extension(format!("{p}.o")))
        .collect();
    // The other partitions read the merged module as bitcode (LLVM contexts are not shared
    // between threads), which reads faster than its text.
    let bitcode = crate::timing::phase("write bitcode", || Bitcode::of(&whole.module));
    std::thread::scope(|s| {
        let others: Vec<_> = (1..plan.len())
            .map(|p| {
                let (plan, out, bitcode) = (&plan, &outs[p], &bitcode);
                s.spawn(move || {
                    let ctx = Context::new();
                    let part = Part::new(target, ctx.read(bitcode)?)?;
                    // SAFETY: this thread's own module.
                    unsafe { super::partition::keep(part.module.0, plan, p) };
                    part.optimize(opt_level)?;
                    part.emit(kind, out)
                })
            })
            .collect();
        let part = whole;
        // SAFETY: this thread's own module.
        unsafe { super::partition::keep(part.module.0, &plan, 0) };
        crate::timing::phase("LLVM opt", || part.optimize(opt_level))?;
        crate::timing::phase("LLVM codegen", || {
            part.emit(kind, &outs[0])?;
            others.into_iter().try_for_each(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(failed(
                        "compiling a partition",
                        "the thread panicked".into(),
                    ))
                })
            })
        })
    })?;
    Ok(outs)
}

/// Registers LLVM's x86-64 target, once.
fn init_x86() {
    // SAFETY: the target registration runs once, before any target machine exists.
    unsafe {
        static INIT: std::sync::Once = std::sync::Once::new();
        INIT.call_once(|| {
            ffi::LLVMInitializeX86TargetInfo();
            ffi::LLVMInitializeX86Target();
            ffi::LLVMInitializeX86TargetMC();
            ffi::LLVMInitializeX86AsmPrinter();
        });
    }
}

/// `mergefunc` alone, for the whole module before it is cut.
const MERGE: &str = "mergefunc";

/// A module with the target machine it is compiled for (dropped in this order, both before
/// the module's context).
struct Part<'c> {
    module: Module<'c>,
    machine: TargetMachine,
}

impl<'c> Part<'c> {
    fn new(target: &Target, module: Module<'c>) -> Result<Part<'c>, Diagnostics> {
        let triple = CString::new(TRIPLE).expect("invariant: no NUL");
        let machine = TargetMachine::new(&triple, &target.cpu)?;
        // SAFETY: the module and the machine are alive; the layout is disposed of after use.
        unsafe {
            ffi::LLVMSetTarget(module.0, triple.as_ptr());
            let layout = ffi::LLVMCreateTargetDataLayout(machine.0);
            ffi::LLVMSetModuleDataLayout(module.0, layout);
            ffi::LLVMDisposeTargetData(layout);
            super::init_array::lower(module.0);
        }
        Ok(Part { module, machine })
    }

    fn optimize(&self, opt_level: usize) -> Result<(), Diagnostics> {
        self.run(passes(opt_level))
    }

    fn run(&self, passes: &str) -> Result<(), Diagnostics> {
        let pipeline = CString::new(passes).expect("invariant: no NUL");
        // SAFETY: the module and the machine are alive; the options are disposed of once and
        // the error message freed after it is copied.
        unsafe {
            let options = ffi::LLVMCreatePassBuilderOptions();
            let err = ffi::LLVMRunPasses(self.module.0, pipeline.as_ptr(), self.machine.0, options);
            ffi::LLVMDisposePassBuilderOptions(options);
            if err.is_null() {
                return Ok(());
            }
            let message = ffi::LLVMGetErrorMessage(err);
            let text = CStr::from_ptr(message).to_string_lossy().into_owned();
            ffi::LLVMDisposeErrorMessage(message);
            Err(failed("optimizing", text))
        }
    }

    fn emit(&self, kind: Output, out: &Path) -> Result<(), Diagnostics> {
        let file = CString::new(out.to_string_lossy().as_bytes()).map_err(|_| {
            vec![Diagnostic::plain(format!(
                "a NUL byte in `{}`",
                out.display()
            ))]
        })?;
        let file_type = match kind {
            Output::Assembly => ffi::ASSEMBLY_FILE,
            Output::Object => ffi::OBJECT_FILE,
        };
        // SAFETY: the module and the machine are alive, the path NUL-terminated; the message
        // is LLVM's, freed by `take`.
        unsafe {
            let mut message = std::ptr::null_mut();
            let failed_to_emit = ffi::LLVMTargetMachineEmitToFile(
                self.machine.0,
                self.module.0,
                file.as_ptr(),
                file_type,
                &mut message,
            ) != 0;
            if failed_to_emit {
                return Err(failed("writing machine code", take(message)));
            }
        }
        Ok(())
    }
}

fn failed(what: &str, message: String) -> Diagnostics {
    vec![Diagnostic::plain(format!("LLVM failed {what}: {message}"))]
}

/// An LLVM message as text; frees it.
///
/// # Safety
/// `message` is null or a message LLVM allocated.
unsafe fn take(message: *mut c_char) -> String {
    if message.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe {
        let text = CStr::from_ptr(message).to_string_lossy().into_owned();
        mlir_sys::LLVMDisposeMessage(message);
        text
    }
}

/// An LLVM context: what a module's types and constants live in, used by one thread at a time.
pub struct Context(mlir_sys::LLVMContextRef);

impl Default for Context {
    fn default() -> Context {
        Context::new()
    }
}

impl Context {
    pub fn new() -> Context {
        // SAFETY: a fresh context, disposed of by `Drop`.
        Context(unsafe { mlir_sys::LLVMContextCreate() })
    }

    /// The module of IR text `ir`, in this context.
    fn parse(&self, ir: &str) -> Result<Module<'_>, Diagnostics> {
        // SAFETY: the buffer copies `ir`, and parsing takes ownership of it; the module lives
        // in this context, which outlives it (`Module`'s lifetime).
        unsafe {
            let buffer = mlir_sys::LLVMCreateMemoryBufferWithMemoryRangeCopy(
                ir.as_ptr().cast(),
                ir.len(),
                c"model.ll".as_ptr(),
            );
            let (mut module, mut message) = (std::ptr::null_mut(), std::ptr::null_mut());
            if ffi::LLVMParseIRInContext(self.0, buffer, &mut module, &mut message) != 0 {
                return Err(failed("reading the IR", take(message)));
            }
            Ok(Module(module, std::marker::PhantomData))
        }
    }

    /// The context as LLVM's C API takes it, for MLIR's translation into it.
    pub fn raw(&self) -> mlir_sys::LLVMContextRef {
        self.0
    }

    /// Links the module of IR text `ir` (which declares what it uses of `module`) into
    /// `module`, a module of this context.
    pub fn link(&self, module: &mut Module<'_>, ir: &str) -> Result<(), Diagnostics> {
        let other = self.parse(ir)?;
        // SAFETY: both modules live in this context; linking destroys the source module, so
        // `other` is forgotten, not dropped.
        let failed_to_link = unsafe { ffi::LLVMLinkModules2(module.0, other.0) != 0 };
        std::mem::forget(other);
        match failed_to_link {
            true => Err(failed(
                "linking the entry points",
                "its reason is on the standard error".into(),
            )),
            false => Ok(()),
        }
    }

    /// The module `bitcode` holds, in this context.
    fn read(&self, bitcode: &Bitcode) -> Result<Module<'_>, Diagnostics> {
        // SAFETY: the buffer refers to `bitcode`'s bytes, which outlive it, and is disposed of
        // here (parsing reads it, does not take it); the module lives in this context.
        unsafe {
            let bytes = bitcode.bytes();
            let buffer = mlir_sys::LLVMCreateMemoryBufferWithMemoryRange(
                bytes.as_ptr().cast(),
                bytes.len(),
                c"model.bc".as_ptr(),
                0,
            );
            let mut module = std::ptr::null_mut();
            let failed_to_read = ffi::LLVMParseBitcodeInContext2(self.0, buffer, &mut module) != 0;
            mlir_sys::LLVMDisposeMemoryBuffer(buffer);
            if failed_to_read {
                return Err(failed("reading the bitcode", "invalid bitcode".into()));
            }
            Ok(Module(module, std::marker::PhantomData))
        }
    }
}

/// A module written as bitcode, in a buffer LLVM owns, read by other threads.
struct Bitcode(mlir_sys::LLVMMemoryBufferRef);

// SAFETY: the buffer is written once, then only read, by any thread.
unsafe impl Sync for Bitcode {}

impl Bitcode {
    fn of(module: &Module) -> Bitcode {
        // SAFETY: the module is alive; the buffer is disposed of by `Drop`.
        Bitcode(unsafe { ffi::LLVMWriteBitcodeToMemoryBuffer(module.0) })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the buffer is alive as long as `self`, its start and size LLVM's own.
        unsafe {
            let start = mlir_sys::LLVMGetBufferStart(self.0);
            std::slice::from_raw_parts(start.cast(), mlir_sys::LLVMGetBufferSize(self.0))
        }
    }
}

impl Drop for Bitcode {
    fn drop(&mut self) {
        // SAFETY: written by `LLVMWriteBitcodeToMemoryBuffer`, disposed of once.
        unsafe { mlir_sys::LLVMDisposeMemoryBuffer(self.0) }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: created by `LLVMContextCreate`; its modules are gone (they borrow it).
        unsafe { mlir_sys::LLVMContextDispose(self.0) }
    }
}

/// A module of LLVM IR, in a context that outlives it.
pub struct Module<'c>(
    mlir_sys::LLVMModuleRef,
    std::marker::PhantomData<&'c Context>,
);

impl<'c> Module<'c> {
    /// Takes ownership of `module`, a module of `_context`.
    ///
    /// # Safety
    /// `module` is a valid module created in `_context`, owned by no one else.
    pub unsafe fn from_raw(_context: &'c Context, module: mlir_sys::LLVMModuleRef) -> Module<'c> {
        Module(module, std::marker::PhantomData)
    }
}

impl Drop for Module<'_> {
    fn drop(&mut self) {
        // SAFETY: owned by this value alone (`Context::parse`, `Context::read`, `from_raw`),
        // disposed of once.
        unsafe { mlir_sys::LLVMDisposeModule(self.0) }
    }
}

struct TargetMachine(ffi::TargetMachine);

impl TargetMachine {
    /// For `triple` and the CPU `cpu` (`native`: this machine, with every feature it has);
    /// position-independent code, optimized instruction selection.
    fn new(triple: &CStr, cpu: &str) -> Result<TargetMachine, Diagnostics> {
        // SAFETY: the strings are NUL-terminated and live through the calls; the host's name
        // and features are LLVM messages, copied and freed by `take`.
        unsafe {
            let (mut target, mut message) = (std::ptr::null_mut(), std::ptr::null_mut());
            if ffi::LLVMGetTargetFromTriple(triple.as_ptr(), &mut target, &mut message) != 0 {
                return Err(failed("finding the x86-64 target", take(message)));
            }
            let (name, features) = if cpu == "native" {
                (
                    take(ffi::LLVMGetHostCPUName()),
                    take(ffi::LLVMGetHostCPUFeatures()),
                )
            } else {
                (cpu.to_string(), String::new())
            };
            let c = |s: String| CString::new(s).map_err(|_| failed("naming the CPU", cpu.into()));
            let (name, features) = (c(name)?, c(features)?);
            let machine = ffi::LLVMCreateTargetMachine(
                target,
                triple.as_ptr(),
                name.as_ptr(),
                features.as_ptr(),
                ffi::CODEGEN_DEFAULT,
                ffi::RELOC_PIC,
                ffi::CODE_MODEL_DEFAULT,
            );
            if machine.is_null() {
                return Err(failed("creating a target machine", cpu.into()));
            }
            Ok(TargetMachine(machine))
        }
    }
}

impl Drop for TargetMachine {
    fn drop(&mut self) {
        // SAFETY: created by `LLVMCreateTargetMachine`, disposed of once.
        unsafe { ffi::LLVMDisposeTargetMachine(self.0) }
    }
}

/// The parts of LLVM's C API (`llvm-c/TargetMachine.h`, `Transforms/PassBuilder.h`,
/// `IRReader.h`, `BitWriter.h`, `BitReader.h`, `Linker.h`, `Target.h`, `Error.h`) that `mlir-sys`
/// does not bind; they are in the LLVM libraries it links.
mod ffi {
    use mlir_sys::{LLVMContextRef, LLVMMemoryBufferRef, LLVMModuleRef};
    use std::ffi::{c_char, c_int, c_void};

    pub type Target = *mut c_void;
    pub type TargetMachine = *mut c_void;
    pub type TargetData = *mut c_void;
    pub type PassBuilderOptions = *mut c_void;
    pub type Error = *mut c_void;

    /// `LLVMCodeGenLevelDefault` (llc's `-O2`).
    pub const CODEGEN_DEFAULT: c_int = 2;
    pub const RELOC_PIC: c_int = 2;
    pub const CODE_MODEL_DEFAULT: c_int = 0;
    pub const ASSEMBLY_FILE: c_int = 0;
    pub const OBJECT_FILE: c_int = 1;

    extern "C" {
        pub fn LLVMInitializeX86TargetInfo();
        pub fn LLVMInitializeX86Target();
        pub fn LLVMInitializeX86TargetMC();
        pub fn LLVMInitializeX86AsmPrinter();
        pub fn LLVMLinkModules2(dest: LLVMModuleRef, src: LLVMModuleRef) -> c_int;
        pub fn LLVMWriteBitcodeToMemoryBuffer(module: LLVMModuleRef) -> LLVMMemoryBufferRef;
        pub fn LLVMParseBitcodeInContext2(
            ctx: LLVMContextRef,
            buffer: LLVMMemoryBufferRef,
            module: *mut LLVMModuleRef,
        ) -> c_int;
        pub fn LLVMParseIRInContext(
            ctx: LLVMContextRef,
            buffer: LLVMMemoryBufferRef,
            module: *mut LLVMModuleRef,
            message: *mut *mut c_char,
        ) -> c_int;
        pub fn LLVMGetTargetFromTriple(
            triple: *const c_char,
            target: *mut Target,
            message: *mut *mut c_char,
        ) -> c_int;
        pub fn LLVMGetHostCPUName() -> *mut c_char;
        pub fn LLVMGetHostCPUFeatures() -> *mut c_char;
        pub fn LLVMCreateTargetMachine(
            target: Target,
            triple: *const c_char,
            cpu: *const c_char,
            features: *const c_char,
            level: c_int,
            reloc: c_int,
            code_model: c_int,
        ) -> TargetMachine;
        pub fn LLVMDisposeTargetMachine(machine: TargetMachine);
        pub fn LLVMCreateTargetDataLayout(machine: TargetMachine) -> TargetData;
        pub fn LLVMDisposeTargetData(layout: TargetData);
        pub fn LLVMSetTarget(module: LLVMModuleRef, triple: *const c_char);
        pub fn LLVMSetModuleDataLayout(module: LLVMModuleRef, layout: TargetData);
        pub fn LLVMCreatePassBuilderOptions() -> PassBuilderOptions;
        pub fn LLVMDisposePassBuilderOptions(options: PassBuilderOptions);
        pub fn LLVMRunPasses(
            module: LLVMModuleRef,
            passes: *const c_char,
            machine: TargetMachine,
            options: PassBuilderOptions,
        ) -> Error;
        pub fn LLVMGetErrorMessage(error: Error) -> *mut c_char;
        pub fn LLVMDisposeErrorMessage(message: *mut c_char);
        pub fn LLVMTargetMachineEmitToFile(
            machine: TargetMachine,
            module: LLVMModuleRef,
            file: *const c_char,
            file_type: c_int,
            message: *mut *mut c_char,
        ) -> c_int;
    }
}
