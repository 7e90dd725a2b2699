//! MLIR's GPU runtime interface, as `gpu-to-llvm` lowers launches and `finalize-memref-to-llvm`
//! (with `use-generic-functions`) lowers allocations, implemented on the CUDA driver.
//!
//! Kernel modules are registered by global constructors, before `main`: their PTX is kept and
//! handed to the driver (which compiles it for the GPU) at the first launch, after [`super::init`].
//! MLIR creates, synchronizes and destroys a stream around every launch; here they all are the
//! rank's one stream, and launches stay queued: the host waits only where it touches memory.

use super::{check, device, or_fail, queued};
use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, OnceLock};

/// A module of kernels: PTX text, loaded at first use, and its functions by name.
struct Module {
    ptx: *const c_char,
    loaded: OnceLock<usize>,
    functions: Mutex<HashMap<usize, usize>>,
}

/// # Safety
/// `data` is a NUL-terminated PTX string that lives as long as the program (a constant of the
/// generated code).
#[no_mangle]
pub unsafe extern "C" fn mgpuModuleLoadJIT(data: *mut c_void, _opt_level: i32) -> *mut c_void {
    let m = Module {
        ptx: data.cast(),
        loaded: OnceLock::new(),
        functions: Mutex::new(HashMap::new()),
    };
    Box::into_raw(Box::new(m)).cast()
}

/// Modules live as long as the process (the context goes with it).
#[no_mangle]
pub extern "C" fn mgpuModuleUnload(_module: *mut c_void) {}

/// # Safety
/// `module` came from [`mgpuModuleLoadJIT`]; `name` is a NUL-terminated constant of the
/// generated code.
#[no_mangle]
pub unsafe extern "C" fn mgpuModuleGetFunction(
    module: *mut c_void,
    name: *const c_char,
) -> *mut c_void {
    // SAFETY: the contract above.
    let m = unsafe { &*module.cast::<Module>() };
    let handle = *m.loaded.get_or_init(|| {
        let mut h: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: `ptx` is NUL-terminated PTX (contract of `mgpuModuleLoadJIT`).
        or_fail(check(
            unsafe { cu::cuModuleLoadData(&mut h, m.ptx.cast()) },
            "loading a kernel module (cuModuleLoadData)",
        ));
        h as usize
    });
    let mut functions = m.functions.lock().unwrap_or_else(|e| e.into_inner());
    let f = *functions.entry(name as usize).or_insert_with(|| {
        let mut f: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: `handle` is a loaded module, `name` a NUL-terminated string (contract).
        or_fail(check(
            unsafe { cu::cuModuleGetFunction(&mut f, handle as cu::CUmodule, name) },
            "finding a kernel (cuModuleGetFunction)",
        ));
        f as usize
    });
    f as *mut c_void
}

#[no_mangle]
pub extern "C" fn mgpuStreamCreate() -> *mut c_void {
    device().stream.cast()
}

/// Launches stay queued; see the module's documentation.
#[no_mangle]
pub extern "C" fn mgpuStreamSynchronize(_stream: *mut c_void) {}

#[no_mangle]
pub extern "C" fn mgpuStreamDestroy(_stream: *mut c_void) {}

/// # Safety
/// `function` came from [`mgpuModuleGetFunction`]; `params` holds one pointer per kernel
/// parameter, as the generated code packs them.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mgpuLaunchKernel(
    function: *mut c_void,
    grid_x: isize,
    grid_y: isize,
    grid_z: isize,
    block_x: isize,
    block_y: isize,
    block_z: isize,
    shared_bytes: i32,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    _param_count: usize,
) {
    // SAFETY: the contract above; the sizes are the launch's static grid and block.
    let r = unsafe {
        cu::cuLaunchKernel(
            function.cast(),
            grid_x as u32,
            grid_y as u32,
            grid_z as u32,
            block_x as u32,
            block_y as u32,
            block_z as u32,
            shared_bytes as u32,
            stream.cast(),
            params,
            extra,
        )
    };
    or_fail(check(r, "launching a kernel (cuLaunchKernel)"));
    queued();
}

/// Generated host code is about to read or write a buffer.
#[no_mangle]
pub extern "C" fn ppc_gpu_sync() {
    super::sync();
}

/// Every buffer of a CUDA program's generated code.
#[no_mangle]
pub extern "C" fn _mlir_memref_to_llvm_alloc(size: usize) -> *mut c_void {
    super::alloc(size)
}

#[no_mangle]
pub extern "C" fn _mlir_memref_to_llvm_free(ptr: *mut c_void) {
    super::free(ptr);
}
