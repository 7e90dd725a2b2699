//! How a rank of a sharded pipeline reaches the others. Generated code calls `ppc_rank` and
//! `ppc_exchange_<dtype>` (the ring exchange of the stage boundary); the driver asks for the
//! rank count, gathers benchmark figures and aborts the job on errors.
//!
//! The transport is installed once per process: executables install MPI's (`runtime/exe`);
//! without one (the JIT of `ppc run`, tests) the process is rank 0 of 1 and an exchange hands a
//! rank its own boundary back, which is what a ring of one does. The time spent inside
//! exchanges is counted, so benchmarks can split waiting from computing.

use crate::memref::Unranked;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// The collective operations a sharded pipeline needs.
pub trait Transport: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Sends `send` to rank `rank + 1` and receives the previous rank's into `recv` (ring
    /// order); with `reverse`, to rank `rank - 1` from the next one (the backward pass).
    fn exchange(&self, send: &[u8], recv: &mut [u8], reverse: bool);
    /// Gathers `values` (the same count on every rank) to rank 0, rank by rank; `None` elsewhere.
    fn gather(&self, values: &[f64]) -> Option<Vec<f64>>;
    /// The largest of every rank's `value`, on every rank.
    fn max(&self, value: f64) -> f64;
    /// Waits until every rank got here.
    fn barrier(&self);
    /// This process's pipeline among the replicas (`--replicas`), `0..replicas`.
    fn replica(&self) -> usize {
        0
    }
    /// Sums `values` over the replicas' ranks that hold the same stages, in replica order (the
    /// same bits on every run), leaving the sum on each of them.
    fn sum_across_replicas(&self, _values: &mut [f32]) {}
    /// Gathers `bytes` (the same count on every rank) from every rank of this pipeline, rank
    /// by rank, onto every one of them.
    fn all_gather_pipeline(&self, bytes: &[u8]) -> Vec<u8>;
    /// Ends the whole job now, with `code`.
    fn abort(&self, code: i32) -> !;
}

static TRANSPORT: OnceLock<Box<dyn Transport>> = OnceLock::new();
static EXCHANGE_NS: AtomicU64 = AtomicU64::new(0);

/// Installs the process's transport; only the first call counts.
pub fn install(t: Box<dyn Transport>) {
    let _ = TRANSPORT.set(t);
}

pub fn transport() -> Option<&'static dyn Transport> {
    TRANSPORT.get().map(|t| t.as_ref())
}

pub fn rank() -> usize {
    transport().map_or(0, |t| t.rank())
}

pub fn size() -> usize {
    transport().map_or(1, |t| t.size())
}

/// [`Transport::replica`]: 0 in a process of one rank.
pub fn replica() -> usize {
    transport().map_or(0, |t| t.replica())
}

/// [`Transport::sum_across_replicas`]; nothing to do without replicas.
pub fn sum_across_replicas(values: &mut [f32]) {
    if let Some(t) = transport() {
        t.sum_across_replicas(values)
    }
}

/// Sums `values` over the ranks of this pipeline, as `((0 + v_0) + v_1) + ...` in rank order,
/// leaving the sum on each: the gradient of a parameter every rank holds (`@embed`'s and
/// `@head`'s), exact on the ranks that use it and zero elsewhere. The fold starts at `+0`
/// in one process too, so the result has the same bits on any number of ranks.
pub fn sum_across_pipeline(values: &mut [f32]) {
    let parts = all_gather_pipeline(values, f32::to_le_bytes, f32::from_le_bytes);
    values.fill(0.0);
    for part in parts.chunks(values.len().max(1)) {
        for (v, p) in values.iter_mut().zip(part) {
            *v += p;
        }
    }
}

/// Every rank's `values` of this pipeline, rank by rank (this rank's alone in one process).
pub fn gather_pipeline_f64(values: &[f64]) -> Vec<f64> {
    all_gather_pipeline(values, f64::to_le_bytes, f64::from_le_bytes)
}

/// [`Transport::all_gather_pipeline`] of numbers, through their little-endian bytes.
fn all_gather_pipeline<T: Copy, const N: usize>(
    values: &[T],
    to: fn(T) -> [u8; N],
    from: fn([u8; N]) -> T,
) -> Vec<T> {
    match transport() {
        Some(t) if t.size() > 1 => {
            let bytes: Vec<u8> = values.iter().flat_map(|&v| to(v)).collect();
            t.all_gather_pipeline(&bytes)
                .chunks(N)
                .map(|c| from(c.try_into().expect("invariant: whole numbers")))
                .collect()
        }
        _ => values.to_vec(),
    }
}

/// [`Transport::max`], or `value` itself in a process of one rank.
pub fn max(value: f64) -> f64 {
    transport().map_or(value, |t| t.max(value))
}

/// [`Transport::gather`], or the values themselves in a process of one rank.
pub fn gather(values: &[f64]) -> Option<Vec<f64>> {
    match transport() {
        Some(t) => t.gather(values),
        None => Some(values.to_vec()),
    }
}

/// Seconds spent in exchanges since the last call (waiting for the neighbours included).
pub fn take_exchange_seconds() -> f64 {
    EXCHANGE_NS.swap(0, Ordering::Relaxed) as f64 * 1e-9
}

/// This process's rank, for generated code.
#[no_mangle]
pub extern "C" fn ppc_rank() -> i32 {
    rank() as i32
}

/// # Safety
/// `send` and `recv` point to live memref descriptors of the same shape with `elem`-byte
/// elements, which do not overlap.
unsafe fn exchange(send: *const Unranked, recv: *const Unranked, elem: usize, reverse: bool) {
    let start = Instant::now();
    // On a GPU, generated code waited for it before this call (`residency.rs` of the compiler).
    // SAFETY: forwarded from this function's contract.
    let (send, recv) = unsafe { (Strided::of(send, elem), Strided::of(recv, elem)) };
    let pass = |out: &[u8], back: &mut [u8]| match transport() {
        Some(t) => t.exchange(out, back, reverse),
        None => back.copy_from_slice(out),
    };
    if send.contiguous() && recv.contiguous() {
        // The buffers themselves go to MPI: no copies (on a GPU, managed memory, which a
        // CUDA-aware MPI moves device to device).
        // SAFETY: both describe live, non-overlapping memory of `bytes()` bytes (contract).
        let (out, back) = unsafe {
            (
                std::slice::from_raw_parts(send.base, send.bytes()),
                std::slice::from_raw_parts_mut(recv.base, recv.bytes()),
            )
        };
        pass(out, back);
    } else {
        let mut out = vec![0u8; send.bytes()];
        // SAFETY: `send` describes live memory (contract); `out` has exactly its size.
        unsafe { send.gather(&mut out) };
        let mut back = vec![0u8; recv.bytes()];
        pass(&out, &mut back);
        // SAFETY: `recv` describes live memory (contract); `back` has exactly its size.
        unsafe { recv.scatter(&back) };
    }
    EXCHANGE_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    crate::trace::record(crate::trace::Kind::Exchange, 0, Some(start));
}

macro_rules! exchange_fn {
    ($name:ident, $bytes:expr, $reverse:expr) => {
        /// The ring exchange for one element type and direction (generated code's `exchange`).
        ///
        /// # Safety
        /// As [`exchange`].
        #[no_mangle]
        pub unsafe extern "C" fn $name(send: *const Unranked, recv: *const Unranked) {
            // SAFETY: forwarded from this function's contract.
            unsafe { exchange(send, recv, $bytes, $reverse) }
        }
    };
}
exchange_fn!(_mlir_ciface_ppc_exchange_f32, 4, false);
exchange_fn!(_mlir_ciface_ppc_exchange_bf16, 2, false);
exchange_fn!(_mlir_ciface_ppc_exchange_f16, 2, false);
exchange_fn!(_mlir_ciface_ppc_exchange_back_f32, 4, true);
exchange_fn!(_mlir_ciface_ppc_exchange_back_bf16, 2, true);
exchange_fn!(_mlir_ciface_ppc_exchange_back_f16, 2, true);

/// A memref as bytes: base pointer, element size, sizes and strides (in elements).
struct Strided {
    base: *mut u8,
    elem: usize,
    sizes: Vec<usize>,
    strides: Vec<isize>,
}

impl Strided {
    /// # Safety
    /// `u` points to a live memref descriptor with `elem`-byte elements.
    unsafe fn of(u: *const Unranked, elem: usize) -> Strided {
        // SAFETY: the descriptor layout is `{allocated, aligned, offset, sizes[rank],
        // strides[rank]}` in 8-byte words.
        unsafe {
            let rank = (*u).rank as usize;
            let w = (*u).descriptor.cast::<i64>();
            let base = (*w.add(1) as *mut u8).offset(*w.add(2) as isize * elem as isize);
            Strided {
                base,
                elem,
                sizes: (0..rank).map(|i| *w.add(3 + i) as usize).collect(),
                strides: (0..rank).map(|i| *w.add(3 + rank + i) as isize).collect(),
            }
        }
    }

    fn bytes(&self) -> usize {
        self.sizes.iter().product::<usize>() * self.elem
    }

    /// Whether the elements lie row-major without gaps (axes of one element aside).
    fn contiguous(&self) -> bool {
        let dense = crate::tensor::strides(&self.sizes);
        self.sizes
            .iter()
            .zip(self.strides.iter().zip(dense))
            .all(|(&n, (&s, d))| n == 1 || s == d as isize)
    }

    /// Byte offsets of the elements, row-major.
    fn offsets(&self) -> impl Iterator<Item = isize> + '_ {
        let count: usize = self.sizes.iter().product();
        (0..count).map(move |mut flat| {
            let mut off = 0isize;
            for ax in (0..self.sizes.len()).rev() {
                off += (flat % self.sizes[ax]) as isize * self.strides[ax];
                flat /= self.sizes[ax];
            }
            off * self.elem as isize
        })
    }

    /// # Safety
    /// The memref is live and `out.len() == self.bytes()`.
    unsafe fn gather(&self, out: &mut [u8]) {
        for (chunk, off) in out.chunks_mut(self.elem).zip(self.offsets()) {
            // SAFETY: `off` is an element of the memref (contract).
            unsafe {
                std::ptr::copy_nonoverlapping(self.base.offset(off), chunk.as_mut_ptr(), self.elem)
            };
        }
    }

    /// # Safety
    /// The memref is live and `data.len() == self.bytes()`.
    unsafe fn scatter(&self, data: &[u8]) {
        for (chunk, off) in data.chunks(self.elem).zip(self.offsets()) {
            // SAFETY: `off` is an element of the memref (contract).
            unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), self.base.offset(off), self.elem)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Strided;

    fn strided(sizes: &[usize], strides: &[isize]) -> Strided {
        Strided {
            base: std::ptr::null_mut(),
            elem: 4,
            sizes: sizes.to_vec(),
            strides: strides.to_vec(),
        }
    }

    #[test]
    fn only_gapless_row_major_buffers_go_to_mpi_as_they_are() {
        assert!(strided(&[4, 16, 256], &[4096, 256, 1]).contiguous());
        // One stage of a state buffer: any stride on its axis of one element.
        assert!(strided(&[1, 16, 256], &[99_999, 256, 1]).contiguous());
        // The last stage's rows of a [S, b, d] buffer, or a transposed view: gathered.
        assert!(!strided(&[16, 256], &[512, 1]).contiguous());
        assert!(!strided(&[256, 16], &[1, 256]).contiguous());
    }
}
