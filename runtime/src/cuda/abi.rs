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
    /// Modules register in the order `ppc compile --emit=ptx` prints them (`init_array.rs`
    /// of the compiler keeps the constructors' order): this is its place there, from 0.
    index: usize,
    ptx: *const c_char,
    loaded: OnceLock<usize>,
    functions: Mutex<HashMap<usize, usize>>,
}

/// # Safety
/// `data` is a NUL-terminated PTX string that lives as long as the program (a constant of the
/// generated code).
#[no_mangle]
pub unsafe extern "C" fn mgpuModuleLoadJIT(data: *mut c_void, _opt_level: i32) -> *mut c_void {
    static REGISTERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let m = Module {
        index: REGISTERED.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
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
    if module.is_null() {
        // Its global constructor did not run (`init_array.rs` of the compiler says why one
        // might not).
        super::fail(
            "a kernel module was not registered before the program started (internal error)",
        );
    }
    // SAFETY: the contract above.
    let m = unsafe { &*module.cast::<Module>() };
    // SAFETY: `ptx` is NUL-terminated PTX (contract of `mgpuModuleLoadJIT`).
    let handle = *m.loaded.get_or_init(|| unsafe { load(m.ptx, m.index) });
    let mut functions = m.functions.lock().unwrap_or_else(|e| e.into_inner());
    let f = *functions.entry(name as usize).or_insert_with(|| {
        let mut f: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: `handle` is a loaded module, `name` a NUL-terminated string (contract).
        or_fail(check(
            unsafe { cu::cuModuleGetFunction(&mut f, handle as cu::CUmodule, name) },
            "finding a kernel (cuModuleGetFunction)",
        ));
        // SAFETY: `name` is a NUL-terminated string (contract).
        let kernel = unsafe { std::ffi::CStr::from_ptr(name) };
        KERNEL_NAMES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(
                f as usize,
                format!(
                    "kernel `{}` of {}",
                    kernel.to_string_lossy(),
                    module_name(m.index)
                ),
            );
        f as usize
    });
    f as *mut c_void
}

/// Where each kernel module comes from in the model file, by its place in registration order
/// (the manifest's `kernels`).
static MODULE_SOURCES: OnceLock<Vec<String>> = OnceLock::new();

/// Names the kernel modules by their model-file locations, for errors and profiles.
pub fn name_modules(sources: Vec<String>) {
    let _ = MODULE_SOURCES.set(sources);
}

/// `module #N (file:line:col)`: the module's place in registration order and where it comes
/// from.
fn module_name(index: usize) -> String {
    let source = MODULE_SOURCES.get().and_then(|v| v.get(index));
    format!("module #{index} ({})", source.map_or("?", String::as_str))
}

/// Kernels by function handle, for errors (`PPC_CUDA_SYNC=1`).
static KERNEL_NAMES: Mutex<Option<HashMap<usize, String>>> = Mutex::new(None);

/// Loads PTX module number `index`; a module the driver refuses fails with the driver's
/// compile log, the module's place and model line and its first kernel, not a bare "invalid
/// PTX".
///
/// # Safety
/// `ptx` is NUL-terminated PTX.
unsafe fn load(ptx: *const c_char, index: usize) -> usize {
    const LOG: usize = 16 << 10;
    let mut log = vec![0u8; LOG];
    let mut options = [
        cu::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        cu::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values = [log.as_mut_ptr().cast::<c_void>(), LOG as *mut c_void];
    let mut h: cu::CUmodule = std::ptr::null_mut();
    // SAFETY: `ptx` per the contract; the log buffer outlives the call and its size is given.
    let r = unsafe {
        cu::cuModuleLoadDataEx(
            &mut h,
            ptx.cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if let Err(e) = check(r, "loading a kernel module (cuModuleLoadDataEx)") {
        // SAFETY: the contract.
        let text = unsafe { std::ffi::CStr::from_ptr(ptx) }.to_string_lossy();
        let entry = text
            .lines()
            .find_map(|l| l.split(".entry ").nth(1))
            .map_or("?", |rest| rest.trim_end_matches(['(', ' ']));
        let log = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]);
        super::fail(&format!(
            "{e}\n  in kernel {}, whose first kernel is `{entry}` ({} bytes of PTX)\n  the driver's log: {}",
            module_name(index),
            text.len(),
            if log.trim().is_empty() { "(empty)" } else { log.trim() }
        ));
    }
    h as usize
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
    let started = std::time::Instant::now();
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
    super::profile::checkpoint(started, || {
        let names = KERNEL_NAMES.lock().unwrap_or_else(|e| e.into_inner());
        let name = names.as_ref().and_then(|n| n.get(&(function as usize)));
        name.map_or_else(|| "a kernel".into(), String::clone)
    });
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
