//! Where the code being written is: the loops around it, which decide where a buffer is
//! allocated (once, per stage of a stage-parallel loop, per thread of a loop over a chain's
//! entries) and what part of a value the code sees (a stage's slice, an entry). The emitter
//! keeps one and updates it as it opens and closes loops (`emit_loops.rs`).

use super::buf::{Buf, BufId};
use ppc_dialect::Type;
use std::collections::HashMap;

/// The loops around the code being written.
#[derive(Default)]
pub(super) struct Nest {
    /// How many `scf.for`s enclose what is written now.
    pub(super) loops: usize,
    /// The stack pointers saved by the host loops being written (`--target cuda`).
    pub(super) saved_stacks: Vec<String>,
    /// The loop over a call's stages being written (`stage_split.rs`), if any.
    pub(super) split: Option<Split>,
    /// The loop over a batched chain's entries being written (`batch_split.rs`), if any.
    pub(super) entries: Option<Entries>,
    /// Where the body of the innermost round-robin parallel loop begins (per-thread buffers
    /// are allocated there): the line and its indentation.
    pub(super) thread_body: (usize, usize),
    /// The pipeline loop being written whose buffers are its own (`Emitter::begin_loop_buffers`).
    pub(super) loop_buffers: Option<LoopBuffers>,
    /// The pools of buffers around it: the training step's, around its pipeline loops.
    pub(super) outer_buffers: Vec<LoopBuffers>,
}

/// The buffers of one of the entry's pipeline loops: allocated right before the loop (the line
/// and indentation where they go) and freed right after it, so that the next loop reuses
/// their memory (the training step's backward loop that of the forward's). The training step's
/// own values outside its loops (the head, the loss, their backward) have a pool of the same
/// kind around the whole step, so that a value dead before the next one is made gives it its
/// buffer.
pub(super) struct LoopBuffers {
    pub(super) at: usize,
    pub(super) indent: usize,
    pub(super) frees: Vec<String>,
    /// Its allocations, by id, and those given back for reuse (`reuse.rs`), by memref type.
    pub(super) made: HashMap<BufId, Buf>,
    pub(super) free: HashMap<String, Vec<Buf>>,
}

/// A loop over a call's stages (`stage_split.rs`): its stage count, induction variable and
/// whether its stages run in parallel or in turn; where the active stages are dealt out
/// ([`Emitter::begin_stage_split`]), the count of active stages its loop carries to the next.
///
/// [`Emitter::begin_stage_split`]: super::emit::Emitter::begin_stage_split
pub(super) struct Split {
    pub(super) stages: u64,
    pub(super) iv: String,
    pub(super) parallel: bool,
    pub(super) active_seen: Option<String>,
}

/// The loop over a batched chain's entries being written (`batch_split.rs`).
pub(super) struct Entries {
    /// The sizes of the leading axes it runs over.
    pub(super) prefix: Vec<u64>,
    /// An entry's size along each of them.
    pub(super) tile: Vec<u64>,
    /// Deallocations of the per-thread buffers, where the thread's part of the loop ends.
    pub(super) frees: Vec<String>,
}

/// Whether `ty`'s leading axes are `prefix` (each of that size, or 1 for a broadcast one).
pub(super) fn has_prefix(ty: &Type, prefix: &[u64]) -> bool {
    ty.rank() >= prefix.len()
        && ty.dims[..prefix.len()]
            .iter()
            .zip(prefix)
            .all(|(d, &p)| d.size == p || d.size == 1)
}

impl Nest {
    /// Inside a loop over entries: the type of one entry of `ty` (its leading axes of the
    /// entry's sizes, or 1 where `ty` broadcasts) when `ty` has the entries' axes in front; `ty`
    /// itself otherwise.
    pub(super) fn entry_type(&self, ty: &Type) -> Type {
        match &self.entries {
            Some(entries) if has_prefix(ty, &entries.prefix) => {
                let mut t = ty.clone();
                for (d, &size) in t.dims.iter_mut().zip(&entries.tile) {
                    d.size = d.size.min(size);
                }
                t
            }
            _ => ty.clone(),
        }
    }

    /// True while a loop over a chain's entries is open.
    pub(super) fn in_entries(&self) -> bool {
        self.entries.is_some()
    }

    /// True while a loop whose iterations run in parallel is open: loop nests inside it stay
    /// sequential (no nested teams).
    pub(super) fn in_parallel_loop(&self) -> bool {
        self.split.as_ref().is_some_and(|s| s.parallel) || self.entries.is_some()
    }

    /// True while a loop over a call's stages is open.
    pub(super) fn in_stage_split(&self) -> bool {
        self.split.is_some()
    }
}
