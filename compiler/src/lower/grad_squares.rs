//! The gradients' sums of squares of a CUDA training step, `@ppc_grad_squares` (its arguments
//! are `ppc_runtime::gpu_update::squares_args`): for `grad_clip`'s global norm, the host
//! fetches one f64 per (parameter, layer) slice instead of every gradient.
//!
//! The order is `clip.rs`'s, so that the norm is the host's bit for bit: element `i` of a slice
//! adds its square (in f64, exact) into lane `i % LANES` in element order, and the lanes add up
//! in lane order. Per parameter two kernels: one thread per (slice, lane), neighbouring threads
//! reading neighbouring elements, each writing its lane's sum to a scratch buffer; then one
//! thread per slice adding its lanes. Each sum leaves as two i32 (its bits, low half first).
//! Where the kernels run as CPU loops (the tests) each kernel is a loop.

use super::buf::Buf;
use super::emit::{Emitter, Written};
use super::entry::{self, Argument};
use super::update::{close_elementwise, flatten, open_elementwise};
use ppc_runtime::clip::{slices, LANES};
use ppc_runtime::gpu_update;
use ppc_runtime::manifest::Manifest;

/// Writes the sums of squares of the gradients of `m`'s parameters with `e` (an emitter for
/// the GPU); returns what it wrote and the function's arguments.
pub fn write(m: &Manifest, mut e: Emitter) -> (Written, Vec<Argument>) {
    let args = gpu_update::squares_args(m);
    let arguments = entry::of_runtime(&mut e, &args, "g");
    let bufs: Vec<&Buf> = arguments.iter().map(|a| &a.buf).collect();
    let (out, grads) = bufs.split_last().expect("invariant: the sums come last");
    let mut first = 0;
    for (grad, a) in grads.iter().zip(&args) {
        let count = slices(a) as u64;
        parameter(&mut e, grad, count, out, first);
        first += count;
    }
    (e.finish(), arguments)
}

/// The sums of squares of `grad`'s `count` slices into `out`, as its sums `first...`.
fn parameter(e: &mut Emitter, grad: &Buf, count: u64, out: &Buf, first: u64) {
    let total = grad.ty.elements();
    let n = total / count.max(1);
    let lanes = LANES as u64;
    let g = flatten(e, grad, total);
    let scratch = e.let_(&format!("memref.alloc() : memref<{}xf64>", count * lanes));
    // Each (slice, lane): its elements' squares in order.
    let i = open_elementwise(e, count * lanes);
    let lanes_c = e.index(lanes);
    let slice = e.let_(&format!("arith.divui {i}, {lanes_c} : index"));
    let lane = e.let_(&format!("arith.remui {i}, {lanes_c} : index"));
    let n_c = e.index(n);
    let base = e.let_(&format!("arith.muli {slice}, {n_c} : index"));
    let zero = e.let_("arith.constant 0.0 : f64");
    let (k, acc, sum) = (e.fresh(), e.fresh(), e.fresh());
    e.open(&format!(
        "{sum} = scf.for {k} = {lane} to {n_c} step {lanes_c} iter_args({acc} = {zero}) -> (f64) {{"
    ));
    let at = e.let_(&format!("arith.addi {base}, {k} : index"));
    let v = e.let_(&format!("memref.load {g}[{at}] : memref<{total}xf32>"));
    let wide = e.let_(&format!("arith.extf {v} : f32 to f64"));
    let square = e.let_(&format!("arith.mulf {wide}, {wide} : f64"));
    let next = e.let_(&format!("arith.addf {acc}, {square} : f64"));
    e.op(&format!("scf.yield {next} : f64"));
    e.close();
    e.op(&format!(
        "memref.store {sum}, {scratch}[{i}] : memref<{}xf64>",
        count * lanes
    ));
    close_elementwise(e);
    // Each slice: its lanes in order, written as two i32.
    let s = open_elementwise(e, count);
    let (lanes_c, zero) = (e.index(lanes), e.let_("arith.constant 0.0 : f64"));
    let base = e.let_(&format!("arith.muli {s}, {lanes_c} : index"));
    let (from, one) = (e.index(0), e.index(1));
    let (j, acc, sum) = (e.fresh(), e.fresh(), e.fresh());
    e.open(&format!(
        "{sum} = scf.for {j} = {from} to {lanes_c} step {one} iter_args({acc} = {zero}) -> (f64) {{"
    ));
    let at = e.let_(&format!("arith.addi {base}, {j} : index"));
    let lane_sum = e.let_(&format!(
        "memref.load {scratch}[{at}] : memref<{}xf64>",
        count * lanes
    ));
    let next = e.let_(&format!("arith.addf {acc}, {lane_sum} : f64"));
    e.op(&format!("scf.yield {next} : f64"));
    e.close();
    let bits = e.let_(&format!("arith.bitcast {sum} : f64 to i64"));
    let low = e.let_(&format!("arith.trunci {bits} : i64 to i32"));
    let shift = e.let_("arith.constant 32 : i64");
    let high = e.let_(&format!("arith.shrui {bits}, {shift} : i64"));
    let high = e.let_(&format!("arith.trunci {high} : i64 to i32"));
    let (first_c, two) = (e.index(first), e.index(2));
    let slot = e.let_(&format!("arith.addi {first_c}, {s} : index"));
    let low_at = e.let_(&format!("arith.muli {slot}, {two} : index"));
    let high_at = e.let_(&format!("arith.addi {low_at}, {one} : index"));
    for (half, at) in [(&low, &low_at), (&high, &high_at)] {
        e.op(&format!(
            "memref.store {half}, {}[{at}] : {}",
            out.name,
            out.mty()
        ));
    }
    close_elementwise(e);
    e.op(&format!(
        "memref.dealloc {scratch} : memref<{}xf64>",
        count * lanes
    ));
}
