//! `shard-stages`: splits the stage program over `ranks` processes, each holding `S/R`
//! consecutive stages and their weights.
//!
//! Preconditions: `vmap-stages` has run, `gpipe-loop` has not; `ranks` (the pipeline setting or
//! `--ranks`) divides `stages`. With one rank the pass changes nothing.
//!
//! Postconditions: every `#stages` axis of `@stage` (state, masks, stacked weights) becomes the
//! `#stages_per_rank` axis, this rank's slice of the full stage axis (and a slice's bounds along
//! it, this rank's stages); ordinary dimensions keep
//! their size, whatever they are called (a layer's `f32[d, stages]` stays `S` wide); rank `r` holds
//! global stages `r*S/R ..`. A parameter's `#stages_per_rank` axis tells the runtime which global
//! layers its values belong to, so every rank draws the same numbers the one-process program
//! holds in that slice. `gpipe-loop` then builds the loop for this rank: global stage indices
//! from `rank`, and the shift as a move inside the rank plus one `exchange` of the boundary
//! stage with the neighbouring ranks (see `gpipe_loop.rs`).
//!
//! ```text
//! func @stage(%x: f32[#stages, b, d], ...)         func @stage(%x: f32[#stages_per_rank, b, d], ...)
//!   param %w: f32[#stages, d, d] = ...       ──▶     param %w: f32[#stages_per_rank, d, d] = ...
//! ```

use super::options::Options;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Module};
use ppc_dialect::op::OpKind;
use ppc_dialect::{Axis, Dim};

pub fn shard_stages(m: &mut Module, _opts: &Options) -> Result<(), Diagnostics> {
    let p = m.pipeline;
    if p.ranks == 1 {
        return Ok(());
    }
    if m.func(names::PIPELINE).is_some() {
        return Err(vec![Diagnostic::plain(
            "`shard-stages` runs before `gpipe-loop`, which builds the loop for the rank",
        )]);
    }
    let stage = m
        .funcs
        .values_mut()
        .find(|f| f.name == names::STAGE)
        .ok_or_else(|| {
            vec![Diagnostic::plain(
                "`shard-stages` needs `@stage`: run `vmap-stages` first",
            )]
        })?;
    let local = Dim::axis(Axis::RankStages, p.stages_per_rank());
    let mut sharded = false;
    for v in stage.values.values_mut() {
        for d in &mut v.ty.dims {
            match d.as_axis() {
                Some(Axis::Stages) => {
                    *d = local.clone();
                    sharded = true;
                }
                Some(Axis::RankStages) => {
                    return Err(vec![Diagnostic::plain(
                        "`@stage` already has a `#stages_per_rank` axis: `shard-stages` has run",
                    )])
                }
                None => {}
            }
        }
    }
    if !sharded {
        return Err(vec![Diagnostic::plain(
            "`@stage` has no `#stages` axis to shard",
        )]);
    }
    // A slice keeps the whole stage axis (vmap-stages never slices across stages): this rank's.
    let values = stage.values.clone();
    for op in stage.ops.values_mut() {
        if let OpKind::Slice { x, end, .. } = &mut op.kind {
            if let Some(a) = values[*x].ty.axis(Axis::RankStages) {
                end[a] = p.stages_per_rank();
            }
        }
    }
    Ok(())
}
