//! ppc's f32 GEMM, whose every result element is one fixed chain of fused multiply-adds:
//!
//! ```text
//! c[i, j] = fma(a[i, k-1], b[k-1, j], … fma(a[i, 1], b[1, j], fma(a[i, 0], b[0, j], c₀)) …)
//! ```
//!
//! with `c₀ = 0`, or `c[i, j]` itself when accumulating. That order is a function of `k` alone:
//! not of how the product is cut into blocks or tasks, of the thread or rank count, of the
//! instruction set, nor of where the element sits in its call. A maintained BLAS gives none of
//! that: OpenBLAS's result for an element changes with the width and height of the call that
//! computes it (measured: a 256×256×1024 product cut into 128-column calls differs from one
//! call in 5.6% of its elements), so a decomposition chosen from the thread count changed results with it.
//!
//! The AVX2/FMA path is a BLIS-style loop nest: `B` packed into `KC × NR` panels, `A` into
//! `MR × KC` slivers, and a micro-kernel that holds an `MR × NR` block of `C` in registers
//! (6 × 16: twelve ymm accumulators, two loads of `B` and six broadcasts of `A` per twelve
//! multiply-adds). Between `KC` blocks the running sums go to `C` and come back, which keeps
//! the chain exact. Padding (rows past `m`, columns past `n`) computes values that are dropped.
//! On AVX-512 CPUs the register block is `12 × 32` (`zmm.rs`) over the same packed operands.
//! [`crate::small_m`]'s AVX-512 few-row kernel sums in the same order; without FMA the portable
//! path is `f32::mul_add` in the same order, so every CPU gives the same bits.

use std::cell::RefCell;

/// One matrix operand: its first element and its strides (elements) between rows and columns.
#[derive(Clone, Copy)]
pub struct Operand {
    pub ptr: *const f32,
    pub row_stride: isize,
    pub col_stride: isize,
}

impl Operand {
    /// The address of element `(i, j)`.
    fn at(&self, i: usize, j: usize) -> *const f32 {
        self.ptr
            .wrapping_offset(i as isize * self.row_stride + j as isize * self.col_stride)
    }
}

/// Steps of `k` per packed block: a 16-column panel of `B` is 16 KiB, inside L1.
const KC: usize = 256;
/// Rows of `A` packed at once: 72 × 256 × 4 B = 72 KiB, inside L2.
const MC: usize = 72;
/// Columns of `B` packed at once: 256 × 1024 × 4 B = 1 MiB.
const NC: usize = 1024;
/// Columns of `B` packed at once for a product of at most `MC` rows, which uses each packed
/// value only for those rows: 128 KiB, in L2 while they do (measured best of 32 to 1024 on
/// 16 × 256 × 1024 and 16 × 1024 × 256).
const NC_FEW_ROWS: usize = 128;

/// `c[m×n] = a[m×k] · b[k×n]`, or `c += a · b` with `accumulate`, in the order the module doc
/// gives.
///
/// # Safety
/// The operands cover their `m×k`, `k×n` and `m×n` elements at their strides, `c` overlaps
/// neither input, and no two of `c`'s elements share an address.
pub unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    c: Operand,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(isa) = Isa::here().filter(|_| k > 0) {
        // SAFETY: the caller's contract; the CPU has `isa`.
        return unsafe { blocked(isa, m, k, n, a, b, c, accumulate) };
    }
    // SAFETY: the caller's contract.
    unsafe { portable(m, k, n, a, b, c, accumulate) }
}

/// The register blocks of the blocked loop nest: AVX2's `MR × NR`, or AVX-512's twice as tall
/// and twice as wide (`zmm.rs`). Both give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx2,
    Avx512,
}

impl Isa {
    /// The widest this CPU runs (looked up once; `PPC_CPU_DISABLE` can hide features), or
    /// `None` without AVX2 and FMA.
    pub fn here() -> Option<Isa> {
        static HERE: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        *HERE.get_or_init(|| match (fma_available(), crate::cpu::has("avx512f")) {
            (true, true) => Some(Isa::Avx512),
            (true, false) => Some(Isa::Avx2),
            (false, _) => None,
        })
    }

    /// Rows and columns of `C` per register block.
    fn block(self) -> (usize, usize) {
        match self {
            Isa::Avx2 => (MR, NR),
            Isa::Avx512 => (zmm::ROWS, zmm::COLS),
        }
    }
}

/// Whether the AVX2/FMA kernel can run here (looked up once; `PPC_CPU_DISABLE` can hide it).
pub fn fma_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| crate::cpu::has("avx2") && crate::cpu::has("fma"))
}

/// The same chains one element at a time: for CPUs without FMA, and the tests' reference.
///
/// # Safety
/// As [`sgemm`].
pub unsafe fn portable(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    c: Operand,
    accumulate: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let cp = c.at(i, j).cast_mut();
            // SAFETY: every index is inside the operands (the caller's contract).
            unsafe {
                let start = if accumulate { *cp } else { 0.0 };
                *cp = (0..k).fold(start, |s, l| (*a.at(i, l)).mul_add(*b.at(l, j), s));
            }
        }
    }
}

thread_local! {
    /// Each thread's packing buffers for `A` and `B`, kept between calls (a GEMM call is made
    /// thousands of times a step; a fresh megabyte each time would be page faults each time).
    static PACKED: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Rows of `C` per register block.
const MR: usize = 6;
/// Columns of `C` per register block: two ymm vectors.
const NR: usize = 16;

/// The blocked loop nest: `k` in blocks of `KC`, columns in blocks of `NC` (each packs its
/// `B` in `NR`-column panels), rows in blocks of `MC` (each packs its `A` in `MR`-row
/// slivers), then register blocks of `isa`'s size.
///
/// # Safety
/// As [`sgemm`], `k > 0`, and the CPU has `isa`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)] // a product's sizes, operands and mode, and the kernel
pub(crate) unsafe fn blocked(
    isa: Isa,
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    c: Operand,
    accumulate: bool,
) {
    PACKED.with(|packed| {
        let (packed_a, packed_b) = &mut *packed.borrow_mut();
        let nc_max = if m <= MC { NC_FEW_ROWS } else { NC };
        // Blocks of `k` outermost: each reads its rows of `B` whole before the next (a few-row
        // product's `B` comes from memory once; the sums of `c` go on block after block).
        for l0 in (0..k).step_by(KC) {
            let kc = KC.min(k - l0);
            for j0 in (0..n).step_by(nc_max) {
                let nc = nc_max.min(n - j0);
                grow(packed_b, nc.div_ceil(NR) * kc * NR);
                // A row-major `B` is packed row by row (reads that the hardware prefetchers
                // follow; its rows are often a page apart); any other panel by panel, just
                // before its first use.
                let by_rows = b.col_stride == 1;
                if by_rows {
                    pack_rows(b, l0, kc, j0, nc, packed_b);
                }
                // The first block of `k` starts each chain at 0 (or at `c`); later ones go on
                // from the sums the previous block stored in `c`.
                let load = accumulate || l0 > 0;
                let (mr, nr) = isa.block();
                for i0 in (0..m).step_by(MC) {
                    let mc = MC.min(m - i0);
                    // SAFETY: AVX2 is there (this function's contract).
                    unsafe { pack(a, i0, mc, l0, kc, MR, packed_a) };
                    for jr in (0..nc).step_by(nr) {
                        let cols = nr.min(nc - jr);
                        if i0 == 0 && !by_rows {
                            for p in (jr..jr + cols).step_by(NR) {
                                let panel = &mut packed_b[p * kc..(p + NR) * kc];
                                let width = NR.min(nc - p);
                                // SAFETY: AVX2 is there (this function's contract).
                                unsafe {
                                    pack_sliver(b.transposed(), j0 + p, width, l0, kc, NR, panel)
                                };
                            }
                        }
                        let panels = packed_b[jr * kc..].as_ptr();
                        for ir in (0..mc).step_by(mr) {
                            let ap = packed_a[ir * kc..].as_ptr();
                            let rows = mr.min(mc - ir);
                            let cp = c.at(i0 + ir, j0 + jr).cast_mut();
                            if ir + mr < mc {
                                // The next block of `c` (its sums, which its first step reads,
                                // or lines it will write) is fetched while this one runs.
                                prefetch_block(
                                    c,
                                    i0 + ir + mr,
                                    j0 + jr,
                                    mr.min(mc - ir - mr),
                                    cols,
                                );
                            }
                            let at = Block {
                                kc,
                                ap,
                                bp: panels,
                                cp,
                                c,
                                rows,
                                cols,
                                load,
                            };
                            // SAFETY: the slivers and panels hold `kc` steps of MR and NR
                            // values each, as many as `rows` and `cols` reach; the block of
                            // `c` is inside it (the caller's contract).
                            unsafe {
                                match isa {
                                    Isa::Avx2 => block(at),
                                    Isa::Avx512 => zmm::block(at),
                                }
                            };
                        }
                    }
                }
            }
        }
    });
}

/// How many rows of `B` ahead [`pack_rows`] fetches.
const PACK_AHEAD: usize = 16;

/// Asks for the cache line of `at`.
fn prefetch(at: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(at.cast());
    }
}

/// Makes `buffer` hold at least `len` values. What it held stays: packing overwrites what the
/// kernels read, and values left in padding only reach results that are dropped (zeroing
/// them on every call cost as much as packing).
fn grow(buffer: &mut Vec<f32>, len: usize) {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
}

/// `B[l0 .. l0+kc, j0 .. j0+nc]` of a row-major `b` into `NR`-column panels of `kc` steps
/// (what the last panel held past `nc` stays), one row of `B` after the other.
fn pack_rows(b: Operand, l0: usize, kc: usize, j0: usize, nc: usize, out: &mut [f32]) {
    let whole = nc / NR;
    for l in 0..kc {
        let row = b.at(l0 + l, j0);
        if l + PACK_AHEAD < kc {
            // Rows are usually a page or more apart, where the hardware prefetchers stop.
            let ahead = b.at(l0 + l + PACK_AHEAD, j0);
            for j in (0..nc).step_by(16) {
                prefetch(ahead.wrapping_add(j));
            }
        }
        for p in 0..whole {
            // SAFETY: `NR` elements of row `l0 + l` from column `j0 + p·NR` are inside `b`.
            let part = unsafe { row.add(p * NR).cast::<[f32; NR]>().read_unaligned() };
            let at = (p * kc + l) * NR;
            out[at..at + NR].copy_from_slice(&part);
        }
        for j in whole * NR..nc {
            // SAFETY: inside `b`.
            out[(whole * kc + l) * NR + j % NR] = unsafe { *row.add(j) };
        }
    }
}

/// Asks for the cache lines of `rows` rows of `cols` elements of `c` from `(i, j)`.
fn prefetch_block(c: Operand, i: usize, j: usize, rows: usize, cols: usize) {
    for r in 0..rows {
        for q in (0..cols).step_by(16) {
            prefetch(c.at(i + r, j + q));
        }
        prefetch(c.at(i + r, j + cols - 1));
    }
}

/// One register block's work: `kc` steps of packed `A` at `ap` and packed `B` at `bp` into the
/// `rows × cols` block of `c` whose first element is `cp`, from zero or (`load`) from its sums.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Block {
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    cp: *mut f32,
    c: Operand,
    rows: usize,
    cols: usize,
    load: bool,
}

/// One block of `C` (at most `MR × NR`): a kernel for its rows ([`in_place_or_tiled`]).
///
/// # Safety
/// `at.ap` holds `kc` steps of `MR` values, `at.bp` `kc` steps of `NR`; the block's
/// `rows × cols` elements are inside `c`; AVX2 and FMA are there.
#[cfg(target_arch = "x86_64")]
unsafe fn block(at: Block) {
    let kernel: Kernel = match at.rows {
        6 => kernel::<6>,
        5 => kernel::<5>,
        4 => kernel::<4>,
        3 => kernel::<3>,
        2 => kernel::<2>,
        _ => kernel::<1>,
    };
    // SAFETY: the contract, which `in_place_or_tiled` asks for with a width of `NR`.
    unsafe { in_place_or_tiled(kernel, NR, at) }
}

/// A register block's kernel: `kc` steps from packed `A` and `B` into a block of `C` with a
/// row stride, from zero or (`load`) from the block's values.
type Kernel = unsafe fn(usize, *const f32, *const f32, *mut f32, usize, bool);

/// Runs `kernel`, which writes rows of `width` columns, on block `at` (`cols ≤ width`): in
/// place where the block's columns are `width` and contiguous, else through a local tile.
///
/// # Safety
/// `kernel` may read `kc` steps at `ap` and `bp`; the block's `rows × cols` elements are
/// inside `c`; `rows × width` fits the tile (the AVX-512 block's).
#[cfg(target_arch = "x86_64")]
unsafe fn in_place_or_tiled(kernel: Kernel, width: usize, at: Block) {
    let Block {
        kc,
        ap,
        bp,
        cp,
        c,
        rows,
        cols,
        load,
    } = at;
    // SAFETY: the kernel reads `kc` packed steps and `rows × width` elements at `cp` (or the
    // tile) with row stride `ldc`.
    unsafe {
        if cols == width && c.col_stride == 1 {
            return kernel(kc, ap, bp, cp, c.row_stride as usize, load);
        }
        let mut tile = [0.0f32; zmm::ROWS * zmm::COLS];
        let at =
            |i: usize, j: usize| cp.offset(i as isize * c.row_stride + j as isize * c.col_stride);
        if load {
            for i in 0..rows {
                for j in 0..cols {
                    tile[i * width + j] = *at(i, j);
                }
            }
        }
        kernel(kc, ap, bp, tile.as_mut_ptr(), width, load);
        for i in 0..rows {
            for j in 0..cols {
                *at(i, j) = tile[i * width + j];
            }
        }
    }
}

/// `R × NR` sums of `kc` steps into the block at `cp` (row stride `ldc`): from zero, or with
/// `load` on from the block's values. `2·R` accumulators, two loads of `B` and `R`
/// broadcasts of `A` per step.
///
/// # Safety
/// `ap` holds `kc` steps of `MR` values (the first `R` used) and `bp` `kc` steps of `NR`
/// values; `cp` covers `R` rows of `NR` at `ldc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const R: usize>(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    cp: *mut f32,
    ldc: usize,
    load: bool,
) {
    use std::arch::x86_64::*;
    // SAFETY: the contract's extents.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        if load {
            for (r, acc) in acc.iter_mut().enumerate() {
                acc[0] = _mm256_loadu_ps(cp.add(r * ldc));
                acc[1] = _mm256_loadu_ps(cp.add(r * ldc + 8));
            }
        }
        for l in 0..kc {
            let b0 = _mm256_loadu_ps(bp.add(l * NR));
            let b1 = _mm256_loadu_ps(bp.add(l * NR + 8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(l * MR + r));
                acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(cp.add(r * ldc), acc[0]);
            _mm256_storeu_ps(cp.add(r * ldc + 8), acc[1]);
        }
    }
}

impl Operand {
    /// The same elements as the transposed matrix.
    fn transposed(self) -> Operand {
        Operand {
            ptr: self.ptr,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }
}

/// Rows `i0 .. i0+rows` and columns `l0 .. l0+kc` of `x` as slivers of `width` rows, each
/// `kc` steps (columns) of `width` values: `A`'s slivers. What a ragged last sliver holds past
/// its rows is never read.
///
/// # Safety
/// Those elements are inside `x`; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
unsafe fn pack(
    x: Operand,
    i0: usize,
    rows: usize,
    l0: usize,
    kc: usize,
    width: usize,
    out: &mut Vec<f32>,
) {
    let slivers = rows.div_ceil(width);
    // Room for the last transposed step's whole vector (`transpose_into`).
    grow(out, slivers * kc * width + 8);
    for s in 0..slivers {
        let count = width.min(rows - s * width);
        let sliver = &mut out[s * kc * width..];
        // SAFETY: the contract.
        unsafe { pack_sliver(x, i0 + s * width, count, l0, kc, width, sliver) };
    }
}

/// Rows `i .. i+count` and columns `l0 .. l0+kc` of `x` as `kc` steps of `width` values
/// (`count ≤ width`): a sliver of `A`, or with `B` transposed a panel of `B`. Past `count`
/// each step holds copies of the last row (computed into results that are dropped).
///
/// # Safety
/// Those elements are inside `x`; `out` holds `kc · width` values, and 8 more where `width`
/// is not a multiple of 8; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
unsafe fn pack_sliver(
    x: Operand,
    i: usize,
    count: usize,
    l0: usize,
    kc: usize,
    width: usize,
    out: &mut [f32],
) {
    if x.row_stride == 1 && count == NR && width == NR {
        // The values of one step are contiguous (a row-major `B`'s row): one fixed-size copy
        // each, which compiles to two vector moves.
        for (l, step) in out[..kc * NR].chunks_exact_mut(NR).enumerate() {
            // SAFETY: `NR` elements from row `i`, column `l0 + l`, are inside `x`.
            let src = unsafe { x.at(i, l0 + l).cast::<[f32; NR]>().read_unaligned() };
            step.copy_from_slice(&src);
        }
    } else if x.col_stride == 1 {
        // Each row contiguous along the steps (a row-major `A`, a transposed weight).
        // SAFETY: the contract.
        unsafe { transpose_into(x, i, count, l0, kc, width, out) };
    } else if x.row_stride == 1 {
        // The values of one step contiguous (a transposed `A`: the weight gradient's
        // activations, `Xᵀ · dY`).
        for (l, step) in out[..kc * width].chunks_exact_mut(width).enumerate() {
            // SAFETY: `count` elements from row `i`, column `l0 + l`, are inside `x`.
            let src = unsafe { std::slice::from_raw_parts(x.at(i, l0 + l), count) };
            step[..count].copy_from_slice(src);
            step[count..].fill(src[count - 1]);
        }
    } else {
        for r in 0..width {
            for l in 0..kc {
                // SAFETY: inside `x`.
                out[l * width + r] = unsafe { *x.at(i + r.min(count - 1), l0 + l) };
            }
        }
    }
}

/// `out[l · width + r] = x[i + r, l0 + l]` for rows `r < count` of `x` that are contiguous
/// along `l`, and copies of the last row for `count ≤ r < width`: 8 × 8 transposes, each
/// step's 8 values stored whole (where `width` is 6 the next step's store overwrites the
/// extra two).
///
/// # Safety
/// As [`pack_sliver`], with `x.col_stride == 1`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_into(
    x: Operand,
    i: usize,
    count: usize,
    l0: usize,
    kc: usize,
    width: usize,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let whole = kc - kc % 8;
    let row = |r: usize| i + r.min(count - 1);
    // SAFETY: the contract's extents; rows past `count` read the last row again.
    unsafe {
        for group in (0..width).step_by(8) {
            for l in (0..whole).step_by(8) {
                let r: [__m256; 8] =
                    std::array::from_fn(|q| _mm256_loadu_ps(x.at(row(group + q), l0 + l)));
                let t = [
                    _mm256_unpacklo_ps(r[0], r[1]),
                    _mm256_unpackhi_ps(r[0], r[1]),
                    _mm256_unpacklo_ps(r[2], r[3]),
                    _mm256_unpackhi_ps(r[2], r[3]),
                    _mm256_unpacklo_ps(r[4], r[5]),
                    _mm256_unpackhi_ps(r[4], r[5]),
                    _mm256_unpacklo_ps(r[6], r[7]),
                    _mm256_unpackhi_ps(r[6], r[7]),
                ];
                let s = [
                    _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                    _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                    _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                    _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                    _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                    _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                    _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                    _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
                ];
                let dst = out.as_mut_ptr().add(l * width + group);
                // Steps in increasing order: a store's extra lanes land in the next step.
                for q in 0..4 {
                    _mm256_storeu_ps(
                        dst.add(q * width),
                        _mm256_permute2f128_ps::<0x20>(s[q], s[q + 4]),
                    );
                }
                for q in 0..4 {
                    _mm256_storeu_ps(
                        dst.add((q + 4) * width),
                        _mm256_permute2f128_ps::<0x31>(s[q], s[q + 4]),
                    );
                }
            }
        }
        for r in 0..width {
            for l in whole..kc {
                out[l * width + r] = *x.at(row(r), l0 + l);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod zmm;

#[cfg(test)]
mod tests;
