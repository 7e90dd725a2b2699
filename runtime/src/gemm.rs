//! The GEMM that generated CPU code calls for f32 `matmul`: `C = A · B` over any batch axes,
//! with NumPy broadcasting of the batch axes, on `matrixmultiply`'s tuned kernels.
//!
//! It is called through MLIR's C interface with unranked memrefs (`memref<*xf32>`), so one
//! symbol serves every rank. The summation order differs from the reference interpreter's
//! k-ordered loop, so results agree to rounding (relative 1e-5), not bit for bit.

use std::ffi::c_void;

/// MLIR's unranked memref: the rank and a pointer to the ranked descriptor.
#[repr(C)]
pub struct Unranked {
    pub rank: i64,
    pub descriptor: *const c_void,
}

struct View {
    ptr: *mut f32,
    sizes: Vec<usize>,
    strides: Vec<isize>,
}

/// # Safety
/// `u` points to a live unranked memref descriptor of f32 elements.
unsafe fn view(u: *const Unranked) -> View {
    // SAFETY: the caller guarantees `u` and its descriptor are valid; the descriptor layout is
    // `{allocated, aligned, offset, sizes[rank], strides[rank]}` in 8-byte words.
    unsafe {
        let rank = (*u).rank as usize;
        let words = (*u).descriptor.cast::<i64>();
        let aligned = *words.add(1) as *mut f32;
        let offset = *words.add(2) as isize;
        let sizes = (0..rank).map(|i| *words.add(3 + i) as usize).collect();
        let strides = (0..rank).map(|i| *words.add(3 + rank + i) as isize).collect();
        View { ptr: aligned.offset(offset), sizes, strides }
    }
}

/// Element offset of batch index `idx` (of the result's batch shape) in an operand whose batch
/// axes broadcast against it.
fn batch_offset(v: &View, idx: &[usize]) -> isize {
    let nb = v.sizes.len() - 2;
    let skip = idx.len() - nb;
    (0..nb).map(|i| if v.sizes[i] == 1 { 0 } else { idx[skip + i] as isize * v.strides[i] }).sum()
}

/// `c = a · b`.
///
/// # Safety
/// All three point to live f32 memref descriptors whose shapes `matmul` type-checked:
/// `a: [..., m, k]`, `b: [..., k, n]`, `c: [batch..., m, n]`, and `c` does not overlap `a` or `b`.
#[no_mangle]
pub unsafe extern "C" fn _mlir_ciface_ppc_matmul_f32(a: *const Unranked, b: *const Unranked, c: *const Unranked) {
    // SAFETY: forwarded from this function's contract.
    let (a, b, c) = unsafe { (view(a), view(b), view(c)) };
    let r = c.sizes.len();
    let (m, n) = (c.sizes[r - 2], c.sizes[r - 1]);
    let k = a.sizes[a.sizes.len() - 1];
    let batch = &c.sizes[..r - 2];
    let count: usize = batch.iter().product();
    let mut idx = vec![0usize; batch.len()];
    let (ra, rb) = (a.sizes.len(), b.sizes.len());
    for _ in 0..count {
        let oc: isize = idx.iter().zip(&c.strides).map(|(&i, &s)| i as isize * s).sum();
        // SAFETY: offsets stay inside each operand (broadcast axes use offset 0); matrixmultiply
        // reads `a` and `b` and writes `c` through the given strides only.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.ptr.offset(batch_offset(&a, &idx)),
                a.strides[ra - 2],
                a.strides[ra - 1],
                b.ptr.offset(batch_offset(&b, &idx)),
                b.strides[rb - 2],
                b.strides[rb - 1],
                0.0,
                c.ptr.offset(oc),
                c.strides[r - 2],
                c.strides[r - 1],
            );
        }
        for ax in (0..batch.len()).rev() {
            idx[ax] += 1;
            if idx[ax] < batch[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
}

/// The address of [`_mlir_ciface_ppc_matmul_f32`], for registering it with a JIT.
pub fn matmul_f32_symbol() -> *mut () {
    _mlir_ciface_ppc_matmul_f32 as *mut ()
}
