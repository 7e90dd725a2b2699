//! A stage backward's results are `-0.0` for the stages that do not run (bubble slots), as
//! the forward's masked matmuls are: the reverse GPipe loop adds them into accumulators, and
//! `-0.0` changes no bit there. Autodiff masks each result so (`autodiff.rs`).
//!
//! The ticked schedules' forward is masked the same way ([`masked_twin`]): their loop calls it
//! on every stage of a rank in every tick, where a stage runs a forward in one tick of two, and
//! a call whose results are all masked skips the stages that do not run
//! (`lower/stage_split.rs`).

use super::vjp::select;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{names, Func, Module, ValueId};
use ppc_dialect::op::{Float, OpKind};
use ppc_dialect::{DType, Dim, Type};
use std::collections::HashMap;

/// `d` where the stage of its stage axis is active, `-0.0` elsewhere (no-op outside `@stage`).
pub(super) fn mask_inactive(
    b: &mut Builder,
    active: Option<ValueId>,
    d: ValueId,
) -> Result<ValueId, Diagnostic> {
    let Some(active) = active else {
        return Ok(d);
    };
    if masked_by(b, d, active) {
        // Already -0.0 for the inactive stages, which it never read.
        return Ok(d);
    }
    let ty = b.ty(d).clone();
    let Some((pos, _)) = ty.stage_axis() else {
        return Ok(d);
    };
    let dims = (0..ty.rank())
        .map(|a| {
            if a == pos {
                ty.dims[a].clone()
            } else {
                Dim::lit(1)
            }
        })
        .collect();
    let cond = b.op(
        "active_at",
        OpKind::Reshape { x: active },
        Some(Type::new(DType::I1, dims)),
    )?;
    let zero = b.op(
        "zero",
        OpKind::Constant { value: Float(-0.0) },
        Some(Type::scalar(ty.dtype)),
    )?;
    select(b, cond, d, zero)
}

/// `@g` with each result `-0.0` (false) where the stage does not run: `@g_masked`. `None`
/// where `g` takes no stage mask, or returns a value other than a float with the stage axis
/// or the mask itself (a value the same for every stage, as Llama's rotary tables: no stage
/// can leave it out, so no loop over the stages could skip one).
pub(super) fn masked_twin(m: &Module, g: &Func) -> Result<Option<Func>, Diagnostic> {
    let Some(&mask) = g.body.args.iter().find(|&&a| g.ty(a).is_stage_mask()) else {
        return Ok(None);
    };
    let maskable = |&r: &ValueId| {
        let ty = g.ty(r);
        r == mask || (ty.dtype.is_float() && ty.stage_axis().is_some())
    };
    if !g.body.results.iter().all(maskable) {
        return Ok(None);
    }
    let mut b = Builder::new(&names::masked(&g.name));
    let mut env = HashMap::new();
    b.signature_of(g, &mut env)?;
    b.copy_ops(m, g, &g.body.ops, &mut env)?;
    let active = Some(env[&mask]);
    let results = (g.body.results.iter())
        .map(|r| match *r == mask {
            true => Ok(env[r]), // false where the stage does not run already
            false => mask_inactive(&mut b, active, env[r]),
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(b.finish(results)))
}

/// Whether `d` is a matmul masked by `active` (or its f32 conversion): `-0.0` wherever
/// `active` is false, computed from nothing there.
fn masked_by(b: &Builder, d: ValueId, active: ValueId) -> bool {
    match b.func.producer(d).map(|op| &op.kind) {
        Some(OpKind::Convert { x }) => masked_by(b, *x, active),
        Some(OpKind::MatMul { mask, .. }) => *mask == Some(active),
        _ => false,
    }
}
