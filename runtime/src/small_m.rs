//! A GEMM for the shapes pipeline stages have: few rows (the microbatch), large weights.
//!
//! `matrixmultiply` packs both operands into panels before multiplying; with 16 rows each weight
//! element is used only 16 times, so packing the weights costs about as much as the arithmetic
//! (measured: 45% of a step in packing). This kernel copies one 16-column strip of `B` at a time
//! into a small contiguous buffer that stays in L1, then walks the rows of `A` four at a time
//! over it, keeping a 4×16 block of `C` in eight AVX registers across the whole `k` loop. Each
//! weight is read from memory once per call.
//!
//! Used for row-major operands with unit column stride when the CPU has AVX2 and FMA; anything
//! else goes to `matrixmultiply`. Sums run in k order with fused multiply-adds.

/// `c[m×n] = a[m×k] · b[k×n]`, all row-major with the given row strides (elements).
///
/// # Safety
/// The pointers cover `m` rows of `k` (a), `k` rows of `n` (b) and `m` rows of `n` (c) elements
/// at the given row strides, `c` overlaps neither input, and the CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
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
    use std::arch::x86_64::*;
    let (m4, n16) = (m - m % 4, n - n % 16);
    // One 16-column strip of B, copied contiguously: rows of B sit a power-of-two stride apart
    // in wide layers, and walking them in place thrashes L1's sets.
    let mut strip = vec![0.0f32; k * 16];
    // SAFETY: every access below stays inside the rows and columns the contract guarantees.
    unsafe {
        for j in (0..n16).step_by(16) {
            let sp = strip.as_mut_ptr();
            for kk in 0..k {
                let bp = b.add(kk * ldb + j);
                _mm256_storeu_ps(sp.add(kk * 16), _mm256_loadu_ps(bp));
                _mm256_storeu_ps(sp.add(kk * 16 + 8), _mm256_loadu_ps(bp.add(8)));
            }
            for i in (0..m4).step_by(4) {
                let mut acc = [_mm256_setzero_ps(); 8];
                for kk in 0..k {
                    let bp = sp.add(kk * 16);
                    let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
                    for r in 0..4 {
                        let av = _mm256_broadcast_ss(&*a.add((i + r) * lda + kk));
                        acc[2 * r] = _mm256_fmadd_ps(av, b0, acc[2 * r]);
                        acc[2 * r + 1] = _mm256_fmadd_ps(av, b1, acc[2 * r + 1]);
                    }
                }
                for r in 0..4 {
                    let cp = c.add((i + r) * ldc + j);
                    _mm256_storeu_ps(cp, acc[2 * r]);
                    _mm256_storeu_ps(cp.add(8), acc[2 * r + 1]);
                }
            }
        }
        // The ragged edges: leftover rows over all columns, leftover columns over the rest.
        let scalar = |i: usize, j: usize| {
            let mut s = 0.0f32;
            for kk in 0..k {
                s = (*a.add(i * lda + kk)).mul_add(*b.add(kk * ldb + j), s);
            }
            *c.add(i * ldc + j) = s;
        };
        for i in m4..m {
            (0..n).for_each(|j| scalar(i, j));
        }
        for i in 0..m4 {
            (n16..n).for_each(|j| scalar(i, j));
        }
    }
}

/// Whether [`sgemm`] can run on this CPU.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::rng::{Init, Rng};

    #[test]
    fn matches_a_naive_product_including_ragged_edges() {
        if !available() {
            return;
        }
        for (m, k, n) in [(16, 64, 48), (7, 13, 37), (4, 1, 16), (1, 5, 3)] {
            let a = Rng::stream(1, "a", 0).fill(Init::Normal(1.0), m * k);
            let b = Rng::stream(1, "b", 0).fill(Init::Normal(1.0), k * n);
            let mut c = vec![f32::NAN; m * n];
            // SAFETY: the buffers have exactly the sizes the call describes; the test checked AVX2.
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
