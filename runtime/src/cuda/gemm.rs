//! `matmul` on the GPU: cuBLAS's GEMM with f32 accumulation (`CUBLAS_COMPUTE_32F`: f32
//! operands without TF32 unless `PPC_TF32=1`; bf16 and f16 operands on the tensor cores),
//! queued on the rank's stream. The result is f32, or of the 16-bit operands' type where
//! nothing accumulates into it (cuBLAS rounds the f32 sums once). Batch entries whose operands sit at a constant stride from one another go in
//! one strided-batched call; entries of stages in a bubble slot are not computed: a memset
//! writes them `-0.0`, as `matmul` defines.
//!
//! cuBLAS is column-major: row-major `C = A · B` is computed as `Cᵀ = Bᵀ · Aᵀ`, each operand
//! given as it lies in memory (a row-major matrix read as its column-major transpose).

use super::{blas_check, device, or_fail, queued};
use crate::gemm::{batch_offset, unflatten, Elem, View};
use blas::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::sys as blas;
use cudarc::driver::sys as cu;
use std::ffi::c_void;

/// f32 accumulation; f32 operands through TF32 tensor cores only when asked
/// (`PPC_TF32=1`: about 8× the rate, 10-bit mantissas in the products).
fn compute_type(operands: Elem) -> blas::cublasComputeType_t {
    static TF32: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let tf32 = *TF32.get_or_init(|| std::env::var("PPC_TF32").is_ok_and(|v| v == "1"));
    if operands == Elem::F32 && tf32 {
        blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        blas::cublasComputeType_t::CUBLAS_COMPUTE_32F
    }
}

fn data_type(e: Elem) -> blas::cudaDataType {
    match e {
        Elem::F32 => blas::cudaDataType::CUDA_R_32F,
        Elem::BF16 => blas::cudaDataType::CUDA_R_16BF,
        Elem::F16 => blas::cudaDataType::CUDA_R_16F,
    }
}

/// How cuBLAS reads a `rows × cols` operand with these strides as the column-major transpose
/// of itself: the operation and the leading dimension, or `None` if neither axis is unit-stride.
fn transposed(
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
) -> Option<(blas::cublasOperation_t, i64)> {
    if cs == 1 && (rows == 1 || rs >= cols as isize) {
        Some((CUBLAS_OP_N, rs.max(cols as isize).max(1) as i64))
    } else if rs == 1 && (cols == 1 || cs >= rows as isize) {
        Some((CUBLAS_OP_T, cs.max(rows as isize).max(1) as i64))
    } else {
        None
    }
}

/// `c = a · b` (or `c += a · b` with `accumulate`) over `c`'s batch axes, entries with
/// `active[i] == false` (over the first batch axis) `-0.0` (or left as they are). The views
/// point into managed memory.
pub(crate) fn matmul(a: &View, b: &View, c: &View, active: Option<&[bool]>, accumulate: bool) {
    let started = std::time::Instant::now();
    let (ra, rb, r) = (a.sizes.len(), b.sizes.len(), c.sizes.len());
    let (m, n, k) = (c.sizes[r - 2], c.sizes[r - 1], a.sizes[ra - 1]);
    let batch = &c.sizes[..r - 2];
    let count: usize = batch.iter().product();
    let per_first = batch.iter().skip(1).product::<usize>().max(1);
    let layout = |v: &View, rank: usize, rows, cols| {
        transposed(rows, cols, v.strides[rank - 2], v.strides[rank - 1]).unwrap_or_else(|| {
            super::fail("matmul on the GPU: an operand has no unit-stride axis (internal error)")
        })
    };
    let (op_a, lda) = layout(a, ra, m, k);
    let (op_b, ldb) = layout(b, rb, k, n);
    let (op_c, ldc) = layout(c, r, m, n);
    if op_c != CUBLAS_OP_N {
        super::fail("matmul on the GPU: the result is not row-major (internal error)");
    }
    // Element offsets of each batch entry in each operand.
    let offsets: Vec<[isize; 3]> = (0..count)
        .map(|flat| {
            let idx = unflatten(flat, batch);
            let oc: isize = idx
                .iter()
                .zip(&c.strides)
                .map(|(&i, &s)| i as isize * s)
                .sum();
            [batch_offset(a, &idx), batch_offset(b, &idx), oc]
        })
        .collect();
    let is_active = |flat: usize| active.is_none_or(|act| act[flat / per_first]);
    // A stage program's entries of one stage go in calls of their own: cuBLAS gives the same
    // bits only for the same call, and how many stages a rank holds depends on the rank count
    // (f32 products of the MLP differed between 1 and 2 ranks on an H200 when a call held
    // every stage of the rank).
    let stage_starts = |flat: usize| active.is_some() && flat.is_multiple_of(per_first);
    // Runs of consecutive entries of one activity and stage at constant strides: one call each.
    let mut start = 0;
    while start < count {
        let on = is_active(start);
        let mut end = start + 1;
        let stride =
            |i: usize| -> [isize; 3] { std::array::from_fn(|j| offsets[i + 1][j] - offsets[i][j]) };
        while end < count
            && is_active(end) == on
            && !stage_starts(end)
            && (end == start + 1 || stride(end - 1) == stride(start))
        {
            end += 1;
        }
        let steps = if end - start > 1 {
            stride(start)
        } else {
            [0; 3]
        };
        let at = |v: &View, o: isize| {
            v.ptr
                .wrapping_offset(o * v.elem.bytes() as isize)
                .cast::<c_void>()
        };
        if !on {
            // Skipped entries are -0.0 (accumulating, they stay as they are): each an m × n
            // block of rows `ldc` apart.
            for o in offsets[start..end].iter().filter(|_| !accumulate) {
                let (ptr, pitch) = (
                    at(c, o[2]) as cu::CUdeviceptr,
                    ldc as usize * c.elem.bytes(),
                );
                // SAFETY: the block lies inside `c`'s buffer (managed memory) of `c.elem`
                // elements; -0.0 is the sign bit alone in bf16 and f16.
                let r = unsafe {
                    match c.elem {
                        Elem::F32 => cu::cuMemsetD2D32Async(
                            ptr,
                            pitch,
                            (-0.0f32).to_bits(),
                            n,
                            m,
                            device().stream,
                        ),
                        Elem::BF16 | Elem::F16 => {
                            cu::cuMemsetD2D16Async(ptr, pitch, 0x8000, n, m, device().stream)
                        }
                    }
                };
                or_fail(super::check(
                    r,
                    "writing skipped entries (cuMemsetD2D*Async)",
                ));
            }
            start = end;
            continue;
        }
        let [oa, ob, oc] = offsets[start];
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // SAFETY: the pointers and strides describe the operands of entries start..end inside
        // the views' buffers (managed memory, addressable by the GPU); the handle is bound to
        // the rank's stream; alpha and beta are f32, as the compute type wants.
        let status = unsafe {
            blas::cublasGemmStridedBatchedEx(
                device().blas,
                op_b,
                op_a,
                n as i32,
                m as i32,
                k as i32,
                (&alpha as *const f32).cast(),
                at(b, ob),
                data_type(b.elem),
                ldb as i32,
                steps[1] as i64,
                at(a, oa),
                data_type(a.elem),
                lda as i32,
                steps[0] as i64,
                (&beta as *const f32).cast(),
                at(c, oc),
                data_type(c.elem),
                ldc as i32,
                steps[2] as i64,
                (end - start) as i32,
                compute_type(a.elem),
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        or_fail(blas_check(status, "GEMM (cublasGemmStridedBatchedEx)"));
        start = end;
    }
    queued();
    super::profile::checkpoint(started, || {
        format!("GEMM {m}×{n}×{k} over {count} batch entries ({:?})", a.elem)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_operands_are_read_untransposed_and_column_major_ones_transposed() {
        assert_eq!(transposed(16, 256, 256, 1), Some((CUBLAS_OP_N, 256)));
        // A transposed view of a row-major [256, 16] matrix.
        assert_eq!(transposed(16, 256, 1, 16), Some((CUBLAS_OP_T, 16)));
        // A single row: the row stride does not matter.
        assert_eq!(transposed(1, 64, 0, 1), Some((CUBLAS_OP_N, 64)));
        assert_eq!(transposed(4, 4, 8, 2), None);
    }
}
