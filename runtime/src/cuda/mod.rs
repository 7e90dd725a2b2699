//! The CUDA executor (`ppc compile --target cuda`): the rank's GPU, its one stream, and the
//! functions the generated host code calls.
//!
//! MLIR lowers the host side of a CUDA program to calls of its GPU runtime interface
//! (`mgpuModuleLoadJIT`, `mgpuLaunchKernel`, ...), which Debian's MLIR ships no library for;
//! this module implements that interface on the CUDA driver through `cudarc` (loaded at run
//! time: executables start and say what is missing on machines without a driver). Every
//! buffer is CUDA managed memory, which host and device address alike: kernels and cuBLAS
//! calls are queued on one stream without waiting, and the host waits ([`sync`]) only where the
//! generated code asks (`ppc_gpu_sync`: where the host would race with queued work, as the
//! compiler's `residency.rs` decides) and before the results of a call are read.
//!
//! `scripts/gpu-check.sh` is the check to run on a GPU; what was written after its last run
//! there (`docs/gpu.md` lists it) has run only with its kernels as CPU loops.
#![allow(unsafe_code)]

pub mod abi;
pub mod gemm;
pub mod profile;
pub mod resident;

use cudarc::cublas::sys as blas;
use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// The rank's GPU: its context, the stream everything is queued on, the cuBLAS handle.
struct Device {
    ctx: cu::CUcontext,
    stream: cu::CUstream,
    blas: blas::cublasHandle_t,
}

// SAFETY: CUDA contexts, streams and cuBLAS handles may be used from any thread once the
// context is current there ([`bind_this_thread`]); the runtime queues work from one thread.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

static DEVICE: OnceLock<Device> = OnceLock::new();

/// Work was queued since the host last waited.
static QUEUED: AtomicBool = AtomicBool::new(false);

/// Why the GPU cannot be used: a library or device missing, or a driver or cuBLAS call that
/// failed, with its status and what it was for.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver (libcuda.so.1) on this machine: this executable was compiled with --target cuda and runs on an NVIDIA GPU; recompile without --target cuda to run on the CPU")]
    NoDriver,
    #[error("the CUDA driver sees no GPU")]
    NoGpu,
    #[error("cuBLAS (libcublas.so.12, or a libcublas.so) not found: the GEMMs of --target cuda run in cuBLAS; install CUDA 12's cuBLAS or put it on LD_LIBRARY_PATH (with CUDA 13 only, a directory on LD_LIBRARY_PATH holding a link libcublas.so to its libcublas.so.13)")]
    NoCublas,
    #[error("the CUDA driver is for CUDA {major}.{minor}; the kernels' PTX (ISA 8.0) needs a driver for CUDA 12.0 or later")]
    OldDriver { major: i32, minor: i32 },
    #[error("{gpu} has compute capability {major}.{minor}, older than the {arch} the kernels were compiled for: recompile with --gpu-arch sm_{major}{minor}")]
    OldGpu {
        gpu: String,
        major: i32,
        minor: i32,
        arch: String,
    },
    #[error("{gpu} does not let the host use managed memory while kernels run (concurrentManagedAccess is 0, as on some vGPUs, on WSL and on GPUs before Pascal); ppc's CUDA programs need it")]
    NoConcurrentManagedAccess { gpu: String },
    /// `why` is the driver's description of `status`.
    #[error("CUDA: {doing} failed: {why}")]
    Driver {
        doing: &'static str,
        status: cu::CUresult,
        why: String,
    },
    #[error("cuBLAS: {doing} failed: {status:?}")]
    Blas {
        doing: &'static str,
        status: blas::cublasStatus_t,
    },
}

/// Whether this machine has a CUDA driver to load.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library; no driver call.
    unsafe { cu::is_culib_present() }
}

/// Whether [`init`] has run: a CUDA program is running.
pub fn active() -> bool {
    DEVICE.get().is_some()
}

/// Which of its node's ranks this one is, as the launcher says: MPICH's `MPI_LOCALRANKID`,
/// Open MPI's `OMPI_COMM_WORLD_LOCAL_RANK` or Slurm's `SLURM_LOCALID` (the first set, read
/// through `lookup`), else the rank itself (one rank per node). Rank `r` uses GPU
/// `local_rank % GPUs`.
pub fn local_rank(lookup: impl Fn(&str) -> Option<String>, rank: usize) -> usize {
    [
        "MPI_LOCALRANKID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
    ]
    .iter()
    .find_map(|name| lookup(name)?.trim().parse().ok())
    .unwrap_or(rank)
}

/// What a GPU must offer to run kernels compiled for `arch` (`sm_NN`; `None`: GEMMs only):
/// the driver's CUDA version (`major * 1000 + minor * 10`), the device's compute capability and
/// whether the host may use managed memory while kernels run.
pub fn meets(
    arch: Option<&str>,
    driver: i32,
    gpu: &str,
    (major, minor): (i32, i32),
    concurrent_managed: bool,
) -> Result<(), CudaError> {
    if driver < 12000 {
        return Err(CudaError::OldDriver {
            major: driver / 1000,
            minor: driver % 1000 / 10,
        });
    }
    let wanted = arch.and_then(|a| a.strip_prefix("sm_")?.parse::<i32>().ok());
    if wanted.is_some_and(|w| major * 10 + minor < w) {
        return Err(CudaError::OldGpu {
            gpu: gpu.into(),
            major,
            minor,
            arch: arch.unwrap_or_default().into(),
        });
    }
    if !concurrent_managed {
        return Err(CudaError::NoConcurrentManagedAccess { gpu: gpu.into() });
    }
    Ok(())
}

/// Opens GPU `local_rank % count` of this node (one rank per GPU under mpirun); returns its
/// name. Fails with a message, never a panic, where no driver, GPU or cuBLAS is found.
/// or where the GPU cannot run kernels compiled for `arch` ([`meets`]).
pub fn init(local_rank: usize, arch: Option<&str>) -> Result<String, CudaError> {
    // SAFETY: each call is a plain driver or cuBLAS call with out-pointers to locals; the
    // libraries are probed before the first call into them (cudarc panics on a missing one).
    unsafe {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        check(cu::cuInit(0), "cuInit")?;
        let mut count = 0;
        check(cu::cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
        if count <= 0 {
            return Err(CudaError::NoGpu);
        }
        let ordinal = (local_rank % count as usize) as i32;
        let mut dev = 0;
        check(cu::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
        let mut name = [0 as std::ffi::c_char; 128];
        check(
            cu::cuDeviceGetName(name.as_mut_ptr(), 128, dev),
            "cuDeviceGetName",
        )?;
        let name = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned();
        let attribute = |a: cu::CUdevice_attribute| -> Result<i32, CudaError> {
            let mut v = 0;
            check(
                cu::cuDeviceGetAttribute(&mut v, a, dev),
                "cuDeviceGetAttribute",
            )?;
            Ok(v)
        };
        use cu::CUdevice_attribute as A;
        let mut driver = 0;
        check(cu::cuDriverGetVersion(&mut driver), "cuDriverGetVersion")?;
        meets(
            arch,
            driver,
            &format!("GPU {ordinal} ({name})"),
            (
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            attribute(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)? == 1,
        )?;
        let mut ctx = std::ptr::null_mut();
        check(
            cu::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            "cuDevicePrimaryCtxRetain",
        )?;
        check(cu::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
        let mut stream = std::ptr::null_mut();
        check(
            cu::cuStreamCreate(
                &mut stream,
                cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            ),
            "cuStreamCreate",
        )?;
        if !blas::is_culib_present() {
            return Err(CudaError::NoCublas);
        }
        let mut handle = std::ptr::null_mut();
        blas_check(blas::cublasCreate_v2(&mut handle), "cublasCreate")?;
        blas_check(
            blas::cublasSetStream_v2(handle, stream.cast()),
            "cublasSetStream",
        )?;
        let _ = DEVICE.set(Device {
            ctx,
            stream,
            blas: handle,
        });
        Ok(format!("GPU {ordinal} of {count}: {name}"))
    }
}

fn device() -> &'static Device {
    DEVICE.get().unwrap_or_else(|| {
        fail("generated CUDA code ran before the GPU was opened (internal error)")
    })
}

/// Makes the GPU's context current on the calling thread (before calling generated code).
pub fn bind_this_thread() {
    if let Some(d) = DEVICE.get() {
        // SAFETY: `ctx` is the primary context retained by `init`.
        or_fail(check(
            unsafe { cu::cuCtxSetCurrent(d.ctx) },
            "cuCtxSetCurrent",
        ));
    }
}

/// Waits for everything queued on the stream, if anything was (a no-op on the CPU).
pub fn sync() {
    if QUEUED.swap(false, Ordering::AcqRel) {
        // SAFETY: the stream was created by `init`.
        or_fail(check(
            unsafe { cu::cuStreamSynchronize(device().stream) },
            "waiting for the GPU (cuStreamSynchronize)",
        ));
    }
}

/// Notes that work was queued on the stream.
fn queued() {
    QUEUED.store(true, Ordering::Release);
}

/// Managed memory freed by generated code, by size, for the next call's buffers: a step
/// allocates the same buffers as the last, and fresh managed pages would be faulted in again.
/// Reuse needs no wait: later GPU work is queued behind earlier work on the one stream, and
/// the host waits before it writes a buffer itself.
struct Pool {
    live: HashMap<usize, usize>,
    spare: HashMap<usize, Vec<usize>>,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

/// `size` bytes of managed memory (at least one: CUDA refuses empty allocations).
pub fn alloc(size: usize) -> *mut c_void {
    let size = size.max(1);
    let mut guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = guard.get_or_insert_with(|| Pool {
        live: HashMap::new(),
        spare: HashMap::new(),
    });
    let ptr = match pool.spare.get_mut(&size).and_then(Vec::pop) {
        Some(p) => p,
        None => {
            let mut ptr: cu::CUdeviceptr = 0;
            // SAFETY: an out-pointer to a local.
            or_fail(check(
                unsafe {
                    cu::cuMemAllocManaged(
                        &mut ptr,
                        size,
                        cu::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32,
                    )
                },
                "allocating GPU memory (cuMemAllocManaged)",
            ));
            ptr as usize
        }
    };
    pool.live.insert(ptr, size);
    ptr as *mut c_void
}

/// Returns what [`alloc`] gave to the pool.
pub fn free(ptr: *mut c_void) {
    let mut guard = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(pool) = guard.as_mut() else { return };
    if let Some(size) = pool.live.remove(&(ptr as usize)) {
        pool.spare.entry(size).or_default().push(ptr as usize);
    }
}

/// `r` as a result: an error says what the call was `doing`.
fn check(r: cu::CUresult, doing: &'static str) -> Result<(), CudaError> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut s: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver returns a pointer to a static string, or leaves it null.
    let why = unsafe {
        cu::cuGetErrorString(r, &mut s);
        if s.is_null() {
            format!("{r:?}")
        } else {
            std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned()
        }
    };
    Err(CudaError::Driver {
        doing,
        status: r,
        why,
    })
}

fn blas_check(r: blas::cublasStatus_t, doing: &'static str) -> Result<(), CudaError> {
    if r == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Blas { doing, status: r })
    }
}

/// Errors inside calls from generated code cannot be returned: say what failed and exit.
fn or_fail(r: Result<(), CudaError>) {
    if let Err(e) = r {
        fail(&e.to_string());
    }
}

pub(crate) fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::{local_rank, meets};

    #[test]
    fn a_gpu_that_cannot_run_the_kernels_is_refused_with_the_reason() {
        let h200 = |arch, driver, cc, concurrent| {
            meets(arch, driver, "GPU 0 (H200)", cc, concurrent).map_err(|e| e.to_string())
        };
        assert!(h200(Some("sm_90"), 13000, (9, 0), true).is_ok());
        assert!(h200(Some("sm_80"), 12000, (9, 0), true).is_ok());
        assert!(h200(None, 12080, (7, 0), true).is_ok());
        let old = h200(Some("sm_90"), 11080, (9, 0), true).unwrap_err();
        assert!(
            old.contains("CUDA 11.8") && old.contains("12.0 or later"),
            "{old}"
        );
        let a100 = h200(Some("sm_90"), 12080, (8, 0), true).unwrap_err();
        assert!(
            a100.contains("8.0") && a100.contains("--gpu-arch sm_80"),
            "{a100}"
        );
        let wsl = h200(Some("sm_90"), 12080, (9, 0), false).unwrap_err();
        assert!(wsl.contains("concurrentManagedAccess is 0"), "{wsl}");
    }

    #[test]
    fn the_local_rank_comes_from_whichever_launcher_started_the_job() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(local_rank(env(&[("MPI_LOCALRANKID", "1")]), 5), 1);
        assert_eq!(
            local_rank(env(&[("OMPI_COMM_WORLD_LOCAL_RANK", "2")]), 5),
            2
        );
        assert_eq!(local_rank(env(&[("SLURM_LOCALID", "3")]), 5), 3);
        // MPICH's own first; a value that is not a number is skipped.
        let both = &[("SLURM_LOCALID", "3"), ("MPI_LOCALRANKID", "0")];
        assert_eq!(local_rank(env(both), 5), 0);
        assert_eq!(
            local_rank(env(&[("MPI_LOCALRANKID", "x"), ("SLURM_LOCALID", "3")]), 5),
            3
        );
        assert_eq!(local_rank(env(&[]), 5), 5);
    }
}
