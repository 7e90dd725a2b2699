//! Loop-carried values updated in place: the op that computes a yielded value writes it
//! straight into the buffer the loop carries it in, instead of into a buffer of its own that
//! is then copied over the carried one at the end of every iteration (the GPipe loop's state
//! and output buffers, a stage's activations between its layers).
//!
//! That is safe when nothing reads the carried value after that op, and the op itself reads it,
//! if at all, element by element where it writes (an elementwise op over the same shape), or
//! it is an `update` of one slice of it (a gradient accumulator's): then only that slice is
//! written.
//!
//! A call (1F1B's recomputation, ZB-H1's `B` and its stash) writes a result into the carried
//! buffer on the same terms, reading no view of it; so does a select guarding an update
//! ([`guarded_updates`]): a pipeline loop writing a finished microbatch into its outputs, and
//! the backward zeroing that slot of their cotangent.
//!
//! [`overwritten`]: a carried value that each iteration `t` of `trips` only updates at a slice
//! of its own, `t` or `trips - 1 - t` (the training step's tapes of what the forward keeps for
//! the backward; a reverse loop's gradients of the microbatches' inputs and of a stage's
//! layers) never has its initial value read: it needs none, and the constant it starts from is
//! not written either ([`unread_inits`]).
//!
//! [`guarded_updates`]: `select(c, update(x, u, i), x)` on a scalar `c` (the GPipe loop writing
//! a finished microbatch into its output buffer) is a write of one slice under an `scf.if`,
//! not a copy of `x` and a select over all of it.

use super::{fuse, views};
use ppc_dialect::ir::{Block, Func, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, OpKind};
use std::collections::{HashMap, HashSet};

/// For a loop body, the yielded values that may be computed in place: value → position of the
/// carried value (block argument `1 + position`) whose buffer it is written into. `deferred`:
/// the body's values computed inside their consumers (`fuse::deferred`).
///
/// A guarded update placed so whose kept value is another guarded update of the same carried
/// value, read nowhere else, takes that one's place too, where it is safe: the backward's
/// zeroing of an output's cotangent slot, then the seed of the microbatch that left (ZB-H1's
/// tick), write the carried buffer in turn, where the first wrote a buffer of its own that the
/// second copied back (a whole `[microbatches, b, d]` copy each way, every tick).
pub fn plan(f: &Func, body: &Block, deferred: &HashSet<ValueId>) -> HashMap<ValueId, usize> {
    let guarded = guarded_updates(f, body);
    let mut placed = HashMap::new();
    for (j, &y) in body.results.iter().enumerate() {
        let arg = body.args[1 + j];
        if body.results.iter().filter(|&&r| r == y).count() != 1 || !safe(f, body, deferred, arg, y)
        {
            continue;
        }
        placed.insert(y, j);
        let mut at = y;
        while let Some(kept) = kept_guarded_update(f, body, &guarded, at) {
            if kept == arg || !safe(f, body, deferred, arg, kept) {
                break;
            }
            placed.insert(kept, j);
            at = kept;
        }
    }
    placed
}

/// The value the guarded update computing `v` keeps (`select(c, update(x, u, i), x)`: `x`),
/// where `x` is itself a guarded update's of `body` that only this one reads.
fn kept_guarded_update(
    f: &Func,
    body: &Block,
    guarded: &HashMap<OpId, OpId>,
    v: ValueId,
) -> Option<ValueId> {
    let select = fuse::producer(f, body, v).filter(|id| guarded.contains_key(id))?;
    let OpKind::Select { on_false, .. } = f.ops[select].kind else {
        unreachable!("invariant: guarded_updates holds selects")
    };
    let kept_by = fuse::producer(f, body, on_false).filter(|id| guarded.contains_key(id))?;
    // Read by the select and the update it guards, nothing else.
    (f.uses(body, on_false) == 2 && kept_by != select).then_some(on_false)
}

/// Whether the op computing `y` may write into the buffer of the carried value `arg`.
fn safe(f: &Func, body: &Block, deferred: &HashSet<ValueId>, arg: ValueId, y: ValueId) -> bool {
    let Some(pos) = body
        .ops
        .iter()
        .position(|&id| f.ops[id].results.contains(&y))
    else {
        return false; // a block argument or a value from outside
    };
    let kind = &f.ops[body.ops[pos]].kind;
    // Reads after it, the yields included (a carried value passed through unchanged).
    let mut later: HashSet<ValueId> = body.results.iter().copied().collect();
    for &id in &body.ops[pos + 1..] {
        later.extend(f.ops[id].kind.operands());
        if let OpKind::Loop { body: inner, .. } = &f.ops[id].kind {
            fuse::used_in(f, inner, &mut later);
        }
    }
    // A deferred value is computed where it is read: what it reads is read there too. So is a
    // matmul's, which a `reduce_sum` of it may compute as one GEMM (`summed_matmul.rs`).
    let mut pending: Vec<ValueId> = later.iter().copied().collect();
    while let Some(v) = pending.pop() {
        let computed_there =
            |id: &OpId| deferred.contains(&v) || matches!(f.ops[*id].kind, OpKind::MatMul { .. });
        if let Some(id) = fuse::producer(f, body, v).filter(computed_there) {
            let reads = f.ops[id].kind.operands();
            pending.extend(reads.iter().copied().filter(|&o| later.insert(o)));
        }
    }
    // An update of one slice of `arg` (an accumulator's) writes just that slice, if neither
    // `arg` nor a view of it is read afterwards.
    if let OpKind::Update { x, index, .. } = kind {
        return *x == arg
            && views::uniform(f, *index, false).is_some()
            && aliases(f, body, arg).iter().all(|v| !later.contains(v));
    }
    // A select guarding an update of one slice (`guarded_updates`) copies the value it keeps
    // into its buffer, then writes the slice if its condition holds: into `arg`'s, if neither
    // `arg` nor a view of it is read afterwards, what it keeps is `arg` or no view of it, and
    // what it writes is no view of it (which the copy would have overwritten).
    if let OpKind::Select { on_false, .. } = kind {
        if let Some(&update) = guarded_updates(f, body).get(&body.ops[pos]) {
            let OpKind::Update {
                update: written, ..
            } = &f.ops[update].kind
            else {
                unreachable!("invariant: guarded_updates pairs selects with updates")
            };
            let views = aliases(f, body, arg);
            return (*on_false == arg || !views.contains(on_false))
                && !views.contains(written)
                && views.iter().all(|v| !later.contains(v));
        }
    }
    // A call computes its results into the buffers it is given (1F1B's recomputed residuals,
    // ZB-H1's stash for `W`): into `arg`'s if it reads no view of `arg`, which nothing reads
    // afterwards.
    if let OpKind::Call { args, .. } = kind {
        let views = aliases(f, body, arg);
        return args.iter().all(|a| !views.contains(a)) && views.iter().all(|v| !later.contains(v));
    }
    if !kind.is_elementwise() && !matches!(kind, OpKind::Shift { .. }) {
        return false;
    }
    // Views of `arg` would read it under another name.
    let viewed = body.ops.iter().any(|&id| {
        matches!(&f.ops[id].kind, OpKind::Reshape { x } | OpKind::Index { x, .. } | OpKind::Transpose { x, .. } if *x == arg)
    });
    // What the op reads, with the deferred values it computes in the same loop nest.
    let mut reads = HashSet::new();
    let mut pending = kind.operands();
    while let Some(v) = pending.pop() {
        if reads.insert(v) && deferred.contains(&v) {
            if let Some(id) = fuse::producer(f, body, v) {
                pending.extend(f.ops[id].kind.operands());
            }
        }
    }
    let same_shape = f.ty(arg).shape() == f.ty(y).shape();
    let own_reads_ok = !reads.contains(&arg) || (kind.is_elementwise() && same_shape);
    !viewed && own_reads_ok && !later.contains(&arg)
}

/// `arg` and the views of it in `body` (reshapes, transposes, indexes, of it or of its views).
pub(super) fn aliases(f: &Func, body: &Block, arg: ValueId) -> HashSet<ValueId> {
    let mut out = HashSet::from([arg]);
    for &id in &body.ops {
        let op = &f.ops[id];
        if let OpKind::Reshape { x } | OpKind::Index { x, .. } | OpKind::Transpose { x, .. } =
            &op.kind
        {
            if out.contains(x) {
                out.insert(op.results[0]);
            }
        }
    }
    out
}

/// The positions of the carried values of loop body `body` (of `trips` iterations) that
/// iteration `t` only writes, at a slice of its own along an axis of `trips` slices, so that
/// the loop covers it: the body's only read of one is `update(arg, v, i, axis)`, yielded and
/// read by nothing else, where `i` is `%t` or `trips - 1 - %t` (a reverse loop's, the
/// weight gradients of a stage's layers), or either broadcast over the stages.
pub fn overwritten(f: &Func, body: &Block, trips: u64) -> HashSet<usize> {
    (0..body.args.len() - 1)
        .filter(|&j| {
            let arg = body.args[1 + j];
            let ty = f.ty(arg);
            let y = body.results[j];
            let Some(id) = fuse::producer(f, body, y) else {
                return false;
            };
            let OpKind::Update { x, index, axis, .. } = f.ops[id].kind else {
                return false;
            };
            x == arg
                && own_slice(f, body, index, trips)
                && ty.rank() > axis
                && ty.dims[axis].size == trips
                && f.uses(body, arg) == 1
                && f.uses(body, y) == 1
        })
        .collect()
}

/// Whether `index` picks a slice of its own in each iteration of loop body `body`: the
/// counter `%t`, `trips - 1 - %t`, or either broadcast.
fn own_slice(f: &Func, body: &Block, index: ValueId, trips: u64) -> bool {
    let counter = body.args[0];
    let defined = |v| fuse::producer(f, body, v).map(|id| &f.ops[id].kind);
    let is_last =
        |v| matches!(defined(v), Some(OpKind::Constant { value }) if value.0 == (trips - 1) as f64);
    let per_trip = |v: ValueId| {
        v == counter
            || matches!(defined(v), Some(&OpKind::Binary { op: BinaryOp::Sub, lhs, rhs })
                if rhs == counter && is_last(lhs))
    };
    per_trip(index) || matches!(defined(index), Some(&OpKind::Broadcast { x }) if per_trip(x))
}

/// The constants of `block` read only as the initial value of a loop's carried value that the
/// loop overwrites before reading ([`overwritten`]): they need a buffer, not its contents.
pub fn unread_inits(f: &Func, block: &Block) -> HashSet<ValueId> {
    let mut out = HashSet::new();
    for &id in &block.ops {
        let OpKind::Loop { inits, trips, body } = &f.ops[id].kind else {
            continue;
        };
        for j in overwritten(f, body, *trips) {
            let v = inits[j];
            let constant = fuse::producer(f, block, v)
                .is_some_and(|p| matches!(f.ops[p].kind, OpKind::Constant { .. }));
            if constant && f.uses(block, v) == 1 {
                out.insert(v);
            }
        }
    }
    out
}

/// The selects of `block` that only guard an `update` (see the module docs): select → update.
/// The update (of one slice, at the same position for every stage) has no other use.
pub fn guarded_updates(f: &Func, block: &Block) -> HashMap<OpId, OpId> {
    let producer: HashMap<ValueId, OpId> = block
        .ops
        .iter()
        .map(|&id| (f.ops[id].results[0], id))
        .collect();
    let mut out = HashMap::new();
    for &id in &block.ops {
        let OpKind::Select {
            cond,
            on_true,
            on_false,
        } = &f.ops[id].kind
        else {
            continue;
        };
        let Some(&u) = producer.get(on_true) else {
            continue;
        };
        if let OpKind::Update { x, index, .. } = &f.ops[u].kind {
            if x == on_false
                && f.ty(*cond).rank() == 0
                && views::uniform(f, *index, false).is_some()
                && f.uses(block, *on_true) == 1
            {
                out.insert(id, u);
            }
        }
    }
    out
}
