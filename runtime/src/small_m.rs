//! A GEMM for the shapes pipeline stages have: few rows (the microbatch), large weights.
//!
//! A packing GEMM (OpenBLAS, `matrixmultiply`) packs both operands into panels before
//! multiplying; with 16 rows each weight element is used only 16 times, so packing the weights
//! costs about as much as the arithmetic
//! (measured: 45% of a step in packing). This kernel instead keeps an 8×32 block of `C` in
//! sixteen AVX-512 registers and streams each 32-column strip of `B` through them in place,
//! 64 rows at a time: every block of 8 rows of `C` uses those 64 rows while they are in L1, so
//! `B` comes from memory once. Per step of `k` that is 2 loads of `B` and 8 broadcasts of `A`
//! for 16 fused multiply-adds; 16 rows by one 16-column vector needed 17 loads for 16 (1.2 to
//! 1.6× slower on stage shapes, BENCHMARKS.md). Only `A` (the few rows) is repacked, k-major,
//! so its broadcasts read
//! consecutive addresses: rows of `A` sit a power-of-two stride apart in wide layers and would
//! all fall into one L1 set. `B` rows are usually a page or more apart, where hardware
//! prefetchers stop, so the kernel prefetches `PREFETCH_ROWS` rows ahead itself.
//!
//! Used for row-major operands with unit column stride when the CPU has AVX-512F; anything
//! else goes to `sgemm.rs` (`gemm.rs` says where each is faster). Each element is the chain of
//! fused multiply-adds in k order that `sgemm.rs` computes, so the two give the same bits.

/// How far ahead (in rows of `B`) the kernel prefetches; 16 measured best on 4-8 KiB strides.
const PREFETCH_ROWS: usize = 16;

/// Rows of `B` per block: 64 rows of a 32-column strip are 8 KiB, well inside L1.
const K_BLOCK: usize = 64;

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
    let kernels: [(usize, Kernel); 4] = [
        (8, rows::<8>),
        (4, rows::<4>),
        (2, rows::<2>),
        (1, rows::<1>),
    ];
    // SAFETY: the caller's contract.
    unsafe { in_row_blocks(&kernels, m, k, n, a, lda, b, ldb, c, ldc) }
}

/// A kernel for a multiple of its block of rows: `(m, k, n, a, lda, b, ldb, c, ldc)`, returns `m`.
#[cfg(target_arch = "x86_64")]
type Kernel =
    unsafe fn(usize, usize, usize, *const f32, usize, *const f32, usize, *mut f32, usize) -> usize;

/// `m` rows in blocks: as many as the first kernel's blocks hold, then at most one block of
/// each smaller size for what is left (the sizes halve down to 1).
///
/// # Safety
/// As the kernels', for the whole product.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)] // as sgemm
unsafe fn in_row_blocks(
    kernels: &[(usize, Kernel)],
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
    let (size, first) = kernels[0];
    let mut i = m - m % size;
    // SAFETY: each call gets a whole number of its blocks, inside the rows the contract covers.
    unsafe {
        first(i, k, n, a, lda, b, ldb, c, ldc);
        while i < m {
            let &(rows, kernel) = kernels
                .iter()
                .find(|(rows, _)| *rows <= m - i)
                .expect("invariant: the last kernel takes one row");
            i += kernel(rows, k, n, a.add(i * lda), lda, b, ldb, c.add(i * ldc), ldc);
        }
    }
}

/// [`sgemm`] for `m` a multiple of `R`: blocks of `R` rows by 32 columns of `C` in `2·R` zmm
/// registers; the ragged last columns use masked loads and stores. Each strip of `B`'s columns
/// is read in blocks of `K_BLOCK` rows, which every row block of `C` then uses while they are
/// in L1 (the block's sums go to `C` and come back in between, in the same k order).
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
    // zmm vectors of columns per row.
    const W: usize = 2;
    // SAFETY: masked-off lanes are not accessed; every other access stays inside the rows and
    // columns the contract guarantees. The prefetch hint reads nothing.
    unsafe {
        // A, one row block after the other, each k-major.
        let mut packed = vec![0.0f32; m * k];
        for (block, packed) in packed.chunks_exact_mut(k * R).enumerate() {
            let ap = a.add(block * R * lda);
            for (kk, packed) in packed.chunks_exact_mut(R).enumerate() {
                for (r, p) in packed.iter_mut().enumerate() {
                    *p = *ap.add(r * lda + kk);
                }
            }
        }
        let packed = packed.as_ptr();
        for j in (0..n).step_by(16 * W) {
            let masks: [__mmask16; W] = std::array::from_fn(|w| {
                let left = n.saturating_sub(j + 16 * w).min(16);
                ((1u32 << left) - 1) as __mmask16
            });
            for k0 in (0..k).step_by(K_BLOCK) {
                let k1 = (k0 + K_BLOCK).min(k);
                for block in 0..m / R {
                    let cp = c.add(block * R * ldc + j);
                    let mut acc = [[_mm512_setzero_ps(); W]; R];
                    if k0 > 0 {
                        for (r, acc) in acc.iter_mut().enumerate() {
                            for w in 0..W {
                                acc[w] = _mm512_maskz_loadu_ps(masks[w], cp.add(r * ldc + 16 * w));
                            }
                        }
                    }
                    let ap = packed.add(block * k * R);
                    for kk in k0..k1 {
                        let bp = b.add(kk * ldb + j);
                        if block == 0 {
                            for w in 0..W {
                                _mm_prefetch::<_MM_HINT_T0>(
                                    bp.wrapping_add(PREFETCH_ROWS * ldb + 16 * w).cast(),
                                );
                            }
                        }
                        let mut bv = [_mm512_setzero_ps(); W];
                        for w in 0..W {
                            bv[w] = _mm512_maskz_loadu_ps(masks[w], bp.add(16 * w));
                        }
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let av = _mm512_set1_ps(*ap.add(kk * R + r));
                            for w in 0..W {
                                acc[w] = _mm512_fmadd_ps(av, bv[w], acc[w]);
                            }
                        }
                    }
                    for (r, acc) in acc.iter().enumerate() {
                        for w in 0..W {
                            _mm512_mask_storeu_ps(cp.add(r * ldc + 16 * w), masks[w], acc[w]);
                        }
                    }
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
    use crate::sgemm::{portable, Operand};

    /// Ragged rows (8, 4, 2 and 1-row blocks) and columns, more than one block of k (sums go to
    /// C and come back): the bits of `sgemm.rs`'s chains.
    #[test]
    fn the_product_has_the_bits_of_the_portable_chains() {
        if !available() {
            // Not a pass: say so. The kernel only runs where AVX-512 is (gemm.rs checks).
            eprintln!(
                "SKIPPED small_m::sgemm: this CPU has no AVX-512F (or PPC_CPU_DISABLE hides \
                 it); it runs on any x86-64-v4 machine"
            );
            return;
        }
        let shapes = [
            (16, 64, 48),
            (31, 13, 37),
            (4, 1, 16),
            (1, 5, 3),
            (16, 40, 1),
            (31, 200, 70),
            (8, 129, 32),
            (64, 64, 17),
        ];
        for (m, k, n) in shapes {
            let a = Rng::stream(1, "a", 0).fill(Init::Normal(1.0), m * k);
            let b = Rng::stream(1, "b", 0).fill(Init::Normal(1.0), k * n);
            let (mut got, mut want) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            let operand = |ptr: *const f32, cols: usize| Operand {
                ptr,
                row_stride: cols as isize,
                col_stride: 1,
            };
            // SAFETY: the buffers have exactly the sizes the calls describe; AVX-512 checked.
            unsafe {
                sgemm(m, k, n, a.as_ptr(), k, b.as_ptr(), n, got.as_mut_ptr(), n);
                portable(
                    m,
                    k,
                    n,
                    operand(a.as_ptr(), k),
                    operand(b.as_ptr(), n),
                    operand(want.as_mut_ptr().cast_const(), n),
                    false,
                );
            }
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "({m},{k},{n})"
            );
        }
    }
}
