//! A CUDA program's arguments in managed memory, kept from call to call, and their copies
//! between host and GPU.

use super::{alloc, check, device, free, or_fail, queued, sync};
use cudarc::driver::sys as cu;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// A CUDA program's arguments in managed memory, kept from call to call: an input or a
/// parameter is copied again only when its host buffer changed (a forward run's weights go
/// once; a training step's updated weights every step), results are copied back after a call.
#[derive(Default)]
pub struct Resident {
    slots: std::sync::Mutex<Vec<Slot>>,
}

/// One argument's managed copy, and the stamp of the host buffer contents it holds.
struct Slot {
    ptr: *mut c_void,
    len: usize,
    holds: Option<u64>,
}

// SAFETY: the pointers are managed memory owned by the slot; the mutex serializes their use.
unsafe impl Send for Slot {}

impl Resident {
    /// The memref descriptors of `bufs`' managed copies, brought up to date; results
    /// (`fills`) are not copied in, the program writes them.
    pub fn stage(&self, bufs: &[&mut crate::memref::HostBuffer], fills: &[bool]) -> Vec<Vec<i64>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        sync();
        slots.resize_with(bufs.len(), || Slot {
            ptr: std::ptr::null_mut(),
            len: 0,
            holds: None,
        });
        bufs.iter()
            .zip(slots.iter_mut())
            .zip(fills)
            .map(|((b, slot), &fill)| {
                let bytes = b.bytes();
                if slot.len != bytes.len() || slot.ptr.is_null() {
                    free(slot.ptr);
                    *slot = Slot {
                        ptr: alloc(bytes.len()),
                        len: bytes.len(),
                        holds: None,
                    };
                }
                if !fill && slot.holds != Some(b.stamp()) {
                    copy(slot.ptr, bytes.as_ptr().cast(), bytes.len(), "host → GPU");
                    slot.holds = Some(b.stamp());
                }
                crate::memref::descriptor(slot.ptr.cast(), &b.shape)
            })
            .collect()
    }

    /// Waits for the GPU and copies the results (`fills`) back into `bufs`.
    pub fn fetch(&self, bufs: &mut [&mut crate::memref::HostBuffer], fills: &[bool]) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        sync();
        for ((b, slot), &fill) in bufs.iter_mut().zip(slots.iter()).zip(fills) {
            if fill {
                let bytes = b.bytes_mut();
                copy(
                    bytes.as_mut_ptr().cast(),
                    slot.ptr,
                    bytes.len(),
                    "GPU → host",
                );
            }
        }
    }
}

/// Seconds spent copying arguments in and results out since the last [`take_copy_seconds`].
static COPY_NANOS: AtomicU64 = AtomicU64::new(0);

/// The seconds `Resident` spent copying between host and GPU since the last call: what a
/// step costs beyond the GPU's work when its arguments and results live on the host.
pub fn take_copy_seconds() -> f64 {
    COPY_NANOS.swap(0, Ordering::Relaxed) as f64 * 1e-9
}

/// Copies `len` bytes between a host buffer and managed memory by the GPU's copy engines, on
/// the stream: pages stay where they are (the host touching managed memory would migrate
/// them page by page, and the GPU fault them back at its next use).
fn copy(dst: *mut c_void, src: *const c_void, len: usize, what: &'static str) {
    if len == 0 {
        return;
    }
    let started = std::time::Instant::now();
    // SAFETY: both ranges hold `len` bytes (the caller's buffers); with unified addressing the
    // driver tells host memory from managed memory by address.
    or_fail(check(
        unsafe {
            cu::cuMemcpyAsync(
                dst as cu::CUdeviceptr,
                src as cu::CUdeviceptr,
                len,
                device().stream,
            )
        },
        "copying between host and GPU (cuMemcpyAsync)",
    ));
    queued();
    sync();
    COPY_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    super::profile::record(what.into(), started);
}

impl Drop for Resident {
    fn drop(&mut self) {
        let slots = self.slots.get_mut().unwrap_or_else(|e| e.into_inner());
        for slot in slots.drain(..) {
            free(slot.ptr);
        }
    }
}
