//! What a training program keeps for its backwards, read off the program by
//! [`crate::schedule_check`]: in each tick, per stage, the microbatches whose stage input a
//! tape or ring holds for a backward that has not run before the tick (the one that runs in it
//! counts: its input is live until then). The report puts the maximum beside the formula each
//! schedule promises (GPipe `M`, 1F1B `S-s`). Stage 0 reads its inputs from
//! the step's own input, so no tape holds them. The residuals 1F1B recomputes a tick before
//! their backward (`names::RECOMPUTED`) are that backward's working set, held one tick, not a
//! kept input: the report counts their bytes with what the step keeps.

use crate::ir::{names, Func};
use crate::provenance::{slot, stage_axis, Abs, Tag, TagSets};
use std::collections::BTreeSet;

/// Per stage slot of one rank, the microbatches held in values that keep several ticks' stage
/// inputs (a stage axis after a leading slot axis: GPipe's tapes, 1F1B's ring) whose backward
/// is not `done`.
pub fn held(
    f: &Func,
    env: &[Option<Abs>],
    sets: &TagSets,
    done: impl Fn(&Tag) -> bool,
) -> Vec<usize> {
    let mut held: Vec<BTreeSet<Tag>> = Vec::new();
    for (id, v) in f.values.iter() {
        let Some(Abs::Tags(t)) = &env[id.index()] else {
            continue;
        };
        if names::is_recomputed(&v.name) {
            continue;
        }
        let Some(axis) = stage_axis(&v.ty).filter(|&a| a > 0) else {
            continue;
        };
        let per_rank = t.shape[axis];
        held.resize(held.len().max(per_rank), BTreeSet::new());
        for (s, kept) in held.iter_mut().enumerate().take(per_rank) {
            for o in slot(&t.shape, axis, s) {
                kept.extend(sets.get(t.data[o] as u32).iter().filter(|t| !done(t)));
            }
        }
    }
    held.iter().map(BTreeSet::len).collect()
}
