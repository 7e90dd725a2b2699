//! Calls as loops over stages: a call of a function that computes each stage from that stage's
//! slices alone (the vmapped `@stage`, and the stage functions of the training step) runs as
//! one loop over the stages, instead of each op over all stages. Small stages run in parallel,
//! each thread computing every op of its stages on their slices; large ones in turn (below).
//!
//! A stage's activations can be small (the transformer example's are `[b, t, d] = 2 K` floats):
//! split op by op they stay under the size at which a parallel loop pays, so every op ran on
//! one thread while the other waited; split by stage, one parallel region per call keeps both
//! busy, with no join between ops, and each stage's GEMMs run on the thread that owns it.
//!
//! Inside the region every buffer is the stage's slice: values of the callee with the stage
//! axis keep it with size 1 (`[1, b, t, d]`, so axis numbers and permutations stay as written),
//! and in a parallel loop every temporary (with the stage axis or without: the causal mask, a
//! loop counter) gets one slot per stage in a buffer allocated once, so the threads share no
//! scratch memory (`Emitter::alloc` while a split is open); stages in turn share one.
//!
//! ```text
//! %out = call @stage(%in, %active)   ──▶   scf.parallel (%j) = (0) to (%threads) {
//!                                              scf.for %s = %j to 4 step %threads {
//!                                                scf.execute_region {     // ppc.outline
//!                                                  %in_s = memref.subview %in[%s, ...] [1, ...]
//!                                                  ... @stage's ops on [1, b, t, d] slices ...
//!                                                }
//!                                              }
//!                                            }
//! ```
//!
//! On the CPU each stage's body is a function of its own (`ppc.outline`), which the parallel
//! loop calls: LLVM's loop passes and code generation cost more than linearly in the loops
//! nested in one function, and the transformer example's stage backward holds 672 (its
//! training step compiled in 2.43 s against 2.72 s, and ran as fast, BENCHMARKS.md).
//!
//! When every result of the callee that the caller reads is masked by the stage mask
//! (`select(%active, v, c)`, as the training step's backward stage functions end, or a matmul
//! masked by it: a bubble stage contributes nothing), a bubble stage skips the whole body and
//! those results get the constants ([`masked_results`]). In parallel, such a call's active
//! stages are dealt out to the threads in stage order by the mask (not `%s = %j step %threads`),
//! so that the every-other active stages of 1F1B's and ZB-H1's parity order spread over them
//! (`Emitter::begin_stage_split`).
//!
//! [`stage_loop`] decides whether and how a call is split: no op of the callee may look across
//! stages (a reduction over the stage axis, an exchange, an iota or a softmax along it, a
//! transpose that moves it). Stages whose input is smaller than one parallel loop nest's worth
//! (`MIN_PARALLEL_ELEMENTS`) run in parallel, as above: most of their loop nests would run on one
//! thread. Larger stages are better shared: each op's loop nest and GEMM over all threads, where
//! a split by stage leaves threads idle in the pipeline's fill and drain (measured, split by
//! stage: the transformer example 1.14x and 1.19x in two runs, at b=8 t=128 0.96x; the MLP 0.95x;
//! BENCHMARKS.md). So a large callee whose results are masked runs its stages in turn, each
//! with every thread, and a bubble stage skips its body: op by op over every stage, masked
//! ones too, a backward iteration of the d = 1024 transformer with one active stage takes half
//! the time of a full one, not a quarter (the iterations' spans in `./t --steps 2 --trace
//! t.json`, `t` compiled with `--dim b=4 --dim t=256 --dim heads=16 --dim dh=64 --train --remat
//! none`; BENCHMARKS.md, 2026-12-06, "large stages of a masked stage function run in turn").
//! Other large
//! callees (the forward, whose bubble results flow on unmasked) are inlined op by op.

use super::emit::MIN_PARALLEL_ELEMENTS;
use super::fuse::producer;
use ppc_dialect::ir::{Block, Func, Module, Op};
use ppc_dialect::op::{Float, OpKind};
use ppc_dialect::DType;
use ppc_dialect::Type;

/// A call's loop over the stages of its callee.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageLoop {
    pub stages: u64,
    /// The stages run in parallel, each on one thread; else in turn, each op on every thread.
    pub parallel: bool,
}

/// How a call of `g` runs over its stages, if it may: `g` takes a value with the stage axis,
/// and each of its stages (and those of the functions it calls) depends only on that stage's
/// slices. Small stages (their input, the smallest float argument with the stage axis, one
/// layer's of it, under `MIN_PARALLEL_ELEMENTS`) run in parallel; large ones in turn, where a bubble stage skips the
/// body (every result the caller reads, `read[i]`, is masked, [`masked_results`]); otherwise,
/// `None`, the call is inlined op by op.
pub fn stage_loop(m: &Module, g: &Func, read: &[bool]) -> Option<StageLoop> {
    let (stages, input) = (g.body.args.iter().map(|&a| g.ty(a)))
        .filter(|t| t.dtype.is_float())
        .filter_map(|t| {
            t.stage_axis()
                .map(|(at, _)| (t.dims[at].size, from_stage_axis(t)))
        })
        .min_by_key(|&(_, elements)| elements)?;
    if !(Check { m, stages }).func(g) {
        return None;
    }
    let parallel = input < MIN_PARALLEL_ELEMENTS;
    (parallel || masked_results(g, read).is_some()).then_some(StageLoop { stages, parallel })
}

/// Which results of the call `op` in `f` are read (`read` of [`stage_loop`]).
pub fn results_read(f: &Func, op: &Op) -> Vec<bool> {
    op.results.iter().map(|&r| f.uses(&f.body, r) > 0).collect()
}

/// If every result of `g` that the caller reads (`read[i]`) is `select(m, v, c)` with `m` one
/// `i1` argument with the stage axis (or a reshape of it) and `c` a constant, a matmul masked
/// by that argument (`-0.0` where it is false), or that argument itself (false there): that
/// argument's position and each read result's constant. A stage where the argument is false
/// computes nothing that is kept.
pub fn masked_results(g: &Func, read: &[bool]) -> Option<(usize, Vec<Option<Float>>)> {
    let defined = |v| producer(g, &g.body, v).map(|id| &g.ops[id].kind);
    let mut mask = None;
    let mut fills = Vec::new();
    for (&r, &read) in g.body.results.iter().zip(read) {
        if !read {
            fills.push(None);
            continue;
        }
        // The stage mask argument itself is false where it is false (ZB-H1's `B` stashes it).
        if let Some(arg) = g.body.args.iter().position(|&a| a == r) {
            if g.ty(r).is_stage_mask() && *mask.get_or_insert(arg) == arg {
                fills.push(Some(Float(0.0)));
                continue;
            }
            return None;
        }
        // A matmul masked by a stage mask argument is `-0.0` where it is false.
        if let Some(&OpKind::MatMul { mask: Some(m), .. }) = defined(r) {
            let arg = g.body.args.iter().position(|&a| a == m)?;
            if *mask.get_or_insert(arg) != arg {
                return None;
            }
            fills.push(Some(Float(-0.0)));
            continue;
        }
        let Some(&OpKind::Select { cond, on_false, .. }) = defined(r) else {
            return None;
        };
        let cond = match defined(cond) {
            Some(&OpKind::Reshape { x }) => x,
            _ => cond,
        };
        let arg = g.body.args.iter().position(|&a| a == cond)?;
        let ty = g.ty(cond);
        if ty.dtype != DType::I1 || ty.rank() != 1 || staged(ty).is_none() {
            return None;
        }
        if *mask.get_or_insert(arg) != arg {
            return None;
        }
        let Some(&OpKind::Constant { value }) = defined(on_false) else {
            return None;
        };
        fills.push(Some(value));
    }
    Some((mask?, fills))
}

/// The elements of `ty` from its stage axis on: all stages' values of one layer, where a
/// stage function takes its layers' tapes (`[layers, stages, ...]`).
fn from_stage_axis(ty: &Type) -> u64 {
    let at = ty.stage_axis().map_or(0, |(at, _)| at);
    ty.dims[at..].iter().map(|d| d.size).product()
}

/// The size of `ty`'s stage axis, if it has one.
fn staged(ty: &Type) -> Option<u64> {
    ty.stage_axis().map(|(at, _)| ty.dims[at].size)
}

/// Where `ty`'s stage axis is, counted from its last axis (NumPy broadcasting lines operands
/// up from the end), if it has one.
fn from_end(ty: &Type) -> Option<usize> {
    ty.stage_axis().map(|(at, _)| ty.rank() - at)
}

/// The type of a stage's slice of `ty`: the stage axis, if any, of size 1.
pub fn slice_type(ty: &Type) -> Type {
    let mut t = ty.clone();
    if let Some((at, _)) = t.stage_axis() {
        t.dims[at].size = 1;
    }
    t
}

struct Check<'m> {
    m: &'m Module,
    stages: u64,
}

impl Check<'_> {
    /// `ty` is unstaged, or staged with the split's stage count.
    fn fits(&self, ty: &Type) -> bool {
        staged(ty).is_none_or(|s| s == self.stages)
    }

    fn func(&mut self, g: &Func) -> bool {
        g.params.iter().all(|p| self.fits(g.ty(p.value))) && self.block(g, &g.body)
    }

    fn block(&mut self, g: &Func, block: &Block) -> bool {
        block.args.iter().all(|&a| self.fits(g.ty(a)))
            && block.ops.iter().all(|&id| {
                let op = &g.ops[id];
                let results: Vec<&Type> = op.results.iter().map(|&r| g.ty(r)).collect();
                let operands: Vec<&Type> = op.kind.operands().iter().map(|&x| g.ty(x)).collect();
                let any_staged = operands.iter().any(|t| staged(t).is_some());
                results.iter().chain(&operands).all(|t| self.fits(t))
                    // A staged operand with an unstaged result mixes stages (a reduction).
                    && (!any_staged || results.iter().all(|t| staged(t).is_some()))
                    && self.op(g, &op.kind, &operands, &results)
            })
    }

    /// The op's own rule: it must not look along the stage axis of a staged value, and the
    /// stage axes of its operands and result must meet (stage `s` of the result is computed
    /// from stage `s` of the operands).
    fn op(&mut self, g: &Func, kind: &OpKind, operands: &[&Type], results: &[&Type]) -> bool {
        let at = |t: &Type| t.stage_axis().map(|(a, _)| a);
        let x_at = operands.first().and_then(|t| at(t));
        let out_at = results.first().and_then(|t| at(t));
        let not_along = |axis: usize| x_at != Some(axis);
        // Broadcast-shaped ops: each staged operand's stage axis meets the result's.
        let aligned = |ts: &[&Type]| {
            ts.iter()
                .all(|t| from_end(t).is_none() || from_end(t) == from_end(results[0]))
        };
        match kind {
            OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Compare { .. }
            | OpKind::Select { .. }
            | OpKind::Convert { .. }
            | OpKind::Broadcast { .. } => aligned(operands),
            // The mask has one entry per entry of the result's first axis: the stage axis.
            OpKind::MatMul { mask, .. } => {
                aligned(&operands[..2]) && (mask.is_none() || out_at == Some(0))
            }
            OpKind::Transpose { perm, .. } => out_at.is_none_or(|o| Some(perm[o]) == x_at),
            // As many elements before the stage axis (`[S]` and `[1, S, 1]` alike): the slice
            // of the one is the slice of the other, in the same order.
            OpKind::Reshape { .. } => match (x_at, out_at) {
                (None, None) => true,
                (Some(a), Some(b)) => {
                    let before = |t: &Type, at: usize| t.shape()[..at].iter().product::<u64>();
                    before(operands[0], a) == before(results[0], b)
                }
                _ => false,
            },
            OpKind::Slice { start, end, .. } => {
                x_at.is_none_or(|a| start[a] == 0 && end[a] == self.stages)
            }
            OpKind::Concat { axis, .. } => {
                operands.iter().all(|t| at(t) != Some(*axis)) && aligned(operands)
            }
            OpKind::Reduce { axes, .. } => x_at.is_none_or(|a| !axes.contains(&a)),
            OpKind::Softmax { axis, .. }
            | OpKind::LayerNorm { axis, .. }
            | OpKind::Pad { axis, .. }
            | OpKind::Shift { axis, .. }
            | OpKind::Index { axis, .. }
            | OpKind::Gather { axis, .. }
            | OpKind::Update { axis, .. } => not_along(*axis),
            OpKind::Iota { axis } => out_at != Some(*axis),
            OpKind::Constant { .. } | OpKind::Rank => true,
            // Stage s of an exchange comes from another stage or rank.
            OpKind::Exchange { .. } => false,
            OpKind::Call { callee, .. } => {
                let callee = &self.m.funcs[*callee];
                self.func(callee)
            }
            OpKind::Loop { body, .. } => self.block(g, body),
        }
    }
}
