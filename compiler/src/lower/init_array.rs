//! Global constructors and destructors as `.init_array` and `.fini_array` entries.
//!
//! A `--target cuda` program registers each kernel module in a global constructor that MLIR's
//! GPU translation lists in `llvm.global_ctors`. LLVM writes that list into the `.init_array`
//! section only when its target options say so (`UseInitArray`, which `llc` and `clang` set
//! and LLVM's C API cannot); otherwise into `.ctors`, which `ld.lld` links but today's C
//! runtimes never run. The kernels' modules then stay unregistered and the first launch
//! faults (seen on the first GPU run, 2026-12-04). So the lists become arrays in the sections
//! themselves, in priority order, as `UseInitArray` would have written them.
#![allow(unsafe_code)] // LLVM's C API

use std::ffi::{c_int, c_uint, c_void, CStr};

type Value = *mut c_void;
type Type = *mut c_void;

/// Moves `llvm.global_ctors` into `.init_array` and `llvm.global_dtors` into `.fini_array`.
///
/// # Safety
/// `module` is a valid LLVM module, used by this thread only.
pub unsafe fn lower(module: mlir_sys::LLVMModuleRef) {
    for (list, section, array) in [
        (c"llvm.global_ctors", c".init_array", c"ppc.init_array"),
        (c"llvm.global_dtors", c".fini_array", c"ppc.fini_array"),
    ] {
        // SAFETY: the caller's contract.
        unsafe { into_section(module, list, section, array) }
    }
}

unsafe fn into_section(module: mlir_sys::LLVMModuleRef, list: &CStr, section: &CStr, name: &CStr) {
    // SAFETY: `module` is valid (the caller's contract); each value read is an operand of the
    // list's constant initializer, `{ i32 priority, ptr function, ptr data }` entries.
    unsafe {
        let global = ffi::LLVMGetNamedGlobal(module, list.as_ptr());
        if global.is_null() {
            return;
        }
        let entries = ffi::LLVMGetInitializer(global);
        let count = if entries.is_null() {
            0
        } else {
            ffi::LLVMGetNumOperands(entries) as c_uint
        };
        let mut functions: Vec<(u64, Value)> = (0..count)
            .map(|i| {
                let entry = ffi::LLVMGetOperand(entries, i);
                let priority = ffi::LLVMConstIntGetZExtValue(ffi::LLVMGetOperand(entry, 0));
                (priority, ffi::LLVMGetOperand(entry, 1))
            })
            .collect();
        ffi::LLVMDeleteGlobal(global);
        if functions.is_empty() {
            return;
        }
        // Lower priorities run first; equal ones in the order listed (a stable sort).
        functions.sort_by_key(|&(priority, _)| priority);
        let mut pointers: Vec<Value> = functions.into_iter().map(|(_, f)| f).collect();
        let pointer = ffi::LLVMTypeOf(pointers[0]);
        let array = ffi::LLVMConstArray2(pointer, pointers.as_mut_ptr(), pointers.len() as u64);
        let g = ffi::LLVMAddGlobal(module, ffi::LLVMTypeOf(array), name.as_ptr());
        ffi::LLVMSetInitializer(g, array);
        ffi::LLVMSetSection(g, section.as_ptr());
        ffi::LLVMSetAlignment(g, 8);
        // Externally visible (hidden), so that no pass drops it as unused; writable, as the C
        // runtime's own entries of these sections are.
        ffi::LLVMSetLinkage(g, EXTERNAL);
        ffi::LLVMSetVisibility(g, HIDDEN);
    }
}

const EXTERNAL: c_int = 0;
const HIDDEN: c_int = 1;

/// The parts of `llvm-c/Core.h` this file needs, in the LLVM libraries `mlir-sys` links.
mod ffi {
    use super::{Type, Value};
    use mlir_sys::LLVMModuleRef;
    use std::ffi::{c_char, c_int, c_uint};

    extern "C" {
        pub fn LLVMGetNamedGlobal(m: LLVMModuleRef, name: *const c_char) -> Value;
        pub fn LLVMGetInitializer(g: Value) -> Value;
        pub fn LLVMGetNumOperands(v: Value) -> c_int;
        pub fn LLVMGetOperand(v: Value, index: c_uint) -> Value;
        pub fn LLVMConstIntGetZExtValue(v: Value) -> u64;
        pub fn LLVMTypeOf(v: Value) -> Type;
        pub fn LLVMConstArray2(element: Type, values: *mut Value, length: u64) -> Value;
        pub fn LLVMAddGlobal(m: LLVMModuleRef, ty: Type, name: *const c_char) -> Value;
        pub fn LLVMDeleteGlobal(g: Value);
        pub fn LLVMSetInitializer(g: Value, value: Value);
        pub fn LLVMSetSection(g: Value, section: *const c_char);
        pub fn LLVMSetAlignment(g: Value, bytes: c_uint);
        pub fn LLVMSetLinkage(g: Value, linkage: c_int);
        pub fn LLVMSetVisibility(g: Value, visibility: c_int);
    }
}
