//! Waiting after every launch, to find a failure or to measure: `PPC_CUDA_SYNC=1` waits for
//! each kernel and GEMM as it is queued and names the one that failed (an asynchronous fault
//! otherwise surfaces at the next wait, far from its cause); `PPC_CUDA_PROFILE=1` also times
//! each, from its launch to its end with nothing else queued, and [`report`] gives the totals
//! by kernel. Both slow the program down: they are for looking, not for timing a whole step.

use super::{check, device, fail};
use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Queued,
    Sync,
    Profile,
}

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| {
        let on = |name| std::env::var(name).is_ok_and(|v| v == "1");
        if on("PPC_CUDA_PROFILE") {
            Mode::Profile
        } else if on("PPC_CUDA_SYNC") {
            Mode::Sync
        } else {
            Mode::Queued
        }
    })
}

/// Seconds and calls by what ran.
static TIMES: Mutex<Option<HashMap<String, (f64, u64)>>> = Mutex::new(None);

/// After queuing `what` (started at `started`): waits for it and names it if it failed, and
/// times it, as the mode says.
pub(crate) fn checkpoint(started: Instant, what: impl FnOnce() -> String) {
    if mode() == Mode::Queued {
        return;
    }
    // SAFETY: the stream was created by `init`.
    if let Err(e) = check(
        unsafe { cu::cuStreamSynchronize(device().stream) },
        "waiting for the GPU (PPC_CUDA_SYNC=1 or PPC_CUDA_PROFILE=1)",
    ) {
        fail(&format!("{} failed: {e}", what()));
    }
    if mode() == Mode::Profile {
        record(what(), started);
    }
}

/// Adds the time since `started` to `what`'s total, when profiling.
pub(crate) fn record(what: String, started: Instant) {
    if mode() != Mode::Profile {
        return;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut times = TIMES.lock().unwrap_or_else(|e| e.into_inner());
    let entry = times
        .get_or_insert_with(HashMap::new)
        .entry(what)
        .or_default();
    entry.0 += seconds;
    entry.1 += 1;
}

/// With `PPC_CUDA_PROFILE=1`, the `rows` largest totals, largest first, as a table.
pub fn report(rows: usize) -> Option<String> {
    let times = TIMES.lock().unwrap_or_else(|e| e.into_inner());
    let times = times.as_ref()?;
    let total: f64 = times.values().map(|t| t.0).sum();
    let mut sorted: Vec<(&String, &(f64, u64))> = times.iter().collect();
    sorted.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0).then(a.0.cmp(b.0)));
    let mut table = format!(
        "GPU profile (PPC_CUDA_PROFILE=1): {total:.3} s in {} kinds of work\n{:>10} {:>6} {:>8}  what\n",
        times.len(),
        "seconds",
        "share",
        "calls"
    );
    for (what, (seconds, calls)) in sorted.into_iter().take(rows) {
        table += &format!(
            "{seconds:>10.4} {:>5.1}% {calls:>8}  {what}\n",
            100.0 * seconds / total
        );
    }
    Some(table)
}
