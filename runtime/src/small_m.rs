//! A GEMM for the shapes pipeline stages have: few rows (the microbatch), large weights.
//!
//! A packing GEMM (OpenBLAS, `matrixmultiply`) packs both operands into panels before
//! multiplying; with 16 rows each weight element is used only 16 times, so packing the weights
//! costs about as much as the arithmetic
//! (measured: 45% of a step in packing). This kernel instead keeps a whole 16×16 block of `C` in
//! AVX-512 registers across the `k` loop and streams each 16-column strip of `B` through them
//! once, in place. Only `A` (the few rows) is repacked, k-major, so its broadcasts read
//! consecutive addresses: rows of `A` sit a power-of-two stride apart in wide layers and would
//! all fall into one L1 set. `B` rows are usually a page or more apart, where hardware
//! prefetchers stop, so the kernel prefetches `PREFETCH_ROWS` rows ahead itself.
//!
//! Used for row-major operands with unit column stride when the CPU has AVX-512F; anything else
//! goes to OpenBLAS (`gemm.rs` says where each is faster). Sums run in k order with fused
//! multiply-adds.

/// How far ahead (in rows of `B`) the kernel prefetches; 16 measured best on 4-8 KiB strides.
const PREFETCH_ROWS: usize = 16;

/// `c[m×n] = a[m×k] · b[k×n]`, all row-major with the given row strides (elements).
///
/// # Safety
/// The pointers cover `m` rows of `k` (a), `k` rows of `n` (b) and `m` rows of `n` (c) elements
/// at the given row strides, `c` overlaps neither input, and the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // the BLAS signature: sizes, then pointer and stride per matrix
pub unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    // Blocks of 16 rows, then at most one block each of 8, 4, 2 and 1 for what is left.
    let mut i = m - m % 16;
    // SAFETY: each call gets a whole number of its blocks, inside the rows the contract covers.
    unsafe {
        rows::<16>(i, k, n, a, lda, b, ldb, c, ldc);
        while i < m {
            let (ai, ci) = (a.add(i * lda), c.add(i * ldc));
            i += match m - i {
                8.. => rows::<8>(8, k, n, ai, lda, b, ldb, ci, ldc),
                4.. => rows::<4>(4, k, n, ai, lda, b, ldb, ci, ldc),
                2.. => rows::<2>(2, k, n, ai, lda, b, ldb, ci, ldc),
                _ => rows::<1>(1, k, n, ai, lda, b, ldb, ci, ldc),
            };
        }
    }
}

/// [`sgemm`] for `m` a multiple of `R`: `R` rows of `C` by 16 columns in `R` zmm registers; the
/// ragged last columns use masked loads and stores.
///
/// # Safety
/// As [`sgemm`], and `m % R == 0`. Returns `m`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // as sgemm
unsafe fn rows<const R: usize>(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) -> usize {
    use std::arch::x86_64::*;
    // SAFETY: masked-off lanes are not accessed; every other access stays inside the rows and
    // columns the contract guarantees. The prefetch hint reads nothing.
    unsafe {
        let mut packed = vec![0.0f32; R * k];
        for i in (0..m).step_by(R) {
            for kk in 0..k {
                for r in 0..R {
                    packed[kk * R + r] = *a.add((i + r) * lda + kk);
                }
            }
            let packed = packed.as_ptr();
            for j in (0..n).step_by(16) {
                let mask: __mmask16 = if n - j >= 16 { !0 } else { (1 << (n - j)) - 1 };
                let mut acc = [_mm512_setzero_ps(); R];
                for kk in 0..k {
                    let bp = b.add(kk * ldb + j);
                    _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(PREFETCH_ROWS * ldb).cast());
                    let bv = _mm512_maskz_loadu_ps(mask, bp);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm512_set1_ps(*packed.add(kk * R + r));
                        *acc = _mm512_fmadd_ps(av, bv, *acc);
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    _mm512_mask_storeu_ps(c.add((i + r) * ldc + j), mask, *acc);
                }
            }
        }
    }
    m
}

/// Whether [`sgemm`] can run on this CPU.
pub fn available() -> bool {
    crate::cpu::has("avx512f")
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::rng::{Init, Rng};

    #[test]
    fn matches_a_naive_product_including_ragged_edges() {
        if !available() {
            // Not a pass: say so. The kernel only runs where AVX-512 is (gemm.rs checks).
            eprintln!(
                "SKIPPED small_m::matches_a_naive_product: this CPU has no AVX-512F (or \
                 PPC_CPU_DISABLE hides it); it runs on any x86-64-v4 machine"
            );
            return;
        }
        for (m, k, n) in [
            (16, 64, 48),
            (31, 13, 37),
            (4, 1, 16),
            (1, 5, 3),
            (16, 40, 1),
        ] {
            let a = Rng::stream(1, "a", 0).fill(Init::Normal(1.0), m * k);
            let b = Rng::stream(1, "b", 0).fill(Init::Normal(1.0), k * n);
            let mut c = vec![f32::NAN; m * n];
            // SAFETY: the buffers have exactly the sizes the call describes; the test checked AVX-512.
            unsafe { sgemm(m, k, n, a.as_ptr(), k, b.as_ptr(), n, c.as_mut_ptr(), n) };
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                        .sum();
                    assert!(
                        (want - f64::from(c[i * n + j])).abs() < 1e-4 * (1.0 + want.abs()),
                        "({m},{k},{n}) at ({i},{j})"
                    );
                }
            }
        }
    }
}
