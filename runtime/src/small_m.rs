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
//! [`sgemm_nt`] is its counterpart for a weight used transposed (`dY · Wᵀ` in the backward).
//!
//! Used for row-major operands with unit column stride (or, for [`sgemm_nt`], a `B` with unit
//! row stride) when the CPU has AVX-512F; anything else goes to OpenBLAS (`gemm.rs` says where
//! each is faster). [`sgemm`]'s sums run in k order with fused multiply-adds.

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

/// Elements of each row of `A` and `B` per block of [`sgemm_nt`]: 16 rows of 512 are 32 KiB,
/// inside L1 (256 and 1024 measured slower on 16×1024×256).
const NT_K_BLOCK: usize = 512;

/// `c[m×n] = a[m×k] · bᵀ` where `b` is `n` rows of `k` at row stride `ldb`: a weight used
/// transposed, as the input gradient `dY · Wᵀ` uses it. A packing GEMM would transpose the
/// whole weight into panels for a few rows' use (OpenBLAS: 18% of the MLP's training step);
/// here each element of `C` is a dot product of two rows read in place along `k`, 4 rows of
/// `A` by 4 rows of `B` at a time (8 loads per 16 fused multiply-adds), blocks of
/// `NT_K_BLOCK` along `k` so that `A`'s block stays in L1 while `B` streams through once. Each
/// block's 16 lanes of partial sums are added up (a fixed tree) and then added to `C`, so the
/// order of the additions depends only on `k`.
///
/// # Safety
/// As [`sgemm`], with `b` covering `n` rows of `k` elements at row stride `ldb`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // as sgemm
pub unsafe fn sgemm_nt(
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
    let kernels: [(usize, Kernel); 3] = [(4, dots::<4>), (2, dots::<2>), (1, dots::<1>)];
    // SAFETY: the caller's contract.
    unsafe { in_row_blocks(&kernels, m, k, n, a, lda, b, ldb, c, ldc) }
}

/// [`sgemm_nt`] for `m` a multiple of `R`: blocks of `R` rows by 4 columns of `C`, one zmm of
/// partial sums each.
///
/// # Safety
/// As [`sgemm_nt`], and `m % R == 0`. Returns `m`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // as sgemm
unsafe fn dots<const R: usize>(
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
    const J: usize = 4; // columns of C, rows of B
                        // SAFETY: masked-off lanes are not accessed; rows of `B` past `n` are replaced by its last
                        // row (computed, never stored); every other access stays inside the contract's rows.
    unsafe {
        for k0 in (0..k).step_by(NT_K_BLOCK) {
            let k1 = (k0 + NT_K_BLOCK).min(k);
            for j in (0..n).step_by(J) {
                let bp: [*const f32; J] = std::array::from_fn(|w| b.add((j + w).min(n - 1) * ldb));
                for i in (0..m).step_by(R) {
                    let mut acc = [[_mm512_setzero_ps(); J]; R];
                    let mut kk = k0;
                    while kk < k1 {
                        let mask: __mmask16 = if k1 - kk >= 16 {
                            !0
                        } else {
                            ((1u32 << (k1 - kk)) - 1) as __mmask16
                        };
                        let mut bv = [_mm512_setzero_ps(); J];
                        for w in 0..J {
                            bv[w] = _mm512_maskz_loadu_ps(mask, bp[w].add(kk));
                            // The second row block (its `B` is in L1) fetches the next rows of
                            // `B`, which the first row block would otherwise wait for.
                            if i == R {
                                _mm_prefetch::<_MM_HINT_T0>(
                                    bp[w].wrapping_add(J * ldb + kk).cast(),
                                );
                            }
                        }
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let av = _mm512_maskz_loadu_ps(mask, a.add((i + r) * lda + kk));
                            for w in 0..J {
                                acc[w] = _mm512_fmadd_ps(av, bv[w], acc[w]);
                            }
                        }
                        kk += 16;
                    }
                    let mut lanes = [_mm512_setzero_ps(); 16];
                    for (r, acc) in acc.iter().enumerate() {
                        lanes[r * J..(r + 1) * J].copy_from_slice(acc);
                    }
                    let mut sums = [0.0f32; 16];
                    _mm512_storeu_ps(sums.as_mut_ptr(), sum_lanes(lanes));
                    for r in 0..R {
                        for w in 0..J.min(n - j) {
                            let cp = c.add((i + r) * ldc + j + w);
                            let s = sums[r * J + w];
                            *cp = if k0 == 0 { s } else { *cp + s };
                        }
                    }
                }
            }
        }
    }
    m
}

/// The sums of the lanes of 16 vectors, as the lanes of one: three rounds of pairwise adds of
/// halves, quarters and the last four lanes, each round's shuffles pairing vectors up.
///
/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_lanes(v: [std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // After the three rounds, lane 4g + e holds the sum of input 4e + g: feed them transposed.
    let x: [__m512; 16] = std::array::from_fn(|i| v[(i % 4) * 4 + i / 4]);
    // Halves: t[p] = [x[2p] folded to 8 lanes, x[2p + 1] folded to 8 lanes].
    let t: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (x[2 * p], x[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // Quarters: u[q] = x[4q .. 4q + 4], each folded to 4 lanes, one per 128-bit group.
    let u: [__m512; 4] = std::array::from_fn(|q| {
        let (a, b) = (t[2 * q], t[2 * q + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // The last four lanes of each group, across u[0..4].
    let v01 = _mm512_add_ps(
        _mm512_unpacklo_ps(u[0], u[1]),
        _mm512_unpackhi_ps(u[0], u[1]),
    );
    let v23 = _mm512_add_ps(
        _mm512_unpacklo_ps(u[2], u[3]),
        _mm512_unpackhi_ps(u[2], u[3]),
    );
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x44>(v01, v23),
        _mm512_shuffle_ps::<0xEE>(v01, v23),
    )
}

/// Whether [`sgemm`] can run on this CPU.
pub fn available() -> bool {
    crate::cpu::has("avx512f")
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::rng::{Init, Rng};

    /// [`sgemm`] or [`sgemm_nt`].
    type Product =
        unsafe fn(usize, usize, usize, *const f32, usize, *const f32, usize, *mut f32, usize);

    /// `product` on the shapes `(m, k, n)` against sums in f64, with `B` stored `k` rows of `n`,
    /// or (`transposed`) `n` rows of `k` with 3 elements of padding per row.
    fn matches_naive_products(
        name: &str,
        product: Product,
        transposed: bool,
        shapes: &[(usize, usize, usize)],
    ) {
        if !available() {
            // Not a pass: say so. The kernels only run where AVX-512 is (gemm.rs checks).
            eprintln!(
                "SKIPPED small_m::{name}: this CPU has no AVX-512F (or PPC_CPU_DISABLE hides \
                 it); it runs on any x86-64-v4 machine"
            );
            return;
        }
        for &(m, k, n) in shapes {
            let (ldb, len) = if transposed {
                (k + 3, n * (k + 3))
            } else {
                (n, k * n)
            };
            let at = |p: usize, j: usize| if transposed { j * ldb + p } else { p * ldb + j };
            let a = Rng::stream(1, "a", 0).fill(Init::Normal(1.0), m * k);
            let b = Rng::stream(1, "b", 0).fill(Init::Normal(1.0), len);
            let mut c = vec![f32::NAN; m * n];
            // SAFETY: the buffers have exactly the sizes the call describes; AVX-512 checked.
            unsafe { product(m, k, n, a.as_ptr(), k, b.as_ptr(), ldb, c.as_mut_ptr(), n) };
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[at(p, j)]))
                        .sum();
                    let got = f64::from(c[i * n + j]);
                    assert!(
                        (want - got).abs() < 1e-4 * (1.0 + want.abs()),
                        "{name} ({m},{k},{n}) at ({i},{j}): {got} against {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_product_matches_a_naive_one_including_ragged_edges() {
        // Ragged rows (8, 4, 2 and 1-row blocks) and columns; more than one block of k (sums go
        // to C and come back).
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
        matches_naive_products("sgemm", sgemm, false, &shapes);
    }

    #[test]
    fn the_transposed_product_matches_a_naive_one_including_ragged_edges() {
        // More than one block of k, ragged rows, columns and k; one row; k below a vector.
        let shapes = [
            (16, 1024, 256),
            (31, 300, 37),
            (1, 5, 3),
            (7, 16, 4),
            (5, 600, 1),
        ];
        matches_naive_products("sgemm_nt", sgemm_nt, true, &shapes);
    }
}
