//! Reductions along a buffer's innermost axis (a softmax's row maximum and sum, a layernorm's
//! mean and variance) as loops that keep the running value in a register.
//!
//! As a `linalg.generic`, such a reduction kept its running value in the output buffer: a load
//! and a store per element, and for the maximum a scalar loop with NaN checks per element
//! (perf: the row maximum was a quarter of a softmax's time, the sums 15% of the transformer
//! example's stage body). Here each row is one `scf.for` with the value as a loop-carried SSA
//! value; rows run in parallel like the loop nests of `emit.rs`.
//!
//! The maximum reads 16 lanes at a time and combines them at the end: a maximum does not
//! depend on the order (`maximumf` orders -0 below +0 and propagates NaN either way), so the
//! bits are those of the interpreter. The sum stays sequential, in the interpreter's order, so
//! it changes no bit either (`--exact` and the `exact` conformance rules hold as before); up to
//! 8 rows go through one loop, as independent add chains (1.05-1.12x against one row at a
//! time, BENCHMARKS.md).
//!
//! ```text
//! max over axis 1 of x: f32[r, n]  ──▶  scf.parallel (%i) = 0 to r {
//!                                           %v = scf.for %j = 0 to n step 16
//!                                                  iter_args(%a = -inf) -> vector<16xf32> {
//!                                             maximumf(%a, vector.load %x[%i, %j]) }
//!                                           memref.store (reduction <maximumf> %v), %acc[%i]
//!                                         }
//! ```

use super::buf::Buf;
use super::emit::{Emitter, MIN_PARALLEL_ELEMENTS};
use ppc_dialect::DType;

/// Lanes of the vector maximum: two AVX2 registers, one AVX-512 register.
const LANES: u64 = 16;

/// Whether [`emit`] computes `acc = reduce(x over axes)`: one f32 reduction along `x`'s last
/// axis, on the CPU (a GPU kernel is made from a generic).
pub fn applies(e: &Emitter, x: &Buf, axes: &[usize], acc: &Buf) -> bool {
    let r = x.ty.rank();
    e.gpu.is_none()
        && r >= 1
        && axes == [r - 1]
        && x.ty.dtype == DType::F32
        && acc.ty.dtype == DType::F32
}

/// `acc = max or sum of x along its last axis` (see [`applies`]).
pub fn emit(e: &mut Emitter, x: &Buf, acc: &Buf, max: bool) {
    let shape = x.ty.shape();
    let (rows, n) = shape.split_at(shape.len() - 1);
    let n = n[0];
    let (op, init) = if max {
        ("arith.maximumf", "0xFF800000")
    } else {
        ("arith.addf", "-0.0")
    };
    let vector = max && x.strides().last() == Some(&1) && n >= LANES;
    // Sequential sums are bound by the add's latency: `group` rows at once are as many
    // independent chains.
    let group = match rows.last() {
        Some(m) if !vector => [8, 4, 2].into_iter().find(|g| m % g == 0).unwrap_or(1),
        _ => 1,
    };
    let mut trips = rows.to_vec();
    if let Some(m) = trips.last_mut() {
        *m /= group;
    }
    let mut at = open_rows(e, &trips, x.ty.elements());
    let block = at.pop();
    let row_ats: Vec<Vec<String>> = (0..group)
        .map(|g| {
            let mut row = at.clone();
            if let Some(k) = &block {
                let (size, offset) = (e.index(group), e.index(g));
                let first = e.let_(&format!("arith.muli {k}, {size} : index"));
                row.push(e.let_(&format!("arith.addi {first}, {offset} : index")));
            }
            row
        })
        .collect();
    let mut values: Vec<String> = (0..group)
        .map(|_| e.let_(&format!("arith.constant {init} : f32")))
        .collect();
    let mut from = 0;
    if vector {
        from = n - n % LANES;
        values = vec![vector_max(e, x, &row_ats[0], from)];
    }
    if from < n {
        values = sequential(e, x, &row_ats, (from, n), op, &values);
    }
    for (row, value) in row_ats.iter().zip(&values) {
        e.op(&format!(
            "memref.store {value}, {}[{}] : {}",
            acc.name,
            row.join(", "),
            acc.mty()
        ));
    }
    close_rows(e, &trips, x.ty.elements());
}

/// The maximum of `x[row, 0..to]` (`to` a multiple of [`LANES`]), read [`LANES`] at a time.
fn vector_max(e: &mut Emitter, x: &Buf, row: &[String], to: u64) -> String {
    let lanes = format!("vector<{LANES}xf32>");
    let start = e.let_(&format!("arith.constant dense<0xFF800000> : {lanes}"));
    let (lo, hi, step) = (e.index(0), e.index(to), e.index(LANES));
    let (j, a, v) = (e.fresh(), e.fresh(), e.fresh());
    e.open(&format!(
        "{v} = scf.for {j} = {lo} to {hi} step {step} iter_args({a} = {start}) -> ({lanes}) {{"
    ));
    let at = element(row, &j);
    let loaded = e.let_(&format!(
        "vector.load {}[{at}] : {}, {lanes}",
        x.name,
        x.mty()
    ));
    let m = e.let_(&format!("arith.maximumf {a}, {loaded} : {lanes}"));
    e.op(&format!("scf.yield {m} : {lanes}"));
    e.close();
    e.let_(&format!(
        "vector.reduction <maximumf>, {v} : {lanes} into f32"
    ))
}

/// `op` over `x[row, from..to]` for each of `rows`, one element after the other from the
/// running values `starts`, in one loop.
fn sequential(
    e: &mut Emitter,
    x: &Buf,
    rows: &[Vec<String>],
    (from, to): (u64, u64),
    op: &str,
    starts: &[String],
) -> Vec<String> {
    let (lo, hi, step) = (e.index(from), e.index(to), e.index(1));
    let j = e.fresh();
    let carried: Vec<String> = starts.iter().map(|_| e.fresh()).collect();
    let result = e.fresh();
    let args: Vec<String> = carried
        .iter()
        .zip(starts)
        .map(|(a, s)| format!("{a} = {s}"))
        .collect();
    let types = vec!["f32"; rows.len()].join(", ");
    e.open(&format!(
        "{result}:{} = scf.for {j} = {lo} to {hi} step {step} iter_args({}) -> ({types}) {{",
        rows.len(),
        args.join(", ")
    ));
    let mut next = Vec::new();
    for (row, a) in rows.iter().zip(&carried) {
        let at = element(row, &j);
        let loaded = e.let_(&format!("memref.load {}[{at}] : {}", x.name, x.mty()));
        // The running value first, as the generic's body and the interpreter add.
        next.push(e.let_(&format!("{op} {a}, {loaded} : f32")));
    }
    e.op(&format!("scf.yield {} : {types}", next.join(", ")));
    e.close();
    (0..rows.len()).map(|i| format!("{result}#{i}")).collect()
}

/// Whether the rows run as one parallel loop (else nested sequential loops): as for a loop
/// nest of `emit.rs`, when the work is big enough and no parallel loop encloses it.
fn parallel(e: &Emitter, rows: &[u64], elements: u64) -> bool {
    !rows.is_empty() && !e.nest.in_parallel_loop() && elements >= MIN_PARALLEL_ELEMENTS
}

/// Opens the loops over the rows; returns their induction variables.
fn open_rows(e: &mut Emitter, rows: &[u64], elements: u64) -> Vec<String> {
    if !parallel(e, rows, elements) {
        return rows.iter().map(|&n| e.begin_for(n)).collect();
    }
    let lo: Vec<String> = rows.iter().map(|_| e.index(0)).collect();
    let hi: Vec<String> = rows.iter().map(|&n| e.index(n)).collect();
    let one: Vec<String> = rows.iter().map(|_| e.index(1)).collect();
    let ivs: Vec<String> = rows.iter().map(|_| e.fresh()).collect();
    e.open(&format!(
        "scf.parallel ({}) = ({}) to ({}) step ({}) {{",
        ivs.join(", "),
        lo.join(", "),
        hi.join(", "),
        one.join(", ")
    ));
    ivs
}

fn close_rows(e: &mut Emitter, rows: &[u64], elements: u64) {
    if !parallel(e, rows, elements) {
        for _ in rows {
            e.end_for();
        }
        return;
    }
    e.op("scf.reduce");
    e.close();
}

/// The indices of element `j` of a row: `%i, %k, %j`.
fn element(row: &[String], j: &str) -> String {
    row.iter()
        .map(String::as_str)
        .chain([j])
        .collect::<Vec<_>>()
        .join(", ")
}
