//! The one thread pool of a rank: LLVM's OpenMP runtime (libomp). Generated code runs its
//! parallel loop nests on it (MLIR's `convert-scf-to-openmp`), and the runtime's own parallel
//! loops (the GEMM blocks of a batched matmul) go onto the same threads through
//! [`parallel_for`], so the two never compete for the cores.
//!
//! libomp keeps its threads spinning for a while after a parallel region (`KMP_BLOCKTIME`,
//! 200 ms unless set), which is what a pipeline iteration's back-to-back regions want.
//!
//! The number of threads is the one given to [`set_threads`], else `PPC_NUM_THREADS` if set,
//! else the machine's available parallelism; 1 runs everything on the calling thread.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

#[link(name = "omp")]
extern "C" {
    /// libomp's entry for GCC-compiled parallel regions: runs `f(data)` on a team of
    /// `threads` (0: the calling thread's default) and returns when all have finished.
    fn GOMP_parallel(
        f: unsafe extern "C" fn(*mut c_void),
        data: *mut c_void,
        threads: u32,
        flags: u32,
    );
    fn omp_set_num_threads(n: i32);
    fn omp_in_parallel() -> i32;
}

static CHOSEN: OnceLock<usize> = OnceLock::new();

/// Fixes the number of threads (at least 1) before the first parallel call; later calls have no
/// effect.
pub fn set_threads(n: usize) {
    let _ = CHOSEN.set(n.max(1));
}

/// Threads used by [`parallel_for`] and by generated code, the caller included.
pub fn threads() -> usize {
    if let Some(&n) = CHOSEN.get() {
        return n;
    }
    // Looked up once: the available parallelism reads cgroup files on every call.
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        std::env::var("PPC_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n >= 1)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// Makes the parallel regions that generated code starts on this thread use [`threads`]
/// threads (OpenMP's thread count is a per-thread setting). Call before running generated code.
pub fn bind_this_thread() {
    let n = i32::try_from(threads()).unwrap_or(i32::MAX);
    // SAFETY: sets an OpenMP setting of the calling thread; no pointers involved.
    unsafe { omp_set_num_threads(n) };
}

/// One `parallel_for` call, shared by the team: indices are handed out one at a time, so a
/// thread that starts late takes fewer.
struct Work<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    panicked: AtomicBool,
}

impl Work<'_> {
    /// Runs indices until none are left. A panic is caught (it must not unwind into libomp)
    /// and reported by `parallel_for` once the region has ended.
    fn help(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| (self.f)(i))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// What every thread of the team runs.
unsafe extern "C" fn team_member(data: *mut c_void) {
    // SAFETY: `parallel_for` passes a `Work` that outlives the region (GOMP_parallel returns
    // only when every thread has left this function).
    let work = unsafe { &*(data as *const Work) };
    work.help();
}

/// Runs `f(i)` for every `i` in `0..n`, spread over the pool's threads; returns when all are
/// done. `f` must be safe to call from several threads at once. If a call panics, the others
/// still run, and then this panics.
pub fn parallel_for(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let work = Work {
        f,
        n,
        next: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    };
    let team = threads().min(n);
    // SAFETY: reads the calling thread's OpenMP state; no pointers involved.
    let nested = unsafe { omp_in_parallel() } != 0;
    // Inside a parallel region of generated code (a stage-parallel loop), every thread is
    // already busy with its own stages: run the work here.
    if team <= 1 || nested {
        work.help();
    } else {
        // SAFETY: `team_member` only reads `work`, which lives until this returns.
        unsafe {
            GOMP_parallel(
                team_member,
                &work as *const Work as *mut c_void,
                u32::try_from(team).unwrap_or(u32::MAX),
                0,
            );
        }
    }
    assert!(
        !work.panicked.load(Ordering::Relaxed),
        "a task of parallel_for panicked"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_every_index_once() {
        let hits: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..50 {
            parallel_for(37, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
    }

    #[test]
    fn runs_on_several_threads() {
        let ids = std::sync::Mutex::new(std::collections::HashSet::new());
        parallel_for(16, &|_| {
            ids.lock().unwrap().insert(std::thread::current().id());
            // Long enough that one thread cannot take every index before the others start.
            std::thread::sleep(std::time::Duration::from_millis(5));
        });
        let want = threads().min(16);
        assert_eq!(ids.lock().unwrap().len(), want);
    }

    #[test]
    fn a_panicking_task_lets_the_others_finish_then_panics() {
        let hits = AtomicUsize::new(0);
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            parallel_for(20, &|i| {
                hits.fetch_add(1, Ordering::Relaxed);
                assert!(i != 7, "task 7 fails");
            })
        }));
        assert!(result.is_err());
        assert_eq!(hits.load(Ordering::Relaxed), 20);
        // The pool still works afterwards.
        let again = AtomicUsize::new(0);
        parallel_for(5, &|_| {
            again.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(again.load(Ordering::Relaxed), 5);
    }
}
