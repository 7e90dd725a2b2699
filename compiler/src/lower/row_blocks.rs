//! `--target cuda`: a kernel of one thread block per row (`gpu_reduce.rs`, `gpu_norm.rs`), as
//! the GPU runs it or, where the kernels run as CPU loops (the tests), as loops that compute the
//! same values.
//!
//! On the GPU it is a `gpu.launch` of one block per row; its threads stride along the row
//! together and `gpu.all_reduce` combines their values (MLIR lowers it to warp shuffles and a
//! pass through shared memory); one thread writes the row's result. On the CPU the same code
//! runs inside a loop over the rows and a loop over the threads; each thread's value goes to a
//! buffer, and the values are combined in thread order after the loop. So the tests check
//! everything the kernel computes, its rows' indices and its threads' strides included, except
//! MLIR's lowering of `gpu.all_reduce`; only the order of the combination differs, which the
//! GPU check (`scripts/gpu-check.sh`) compares against the interpreter within tolerance.
//!
//! ```text
//! GPU                                       CPU (kernels as loops)
//! gpu.launch blocks(%b) in (rows)           scf.for %b = 0 to rows {
//!            threads(%t) in (T) {             scf.for %t = 0 to T { ... store %p, %parts[%t] }
//!   ... %p ...                                %v = fold of %parts[0..T]
//!   %v = gpu.all_reduce add %p                store %v
//!   scf.if %t == 0 { store %v } }           }
//! ```

use super::buf::Buf;
use super::emit::Emitter;
use ppc_dialect::{DType, Type};

/// Threads per block, at most: a row of 4096 takes 16 elements a thread.
const MAX_THREADS: u64 = 256;

/// Rows shorter than a warp stay one thread's loop.
const MIN_ROW: u64 = 32;

/// Whether work along `axis` of `x` can be such a kernel: a GPU program, the innermost axis of
/// at least [`MIN_ROW`] elements, no parallel loop around (there would be nothing to launch
/// from).
pub fn fits(e: &Emitter, x: &Buf, axis: usize) -> bool {
    let r = x.ty.rank();
    e.gpu.is_some()
        && r >= 2
        && axis == r - 1
        && x.ty.shape()[r - 1] >= MIN_ROW
        && !e.nest.in_parallel_loop()
}

/// The threads of a block for rows of `n`: the largest power of two up to `n` and
/// [`MAX_THREADS`], so that every warp is full.
fn threads(n: u64) -> u64 {
    let t = MAX_THREADS.min(n);
    1 << (63 - t.leading_zeros())
}

/// How the threads' values combine.
#[derive(Clone, Copy)]
pub enum Fold {
    Sum,
    Max,
}

impl Fold {
    /// The op of `gpu.all_reduce`.
    fn all_reduce(self) -> &'static str {
        match self {
            Fold::Sum => "add",
            Fold::Max => "maximumf",
        }
    }

    /// The f32 op that combines two values.
    fn op(self) -> &'static str {
        match self {
            Fold::Sum => "arith.addf",
            Fold::Max => "arith.maximumf",
        }
    }

    /// The value a thread starts from (-0.0, as the interpreter's sums; -inf).
    fn init(self) -> &'static str {
        match self {
            Fold::Sum => "-0.0",
            Fold::Max => "0xFF800000",
        }
    }
}

/// An open kernel of one block of `threads` threads per row of `n` elements, whose threads
/// take the row's elements `t, t + threads, ...` (consecutive threads, consecutive elements).
pub struct RowBlocks {
    /// The indices of the block's row.
    row: Vec<String>,
    /// The thread's index (on the GPU; as CPU loops, set by each loop over the threads).
    thread: String,
    threads: u64,
    n: u64,
    /// Kernels as CPU loops: each thread's value before it is combined.
    parts: Option<Buf>,
}

impl RowBlocks {
    /// Opens the kernel over the rows of `x` (its last axis the row), which writes `out`: one
    /// block per row, of [`threads`] threads.
    pub fn open(e: &mut Emitter, x: &Buf, out: &Buf) -> RowBlocks {
        e.device_uses(&[x], out);
        let shape = x.ty.shape();
        let (rows, n) = shape.split_at(shape.len() - 1);
        let (count, n) = (rows.iter().product(), n[0]);
        let threads = threads(n);
        let on_cpu = e.gpu.as_ref().is_some_and(|g| g.kernels_on_cpu);
        if on_cpu {
            let parts = e.alloc(&Type::of(DType::F32, &[threads]));
            let block = e.begin_for(count);
            return RowBlocks {
                row: row_indices(e, &block, rows),
                thread: String::new(),
                threads,
                n,
                parts: Some(parts),
            };
        }
        let (bx, tx) = e.open_launch(count, threads);
        RowBlocks {
            row: row_indices(e, &bx, rows),
            thread: tx,
            threads,
            n,
            parts: None,
        }
    }

    /// The indices of element `j` of the block's row: `%i, %k, %j`.
    fn element(&self, j: &str) -> String {
        self.row
            .iter()
            .map(String::as_str)
            .chain([j])
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `fold` of `value(at)` over the row's elements (`at`: an element's indices, `%i, %k, %j`),
    /// every thread's share combined: the same f32 value for the whole block.
    pub fn reduce_row(
        &mut self,
        e: &mut Emitter,
        fold: Fold,
        value: impl FnOnce(&mut Emitter, &str) -> String,
    ) -> String {
        self.begin_threads(e);
        let start = e.let_(&format!("arith.constant {} : f32", fold.init()));
        let (from, to, step) = self.bounds(e);
        let (j, a, partial) = (e.fresh(), e.fresh(), e.fresh());
        e.open(&format!(
            "{partial} = scf.for {j} = {from} to {to} step {step} iter_args({a} = {start}) -> (f32) {{"
        ));
        let v = value(e, &self.element(&j));
        let next = e.let_(&format!("{} {a}, {v} : f32", fold.op()));
        e.op(&format!("scf.yield {next} : f32"));
        e.close();
        self.combine(e, &partial, fold)
    }

    /// Runs `body(at)` for each of the row's elements, spread over the threads (`at`: the
    /// element's indices).
    pub fn for_row(&mut self, e: &mut Emitter, body: impl FnOnce(&mut Emitter, &str)) {
        self.begin_threads(e);
        let (from, to, step) = self.bounds(e);
        let j = e.fresh();
        e.open(&format!("scf.for {j} = {from} to {to} step {step} {{"));
        body(e, &self.element(&j));
        e.close();
        if self.parts.is_some() {
            e.end_for();
        }
    }

    /// The thread's first element, the row's end and the threads' stride.
    fn bounds(&self, e: &mut Emitter) -> (String, String, String) {
        (self.thread.clone(), e.index(self.n), e.index(self.threads))
    }

    /// As CPU loops, opens the loop over the threads.
    fn begin_threads(&mut self, e: &mut Emitter) {
        if self.parts.is_some() {
            self.thread = e.begin_for(self.threads);
        }
    }

    /// Each thread's f32 `value` combined over the block: on the GPU every thread has the
    /// result; as CPU loops the threads' loop ends here, and what follows runs once per row.
    fn combine(&self, e: &mut Emitter, value: &str, fold: Fold) -> String {
        let Some(parts) = &self.parts else {
            return e.let_(&format!(
                "gpu.all_reduce {} {value} uniform {{}} : (f32) -> (f32)",
                fold.all_reduce()
            ));
        };
        e.op(&format!(
            "memref.store {value}, {}[{}] : {}",
            parts.name,
            self.thread,
            parts.mty()
        ));
        e.end_for();
        let zero = e.index(0);
        let first = e.let_(&format!(
            "memref.load {}[{zero}] : {}",
            parts.name,
            parts.mty()
        ));
        let (lo, hi, one) = (e.index(1), e.index(self.threads), e.index(1));
        let (t, a, folded) = (e.fresh(), e.fresh(), e.fresh());
        e.open(&format!(
            "{folded} = scf.for {t} = {lo} to {hi} step {one} iter_args({a} = {first}) -> (f32) {{"
        ));
        let v = e.let_(&format!(
            "memref.load {}[{t}] : {}",
            parts.name,
            parts.mty()
        ));
        let next = e.let_(&format!("{} {a}, {v} : f32", fold.op()));
        e.op(&format!("scf.yield {next} : f32"));
        e.close();
        folded
    }

    /// Code that one thread runs for the block (after [`RowBlocks::reduce_row`]): `body(row)`,
    /// `row` the indices of the block's row.
    pub fn once(&self, e: &mut Emitter, body: impl FnOnce(&mut Emitter, &str)) {
        let row = self.row.join(", ");
        if self.parts.is_some() {
            return body(e, &row);
        }
        let zero = e.index(0);
        let first = e.let_(&format!("arith.cmpi eq, {}, {zero} : index", self.thread));
        e.open(&format!("scf.if {first} {{"));
        body(e, &row);
        e.close();
    }

    /// Ends the kernel.
    pub fn close(self, e: &mut Emitter) {
        match self.parts {
            Some(_) => e.end_for(),
            None => e.close_launch(),
        }
    }
}

/// The indices of row `block` of `rows` (row-major).
fn row_indices(e: &mut Emitter, block: &str, rows: &[u64]) -> Vec<String> {
    let mut below = 1;
    let mut out = Vec::new();
    for &size in rows.iter().rev() {
        let (stride, extent) = (e.index(below), e.index(size));
        let above = e.let_(&format!("arith.divui {block}, {stride} : index"));
        out.push(e.let_(&format!("arith.remui {above}, {extent} : index")));
        below *= size;
    }
    out.reverse();
    out
}
