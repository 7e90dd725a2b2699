//! What the lowering decides for one block, as a value computed before anything is written.
//! The analyses run once each, in order, each taking what it needs as arguments: which selects
//! guard an update (`in_place.rs`), which values fuse into their consumer (`fuse.rs`), which
//! adds fold into the call before them (`accumulate.rs`), which ops run as one loop over batch
//! entries (`batch_split.rs`), which sums of a matmul's batch are one GEMM
//! (`summed_matmul.rs`); then each op gets one [`Decision`]. `walk.rs` writes the plan
//! out with one arm per decision.
//!
//! ```text
//! %s = select %c, %u, %x      ──▶  Decision::GuardedUpdate { update: %u's op, .. }
//! %u = update %x, %y, %k          Decision::Skip (written by the select)
//! %h = mul %a, %b             ──▶  Decision::Skip (deferred: fused into its reader)
//! %g = gelu %h                     Decision::Elementwise
//! ```

use super::accumulate::{self, Accumulation, Fold};
use super::batch_split::{self, Chain, Step};
use super::fast_math::Numerics;
use super::stage_split::{self, StageLoop};
use super::{fuse, in_place, summed_matmul, views};
use ppc_dialect::ir::{Block, Func, Module, OpId, ValueId};
use ppc_dialect::op::OpKind;
use std::collections::{HashMap, HashSet};

/// Where the block is written, as far as the decisions depend on it.
pub struct Context {
    pub numerics: Numerics,
    /// `--target cuda`: loop nests become kernels.
    pub gpu: bool,
    /// Inside a loop the threads already share (a stage-parallel call, a chain's entries).
    pub in_parallel_loop: bool,
    /// Values computed into a buffer given from outside: a loop's carried buffer
    /// (`in_place.rs`) or an accumulator the caller adds into.
    pub carried: HashSet<ValueId>,
    /// Among them, those the caller adds into (`accumulate.rs`).
    pub accumulated: HashSet<ValueId>,
    /// Inside a call split into stages: a value with the stage axis is one stage's slice.
    pub in_stage_split: bool,
    /// Masks known to hold only `true` where the block runs (`Walker::func_into`).
    pub true_masks: HashSet<ValueId>,
    /// Values the caller adds into an accumulator slice by slice (`accumulate::summed_by_slices`):
    /// the selects and transposes it is read through, and the loop's carried value or the
    /// update that writes the slices.
    pub summed: HashSet<ValueId>,
}

/// The analyses a loop body needs before its carried values are placed (`in_place::plan`).
pub struct Fusion {
    /// Selects that only guard an update: select → update.
    pub guarded: HashMap<OpId, OpId>,
    /// Values with no buffer: computed inside their consumer's loop nest.
    pub deferred: HashSet<ValueId>,
}

impl Fusion {
    pub fn of(f: &Func, block: &Block) -> Fusion {
        let guarded = in_place::guarded_updates(f, block);
        let deferred = fuse::deferred(f, block, &guarded);
        Fusion { guarded, deferred }
    }
}

/// How one op is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Nothing: computed inside its consumer's loop nest, or written by the select it feeds.
    Skip,
    /// A view of its operand (a reshape; a transpose the GEMM reads through strides).
    View,
    /// `update` at the same position for every stage: a copy into a view of the slice.
    UpdateSlice {
        scalar: ValueId,
    },
    /// `select(c, update(x, u, i), x)`: `x` with slice `i` written if `c`.
    GuardedUpdate {
        update: OpId,
        scalar: ValueId,
    },
    /// `index` at the same position for every stage: a view, no copy.
    IndexView {
        scalar: ValueId,
    },
    /// `index` at a position per stage (`[stages, slots, ...]` at `[stages]`: a stage reading
    /// its ring slot) that only a call split into stages reads, directly or through a
    /// transpose that moves the stage axis back (the stage axis after a layer axis): in the
    /// call's loop, each stage's slot as a view, no copy of all of them before it
    /// (`Walker::call`). The transpose gets this decision too.
    AtStageSlot,
    /// A call, inlined; `stages`: as one loop over the callee's stages.
    Call {
        stages: Option<StageLoop>,
    },
    /// `select %c, %x, %y` where `%c` holds only `true` and nothing else reads `%x`: `%x`'s
    /// buffer, no loop nest (a stage function's masking of its results, inside a call that
    /// runs only for an active stage).
    Alias {
        of: ValueId,
    },
    /// A select or transpose of what the caller adds into its accumulator slice by slice
    /// (`accumulate::summed_by_slices`): that accumulator, once the slices are added.
    Summed,
    /// A matmul that adds into the accumulator its caller gave.
    MatMulInto,
    /// A matmul that only `update` reads, writing it into the slice of the carried value that
    /// the update writes in place: computed there, and the update copies nothing (a layer's
    /// weight gradient in a stage backward's layer loop). `walk.rs` falls back to a buffer of
    /// its own where the update turns out not to be in place.
    MatMulIntoSlice {
        update: OpId,
    },
    /// An elementwise op that only `update` reads, computed in the slice the update writes in
    /// place, as [`Decision::MatMulIntoSlice`] is: a stage keeping its stash entry where it is
    /// idle (`select(active, new, index(ring, k))` then `update(ring, ·, k)`) reads and writes
    /// the slice once, with no buffer of its own and no copy.
    ElementwiseIntoSlice {
        update: OpId,
    },
    /// A `reduce_sum` of a matmul's batch axes: one GEMM summing over them too
    /// (`summed_matmul.rs`; the matmul is skipped).
    SummedMatMul {
        matmul: OpId,
    },
    /// A constant only a loop's overwritten carried value starts from: a buffer, no fill.
    Unfilled,
    Loop,
    /// An elementwise op: one loop nest, fusing the deferred values it reads.
    Elementwise,
    /// Any other op, by `ops.rs`.
    Compute,
}

/// Every decision for one block.
pub struct BlockPlan {
    pub fusion: Fusion,
    /// Adds a GEMM does (fast numerics: another order of sums) and adds a stage-parallel call
    /// does where each stage ends (the same sums); the call decides which it can take.
    pub gemm_accumulations: Vec<Accumulation>,
    pub stage_accumulations: Vec<Accumulation>,
    pub chains: Vec<Chain>,
    /// The order ops are written in, with each chain's loop around its ops.
    pub steps: Vec<Step>,
    /// For each value read once in this block, the op that reads it (elementwise ops may write
    /// over such a buffer; none on the GPU).
    pub sole_readers: HashMap<ValueId, OpId>,
    /// Values computed in the slot of a loop's carried value that an in-place `update` writes
    /// them into, with that update ([`slot_writers`]; those a [`Decision::MatMulIntoSlice`]
    /// or [`Decision::ElementwiseIntoSlice`] computes there are not listed).
    pub in_slots: Vec<(ValueId, OpId)>,
    pub decisions: HashMap<OpId, Decision>,
}

impl BlockPlan {
    pub fn new(m: &Module, f: &Func, block: &Block, fusion: Fusion, cx: &Context) -> BlockPlan {
        let deferred = &fusion.deferred;
        let gemm_accumulations = match cx.numerics {
            Numerics::Fast => accumulate::find(m, f, block, deferred, Fold::Gemm),
            Numerics::Exact => Vec::new(),
        };
        let stage_accumulations = accumulate::find(m, f, block, deferred, Fold::StageEnd);
        let unread = in_place::unread_inits(f, block);
        let chains = if cx.numerics == Numerics::Fast && !cx.gpu && !cx.in_parallel_loop {
            let guarded = &fusion.guarded;
            let summed = (block.ops.iter().copied())
                .filter(|&id| f.ops[id].results.iter().any(|r| cx.summed.contains(r)));
            let excluded = (guarded.keys().chain(guarded.values()).copied())
                .chain(summed)
                .collect();
            batch_split::find(f, block, deferred, &excluded, &cx.carried)
        } else {
            Vec::new()
        };
        let strided = batch_split::matmul_operands(f, block, &chains);
        let sole_readers = match cx.gpu {
            false => fuse::sole_readers(f, block, deferred),
            true => HashMap::new(),
        };
        let in_chains: HashSet<OpId> = chains.iter().flat_map(|c| c.ops.iter().copied()).collect();
        let summed = match (cx.numerics, cx.gpu) {
            (Numerics::Fast, false) => {
                summed_matmul::find(f, block, &sole_readers, &in_chains, &cx.carried)
            }
            _ => HashMap::new(),
        };
        let summing: HashSet<OpId> = summed.values().copied().collect();
        // The `-0.0`s an update summed slice by slice writes its slice over: never read.
        let summed_over: HashSet<ValueId> = (block.ops.iter().map(|&id| &f.ops[id]))
            .filter(|op| op.results.iter().any(|r| cx.summed.contains(r)))
            .filter_map(|op| match op.kind {
                OpKind::Update { x, .. } => Some(x),
                _ => None,
            })
            .collect();
        let guarded_updates: HashSet<OpId> = fusion.guarded.values().copied().collect();
        let split = cx.in_stage_split;
        // How a call runs over its callee's stages, if it does (`None` for any other op).
        let call_stages = |id: OpId| {
            let op = &f.ops[id];
            let OpKind::Call { callee, on, .. } = &op.kind else {
                return None;
            };
            let gemm_adds = gemm_accumulations.iter().any(|a| a.call == id);
            match (cx.gpu, cx.in_parallel_loop || gemm_adds, on) {
                (false, false, None) => {
                    let read = stage_split::results_read(f, op);
                    stage_split::stage_loop(m, &m.funcs[*callee], &read)
                }
                _ => None,
            }
        };
        // Read only by a call split into stages.
        let split_call =
            |v: ValueId| (sole_readers.get(&v)).is_some_and(|&call| call_stages(call).is_some());
        // An `index` at a slot per stage a split call reads, directly or through a transpose
        // moving the stage axis; or that transpose.
        let per_stage = |id: OpId| per_stage_index(f, &f.ops[id], split);
        let at_stage_slot = |id: OpId| {
            let (op, result) = (&f.ops[id], f.ops[id].results[0]);
            match &op.kind {
                OpKind::Index { .. } => {
                    per_stage(id)
                        && (split_call(result)
                            || (sole_readers.get(&result)).is_some_and(|&t| {
                                moves_stage_axis(f, t) && split_call(f.ops[t].results[0])
                            }))
                }
                OpKind::Transpose { x, .. } => {
                    moves_stage_axis(f, id)
                        && split_call(result)
                        && sole_readers.get(x) == Some(&id)
                        && fuse::producer(f, block, *x).is_some_and(per_stage)
                }
                _ => false,
            }
        };
        let decide = |id: OpId| {
            let op = &f.ops[id];
            if op.results.first().is_some_and(|v| deferred.contains(v))
                || guarded_updates.contains(&id)
                || summing.contains(&id)
            {
                return Decision::Skip;
            }
            if let Some(&matmul) = summed.get(&id) {
                return Decision::SummedMatMul { matmul };
            }
            match &op.kind {
                _ if at_stage_slot(id) => Decision::AtStageSlot,
                OpKind::Select { .. } | OpKind::Transpose { .. }
                    if cx.summed.contains(&op.results[0]) =>
                {
                    Decision::Summed
                }
                OpKind::Reshape { .. } => Decision::View,
                OpKind::Transpose { perm, .. }
                    if views::swaps_last_two(perm)
                        || strided.contains(&op.results[0])
                        || only_indexed(f, block, op.results[0]) =>
                {
                    Decision::View
                }
                OpKind::Update { index, .. } => match views::uniform(f, *index, split) {
                    Some(scalar) => Decision::UpdateSlice { scalar },
                    None => Decision::Compute,
                },
                OpKind::Select { .. } if fusion.guarded.contains_key(&id) => {
                    let update = fusion.guarded[&id];
                    let OpKind::Update { index, .. } = &f.ops[update].kind else {
                        unreachable!("invariant: guarded_updates pairs selects with updates")
                    };
                    let scalar =
                        views::uniform(f, *index, false).expect("checked by guarded_updates");
                    Decision::GuardedUpdate { update, scalar }
                }
                OpKind::Select { cond, on_true, .. }
                    if cx.true_masks.contains(cond)
                        && !cx.gpu
                        && !deferred.contains(on_true)
                        && sole_readers.get(on_true) == Some(&id)
                        && !cx.carried.contains(&op.results[0])
                        && !in_chains.contains(&id) =>
                {
                    Decision::Alias { of: *on_true }
                }
                OpKind::Index { index, .. } => match views::uniform(f, *index, split) {
                    Some(scalar) => Decision::IndexView { scalar },
                    None => Decision::Compute,
                },
                OpKind::Call { .. } => Decision::Call {
                    stages: call_stages(id),
                },
                OpKind::MatMul { .. } if cx.accumulated.contains(&op.results[0]) => {
                    Decision::MatMulInto
                }
                OpKind::MatMul { .. } if !cx.gpu && !in_chains.contains(&id) => {
                    match slice_writer(f, block, (&sole_readers, deferred), id, split) {
                        Some(update) => Decision::MatMulIntoSlice { update },
                        None => Decision::Compute,
                    }
                }
                OpKind::Constant { .. }
                    if unread.contains(&op.results[0]) || summed_over.contains(&op.results[0]) =>
                {
                    Decision::Unfilled
                }
                OpKind::Loop { .. } => Decision::Loop,
                kind if kind.is_elementwise() && !cx.gpu && !in_chains.contains(&id) => {
                    match slice_writer(f, block, (&sole_readers, deferred), id, split) {
                        Some(update) => Decision::ElementwiseIntoSlice { update },
                        None => Decision::Elementwise,
                    }
                }
                kind if kind.is_elementwise() => Decision::Elementwise,
                _ => Decision::Compute,
            }
        };
        let decisions: HashMap<OpId, Decision> =
            block.ops.iter().map(|&id| (id, decide(id))).collect();
        let in_slice = |id: &OpId| {
            matches!(
                decisions[id],
                Decision::MatMulIntoSlice { .. } | Decision::ElementwiseIntoSlice { .. }
            )
        };
        let in_slots = match cx.gpu {
            false => slot_writers(f, block, (&sole_readers, deferred), &in_chains)
                .into_iter()
                .filter(|(_, made, _)| !in_slice(made))
                .map(|(v, _, update)| (v, update))
                .collect(),
            true => Vec::new(),
        };
        BlockPlan {
            in_slots,
            steps: batch_split::schedule(block, &chains),
            fusion,
            gemm_accumulations,
            stage_accumulations,
            chains,
            sole_readers,
            decisions,
        }
    }
}

/// Whether `v` is read only by `index` ops of `block`, which read a strided view as well as a
/// buffer (the ring of stage inputs of `--schedule 1f1b`, read stage-major).
fn only_indexed(f: &Func, block: &Block, v: ValueId) -> bool {
    let nested = read_in_loops(f, block);
    let indexed = |kind: &OpKind| {
        !kind.operands().contains(&v)
            || matches!(kind, OpKind::Index { x, index, .. } if *x == v && *index != v)
    };
    !nested.contains(&v)
        && !block.results.contains(&v)
        && block.ops.iter().all(|&id| indexed(&f.ops[id].kind))
}

/// Whether `index` op `op` reads one position per stage, not the same for all: its index is
/// `[stages]`, along `x`'s first axis, the stage axis.
fn per_stage_index(f: &Func, op: &ppc_dialect::ir::Op, in_split: bool) -> bool {
    let OpKind::Index { x, index, .. } = &op.kind else {
        return false;
    };
    f.ty(*index).rank() == 1
        && f.ty(*x).stage_axis().is_some_and(|(at, _)| at == 0)
        && views::uniform(f, *index, in_split).is_none()
}

/// Whether op `id` is a transpose that only moves its operand's stage axis, the first, to
/// another place (the other axes keep their order).
fn moves_stage_axis(f: &Func, id: OpId) -> bool {
    let OpKind::Transpose { x, perm } = &f.ops[id].kind else {
        return false;
    };
    let others: Vec<usize> = perm.iter().copied().filter(|&a| a != 0).collect();
    f.ty(*x).stage_axis().is_some_and(|(at, _)| at == 0) && others.is_sorted()
}

/// The values the loops of `block` read.
fn read_in_loops(f: &Func, block: &Block) -> HashSet<ValueId> {
    let mut nested = HashSet::new();
    for &id in &block.ops {
        if let OpKind::Loop { body, .. } = &f.ops[id].kind {
            fuse::used_in(f, body, &mut nested);
        }
    }
    nested
}

/// The `update` that alone reads op `id`'s result (a matmul's in f32, or an elementwise op's)
/// and writes it, at an index known before the op, into a slice of a value that nothing else
/// in `block` reads; for an elementwise op, nothing else from the op on
/// ([`read_only_at_slice`]).
fn slice_writer(
    f: &Func,
    block: &Block,
    (sole_readers, deferred): (&HashMap<ValueId, OpId>, &HashSet<ValueId>),
    id: OpId,
    in_split: bool,
) -> Option<OpId> {
    let result = f.ops[id].results[0];
    let update = *sole_readers.get(&result)?;
    let OpKind::Update {
        x,
        update: value,
        index,
        ..
    } = &f.ops[update].kind
    else {
        return None;
    };
    let scalar = views::uniform(f, *index, in_split)?;
    let at = |v: ValueId| {
        block
            .ops
            .iter()
            .position(|&o| f.ops[o].results.contains(&v))
    };
    let known_before = at(scalar).is_none_or(|p| Some(p) < at(result));
    let kind = &f.ops[id].kind;
    let (typed, x_read) = match kind {
        OpKind::MatMul { .. } => (
            f.ty(result).dtype == ppc_dialect::DType::F32,
            sole_readers.get(x) == Some(&update),
        ),
        _ => (
            true,
            read_only_at_slice(f, block, (sole_readers, deferred), *x, update, id),
        ),
    };
    (*value == result && typed && x_read && known_before).then_some(update)
}

/// The values of a loop body that an `update` writes, at the loop's counter, into the carried
/// value it yields, and that other ops read too (a training forward's tapes of a layer's
/// activations, which the layer reads on): computed in that slot, where the other ops read
/// them, and the update copies nothing (`Walker::block`; where the update is not in place, or
/// the op computes no buffer of its own, it copies as before). Only where nothing reads the
/// carried value from the value's op to the update ([`read_only_at_slice`]), and not for a
/// value a chain computes (its entries interleave with its other ops'). Each with the op that
/// computes it and the update.
fn slot_writers(
    f: &Func,
    block: &Block,
    (sole_readers, deferred): (&HashMap<ValueId, OpId>, &HashSet<ValueId>),
    in_chains: &HashSet<OpId>,
) -> Vec<(ValueId, OpId, OpId)> {
    let mut slots: Vec<(ValueId, OpId, OpId)> = Vec::new();
    for &update in &block.ops {
        let op = &f.ops[update];
        let OpKind::Update {
            x,
            update: v,
            index,
            ..
        } = &op.kind
        else {
            continue;
        };
        let at_counter = block.args.first() == Some(index) && f.ty(*index).rank() == 0;
        let made = (block.ops.iter()).find(|&&o| f.ops[o].results.contains(v));
        let Some(&made) = made else {
            continue;
        };
        let fits = at_counter
            && block.results.contains(&op.results[0])
            && !block.results.contains(v)
            && !deferred.contains(v)
            && !in_chains.contains(&made)
            && !slots.iter().any(|&(w, _, _)| w == *v)
            && read_only_at_slice(f, block, (sole_readers, deferred), *x, update, made);
        if fits {
            slots.push((*v, made, update));
        }
    }
    slots
}

/// Whether op `id` may write into the slice of `x` that `update` writes: from `id` to the update
/// nothing reads `x` or a view of it (a value deferred into a later op included), except `id`
/// itself, where it is elementwise, through `index` ops at the update's position that only it
/// reads (any other op may write an element before it reads all it needs). Ops before `id`
/// read `x` before it changes; placing the update in place checked that none reads it after.
fn read_only_at_slice(
    f: &Func,
    block: &Block,
    (sole_readers, deferred): (&HashMap<ValueId, OpId>, &HashSet<ValueId>),
    x: ValueId,
    update: OpId,
    id: OpId,
) -> bool {
    let OpKind::Update { index: at, .. } = &f.ops[update].kind else {
        return false;
    };
    let mut views = in_place::aliases(f, block, x);
    for &o in &block.ops {
        let op = &f.ops[o];
        if deferred.contains(&op.results[0]) && op.kind.operands().iter().any(|v| views.contains(v))
        {
            views.insert(op.results[0]);
        }
    }
    let elementwise = f.ops[id].kind.is_elementwise();
    let same_slice = |v: ValueId| {
        elementwise
            && fuse::producer(f, block, v).is_some_and(|p| {
            matches!(&f.ops[p].kind, OpKind::Index { x: of, index, .. } if *of == x && index == at)
        }) && sole_readers.get(&v) == Some(&id)
    };
    let (Some(from), Some(to)) = (
        block.ops.iter().position(|&o| o == id),
        block.ops.iter().position(|&o| o == update),
    ) else {
        return false;
    };
    block.ops[from..to].iter().all(|&o| {
        let mut reads: HashSet<ValueId> = f.ops[o].kind.operands().into_iter().collect();
        if let OpKind::Loop { body, .. } = &f.ops[o].kind {
            fuse::used_in(f, body, &mut reads);
        }
        reads
            .into_iter()
            .all(|v| !views.contains(&v) || (o == id && same_slice(v)))
    })
}
