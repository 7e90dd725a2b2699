//! The few-row GEMM against a transposed weight, `C = A · Wᵀ`: a stage's input gradient
//! (`dY · Wᵀ`) with a microbatch's few rows.
//!
//! `small_m.rs` streams row-major `B` in vectors along `C`'s columns. Here `B = Wᵀ` holds a
//! column of `C` along each row of `W`, so a packing GEMM first transposes `W`, a megabyte for
//! 16 rows of use: 13% of the MLP's one-thread training step went to that transpose alone
//! (`perf`, BENCHMARKS.md). This kernel instead runs its vectors along `C`'s *rows*: `A`'s few
//! rows are packed k-major (16 to a zmm register, a small copy), and each step `l` broadcasts
//! `W[j, l]` for 8 rows `j` of `W` at once, each read in place along its row. So `W` comes from
//! memory once, untransposed, and a block of `C` is 16 rows by 8 columns in 8 registers; its
//! columns go to `C` through a small buffer at the end. The 8 rows of `W` are 8 sequential
//! streams, which the hardware prefetchers follow: prefetching them in software gains nothing
//! (the `small_m ·Bᵀ` rows of `cargo run --release -p ppc-runtime --example gemm`, with and
//! without it; BENCHMARKS.md, 2026-12-06).
//!
//! Each element is still the chain of fused multiply-adds in k order from zero that `sgemm.rs`
//! computes (`fma(A[i,l], W[j,l], c)`; a product's two factors commute exactly), so the two
//! give the same bits.

/// Rows of `C` per register: one zmm vector of f32.
const ROWS: usize = 16;

/// `c[m×n] = a[m×k] · wᵀ` for row-major `a` (row stride `lda`), `w` (`n` rows of `k`, row
/// stride `ldw`) and `c` (row stride `ldc`).
///
/// # Safety
/// The pointers cover those rows at those strides, `c` overlaps neither input, and the CPU
/// supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // the BLAS signature: sizes, then pointer and stride per matrix
pub unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    lda: usize,
    w: *const f32,
    ldw: usize,
    c: *mut f32,
    ldc: usize,
) {
    // A's rows in blocks of 16, each k-major: step l's 16 values are one vector (rows past `m`
    // hold zeros, whose sums are never stored).
    let blocks = m.div_ceil(ROWS);
    let mut packed = vec![0.0f32; blocks * k * ROWS];
    for (block, packed) in packed.chunks_exact_mut(k * ROWS).enumerate() {
        for r in 0..ROWS.min(m - block * ROWS) {
            // SAFETY: row `block·16 + r < m` of `a` has `k` elements.
            let row = unsafe { std::slice::from_raw_parts(a.add((block * ROWS + r) * lda), k) };
            for (l, &x) in row.iter().enumerate() {
                packed[l * ROWS + r] = x;
            }
        }
    }
    for block in 0..blocks {
        let rows = ROWS.min(m - block * ROWS);
        let ap = packed[block * k * ROWS..].as_ptr();
        let cp = c.wrapping_add(block * ROWS * ldc);
        let mut j = 0;
        // SAFETY: the kernels read `k` steps of the packed block and rows `j..` of `w`, and
        // write `rows` rows of their columns of `c` (the contract).
        unsafe {
            while j + 8 <= n {
                columns::<8>(k, ap, w.add(j * ldw), ldw, cp.add(j), ldc, rows);
                j += 8;
            }
            while j < n {
                columns::<1>(k, ap, w.add(j * ldw), ldw, cp.add(j), ldc, rows);
                j += 1;
            }
        }
    }
}

/// `J` columns of `C` for one block of rows: column `jj` is row `jj` of `w` against the
/// packed block, its 16 rows' sums in one register.
///
/// # Safety
/// `ap` holds `k` steps of 16 values; `w` covers `J` rows of `k` at `ldw`; `c` covers `rows`
/// rows of `J` at `ldc`; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn columns<const J: usize>(
    k: usize,
    ap: *const f32,
    w: *const f32,
    ldw: usize,
    c: *mut f32,
    ldc: usize,
    rows: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: every access stays inside the extents of the contract.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); J];
        for l in 0..k {
            let av = _mm512_loadu_ps(ap.add(l * ROWS));
            for (jj, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(av, _mm512_set1_ps(*w.add(jj * ldw + l)), *acc);
            }
        }
        let mut sums = [[0.0f32; ROWS]; J];
        for (jj, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(sums[jj].as_mut_ptr(), *acc);
        }
        for r in 0..rows {
            for (jj, sums) in sums.iter().enumerate() {
                *c.add(r * ldc + jj) = sums[r];
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::rng::{Init, Rng};
    use crate::sgemm::{portable, Operand};

    /// Ragged row blocks and columns, strides wider than the rows: the bits of `sgemm.rs`'s
    /// chains.
    #[test]
    fn the_product_has_the_bits_of_the_portable_chains() {
        if !crate::small_m::available() {
            // Not a pass: say so. The kernel only runs where AVX-512 is (gemm.rs checks).
            eprintln!(
                "SKIPPED small_m_bt::sgemm: this CPU has no AVX-512F (or PPC_CPU_DISABLE hides \
                 it); it runs on any x86-64-v4 machine"
            );
            return;
        }
        for (m, k, n) in [
            (16, 64, 48),
            (31, 13, 37),
            (4, 1, 16),
            (1, 5, 3),
            (16, 40, 1),
            (33, 200, 70),
            (64, 129, 9),
        ] {
            // Row strides past the rows, as a slice of a wider tensor has.
            let (lda, ldw, ldc) = (k + 3, k + 5, n + 2);
            let a = Rng::stream(1, "a", 0).fill(Init::Normal(1.0), m * lda);
            let w = Rng::stream(1, "w", 0).fill(Init::Normal(1.0), n * ldw);
            let (mut got, mut want) = (vec![f32::NAN; m * ldc], vec![f32::NAN; m * ldc]);
            // SAFETY: the buffers have the sizes the calls describe; AVX-512 checked.
            unsafe {
                sgemm(
                    m,
                    k,
                    n,
                    a.as_ptr(),
                    lda,
                    w.as_ptr(),
                    ldw,
                    got.as_mut_ptr(),
                    ldc,
                );
                portable(
                    m,
                    k,
                    n,
                    Operand {
                        ptr: a.as_ptr(),
                        row_stride: lda as isize,
                        col_stride: 1,
                    },
                    Operand {
                        ptr: w.as_ptr(),
                        row_stride: 1,
                        col_stride: ldw as isize,
                    },
                    Operand {
                        ptr: want.as_mut_ptr().cast_const(),
                        row_stride: ldc as isize,
                        col_stride: 1,
                    },
                    false,
                );
            }
            for i in 0..m {
                for j in 0..n {
                    let (g, e) = (got[i * ldc + j], want[i * ldc + j]);
                    assert_eq!(g.to_bits(), e.to_bits(), "({m},{k},{n}) at ({i},{j})");
                }
                // The columns past `n` stay untouched.
                assert!(got[i * ldc + n..(i + 1) * ldc].iter().all(|x| x.is_nan()));
            }
        }
    }
}
