//! Code generation in parallel: an executable's LLVM module cut into partitions by function,
//! each optimized and compiled on its own thread into its own object file, all of them linked.
//!
//! LLVM compiles one module on one thread, and a training step's module is a few large
//! functions (a stage's forward, its backward, the entry) with the OpenMP regions outlined from
//! each: instruction selection for GPT-2's was 5 s of a 9.3 s compile on two cores, one idle.
//! Every function is optimized and compiled on its own (the pipeline in `machine.rs` has
//! function passes only, and code generation is per function), so cutting the module between
//! functions leaves each function's machine code as it was: only which object holds it changes.
//!
//! Each partition parses the whole module and keeps its share: the external functions assigned
//! to it (largest first, to the partition with the least so far; sizes counted with the local
//! functions they reach, the outlined OpenMP regions) and, as local copies, whatever local
//! functions and constants those reach. The others' external functions become declarations,
//! resolved by the link; global definitions other than local ones stay in partition 0 only.
//! The cut is fixed (`--codegen-partitions`, [`PARTITIONS`] by default), not the machine's core
//! count, so an executable's code does not depend on where it was compiled.
#![allow(unsafe_code)] // LLVM's C API

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// How many partitions a module large enough is cut into unless `--codegen-partitions` says:
/// the project's machines have two cores.
pub const PARTITIONS: usize = 2;

/// Modules with fewer instructions than this are compiled whole: a second parse and thread
/// would cost more than they save.
const MIN_INSTRUCTIONS: usize = 20_000;

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
        let mut local_size = HashMap::new();
        let mut roots = Vec::new();
        for f in functions(module) {
            if ffi::LLVMIsDeclaration(f) == 0 && !is_local(f) {
                roots.push(f);
            }
        }
        let mut sized: Vec<(usize, usize, Vec<u8>)> = roots
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                (
                    reached_size(f, &mut local_size, &mut Vec::new()),
                    i,
                    name(f),
                )
            })
            .collect();
        let total: usize = sized.iter().map(|s| s.0).sum();
        let partitions = partitions.min(sized.len());
        if partitions < 2 || total < MIN_INSTRUCTIONS {
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
            if ffi::LLVMIsDeclaration(f) == 0 && !is_local(f) && !mine.contains(&name(f)) {
                into_declaration(module, f);
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
        // Local functions and constants that nothing here uses any more (another partition's
        // outlined regions, their constants), until none is left.
        loop {
            let dead: Vec<Value> = functions(module)
                .chain(globals(module))
                .filter(|&v| is_local(v) && ffi::LLVMGetFirstUse(v).is_null())
                .collect();
            if dead.is_empty() {
                break;
            }
            for v in dead {
                if ffi::LLVMIsAFunction(v).is_null() {
                    ffi::LLVMDeleteGlobal(v);
                } else {
                    ffi::LLVMDeleteFunction(v);
                }
            }
        }
    }
}

/// Replaces the definition `f` by a declaration of the same name and type.
unsafe fn into_declaration(module: Module, f: Value) {
    // SAFETY: `f` is a function of `module` (the caller's contract).
    unsafe {
        let name = name(f);
        let decl = ffi::LLVMAddFunction(module, c"".as_ptr(), ffi::LLVMGlobalGetValueType(f));
        ffi::LLVMSetFunctionCallConv(decl, ffi::LLVMGetFunctionCallConv(f));
        ffi::LLVMReplaceAllUsesWith(f, decl);
        ffi::LLVMDeleteFunction(f);
        ffi::LLVMSetValueName2(decl, name.as_ptr().cast(), name.len());
    }
}

/// Instructions of `f` and of the local functions it reaches (each counted once per root).
unsafe fn reached_size(
    f: Value,
    local_size: &mut HashMap<Value, usize>,
    path: &mut Vec<Value>,
) -> usize {
    // SAFETY: `f` is a defined function (the caller's contract); its blocks and instructions
    // are walked read-only.
    unsafe {
        path.push(f);
        let mut size = 0;
        let mut bb = ffi::LLVMGetFirstBasicBlock(f);
        while !bb.is_null() {
            let mut inst = ffi::LLVMGetFirstInstruction(bb);
            while !inst.is_null() {
                size += 1;
                for i in 0..ffi::LLVMGetNumOperands(inst).max(0) as c_uint {
                    let callee = ffi::LLVMGetOperand(inst, i);
                    let local_fn = !ffi::LLVMIsAFunction(callee).is_null()
                        && is_local(callee)
                        && ffi::LLVMIsDeclaration(callee) == 0;
                    if local_fn && !path.contains(&callee) {
                        let s = match local_size.get(&callee) {
                            Some(&s) => s,
                            None => {
                                let s = reached_size(callee, local_size, path);
                                local_size.insert(callee, s);
                                s
                            }
                        };
                        size += s;
                    }
                }
                inst = ffi::LLVMGetNextInstruction(inst);
            }
            bb = ffi::LLVMGetNextBasicBlock(bb);
        }
        path.pop();
        size
    }
}

const EXTERNAL: c_int = 0;
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
        pub fn LLVMGetLinkage(g: Value) -> c_int;
        pub fn LLVMSetLinkage(g: Value, linkage: c_int);
        pub fn LLVMGetValueName2(v: Value, len: *mut usize) -> *const c_char;
        pub fn LLVMSetValueName2(v: Value, name: *const c_char, len: usize);
        pub fn LLVMGetFirstUse(v: Value) -> Value;
        pub fn LLVMIsAFunction(v: Value) -> Value;
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
        pub fn LLVMGetNumOperands(v: Value) -> c_int;
        pub fn LLVMGetOperand(v: Value, index: c_uint) -> Value;
    }
}
