//! Where a block's values go when what they become goes into a buffer given from outside that
//! nothing else reads (the entry's results into its arguments): back through the ops that
//! compute in place what they read last, each value is computed in that buffer too. A
//! training step's weight gradient is a fill of zeros, carried through the backward loop, and
//! (ZB-H1) added into by the last weight-gradient GEMM after it; each of the three went into
//! a buffer of its own and was copied into the next, and the last into the argument: three
//! whole-gradient copies a step. Now there are none: `ppc compile examples/mlp.ppc --train
//! --schedule zb-h1 --emit=mlir` shows each gradient filled, carried and added into in its
//! argument (the lowering case `destinations/the_output_is_written_in_its_argument.ppc`).
//!
//! Only a buffer no value of the block is bound to yet: a loop's carried buffer or a caller's
//! argument may still be read (a loop body's carried argument, a stage's input) where the
//! value that goes there would be written.

use super::buf::Buf;
use super::fuse;
use super::plan::BlockPlan;
use ppc_dialect::ir::{Block, Func, OpId, ValueId};
use ppc_dialect::op::OpKind;
use std::collections::{HashMap, HashSet};

/// Whether loop `id` may start carried value `j` in its init's buffer: the init is computed
/// by an op of `block` and read by the loop alone, once, and not inside its body.
pub(super) fn loop_takes_init(
    f: &Func,
    block: &Block,
    plan: &BlockPlan,
    id: OpId,
    j: usize,
) -> bool {
    let OpKind::Loop { inits, body, .. } = &f.ops[id].kind else {
        return false;
    };
    let v = inits[j];
    let mut captured = HashSet::new();
    fuse::used_in(f, body, &mut captured);
    made_in(f, block, v)
        && plan.sole_readers.get(&v) == Some(&id)
        && !captured.contains(&v)
        && !inits[..j].contains(&v)
}

/// The values of `block` to compute in the buffers of `into` (that no value in `env` is bound
/// to) beyond `into`'s own: a loop's init where the loop's result goes there, and the
/// accumulator a call's GEMM or stages add into where the sum goes there.
pub(super) fn of(
    f: &Func,
    block: &Block,
    plan: &BlockPlan,
    into: &HashMap<ValueId, Buf>,
    env: &HashMap<ValueId, Buf>,
) -> HashMap<ValueId, Buf> {
    let bound: HashSet<_> = env.values().map(|b| b.base).collect();
    let mut dest: HashMap<ValueId, Buf> = (into.iter())
        .filter(|(_, b)| !bound.contains(&b.base))
        .map(|(&v, b)| (v, b.clone()))
        .collect();
    if dest.is_empty() {
        return dest;
    }
    let accumulations = (plan.gemm_accumulations.iter()).chain(&plan.stage_accumulations);
    let by_add: HashMap<OpId, ValueId> = accumulations.map(|a| (a.add, a.acc)).collect();
    for &id in block.ops.iter().rev() {
        let op = &f.ops[id];
        let mut before: Vec<(ValueId, Buf)> = Vec::new();
        if let OpKind::Loop { inits, .. } = &op.kind {
            for (j, r) in op.results.iter().enumerate() {
                if let Some(d) = dest
                    .get(r)
                    .filter(|_| loop_takes_init(f, block, plan, id, j))
                {
                    before.push((inits[j], d.clone()));
                }
            }
        }
        if let (Some(&acc), Some(d)) = (by_add.get(&id), dest.get(&op.results[0])) {
            let same_type = f.ty(acc).same_as(f.ty(op.results[0]));
            if same_type && made_in(f, block, acc) && plan.sole_readers.get(&acc) == Some(&id) {
                before.push((acc, d.clone()));
            }
        }
        for (v, d) in before {
            dest.entry(v).or_insert(d);
        }
    }
    dest
}

/// Whether an op of `block` computes `v` (a loop's results included).
fn made_in(f: &Func, block: &Block, v: ValueId) -> bool {
    (block.ops.iter()).any(|&id| f.ops[id].results.contains(&v))
}
