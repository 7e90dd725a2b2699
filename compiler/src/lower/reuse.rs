//! Buffers shared by values whose lives do not overlap, inside a training step's pipeline loops
//! and, with a pool of its own around them, in the step outside its loops (its head, loss and
//! their backward: `entry.rs`; `Emitter::share_buffers` says why not elsewhere): after the last
//! step of a block that reads a value, the buffer the loop allocated for it goes back to the
//! loop's pool (`Emitter::release`), and a later value of the same memref type takes it
//! instead of a new allocation. A training step's backward loop keeps gigabytes of
//! temporaries at d = 1024 (attention's `[stages, b, heads, t, t]` values, the weight
//! gradients' partial sums), most of them dead long before the loop body ends.
//!
//! A buffer is given back only when nothing can still read it:
//! - the value was computed by an op of this block, and every step that reads it (directly, in
//!   a loop body inside an op, or through a value computed inside its consumer's loop nest)
//!   is written; the block's results are read at its end;
//! - no other value bound to the same allocation (a view of it, an elementwise result written
//!   over it) may still be read: values of this block read later, and every value of other
//!   blocks, count as read;
//! - the allocation was made while this block was being written, by the loop's pool (not a
//!   caller's buffer, a carried one, or an argument);
//! - no loop over a chain's batch entries is open: its threads run the chain's steps entry by
//!   entry, each at its own pace, so a value is live until the chain's loop ends.

use super::batch_split::Step;
use super::buf::{Buf, BufId};
use super::plan::{BlockPlan, Decision};
use super::walk::Walker;
use ppc_dialect::ir::{Block, Func, ValueId};
use std::collections::{HashMap, HashSet};

/// For each value an op of `block` computes: the index of the last step of `plan` that reads
/// it (`usize::MAX` for the block's results).
pub(super) fn last_reads(f: &Func, block: &Block, plan: &BlockPlan) -> HashMap<ValueId, usize> {
    let mut last: HashMap<ValueId, usize> = HashMap::new();
    for &r in &block.results {
        last.insert(r, usize::MAX);
    }
    for (k, step) in plan.steps.iter().enumerate().rev() {
        let Step::Op(id) = *step else { continue };
        let op = &f.ops[id];
        // An op computed inside its consumer's loop nest reads its operands there, as does an
        // `index` a split call reads a stage's slot of (and its transpose), in its loop over the
        // stages.
        let at = match plan.decisions.get(&id) {
            Some(Decision::Skip | Decision::AtStageSlot) => (op.results.iter())
                .filter_map(|r| last.get(r).copied())
                .max()
                .unwrap_or(k)
                .max(k),
            _ => k,
        };
        for &r in &op.results {
            last.entry(r).or_insert(k);
        }
        let mut reads = HashSet::new();
        super::fuse::used_in_op(f, &op.kind, &mut reads);
        for v in reads {
            let e = last.entry(v).or_insert(at);
            *e = (*e).max(at);
        }
    }
    last
}

/// The values of a block whose buffers may go back to the pool, as its steps are written.
pub(super) struct Lives {
    last: HashMap<ValueId, usize>,
    /// Values computed by the block's ops, not yet given back (or found shared), in the order
    /// their last reads come.
    pending: Vec<(usize, ValueId)>,
    /// The first allocation made while the block was being written.
    first: BufId,
}

impl Lives {
    fn new(f: &Func, block: &Block, plan: &BlockPlan, first: BufId) -> Lives {
        let last = last_reads(f, block, plan);
        let computed: HashSet<ValueId> = (block.ops.iter())
            .flat_map(|&id| f.ops[id].results.iter().copied())
            .collect();
        let mut pending: Vec<(usize, ValueId)> = (last.iter())
            .filter(|(v, &k)| computed.contains(v) && k != usize::MAX)
            .map(|(&v, &k)| (k, v))
            .collect();
        pending.sort_by_key(|&(k, v)| (std::cmp::Reverse(k), v));
        Lives {
            last,
            pending,
            first,
        }
    }

    /// Whether `w` may still be read after step `k`.
    fn live(&self, w: ValueId, k: usize) -> bool {
        self.last.get(&w).is_none_or(|&l| l > k)
    }
}

impl Walker<'_, '_> {
    /// The lives of `block`'s values, before its first step is written.
    pub(super) fn lives(&self, f: &Func, block: &Block, plan: &BlockPlan) -> Lives {
        Lives::new(f, block, plan, self.e.next_buffer())
    }

    /// After step `k` of a block (and no chain's loop open): gives back the buffers of the
    /// values last read there or before, where nothing else can read them.
    pub(super) fn give_back(&mut self, lives: &mut Lives, env: &HashMap<ValueId, Buf>, k: usize) {
        while let Some(&(at, v)) = lives.pending.last() {
            if at > k {
                break;
            }
            lives.pending.pop();
            let Some(b) = env.get(&v) else { continue };
            let base = b.base;
            if base.0 < lives.first.0 {
                continue;
            }
            let shared = env
                .iter()
                .any(|(&w, o)| w != v && o.base == base && lives.live(w, k));
            if !shared {
                self.e.release(base);
            }
        }
    }
}
