//! The AVX-512 register block of [`super::blocked`]: a `12 × 32` block of `C` in 24 zmm
//! accumulators, read from the same packed operands as the AVX2 block (two consecutive
//! `MR`-row slivers of `A`, two consecutive `NR`-column panels of `B`), so packing does not
//! change with the instruction set. Per step of `k`: two loads of `B`, twelve broadcasts of
//! `A`, 24 fused multiply-adds, twice the AVX2 block's work per load.
//!
//! Each element's chain is the AVX2 block's (module doc of `sgemm.rs`): the same bits on either
//! path, only twice the width at a time.

use super::{Block, MR, NR};

/// Rows of `C` per AVX-512 register block.
pub(super) const ROWS: usize = 2 * MR;
/// Columns of `C` per AVX-512 register block: two zmm vectors.
pub(super) const COLS: usize = 2 * NR;

/// One block of `C` (at most [`ROWS`] × [`COLS`]): blocks of at most `NR` columns go to the
/// AVX2 block sliver by sliver; wider ones to a kernel for their rows
/// ([`super::in_place_or_tiled`]).
///
/// # Safety
/// `at.ap` holds `kc` steps of `MR` values, followed by a second sliver where `rows > MR`;
/// `at.bp` `kc` steps of `NR`, followed by a second panel where `cols > NR`; the block's
/// `rows × cols` elements are inside `c`; the CPU has AVX-512F, AVX2 and FMA.
pub(super) unsafe fn block(at: Block) {
    // SAFETY: the contract, sliver by sliver.
    unsafe {
        if at.cols <= NR {
            for s in (0..at.rows).step_by(MR) {
                super::block(Block {
                    ap: at.ap.add(s * at.kc),
                    cp: at.cp.offset(s as isize * at.c.row_stride),
                    rows: MR.min(at.rows - s),
                    ..at
                });
            }
            return;
        }
    }
    let kernel: super::Kernel = match at.rows {
        12 => kernel::<12>,
        11 => kernel::<11>,
        10 => kernel::<10>,
        9 => kernel::<9>,
        8 => kernel::<8>,
        7 => kernel::<7>,
        6 => kernel::<6>,
        5 => kernel::<5>,
        4 => kernel::<4>,
        3 => kernel::<3>,
        2 => kernel::<2>,
        _ => kernel::<1>,
    };
    // SAFETY: the contract, which `in_place_or_tiled` asks for with a width of `COLS`.
    unsafe { super::in_place_or_tiled(kernel, COLS, at) }
}

/// `R × COLS` sums of `kc` steps into the block at `cp` (row stride `ldc`): from zero, or with
/// `load` on from the block's values. Rows below `MR` come from the sliver at `ap`, the others
/// from the next one.
///
/// # Safety
/// `ap` holds `kc` steps of `MR` values and, where `R > MR`, a second sliver after them; `bp`
/// two panels of `kc` steps of `NR` values; `cp` covers `R` rows of `COLS` at `ldc`.
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const R: usize>(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    cp: *mut f32,
    ldc: usize,
    load: bool,
) {
    use std::arch::x86_64::*;
    // The second sliver and panel (never read past their steps where they do not exist).
    let (ap1, bp1) = (ap.wrapping_add(kc * MR), bp.wrapping_add(kc * NR));
    // SAFETY: the contract's extents.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        if load {
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm512_loadu_ps(cp.add(r * ldc));
                acc[1] = _mm512_loadu_ps(cp.add(r * ldc + NR));
            }
        }
        for l in 0..kc {
            let b0 = _mm512_loadu_ps(bp.add(l * NR));
            let b1 = _mm512_loadu_ps(bp1.add(l * NR));
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = if r < MR {
                    *ap.add(l * MR + r)
                } else {
                    *ap1.add(l * MR + r - MR)
                };
                let av = _mm512_set1_ps(a);
                acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(cp.add(r * ldc), acc[0]);
            _mm512_storeu_ps(cp.add(r * ldc + NR), acc[1]);
        }
    }
}
