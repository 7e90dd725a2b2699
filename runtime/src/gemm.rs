//! The GEMM that generated CPU code calls for f32 `matmul`: `C = A · B` over any batch axes,
//! with NumPy broadcasting of the batch axes: the few-row kernels of `small_m.rs` (`X · W`)
//! and `small_m_bt.rs` (`dY · Wᵀ`) for the few-row products of pipeline stages with wide
//! weights on AVX-512 CPUs, `sgemm.rs` (AVX-512 or AVX2 register blocks) otherwise.
//!
//! Both compute every element as the same chain of fused multiply-adds in k order, so how a
//! product is cut into tasks here (from the shapes and the thread count, for speed) never
//! changes a bit of the result: the same bytes on any number of threads and ranks, and on AVX2
//! and AVX-512 CPUs alike.
//!
//! Operands with more axes than the result sum over the extra ones (those just before the
//! matrix axes): `C = Σₛ Aₛ · Bₛ`, a weight gradient summed over the batch. Each element is
//! then the one chain over the summed entries and k in order, so the products fold into one
//! GEMM with a longer k where the strides allow, and otherwise run entry by entry, each
//! accumulating from where the last stopped: the same bits either way on the CPU (the compiler
//! emits such products for the CPU only; cuBLAS would round the two ways differently).
//!
//! It is called through MLIR's C interface with unranked memrefs (`memref<*xf32>`), so one
//! symbol serves every tensor rank. The reference interpreter sums with separate multiplies
//! and adds, so results agree with it to rounding (relative 1e-5), not bit for bit.

use crate::memref::Unranked;
use crate::sgemm::Operand;
use crate::trace;
use std::ops::Deref;

/// The element types of `matmul` operands: f32 on the CPU (other dtypes are converted to f32
/// first); bf16 and f16 operands also go straight to the GPU's tensor cores (`--target cuda`),
/// accumulating in f32 into an f32 result or, rounded once, one of their own type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    BF16,
    F16,
}

impl Elem {
    pub fn bytes(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::BF16 | Elem::F16 => 2,
        }
    }
}

/// The most axes a `matmul` operand has (the type checker rejects more).
pub const MAX_RANK: usize = crate::tensor::MAX_MATMUL_RANK;

/// An operand's sizes, strides or batch index, inline: generated code calls the GEMM
/// thousands of times a step (the transformer's training step), and allocating these showed in
/// profiles.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims<T> {
    len: usize,
    items: [T; MAX_RANK],
}

impl<T: Copy + Default> Dims<T> {
    fn from_fn(len: usize, mut f: impl FnMut(usize) -> T) -> Dims<T> {
        assert!(
            len <= MAX_RANK,
            "invariant: matmul operands have at most {MAX_RANK} axes"
        );
        let mut items = [T::default(); MAX_RANK];
        items[..len]
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = f(i));
        Dims { len, items }
    }
}

impl<T: Copy> Dims<T> {
    fn remove(&mut self, axis: usize) {
        self.items.copy_within(axis + 1..self.len, axis);
        self.len -= 1;
    }
}

impl<T> Deref for Dims<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<'a, T> IntoIterator for &'a Dims<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The index of row-major flat position `flat` in `shape`.
pub(crate) fn unflatten(flat: usize, shape: &[usize]) -> Dims<usize> {
    let mut idx = Dims::from_fn(shape.len(), |_| 0);
    let mut rest = flat;
    for ax in (0..shape.len()).rev() {
        idx.items[ax] = rest % shape[ax];
        rest /= shape[ax];
    }
    idx
}

#[derive(Clone, Copy)]
pub(crate) struct View {
    /// The first element's address.
    pub(crate) ptr: *mut u8,
    pub(crate) elem: Elem,
    pub(crate) sizes: Dims<usize>,
    /// In elements.
    pub(crate) strides: Dims<isize>,
}

impl View {
    /// The first element of an f32 view (a method, so closures capture the whole `Sync` view).
    fn base(&self) -> *mut f32 {
        self.ptr.cast()
    }

    /// Batch axis `axis` (the one just before the rows) as more rows.
    fn fold_into_rows(&mut self, axis: usize) {
        self.sizes.items[axis + 1] *= self.sizes[axis];
        self.sizes.remove(axis);
        self.strides.remove(axis);
    }

    /// Whether the `entries` entries of batch axis `rank - 3` lay their `rows` rows one after
    /// another.
    fn rows_follow(&self, entries: usize, rows: usize) -> bool {
        let rank = self.sizes.len();
        rank >= 3
            && self.sizes[rank - 3] == entries
            && self.strides[rank - 3] == rows as isize * self.strides[rank - 2]
    }
}

/// Folds `c`'s last batch axis into the rows, as long as `b` is the same matrix along it and
/// `a` and `c` lay its entries' rows one after another: one taller GEMM instead of one per entry,
/// and `b` packed once (the transformer's weight products, `[S, b, t, d] · [S, 1, d, f]`). With
/// `keep_first`, the first axis stays (a stage mask indexes it). Each element of `c` is still
/// the same dot product, summed the same way.
fn fold_rows(a: &mut View, b: &mut View, c: &mut View, keep_first: bool) {
    loop {
        let (rb, r) = (b.sizes.len(), c.sizes.len());
        if r < 3 || (keep_first && r == 3) {
            return;
        }
        let (rows, entries) = (c.sizes[r - 2], c.sizes[r - 3]);
        let b_same = rb < 3 || b.sizes[rb - 3] == 1;
        if !(b_same && a.rows_follow(entries, rows) && c.rows_follow(entries, rows)) {
            return;
        }
        a.fold_into_rows(a.sizes.len() - 3);
        c.fold_into_rows(r - 3);
        if rb >= 3 {
            b.sizes.remove(rb - 3);
            b.strides.remove(rb - 3);
        }
    }
}

// SAFETY: a view is only a description of memory; `_mlir_ciface_ppc_matmul_f32` guarantees
// that concurrent users write disjoint elements.
unsafe impl Sync for View {}

/// # Safety
/// `u` points to a live unranked memref descriptor of `elem` elements.
pub(crate) unsafe fn view(u: *const Unranked, elem: Elem) -> View {
    // SAFETY: the caller guarantees `u` and its descriptor are valid; the descriptor layout is
    // `{allocated, aligned, offset, sizes[rank], strides[rank]}` in 8-byte words.
    unsafe {
        let rank = (*u).rank as usize;
        let words = (*u).descriptor.cast::<i64>();
        let aligned = *words.add(1) as *mut u8;
        let offset = *words.add(2) as isize * elem.bytes() as isize;
        let sizes = Dims::from_fn(rank, |i| *words.add(3 + i) as usize);
        let strides = Dims::from_fn(rank, |i| *words.add(3 + rank + i) as isize);
        View {
            ptr: aligned.offset(offset),
            elem,
            sizes,
            strides,
        }
    }
}

/// Element offset of batch index `idx` (of the result's batch shape) in an operand whose batch
/// axes broadcast against it.
pub(crate) fn batch_offset(v: &View, idx: &[usize]) -> isize {
    let nb = v.sizes.len() - 2;
    let skip = idx.len() - nb;
    (0..nb)
        .map(|i| {
            if v.sizes[i] == 1 {
                0
            } else {
                idx[skip + i] as isize * v.strides[i]
            }
        })
        .sum()
}

/// `c = a · b` where `mask[i]` (over `c`'s first axis) is true, zero elsewhere (stage programs:
/// entries of stages in a bubble slot are skipped); `None`: everywhere.
///
/// # Safety
/// `a`, `b` point to live memref descriptors of `elem` elements and `c` of `out` ones (f32,
/// or `elem` where nothing accumulates), whose
/// shapes `matmul` type-checked: `a: [..., m, k]`, `b: [..., k, n]`, `c: [batch..., m, n]`
/// (or, summed over `s..`, `a: [batch..., s.., m, k]` and `b: [batch..., s.., k, n]`);
/// `c` does not overlap `a` or `b`; `mask` points to a live i1 memref of `c`'s first axis.
unsafe fn masked(
    a: *const Unranked,
    b: *const Unranked,
    c: *const Unranked,
    mask: Option<*const Unranked>,
    (elem, out): (Elem, Elem),
    accumulate: bool,
) {
    let Some(mask) = mask else {
        // SAFETY: forwarded from this function's contract.
        return unsafe { matmul(a, b, c, None, (elem, out), accumulate) };
    };
    // On a GPU, the host computed the mask, or generated code waited for the GPU before this
    // call (`residency.rs` of the compiler).
    // SAFETY: forwarded from this function's contract.
    unsafe {
        let active = crate::bubble::read_mask(mask);
        matmul(a, b, c, Some(&active), (elem, out), accumulate)
    }
}

/// The GEMM entry points of generated code for one operand type, result type and mode:
/// `NAME(a, b, c)` and `NAME_masked(a, b, c, mask)`; with `accumulate`, `c += a · b` (entries
/// of masked-out stages left as they are: adding `-0.0` changes nothing).
macro_rules! matmul_fns {
    ($($plain:ident, $masked:ident, $elems:expr, $accumulate:expr;)*) => {$(
        /// `c = a · b` or `c += a · b` (see [`masked`]).
        ///
        /// # Safety
        /// As [`masked`].
        #[no_mangle]
        pub unsafe extern "C" fn $plain(
            a: *const Unranked,
            b: *const Unranked,
            c: *const Unranked,
        ) {
            // SAFETY: forwarded from this function's contract.
            unsafe { masked(a, b, c, None, $elems, $accumulate) }
        }

        /// The same where `mask` is true (see [`masked`]).
        ///
        /// # Safety
        /// As [`masked`].
        #[no_mangle]
        pub unsafe extern "C" fn $masked(
            a: *const Unranked,
            b: *const Unranked,
            c: *const Unranked,
            mask: *const Unranked,
        ) {
            // SAFETY: forwarded from this function's contract.
            unsafe { masked(a, b, c, Some(mask), $elems, $accumulate) }
        }
    )*};
}
matmul_fns! {
    _mlir_ciface_ppc_matmul_f32, _mlir_ciface_ppc_matmul_f32_masked, (Elem::F32, Elem::F32), false;
    _mlir_ciface_ppc_matmul_bf16, _mlir_ciface_ppc_matmul_bf16_masked, (Elem::BF16, Elem::F32), false;
    _mlir_ciface_ppc_matmul_f16, _mlir_ciface_ppc_matmul_f16_masked, (Elem::F16, Elem::F32), false;
    _mlir_ciface_ppc_matmul_acc_f32, _mlir_ciface_ppc_matmul_acc_f32_masked, (Elem::F32, Elem::F32), true;
    _mlir_ciface_ppc_matmul_acc_bf16, _mlir_ciface_ppc_matmul_acc_bf16_masked, (Elem::BF16, Elem::F32), true;
    _mlir_ciface_ppc_matmul_acc_f16, _mlir_ciface_ppc_matmul_acc_f16_masked, (Elem::F16, Elem::F32), true;
    _mlir_ciface_ppc_matmul_bf16_rounded, _mlir_ciface_ppc_matmul_bf16_rounded_masked, (Elem::BF16, Elem::BF16), false;
    _mlir_ciface_ppc_matmul_f16_rounded, _mlir_ciface_ppc_matmul_f16_rounded_masked, (Elem::F16, Elem::F16), false;
}

/// # Safety
/// As [`masked`]; `active`, if given, has one entry per index of `c`'s first axis.
unsafe fn matmul(
    a: *const Unranked,
    b: *const Unranked,
    c: *const Unranked,
    active: Option<&[bool]>,
    (elem, out): (Elem, Elem),
    accumulate: bool,
) {
    let started = trace::start();
    // SAFETY: forwarded from this function's contract.
    let (a, b, result) = unsafe { (view(a, elem), view(b, elem), view(c, out)) };
    let on_gpu = crate::cuda::active();
    // `--target cuda` code with its kernels run on the CPU (tests): widen, then as f32, and
    // round a 16-bit result once from the f32 sums, as cuBLAS does.
    let wide = (elem != Elem::F32 && !on_gpu).then(|| (widened(&a), widened(&b)));
    let (a, b) = match &wide {
        Some(((_, va), (_, vb))) => (*va, *vb),
        None => (a, b),
    };
    let sums = (out != Elem::F32 && !on_gpu).then(|| f32_like(&result));
    let c = sums.as_ref().map_or(result, |(_, v)| *v);
    each_summed_entry(
        a,
        b,
        c.sizes.len(),
        accumulate,
        |mut a, mut b, accumulate| {
            let mut c = c;
            fold_rows(&mut a, &mut b, &mut c, active.is_some());
            if on_gpu {
                crate::cuda::gemm::matmul(&a, &b, &c, active, accumulate);
                trace::record_gemm(started, || traced(&a, &b, &c, accumulate));
            } else {
                // SAFETY: forwarded from this function's contract (the widened copies live
                // until this function returns).
                unsafe { multiply(&a, &b, &c, active, accumulate, started) }
            }
        },
    );
    if let Some((values, _)) = sums {
        round_into(&values, &result);
    }
}

/// Calls `product(a, b, accumulate)` for the products whose sum is `c` (of rank `rank_c`):
/// once when `a` and `b` have no axes to sum or their summed axes fold into k, else once per
/// summed entry, each after the first accumulating. Either way each element is the chain over
/// the summed entries and k in order (the module doc).
fn each_summed_entry(
    mut a: View,
    mut b: View,
    rank_c: usize,
    accumulate: bool,
    mut product: impl FnMut(View, View, bool),
) {
    let summed = a.sizes.len().saturating_sub(rank_c);
    if summed == 0 || fold_summed_into_k(&mut a, &mut b, summed) {
        return product(a, b, accumulate);
    }
    let (ra, rb) = (a.sizes.len(), b.sizes.len());
    let axes = ra - 2 - summed..ra - 2;
    let sizes: Dims<usize> = Dims::from_fn(summed, |i| a.sizes[axes.start + i]);
    let count: usize = sizes.iter().product();
    let entry = |v: &View, idx: &[usize]| {
        let rank = v.sizes.len();
        let first = rank - 2 - summed;
        let offset: isize = (0..summed)
            .map(|i| idx[i] as isize * v.strides[first + i])
            .sum();
        let mut e = *v;
        e.ptr = v.ptr.wrapping_offset(offset * v.elem.bytes() as isize);
        for _ in 0..summed {
            e.sizes.remove(first);
            e.strides.remove(first);
        }
        e
    };
    assert_eq!(rb, ra, "invariant: summed operands have the same rank");
    for flat in 0..count {
        let idx = unflatten(flat, &sizes);
        product(entry(&a, &idx), entry(&b, &idx), accumulate || flat > 0);
    }
}

/// Folds the `summed` axes just before the matrix axes of `a: [.., s.., m, k]` and
/// `b: [.., s.., k, n]` into k, where both lay the summed entries' k one after another.
fn fold_summed_into_k(a: &mut View, b: &mut View, summed: usize) -> bool {
    let (ra, rb) = (a.sizes.len(), b.sizes.len());
    let k = a.sizes[ra - 1];
    // The stride a summed axis must have to continue k: k's own (a's columns, b's rows)
    // times the size of everything folded inside it.
    let follows = |v: &View, k_stride: isize| {
        let rank = v.sizes.len();
        let mut want = k as isize * k_stride;
        (rank - 2 - summed..rank - 2).rev().all(|ax| {
            let ok = v.strides[ax] == want;
            want *= v.sizes[ax] as isize;
            ok
        })
    };
    let same_sizes = (1..=summed).all(|i| a.sizes[ra - 2 - i] == b.sizes[rb - 2 - i]);
    if !(same_sizes && follows(a, a.strides[ra - 1]) && follows(b, b.strides[rb - 2])) {
        return false;
    }
    let entries: usize = a.sizes[ra - 2 - summed..ra - 2].iter().product();
    for _ in 0..summed {
        a.sizes.remove(ra - 2 - summed);
        a.strides.remove(ra - 2 - summed);
        b.sizes.remove(rb - 2 - summed);
        b.strides.remove(rb - 2 - summed);
    }
    let (ra, rb) = (a.sizes.len(), b.sizes.len());
    a.sizes.items[ra - 1] *= entries;
    b.sizes.items[rb - 2] *= entries;
    true
}

/// Row-major f32 zeros of `v`'s shape, and a view of them (which points into the returned
/// vector: keep it alive).
fn f32_like(v: &View) -> (Vec<f32>, View) {
    f32_view(vec![0.0f32; v.sizes.iter().product()], v)
}

/// `data`, row-major f32 values of `like`'s shape, with a view of them.
fn f32_view(data: Vec<f32>, like: &View) -> (Vec<f32>, View) {
    let view = View {
        ptr: data.as_ptr().cast_mut().cast(),
        elem: Elem::F32,
        sizes: like.sizes,
        strides: row_major(&like.sizes),
    };
    (data, view)
}

/// Writes row-major f32 `values` into the 16-bit view `v`, each rounded to nearest even.
fn round_into(values: &[f32], v: &View) {
    for (flat, &x) in values.iter().enumerate() {
        let bits = match v.elem {
            Elem::BF16 => half::bf16::from_f32(x).to_bits(),
            Elem::F16 => half::f16::from_f32(x).to_bits(),
            Elem::F32 => unreachable!("invariant: a 16-bit result"),
        };
        // SAFETY: the offset is inside the view (each index below its size).
        unsafe { *v.ptr.cast::<u16>().offset(element_offset(v, flat)) = bits };
    }
}

/// The element offset of row-major element `flat` of view `v`.
fn element_offset(v: &View, flat: usize) -> isize {
    unflatten(flat, &v.sizes)
        .iter()
        .zip(&v.strides)
        .map(|(&i, &s)| i as isize * s)
        .sum()
}

fn row_major(sizes: &Dims<usize>) -> Dims<isize> {
    let strides = crate::tensor::strides(sizes);
    Dims::from_fn(strides.len(), |i| strides[i] as isize)
}

/// A 16-bit (bf16 or f16) operand's values as contiguous row-major f32, and a view of them
/// (which points into the returned vector: keep it alive).
fn widened(v: &View) -> (Vec<f32>, View) {
    let n: usize = v.sizes.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|flat| {
            // SAFETY: the offset is inside the view (each index below its size).
            let bits = unsafe { *v.ptr.cast::<u16>().offset(element_offset(v, flat)) };
            if v.elem == Elem::BF16 {
                half::bf16::from_bits(bits).to_f32()
            } else {
                half::f16::from_bits(bits).to_f32()
            }
        })
        .collect();
    f32_view(data, v)
}

/// # Safety
/// As [`matmul`], with f32 views.
unsafe fn multiply(
    a: &View,
    b: &View,
    c: &View,
    active: Option<&[bool]>,
    accumulate: bool,
    started: Option<std::time::Instant>,
) {
    let r = c.sizes.len();
    let (m, n) = (c.sizes[r - 2], c.sizes[r - 1]);
    let k = a.sizes[a.sizes.len() - 1];
    let batch = &c.sizes[..r - 2];
    let count: usize = batch.iter().product();
    let per_first = batch.iter().skip(1).product::<usize>().max(1);
    let (ra, rb) = (a.sizes.len(), b.sizes.len());
    // One GEMM per batch entry (per stage, in a stage program). When there are too few of them
    // to share evenly among the threads (a stage's few-row product, with 1 to 4 stages active),
    // each is cut into column blocks; otherwise whole GEMMs are the tasks, so that no two
    // tasks pack the same rows of `A` (1.09× on the large transformer, BENCHMARKS.md). The
    // cut depends on the thread count; the results do not (the module doc).
    let threads = crate::pool::threads();
    let live = active.map_or(count, |act| act.iter().filter(|&&a| a).count() * per_first);
    let balanced = m >= 256 && live.is_multiple_of(threads);
    let blocks = if n >= 64 * threads && live < 4 * threads && !balanced {
        threads
    } else {
        1
    };
    let width = n.div_ceil(blocks).next_multiple_of(16).min(n);
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for flat in 0..count {
        if active.is_some_and(|act| !act[flat / per_first]) {
            if accumulate {
                continue; // adding -0.0 changes nothing
            }
            // A skipped entry is -0.0 (the additive identity, as in the interpreter).
            let (cp, (rs, cs)) = (entry(c, flat, batch), (c.strides[r - 2], c.strides[r - 1]));
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: inside this entry's [m, n] block of `c`.
                    unsafe { *cp.offset(i as isize * rs + j as isize * cs) = -0.0 };
                }
            }
            continue;
        }
        tasks.extend(
            (0..n)
                .step_by(width)
                .map(|j0| (flat, j0, (j0 + width).min(n))),
        );
    }
    let one = |t: usize| {
        let block_started = trace::start();
        let (flat, j0, j1) = tasks[t];
        let idx = unflatten(flat, batch);
        let (cs, bs) = (c.strides[r - 1], b.strides[rb - 1]);
        // SAFETY: offsets stay inside each operand (broadcast axes use offset 0); each task
        // writes only columns j0..j1 of its own entry's block of `c`, so tasks never write the
        // same element; the kernels read `a` and `b` and write `c` through the given strides.
        unsafe {
            let cp = entry(c, flat, batch).offset(j0 as isize * cs);
            let ap = a.base().offset(batch_offset(a, &idx));
            let bp = b.base().offset(batch_offset(b, &idx) + j0 as isize * bs);
            let width = j1 - j0;
            let few_rows = a.strides[ra - 1] == 1
                && cs == 1
                && !accumulate
                && few_row_kernel_wins(m, k, width);
            if few_rows && b.strides[rb - 2] == 1 && m.is_multiple_of(16) {
                // `B` is a row-major weight transposed: its columns are the weight's rows.
                // The kernel's vectors run along 16 rows of `C`; with a ragged block it lost
                // to `sgemm.rs` (24 rows: 77 against 83 GFLOP/s, BENCHMARKS.md).
                crate::small_m_bt::sgemm(
                    m,
                    k,
                    width,
                    ap,
                    a.strides[ra - 2] as usize,
                    bp,
                    bs as usize,
                    cp,
                    c.strides[r - 2] as usize,
                );
            } else if few_rows && bs == 1 {
                crate::small_m::sgemm(
                    m,
                    k,
                    width,
                    ap,
                    a.strides[ra - 2] as usize,
                    bp,
                    b.strides[rb - 2] as usize,
                    cp,
                    c.strides[r - 2] as usize,
                );
            } else {
                let operand = |ptr: *const f32, v: &View, rank: usize| Operand {
                    ptr,
                    row_stride: v.strides[rank - 2],
                    col_stride: v.strides[rank - 1],
                };
                crate::sgemm::sgemm(
                    m,
                    k,
                    width,
                    operand(ap, a, ra),
                    operand(bp, b, rb),
                    operand(cp, c, r),
                    accumulate,
                );
            }
        }
        trace::record(trace::Kind::GemmBlock, flat as i64, block_started);
    };
    // Products too small to pay for waking the team run on this thread.
    if (m * n * k * tasks.len()) / blocks < SERIAL_FMAS {
        (0..tasks.len()).for_each(one);
    } else {
        crate::pool::parallel_for(tasks.len(), &one);
    }
    trace::record_gemm(started, || traced(a, b, c, accumulate));
}

/// How the trace describes the product `c = a · b` (after the folds into rows and k).
fn traced(a: &View, b: &View, c: &View, accumulate: bool) -> trace::Gemm {
    let (ra, rb, r) = (a.sizes.len(), b.sizes.len(), c.sizes.len());
    let layout =
        |v: &View, rank: usize| trace::Layout::of(v.strides[rank - 2], v.strides[rank - 1]);
    trace::Gemm {
        batch: c.sizes[..r - 2].iter().product(),
        m: c.sizes[r - 2],
        n: c.sizes[r - 1],
        k: a.sizes[ra - 1],
        a: layout(a, ra),
        b: layout(b, rb),
        accumulate,
    }
}

/// The first element of `c`'s block for flat batch entry `flat`.
fn entry(c: &View, flat: usize, batch: &[usize]) -> *mut f32 {
    let oc: isize = unflatten(flat, batch)
        .iter()
        .zip(&c.strides)
        .map(|(&i, &s)| i as isize * s)
        .sum();
    c.base().wrapping_offset(oc)
}

/// Below this many multiply-adds in all, a GEMM call runs on the calling thread: the attention's
/// tiny products cost less than waking the team (1.03× on the transformer; 2^20: 0.94×).
const SERIAL_FMAS: usize = 1 << 18;

/// Where the few-row kernel of `small_m.rs` beats a packing GEMM: AVX-512, at most 64 rows, and
/// a weight block of at least 64K elements (measured against OpenBLAS, one thread: 16×256×256
/// 167-197 against 99-102 GFLOP/s, 16×256×1024 106-118 against 63-68; but 32×256×64 182
/// against 220 and 16×16×16 49 against 92; `cargo run --release -p ppc-runtime --example
/// gemm`). Its sums are `sgemm.rs`'s, so the choice changes the speed only.
fn few_row_kernel_wins(m: usize, k: usize, n: usize) -> bool {
    m <= 64 && k * n >= 65_536 && small_m_available()
}

/// The kernels this CPU runs, as `--bench` reports them.
pub fn kernels() -> &'static str {
    use crate::sgemm::Isa;
    match (small_m_available(), Isa::here()) {
        (true, Some(Isa::Avx512)) => "avx512 (few-row kernel, 12x32 blocks)",
        (true, _) => "avx512 few-row + avx2/fma",
        (false, Some(_)) => "avx2/fma",
        (false, None) => "portable",
    }
}

/// Whether the few-row kernel can run here (looked up once).
fn small_m_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(crate::small_m::available)
}

#[cfg(test)]
mod tests;
