//! A stage backward's results are `-0.0` for the stages that do not run (bubble slots), as
//! the forward's masked matmuls are: the reverse GPipe loop adds them into accumulators, and
//! `-0.0` changes no bit there. Autodiff masks each result so (`autodiff.rs`).

use super::vjp::select;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::ValueId;
use ppc_dialect::op::{Float, OpKind};
use ppc_dialect::{DType, Dim, Type};

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

/// Whether `d` is a matmul masked by `active` (or its f32 conversion): `-0.0` wherever
/// `active` is false, computed from nothing there.
fn masked_by(b: &Builder, d: ValueId, active: ValueId) -> bool {
    let producer = |v: ValueId| {
        b.func
            .ops
            .values()
            .find(|op| op.results.contains(&v))
            .map(|op| &op.kind)
    };
    match producer(d) {
        Some(OpKind::Convert { x }) => masked_by(b, *x, active),
        Some(OpKind::MatMul { mask, .. }) => *mask == Some(active),
        _ => false,
    }
}
