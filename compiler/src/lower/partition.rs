//! Code generation in parallel: an executable's LLVM module cut into partitions by function,
//! each optimized and compiled on its own thread into its own object file, all of them linked.
//!
//! LLVM compiles one module on one thread, and a training step's module is a few large
//! functions (a stage's forward, its backward, the entry) with the OpenMP regions outlined from
//! each: instruction selection for GPT-2's was 5 s of a 9.3 s compile on two cores, one idle.
//! Every function is optimized and compiled on its own (the pipeline in `machine.rs` has
//! function passes only, but for `mergefunc`, which runs on the whole module before the cut;
//! code generation is per function), so cutting the module between functions leaves each
//! function's machine code as it was: only which object holds it changes.
//!
//! Each partition has the whole module (the main thread its own, the others a copy read from
//! bitcode) and keeps its share: the functions assigned to it
//! (largest first, to the partition with the least so far, by instruction count), the outlined
//! OpenMP regions among them one by one, as a large stage function's regions are most of its
//! code. Functions local to the module become hidden external symbols under a name of their
//! own (`ppc.part.` and theirs) so that another partition can call them; the others' functions
//! become declarations, resolved by the link; global definitions other than local constants
//! (local variables too, shared the same way) stay in partition 0 only, and each partition
//! keeps the local constants it uses.
//! The cut is fixed (`--codegen-partitions`, [`PARTITIONS`] by default), not the machine's core
//! count, so an executable's code does not depend on where it was compiled.
#![allow(unsafe_code)] // LLVM's C API

use std::ffi::{c_char, c_int, c_void};

/// How many partitions a module is cut into unless `--codegen-partitions` says: the project's
/// machines have two cores. Even the smallest examples gain from a second thread (the MLP's
/// training step compiled in 0.35 s against 0.50 s whole, the tiny example's forward in 0.11
/// against 0.12 s; BENCHMARKS.md), so a module of two functions or more is always cut.
pub const PARTITIONS: usize = 2;

type Value = *mut c_void;
type Module = mlir_sys::LLVMModuleRef;

/// The external functions of each of at most `partitions` partitions, by name; `None` when
/// `module` is compiled whole.
///
/// # Safety
/// `module` is a valid LLVM module.
pub unsafe fn plan(module: Module, partitions: usize) -> Option<Vec<Vec<Vec<u8>>>> {
    // SAFETY: the caller's contract; the values walked belong to `module`.
    unsafe {
        let mut sized: Vec<(usize, usize, Vec<u8>)> = functions(module)
            .filter(|&f| ffi::LLVMIsDeclaration(f) == 0)
            .enumerate()
            .map(|(i, f)| (instructions(f), i, name(f)))
            .collect();
        let partitions = partitions.min(sized.len());
        if partitions < 2 {
            return None;
        }
        sized.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut parts = vec![(0usize, Vec::new()); partitions];
        for (size, _, name) in sized {
            let lightest = (0..partitions)
                .min_by_key(|&p| (parts[p].0, p))
                .expect("invariant: partitions");
            parts[lightest].0 += size;
            parts[lightest].1.push(name);
        }
        Some(parts.into_iter().map(|(_, names)| names).collect())
    }
}

/// Cuts `module` down to partition `index` of `plan`.
///
/// # Safety
/// `module` is a valid LLVM module, not used by another thread meanwhile.
pub unsafe fn keep(module: Module, plan: &[Vec<Vec<u8>>], index: usize) {
    // SAFETY: the caller's contract; every value is read before the one it came from is
    // deleted, and deleted values are not touched again.
    unsafe {
        let mine = &plan[index];
        for f in functions(module) {
            if ffi::LLVMIsDeclaration(f) != 0 {
                continue;
            }
            let kept = mine.contains(&name(f));
            if is_local(f) {
                share(f);
            }
            if !kept {
                into_declaration(module, f);
            }
        }
        // A local variable (a kernel module's handle: its loader writes it, each launch reads
        // it) is one object, however many partitions use it: shared like a local function,
        // defined in partition 0 only (below).
        for g in globals(module) {
            if is_local(g) && ffi::LLVMIsGlobalConstant(g) == 0 {
                share(g);
            }
        }
        if index != 0 {
            for g in globals(module) {
                if ffi::LLVMGetLinkage(g) == APPENDING {
                    ffi::LLVMDeleteGlobal(g);
                } else if ffi::LLVMIsDeclaration(g) == 0 && !is_local(g) {
                    ffi::LLVMSetInitializer(g, std::ptr::null_mut());
                    ffi::LLVMSetLinkage(g, EXTERNAL);
                }
            }
        }
        // Local constants that nothing here uses (those of another partition's functions, and
        // the constants only those referred to), until none is left.
        loop {
            let dead: Vec<Value> = globals(module)
                .filter(|&g| is_local(g) && ffi::LLVMGetFirstUse(g).is_null())
                .collect();
            if dead.is_empty() {
                break;
            }
            dead.into_iter().for_each(|g| ffi::LLVMDeleteGlobal(g));
        }
    }
}

/// Makes the local `v` a hidden external symbol under a name of its own, so that other
/// partitions can refer to it.
unsafe fn share(v: Value) {
    // SAFETY: `v` is a global value (the caller's contract).
    unsafe {
        let mut shared = b"ppc.part.".to_vec();
        shared.extend(name(v));
        ffi::LLVMSetValueName2(v, shared.as_ptr().cast(), shared.len());
        ffi::LLVMSetLinkage(v, EXTERNAL);
        ffi::LLVMSetVisibility(v, HIDDEN);
    }
}

/// Replaces the definition `f` by a declaration of the same name, type, calling convention
/// and visibility.
unsafe fn into_declaration(module: Module, f: Value) {
    // SAFETY: `f` is a function of `module` (the caller's contract).
    unsafe {
        let name = name(f);
        let decl = ffi::LLVMAddFunction(module, c"".as_ptr(), ffi::LLVMGlobalGetValueType(f));
        ffi::LLVMSetFunctionCallConv(decl, ffi::LLVMGetFunctionCallConv(f));
        ffi::LLVMSetVisibility(decl, ffi::LLVMGetVisibility(f));
        ffi::LLVMReplaceAllUsesWith(f, decl);
        ffi::LLVMDeleteFunction(f);
        ffi::LLVMSetValueName2(decl, name.as_ptr().cast(), name.len());
    }
}

/// Instructions in the body of `f`.
unsafe fn instructions(f: Value) -> usize {
    // SAFETY: `f` is a defined function (the caller's contract), walked read-only.
    unsafe {
        let mut count = 0;
        let mut bb = ffi::LLVMGetFirstBasicBlock(f);
        while !bb.is_null() {
            let mut inst = ffi::LLVMGetFirstInstruction(bb);
            while !inst.is_null() {
                count += 1;
                inst = ffi::LLVMGetNextInstruction(inst);
            }
            bb = ffi::LLVMGetNextBasicBlock(bb);
        }
        count
    }
}

const EXTERNAL: c_int = 0;
const HIDDEN: c_int = 1;
const APPENDING: c_int = 7;
const INTERNAL: c_int = 8;
const PRIVATE: c_int = 9;

unsafe fn is_local(v: Value) -> bool {
    // SAFETY: `v` is a global value (the caller's contract).
    matches!(unsafe { ffi::LLVMGetLinkage(v) }, INTERNAL | PRIVATE)
}

unsafe fn name(v: Value) -> Vec<u8> {
    let mut len = 0;
    // SAFETY: `v` is a value; LLVM returns its name, `len` bytes, owned by the value.
    unsafe {
        let p: *const c_char = ffi::LLVMGetValueName2(v, &mut len);
        std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec()
    }
}

/// The functions of `module`, collected first (callers delete some).
unsafe fn functions(module: Module) -> impl Iterator<Item = Value> {
    // SAFETY: the caller's contract.
    unsafe { collect(ffi::LLVMGetFirstFunction(module), ffi::LLVMGetNextFunction) }
}

/// The global variables of `module`, collected first.
unsafe fn globals(module: Module) -> impl Iterator<Item = Value> {
    // SAFETY: the caller's contract.
    unsafe { collect(ffi::LLVMGetFirstGlobal(module), ffi::LLVMGetNextGlobal) }
}

unsafe fn collect(
    first: Value,
    next: unsafe extern "C" fn(Value) -> Value,
) -> std::vec::IntoIter<Value> {
    let mut all = Vec::new();
    let mut v = first;
    while !v.is_null() {
        all.push(v);
        // SAFETY: `v` is a live value of the module being walked (the caller's contract).
        v = unsafe { next(v) };
    }
    all.into_iter()
}

/// The parts of `llvm-c/Core.h` this file needs, in the LLVM libraries `mlir-sys` links.
mod ffi {
    use super::{Module, Value};
    use std::ffi::{c_char, c_int, c_uint};

    extern "C" {
        pub fn LLVMGetFirstFunction(m: Module) -> Value;
        pub fn LLVMGetNextFunction(f: Value) -> Value;
        pub fn LLVMGetFirstGlobal(m: Module) -> Value;
        pub fn LLVMGetNextGlobal(g: Value) -> Value;
        pub fn LLVMIsDeclaration(g: Value) -> c_int;
        pub fn LLVMIsGlobalConstant(g: Value) -> c_int;
        pub fn LLVMGetLinkage(g: Value) -> c_int;
        pub fn LLVMSetLinkage(g: Value, linkage: c_int);
        pub fn LLVMGetVisibility(g: Value) -> c_int;
        pub fn LLVMSetVisibility(g: Value, visibility: c_int);
        pub fn LLVMGetValueName2(v: Value, len: *mut usize) -> *const c_char;
        pub fn LLVMSetValueName2(v: Value, name: *const c_char, len: usize);
        pub fn LLVMGetFirstUse(v: Value) -> Value;
        pub fn LLVMAddFunction(m: Module, name: *const c_char, ty: Value) -> Value;
        pub fn LLVMGlobalGetValueType(g: Value) -> Value;
        pub fn LLVMGetFunctionCallConv(f: Value) -> c_uint;
        pub fn LLVMSetFunctionCallConv(f: Value, cc: c_uint);
        pub fn LLVMReplaceAllUsesWith(old: Value, new: Value);
        pub fn LLVMDeleteFunction(f: Value);
        pub fn LLVMDeleteGlobal(g: Value);
        pub fn LLVMSetInitializer(g: Value, init: Value);
        pub fn LLVMGetFirstBasicBlock(f: Value) -> Value;
        pub fn LLVMGetNextBasicBlock(bb: Value) -> Value;
        pub fn LLVMGetFirstInstruction(bb: Value) -> Value;
        pub fn LLVMGetNextInstruction(i: Value) -> Value;
    }
}
