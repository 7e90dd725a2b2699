//! A CUDA program's arguments on the GPU, kept from call to call, and their copies between
//! host and GPU.
//!
//! An argument has one copy per role and name, so that a step's weights and gradients are the
//! optimizer update's (`gpu_update.rs`). It is copied to the GPU again only when its host
//! buffer changed (its stamp). A result is copied back after the call, unless the caller keeps
//! it on the GPU: then the GPU holds the newer contents until [`Resident::fetch`] brings them
//! back, and the host must not change that buffer before (that would be lost work: it stops
//! the program with an internal error). Where the kernels run as CPU loops (the tests) the
//! copies live in host memory, so that what is copied when is tested without a GPU.

use super::{check, device, or_fail, queued, sync};
use crate::manifest::{Arg, Role};
use crate::memref::HostBuffer;
use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A CUDA program's arguments on the GPU, by role and name.
#[derive(Default)]
pub struct Resident {
    slots: Mutex<HashMap<(Role, String), Slot>>,
    /// Bytes copied to the GPU and back, for [`Resident::bytes_moved`].
    moved: Mutex<(u64, u64)>,
}

/// One argument's copy, the stamp of the host contents it was made from or copied back to,
/// and whether the GPU's contents are newer than those (a result kept on the GPU).
struct Slot {
    ptr: *mut c_void,
    len: usize,
    holds: Option<u64>,
    newer: bool,
}

// SAFETY: the pointers are memory owned by the slot; the mutex serializes their use.
unsafe impl Send for Slot {}

/// How a call uses an argument: reads it (copied in where the host changed it), writes it
/// (copied back after the call, unless the GPU keeps what it wrote).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub reads: bool,
    pub writes: bool,
    pub keeps: bool,
}

impl Resident {
    /// The memref descriptors of the copies of `bufs` (arguments `args`), brought up to date
    /// where `access` reads them.
    pub fn stage(
        &self,
        args: &[Arg],
        bufs: &[&mut HostBuffer],
        access: &[Access],
    ) -> Vec<Vec<i64>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        sync();
        let mut moved = 0;
        let descriptors = (args.iter().zip(bufs).zip(access))
            .map(|((a, b), access)| {
                let bytes = b.bytes();
                let slot = slots.entry((a.role, a.name.clone())).or_insert(Slot {
                    ptr: std::ptr::null_mut(),
                    len: 0,
                    holds: None,
                    newer: false,
                });
                if slot.len != bytes.len() || slot.ptr.is_null() {
                    if slot.newer {
                        changed_while_newer(a);
                    }
                    free(slot.ptr, slot.len);
                    *slot = Slot {
                        ptr: alloc(bytes.len()),
                        len: bytes.len(),
                        holds: None,
                        newer: false,
                    };
                }
                if access.reads && slot.holds != Some(b.stamp()) {
                    if slot.newer {
                        changed_while_newer(a);
                    }
                    copy(slot.ptr, bytes.as_ptr().cast(), bytes.len(), "host → GPU");
                    slot.holds = Some(b.stamp());
                    moved += bytes.len() as u64;
                }
                crate::memref::descriptor(slot.ptr.cast(), &b.shape)
            })
            .collect();
        self.moved.lock().unwrap_or_else(|e| e.into_inner()).0 += moved;
        descriptors
    }

    /// After the call: waits for the GPU and copies what it wrote back into `bufs`, except
    /// what it keeps.
    pub fn finish(&self, args: &[Arg], bufs: &mut [&mut HostBuffer], access: &[Access]) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        sync();
        let mut moved = 0;
        for ((a, b), access) in args.iter().zip(bufs.iter_mut()).zip(access) {
            let Some(slot) = slots.get_mut(&(a.role, a.name.clone())) else {
                continue;
            };
            if !access.writes {
                continue;
            }
            if access.keeps {
                slot.newer = true;
                slot.holds = Some(b.stamp());
            } else {
                moved += copy_back(slot, b);
            }
        }
        self.moved.lock().unwrap_or_else(|e| e.into_inner()).1 += moved;
    }

    /// Copies the GPU's contents of argument `role` `name` into `buf` where they are newer
    /// than the host's (a result kept on the GPU).
    pub fn fetch(&self, role: Role, name: &str, buf: &mut HostBuffer) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get_mut(&(role, name.to_string())) {
            if slot.newer && slot.len != buf.bytes().len() {
                super::fail(&format!(
                    "internal error: fetching {role:?} `{name}` into a buffer of another size"
                ));
            }
            if slot.newer {
                sync();
                let moved = copy_back(slot, buf);
                self.moved.lock().unwrap_or_else(|e| e.into_inner()).1 += moved;
            }
        }
    }

    /// Bytes copied to the GPU and back so far.
    pub fn bytes_moved(&self) -> (u64, u64) {
        *self.moved.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Copies `slot` back into `b`, which then holds what the GPU does; the bytes copied.
fn copy_back(slot: &mut Slot, b: &mut HostBuffer) -> u64 {
    let bytes = b.bytes_mut();
    let len = bytes.len();
    copy(bytes.as_mut_ptr().cast(), slot.ptr, len, "GPU → host");
    slot.holds = Some(b.stamp());
    slot.newer = false;
    len as u64
}

/// The host changed a buffer whose newer contents are on the GPU: the update would be lost.
fn changed_while_newer(a: &Arg) -> ! {
    super::fail(&format!(
        "internal error: the host changed {:?} `{}` while the GPU held newer contents",
        a.role, a.name
    ))
}

/// Seconds spent copying arguments in and results out since the last [`take_copy_seconds`].
static COPY_NANOS: AtomicU64 = AtomicU64::new(0);

/// The seconds `Resident` spent copying between host and GPU since the last call: what a
/// step costs beyond the GPU's work when its arguments and results live on the host.
pub fn take_copy_seconds() -> f64 {
    COPY_NANOS.swap(0, Ordering::Relaxed) as f64 * 1e-9
}

/// The alignment of copies in host memory (kernels as CPU loops): a cache line.
const HOST_ALIGN: usize = 64;

/// `len` bytes for a copy: managed memory on the GPU, else (kernels as CPU loops) host memory.
fn alloc(len: usize) -> *mut c_void {
    if super::active() {
        return super::alloc(len);
    }
    let layout = std::alloc::Layout::from_size_align(len.max(1), HOST_ALIGN)
        .expect("invariant: a buffer's size fits a layout");
    // SAFETY: the layout's size is at least one byte.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    ptr.cast()
}

/// Gives back what [`alloc`] gave for `len` bytes (null: nothing).
fn free(ptr: *mut c_void, len: usize) {
    if ptr.is_null() {
    } else if super::active() {
        super::free(ptr);
    } else {
        let layout = std::alloc::Layout::from_size_align(len.max(1), HOST_ALIGN)
            .expect("invariant: allocated with this layout");
        // SAFETY: `alloc` allocated `ptr` with this layout.
        unsafe { std::alloc::dealloc(ptr.cast(), layout) };
    }
}

/// Copies `len` bytes between a host buffer and a copy. On the GPU by its copy engines, on the
/// stream: managed pages stay where they are (the host touching managed memory would migrate
/// them page by page, and the GPU fault them back at its next use).
fn copy(dst: *mut c_void, src: *const c_void, len: usize, what: &'static str) {
    if len == 0 {
        return;
    }
    if !super::active() {
        // SAFETY: both ranges hold `len` bytes (a host buffer and a copy of its size), apart.
        unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.cast::<u8>(), len) };
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
        for (_, slot) in slots.drain() {
            free(slot.ptr, slot.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    fn arg(role: Role, name: &str) -> Arg {
        Arg {
            role,
            name: name.into(),
            dtype: DType::F32,
            shape: vec![4],
            init: crate::Init::Zeros,
            layer_axes: 0,
            shard_axis: None,
        }
    }

    /// Reads the copy a descriptor points to.
    fn contents(d: &[i64]) -> Vec<f32> {
        // SAFETY: a descriptor of a live copy of 4 f32s (its data pointer is `d[1]`).
        unsafe { std::slice::from_raw_parts(d[1] as *const f32, 4).to_vec() }
    }

    /// Without a GPU the copies are host memory: a weight goes in once while its host buffer
    /// is unchanged, a kept result stays until fetched, and one role's copy is another's.
    #[test]
    fn copies_follow_the_host_buffers_and_kept_results_wait_for_a_fetch() {
        let r = Resident::default();
        let (w, g) = (arg(Role::Param, "w"), arg(Role::Grad, "w"));
        let access = |reads, writes, keeps| Access {
            reads,
            writes,
            keeps,
        };
        let (read, write) = (access(true, false, false), access(false, true, true));
        let both = access(true, true, true);
        let mut wb =
            HostBuffer::from_tensor(&crate::Tensor::new(DType::F32, vec![4], vec![1.0; 4]));
        let mut gb = HostBuffer::zeros(DType::F32, &[4]);
        let args = [w.clone(), g.clone()];
        // A step: reads the weight, writes the gradient, which stays.
        let d = r.stage(&args, &[&mut wb, &mut gb], &[read, write]);
        assert_eq!(contents(&d[0]), vec![1.0; 4]);
        // SAFETY: the gradient's copy holds 4 f32s.
        unsafe { std::slice::from_raw_parts_mut(d[1][1] as *mut f32, 4).fill(0.5) };
        r.finish(&args, &mut [&mut wb, &mut gb], &[read, write]);
        assert_eq!(r.bytes_moved(), (16, 0), "the weight in, nothing back");
        assert_eq!(gb.to_tensor().data, vec![0.0; 4], "the gradient stays");
        // An update: reads both, writes the weight in place, which stays too.
        let d = r.stage(&args, &[&mut wb, &mut gb], &[both, read]);
        assert_eq!(contents(&d[1]), vec![0.5; 4], "the step's gradient");
        // SAFETY: the weight's copy holds 4 f32s.
        unsafe { std::slice::from_raw_parts_mut(d[0][1] as *mut f32, 4).fill(2.0) };
        r.finish(&args, &mut [&mut wb, &mut gb], &[both, read]);
        assert_eq!(r.bytes_moved(), (16, 0), "nothing copied for the update");
        r.fetch(Role::Param, "w", &mut wb);
        assert_eq!(wb.to_tensor().data, vec![2.0; 4]);
        assert_eq!(r.bytes_moved(), (16, 16));
        r.fetch(Role::Param, "w", &mut wb);
        assert_eq!(r.bytes_moved(), (16, 16), "fetched once");
        // The host changes the weight: it goes in again.
        wb.f32s_mut().expect("f32")[0] = 3.0;
        let d = r.stage(&args, &[&mut wb, &mut gb], &[read, write]);
        assert_eq!(contents(&d[0]), vec![3.0, 2.0, 2.0, 2.0]);
        assert_eq!(r.bytes_moved(), (32, 16));
    }
}
