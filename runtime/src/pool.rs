//! A tiny persistent thread pool for the runtime's parallel loops (the GEMMs of a batched
//! matmul, one per stage, are independent). Threads start once and wait for work.
//!
//! A stage program calls a parallel GEMM twice per pipeline iteration, a few hundred microseconds
//! apart. Putting threads to sleep between calls cost two context switches per call and left a
//! third of the CPU idle (measured with `perf stat`), so threads spin for a while (`SPIN`)
//! before they sleep, as OpenMP runtimes do; indices are handed out one at a time from a shared
//! counter, so a thread that starts late takes fewer.
//!
//! The number of threads is the one given to [`set_threads`], else `PPC_NUM_THREADS` if set,
//! else the machine's available parallelism; 1 runs everything on the calling thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a thread waits for the next job, spinning, before it sleeps.
const SPIN: Duration = Duration::from_micros(100);

/// One `parallel_for` call: indices `0..n` of `task`.
struct Work {
    task: Task,
    n: usize,
    next: AtomicUsize,
    /// Indices whose call has returned or panicked.
    done: AtomicUsize,
    panicked: AtomicBool,
}

impl Work {
    /// Runs indices until none are left. A panic is caught and counted, so that every index
    /// reaches `done` and `parallel_for` can report it once no thread uses the closure.
    fn help(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            // SAFETY: `parallel_for` does not return before `done` reaches `n`, and this index
            // counts only after the call, so the closure behind the pointer is alive.
            let call = catch_unwind(AssertUnwindSafe(|| unsafe { (*self.task.0)(i) }));
            if call.is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Spins until `ready()` or `SPIN` has passed; returns `ready()`.
fn spin_until(ready: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > SPIN {
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

struct Pool {
    /// The latest job; threads pick it up when `epoch` moves.
    current: Mutex<Option<Arc<Work>>>,
    epoch: AtomicU64,
    sleepers: AtomicUsize,
    wake: Condvar,
    helpers: usize,
}

impl Pool {
    fn worker(&self) {
        let mut seen = 0;
        loop {
            spin_until(|| self.epoch.load(Ordering::Acquire) != seen);
            let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            if self.epoch.load(Ordering::Acquire) == seen {
                self.sleepers.fetch_add(1, Ordering::SeqCst);
                while self.epoch.load(Ordering::Acquire) == seen {
                    current = self.wake.wait(current).unwrap_or_else(|e| e.into_inner());
                }
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
            }
            seen = self.epoch.load(Ordering::Acquire);
            let work = current.clone();
            drop(current);
            if let Some(work) = work {
                work.help();
            }
        }
    }
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            current: Mutex::new(None),
            epoch: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            helpers: threads() - 1,
        }));
        for _ in 0..pool.helpers {
            std::thread::spawn(|| pool.worker());
        }
        pool
    })
}

static CHOSEN: OnceLock<usize> = OnceLock::new();

/// Fixes the number of threads (at least 1) before the first parallel call; later calls and
/// calls after the pool started have no effect.
pub fn set_threads(n: usize) {
    let _ = CHOSEN.set(n.max(1));
}

/// Threads used by [`parallel_for`], the caller included.
pub fn threads() -> usize {
    if let Some(&n) = CHOSEN.get() {
        return n;
    }
    std::env::var("PPC_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n >= 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f(i)` for every `i` in `0..n`, spread over the pool's threads; returns when all are
/// done. `f` must be safe to call from several threads at once. If a call panics, the others
/// still run, and then this panics.
pub fn parallel_for(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let p = pool();
    if p.helpers == 0 || n <= 1 {
        // Every index runs, as on the pool's threads, before a panic is passed on.
        let failed = (0..n)
            .filter(|&i| catch_unwind(AssertUnwindSafe(|| f(i))).is_err())
            .count();
        assert!(failed == 0, "a task of parallel_for panicked");
        return;
    }
    // Threads need a `'static` job; `f` lives until this function returns, which is after every
    // index has run (see `Work::help`), so its lifetime may be erased for the job's sake.
    // SAFETY: same fat pointer, only the trait object's lifetime bound changes (see above).
    let task = Task(unsafe {
        std::mem::transmute::<
            *const (dyn Fn(usize) + Sync + '_),
            *const (dyn Fn(usize) + Sync + 'static),
        >(f)
    });
    let work = Arc::new(Work {
        task,
        n,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    });
    {
        let mut current = p.current.lock().unwrap_or_else(|e| e.into_inner());
        *current = Some(work.clone());
        p.epoch.fetch_add(1, Ordering::Release);
    }
    if p.sleepers.load(Ordering::SeqCst) > 0 {
        p.wake.notify_all();
    }
    work.help();
    let finished = || work.done.load(Ordering::Acquire) == n;
    if !spin_until(finished) {
        while !finished() {
            std::thread::yield_now();
        }
    }
    assert!(
        !work.panicked.load(Ordering::Relaxed),
        "a task of parallel_for panicked"
    );
}

/// A closure pointer that may cross to a pool thread.
#[derive(Clone, Copy)]
struct Task(*const (dyn Fn(usize) + Sync));
// SAFETY: the pointee is `Sync`, and `parallel_for` keeps it alive until every index has run.
unsafe impl Send for Task {}
unsafe impl Sync for Task {}

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
