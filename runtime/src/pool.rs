//! A tiny persistent thread pool for the runtime's parallel loops (the GEMMs of a batched
//! matmul, one per stage, are independent). Threads start once and wait for work, so a
//! parallel call costs a wake-up, not a thread spawn.
//!
//! The number of threads is `PPC_NUM_THREADS` if set, else the machine's available
//! parallelism; 1 runs everything on the calling thread.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Pool {
    workers: Vec<Mutex<Sender<Job>>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let n = threads();
        let workers = (1..n)
            .map(|_| {
                let (tx, rx): (Sender<Job>, Receiver<Job>) = channel();
                std::thread::spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                });
                Mutex::new(tx)
            })
            .collect();
        Pool { workers }
    })
}

/// Threads used by [`parallel_for`], the caller included.
pub fn threads() -> usize {
    std::env::var("PPC_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n >= 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f(i)` for every `i` in `0..n`, spread over the pool's threads; returns when all are
/// done. `f` must be safe to call from several threads at once.
pub fn parallel_for(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let p = pool();
    let parts = (p.workers.len() + 1).min(n);
    if parts <= 1 {
        (0..n).for_each(f);
        return;
    }
    // The jobs need `'static` closures; `f` lives until this function returns, which is after
    // every job has reported back, so its lifetime may be erased for the jobs' sake.
    // SAFETY: same fat pointer, only the trait object's lifetime bound changes (see above).
    let task = Task(unsafe {
        std::mem::transmute::<
            *const (dyn Fn(usize) + Sync + '_),
            *const (dyn Fn(usize) + Sync + 'static),
        >(f)
    });
    let (tx, rx) = channel::<()>();
    let chunk = n.div_ceil(parts);
    for (w, worker) in p.workers.iter().take(parts - 1).enumerate() {
        let lo = (w + 1) * chunk;
        let hi = ((w + 2) * chunk).min(n);
        let tx = tx.clone();
        let job: Job = Box::new(move || {
            let task = task;
            for i in lo..hi {
                // SAFETY: `parallel_for` does not return before this job has sent its
                // completion, so the closure behind the pointer is alive.
                unsafe { (*task.0)(i) };
            }
            let _ = tx.send(());
        });
        worker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .expect("invariant: pool threads live for the process");
    }
    (0..chunk.min(n)).for_each(f);
    for _ in 0..parts - 1 {
        rx.recv().expect("invariant: every job reports back");
    }
}

/// A closure pointer that may cross to a pool thread.
#[derive(Clone, Copy)]
struct Task(*const (dyn Fn(usize) + Sync));
// SAFETY: the pointee is `Sync`, and `parallel_for` keeps it alive until all jobs finished.
unsafe impl Send for Task {}

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
}
