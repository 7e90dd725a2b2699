//! The rings of the 1F1B tick loop (`one_f_one_b.rs`): `S` slots per stage in place of each of
//! GPipe's tapes of `M + S - 1`. In the parity order stage `g` writes slot `τ mod S` in the
//! pair of ticks `τ` in which it runs a forward, and reads that microbatch back `d = S-1-g`
//! (even `g`) or `S-g` (odd) pairs later, in its backward: at most `S - g` slots hold a live
//! entry. The interleaved order has rings of `2·R·S` slots (`tick_interleaved.rs`).

use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::ValueId;
use ppc_dialect::op::{BinaryOp, CmpPred, OpKind};
use ppc_dialect::{DType, Dim, Type};

/// A ring's length and, per local stage, `2⌊g/2⌋ + 1`: the distance in slots from the slot a
/// stage writes in pair `τ` to the one its backward reads then.
pub(super) struct Rings {
    pub(super) slots: i64,
    pub(super) read_offset: ValueId,
}

impl Rings {
    /// `τ mod S`: the slot written in pair `τ`.
    pub(super) fn write_slot(&self, b: &mut Builder, pair: ValueId) -> Result<ValueId, Diagnostic> {
        let k = b.scalar("ring_len", self.slots as f64, DType::I32)?;
        let laps = b.binary("laps", BinaryOp::Div, pair, k)?;
        let lapped = b.binary("lapped", BinaryOp::Mul, laps, k)?;
        b.binary("slot", BinaryOp::Sub, pair, lapped)
    }

    /// `ring` with `value` written at `slot` on the stages where `here` (one slice in place; the
    /// other stages' entries kept).
    pub(super) fn write(
        &self,
        b: &mut Builder,
        ring: ValueId,
        value: ValueId,
        here: ValueId,
        slot: ValueId,
    ) -> Result<ValueId, Diagnostic> {
        let (x, index, axis) = (ring, slot, 0);
        let kept = b.op("ring_slot", OpKind::Index { x, index, axis }, None)?;
        let mask = stage_mask(b, here, &b.ty(value).clone())?;
        let update = b.select("ring_entry", mask, value, kept)?;
        let kind = OpKind::Update {
            x: ring,
            update,
            index,
            axis,
        };
        b.op("ring_written", kind, None)
    }

    /// The slots the stages' backwards in pair `τ` read (parity order): `(τ - d) mod S`,
    /// `= (τ mod S + 2⌊g/2⌋ + 1) mod S`.
    pub(super) fn read_slots(&self, b: &mut Builder, pair: ValueId) -> Result<ValueId, Diagnostic> {
        let slot = self.write_slot(b, pair)?;
        let read = b.binary("read_slot", BinaryOp::Add, self.read_offset, slot)?;
        let k = b.scalar("ring_len", self.slots as f64, DType::I32)?;
        let over = b.compare("lapped_read", CmpPred::Ge, read, k)?;
        let wrapped = b.binary("wrapped_read", BinaryOp::Sub, read, k)?;
        b.select("read_slots", over, wrapped, read)
    }

    /// Each stage's entry at its slot of `slots`, through a stage-major view.
    pub(super) fn read(
        &self,
        b: &mut Builder,
        ring: ValueId,
        slots: ValueId,
    ) -> Result<ValueId, Diagnostic> {
        // Stage-major, so that each stage reads its own slot, then back in the kept value's order.
        let ty = b.ty(ring).clone();
        let (rank, at) = (ty.rank(), stage_axis(&ty));
        let perm = [at, 0]
            .into_iter()
            .chain((1..at).chain(at + 1..rank))
            .collect();
        let by_stage = b.op("ring_by_stage", OpKind::Transpose { x: ring, perm }, None)?;
        let index = OpKind::Index {
            x: by_stage,
            index: slots,
            axis: 1,
        };
        let kept = b.op("kept_input", index, None)?;
        match at - 1 {
            0 => Ok(kept),
            at => {
                let perm = (1..=at).chain([0]).chain(at + 1..rank - 1).collect();
                b.op("kept_in_order", OpKind::Transpose { x: kept, perm }, None)
            }
        }
    }
}

/// Where the stage axis of a value the rings keep is: first, or after the layer axis of a
/// stage's layers (`--remat none` with several layers per stage).
fn stage_axis(ty: &Type) -> usize {
    ty.stage_axis().map_or(0, |(at, _)| at)
}

/// A stage mask shaped to select between values of type `like` (`[stages, 1, ...]`, or
/// `[1, stages, 1, ...]`).
pub(super) fn stage_mask(
    b: &mut Builder,
    mask: ValueId,
    like: &Type,
) -> Result<ValueId, Diagnostic> {
    let at = stage_axis(like);
    let dims = (0..like.rank())
        .map(|i| match i == at {
            true => like.dims[at].clone(),
            false => Dim::lit(1),
        })
        .collect();
    let ty = Type::new(DType::I1, dims);
    b.op("stage_mask", OpKind::Reshape { x: mask }, Some(ty))
}
