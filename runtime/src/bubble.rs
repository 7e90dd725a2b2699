//! The bubble as the running program meets it: every stage call of a pipeline loop counts the
//! stage slots its mask offers and those it fills (`ppc_count_stage_slots`), so `--bench`
//! measures the bubble from the masks the program computed, whatever the calls then skip
//! (a masked GEMM's entries, a bubble stage's whole body).

use crate::memref::Unranked;
use std::sync::atomic::{AtomicU64, Ordering};

/// Stage slots the stage calls were offered, and those that were active (not in a bubble).
static SLOTS_ALL: AtomicU64 = AtomicU64::new(0);
static SLOTS_BUSY: AtomicU64 = AtomicU64::new(0);

/// The share of stage slots without work since the last call. Each (tick, stage) slot is
/// offered to `calls_per_slot` stage calls (a forward and a backward in 1F1B's ticks, of
/// which a stage takes one), so the slots are `all / calls_per_slot`. `None` if no stage call
/// counted (a program without a pipeline loop).
pub fn take_measured_bubble(calls_per_slot: u64) -> Option<f64> {
    let all = SLOTS_ALL.swap(0, Ordering::Relaxed);
    let busy = SLOTS_BUSY.swap(0, Ordering::Relaxed) * calls_per_slot;
    (all > 0).then(|| (all as f64 - busy as f64) / all as f64)
}

/// The entries of an i1 memref (one byte each).
///
/// # Safety
/// `mask` points to a live rank-1 i1 memref descriptor.
pub(crate) unsafe fn read_mask(mask: *const Unranked) -> Vec<bool> {
    // SAFETY: forwarded from this function's contract; i1 memrefs hold one byte per element.
    unsafe {
        let words = (*mask).descriptor.cast::<i64>();
        let (ptr, offset, n, stride) = (
            *words.add(1) as *const u8,
            *words.add(2) as isize,
            *words.add(3) as usize,
            *words.add(4) as isize,
        );
        (0..n)
            .map(|i| *ptr.offset(offset + i as isize * stride) & 1 == 1)
            .collect()
    }
}

/// Called by generated code at each stage call in a pipeline loop, with the call's stage mask.
///
/// # Safety
/// `mask` points to a live rank-1 i1 memref descriptor, written by the host.
#[no_mangle]
pub unsafe extern "C" fn _mlir_ciface_ppc_count_stage_slots(mask: *const Unranked) {
    // SAFETY: forwarded from this function's contract.
    let active = unsafe { read_mask(mask) };
    let busy = active.iter().filter(|&&a| a).count() as u64;
    SLOTS_BUSY.fetch_add(busy, Ordering::Relaxed);
    SLOTS_ALL.fetch_add(active.len() as u64, Ordering::Relaxed);
}
