//! Subnormal floats count as zero while generated CPU code runs (x86's `MXCSR.FTZ` and `DAZ`),
//! as XLA's CPU backend runs JAX's programs.
//!
//! A softmax of peaked scores has probabilities below 2^-126, and its backward multiplies them
//! by small gradients: values in the subnormal range, each of which costs a microcode assist
//! in the instruction that makes it and in every GEMM that reads it. At d = 1024 one attention
//! product of the transformer's backward ran at 49–53 GFLOP/s for that, 189 without it (the
//! trace, BENCHMARKS.md). With `FTZ` set an operation whose result would be subnormal gives ±0, and
//! with `DAZ` one that reads a subnormal (from a file: none is made) reads ±0, so no subnormal
//! takes part in arithmetic; copies still move their bits. The fast numerics run so on the CPU;
//! the exact numerics (bit for bit with the interpreter) and GPU kernels keep IEEE's gradual
//! underflow: the manifest's `flush_to_zero`.
//!
//! The setting is per thread. The thread that calls generated code sets it for the call
//! ([`FlushToZero`]); the pool's other threads take it from that thread at the start of each
//! parallel region (libomp copies `MXCSR` to a region's threads: `KMP_INHERIT_FP_CONTROL`,
//! on by default; set to false, the pool's threads would keep whatever they last had), so the
//! GEMM's tasks and generated code's loops run under it too. Other architectures have no such
//! setting here (ppc's CPU targets are x86-64): the guard does nothing there.

/// `MXCSR`'s flush-to-zero and denormals-are-zero bits.
#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = 1 << 15 | 1 << 6;

/// While alive, the calling thread's float arithmetic reads and writes subnormals as ±0;
/// dropping it restores the setting it found.
#[must_use = "the flush lasts as long as the guard"]
pub struct FlushToZero {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl FlushToZero {
    pub fn begin() -> FlushToZero {
        #[cfg(target_arch = "x86_64")]
        {
            let saved = mxcsr();
            set_mxcsr(saved | FTZ_DAZ);
            FlushToZero { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        FlushToZero {}
    }
}

impl Drop for FlushToZero {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        set_mxcsr(self.saved);
    }
}

#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut csr = 0u32;
    // SAFETY: stores the SSE control and status register into a local.
    unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack)) };
    csr
}

#[cfg(target_arch = "x86_64")]
fn set_mxcsr(csr: u32) {
    // SAFETY: loads a value read by `mxcsr` with at most the two flush bits changed: every
    // exception stays masked, so no instruction starts to trap.
    unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, readonly)) };
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::hint::black_box;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// 2^e, normal or subnormal, from its bits: exact whatever the thread's setting (a debug
    /// build computes `powi` at run time, and 2^130 on the way to 2^-130 overflows).
    fn pow2(e: i32) -> f32 {
        match e {
            -126.. => f32::from_bits(((e + 127) as u32) << 23),
            _ => f32::from_bits(1 << (e + 149)),
        }
    }

    /// 2^-100 · 2^-30: 2^-130, a subnormal.
    fn subnormal_product() -> f32 {
        black_box(pow2(-100)) * black_box(pow2(-30))
    }

    #[test]
    fn flushes_while_alive_and_restores() {
        assert_eq!(subnormal_product(), pow2(-130));
        {
            let _flush = FlushToZero::begin();
            assert_eq!(subnormal_product(), 0.0);
            // A subnormal input counts as 0: 2^-130 · 2^30 is 0, not 2^-100.
            assert_eq!(black_box(pow2(-130)) * black_box(pow2(30)), 0.0);
        }
        assert_eq!(subnormal_product(), pow2(-130));
    }

    /// Runs 64 tasks on the pool, on every thread of it: how many kept a subnormal result.
    fn pool_tasks_keeping_subnormals() -> usize {
        let kept = AtomicUsize::new(0);
        let threads = std::sync::Mutex::new(std::collections::HashSet::new());
        crate::pool::parallel_for(64, &|_| {
            if subnormal_product() != 0.0 {
                kept.fetch_add(1, Ordering::Relaxed);
            }
            threads.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_millis(1));
        });
        let threads = threads.into_inner().unwrap().len();
        assert_eq!(
            threads,
            crate::pool::threads().min(64),
            "a thread took no task"
        );
        kept.into_inner()
    }

    #[test]
    fn the_pools_threads_flush_in_its_regions() {
        // The team's threads exist before the flush begins: each region must hand it to them.
        assert_eq!(pool_tasks_keeping_subnormals(), 64);
        {
            let _flush = FlushToZero::begin();
            assert_eq!(pool_tasks_keeping_subnormals(), 0);
        }
        assert_eq!(pool_tasks_keeping_subnormals(), 64);
    }
}
