//! The interleaved order of the tick loop: `--schedule 1f1b` on a circular pipeline
//! (`repeats = R > 1`, Megatron's interleaved 1F1B), where stage `s` holds the layer groups
//! `s, S + s, …, (R-1)·S + s` and a microbatch passes every stage `R` times.
//!
//! **Why not the parity order** (`one_f_one_b.rs`): a microbatch's forward through all `R·S`
//! groups and its backward take `2·R·S - 1` ticks, and a stage that runs a forward only every
//! other tick fills them with `R·S` forwards: the bubble is a pipeline's of `R·S` stages, no
//! smaller than without repeats. Here a stage may run a forward and a backward in the same
//! tick (the forward half after the backward half, as in every tick loop), and the bubble is
//! the interleaved one, `(S-1)/(R·M + S - 1)` of the step with a group's forward and backward
//! as one unit each.
//!
//! **The order.** Microbatches enter in groups of `S`, last first (entering number `n` is
//! microbatch `M-1-n`, so that every group's weight gradients add up in GPipe's order). Stage
//! `s` runs its forwards one per tick from tick `s`: forward unit `u = q·R·S + r·S + i` is
//! repeat `r` of entering microbatch `n = q·S + i`; its backwards one per tick from tick
//! `R·S + S - 1 - s`, unit `w = q·R·S + (R-1-r)·S + i`, the repeats in reverse. So:
//! - a forward's input left the previous stage a tick earlier, and stage 0's repeat `r` takes
//!   what the last stage finished of repeat `r-1` `S` units (a tick) before;
//! - a backward's cotangent left the next stage (or stage 0, for the last stage's repeat `r`)
//!   a tick earlier, and its forward ran at least a tick before it;
//! - the loop has `R·M + R·S + S - 1` ticks where `S` divides `M` (else the last group's
//!   missing microbatches leave their units idle), and an input waits at most `2·R·S - 1` ticks for
//!   its backward, so a ring of `2·R·S` slots, written at slot `h mod 2RS` in tick `h`,
//!   keeps every one until it is read.
//!
//! Items are GPipe's: repeat `r` of microbatch `m` is item `r·M + m`, from which the
//! copied GPipe ops derive the stage mask, the repeat, the output slot and the back edge.

use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::ValueId;
use ppc_dialect::op::{BinaryOp, CmpPred};
use ppc_dialect::DType;

/// The interleaved order's sizes: `R`, `S` and `M`.
#[derive(Clone, Copy)]
pub(super) struct Interleaved {
    pub(super) repeats: i64,
    pub(super) stages: i64,
    pub(super) microbatches: i64,
}

/// What the stages (a vector of stage indices, or one) run in a tick: where one runs, the
/// item (`-1` where none) and, for a backward, the ring slot its forward wrote.
pub(super) struct Units {
    pub(super) here: ValueId,
    pub(super) item: ValueId,
    pub(super) slot: ValueId,
}

impl Interleaved {
    /// Until stage 0's last backward, unit `w = q·R·S + (R-1)·S + i` of the last microbatch
    /// to enter, `n = M - 1 = q·S + i`: `R·M + R·S + S - 1` ticks where `S` divides `M`.
    pub(super) fn ticks(self) -> u64 {
        let Interleaved {
            repeats: r,
            stages: s,
            microbatches: m,
        } = self;
        let (q, i) = ((m - 1) / s, (m - 1) % s);
        let w = q * r * s + (r - 1) * s + i;
        (r * s + s + w) as u64
    }

    /// GPipe's `T = R·M + S - 1` iterations, the length of its padded inputs: item `T - 1` is
    /// padding, which feeds and takes back nothing.
    fn gpipe_iterations(self) -> i64 {
        self.repeats * self.microbatches + self.stages - 1
    }

    /// `2·R·S`: a ring slot per tick of the longest wait.
    pub(super) fn ring_len(self) -> i64 {
        2 * self.repeats * self.stages
    }

    /// The slot tick `h`'s forwards write.
    pub(super) fn write_slot(self, b: &mut Builder, h: ValueId) -> Result<ValueId, Diagnostic> {
        modulo(b, h, self.ring_len())
    }

    /// The forwards of tick `h` on `stage`: unit `h - s`.
    pub(super) fn forward(
        self,
        b: &mut Builder,
        h: ValueId,
        stage: ValueId,
    ) -> Result<Units, Diagnostic> {
        let u = b.binary("forward_unit", BinaryOp::Sub, h, stage)?;
        let (here, _, repeat, n) = self.unit(b, u, false)?;
        let item = self.item(b, here, repeat, n)?;
        let slot = self.write_slot(b, h)?;
        Ok(Units { here, item, slot })
    }

    /// The backwards of tick `h` on `stage`: unit `h - (R·S + S - 1 - s)`.
    pub(super) fn backward(
        self,
        b: &mut Builder,
        h: ValueId,
        stage: ValueId,
    ) -> Result<Units, Diagnostic> {
        let (r, s) = (self.repeats, self.stages);
        let turn = int(b, "backward_turn", r * s + s - 1)?;
        let since = b.binary("since_turn", BinaryOp::Sub, h, turn)?;
        let w = b.binary("backward_unit", BinaryOp::Add, since, stage)?;
        let (here, k, repeat, n) = self.unit(b, w, true)?;
        let item = self.item(b, here, repeat, n)?;
        // Its forward was unit `q·R·S + r·S + i`, `w` with `r` for `k = R-1-r`, in tick `s + u`.
        let turned = b.binary("repeat_turn", BinaryOp::Sub, repeat, k)?;
        let sn = int(b, "stages", s)?;
        let shift = b.binary("units_turned", BinaryOp::Mul, turned, sn)?;
        let u = b.binary("forward_unit_of", BinaryOp::Add, w, shift)?;
        let ran = b.binary("forward_tick_of", BinaryOp::Add, u, stage)?;
        let slot = modulo(b, ran, self.ring_len())?;
        Ok(Units { here, item, slot })
    }

    /// The items of the first and the last stage in tick `h` (forwards, or backwards where
    /// `backward`): stage 0's, or the padding's where it runs none (L1's and L2's iteration,
    /// which feeds and takes back nothing there), and the last stage's, `-1` where none.
    pub(super) fn ends(
        self,
        b: &mut Builder,
        h: ValueId,
        backward: bool,
    ) -> Result<(ValueId, ValueId), Diagnostic> {
        let units = |b: &mut Builder, stage: i64| {
            let stage = int(b, "end_stage", stage)?;
            match backward {
                false => self.forward(b, h, stage),
                true => self.backward(b, h, stage),
            }
        };
        let first = units(b, 0)?;
        let padding = int(b, "padding_item", self.gpipe_iterations() - 1)?;
        let t = b.select("first_stage_item", first.here, first.item, padding)?;
        Ok((t, units(b, self.stages - 1)?.item))
    }

    /// Unit `u = q·R·S + k·S + i` of a stage: whether it runs, `k`, its repeat (`k`, or
    /// `R-1-k` for a backward) and its entering number `n = q·S + i`.
    fn unit(
        self,
        b: &mut Builder,
        u: ValueId,
        turned: bool,
    ) -> Result<(ValueId, ValueId, ValueId, ValueId), Diagnostic> {
        let (r, s, m) = (self.repeats, self.stages, self.microbatches);
        let rs = int(b, "group_units", r * s)?;
        let q = b.binary("unit_group", BinaryOp::Div, u, rs)?;
        let start = b.binary("group_start", BinaryOp::Mul, q, rs)?;
        let rem = b.binary("in_unit_group", BinaryOp::Sub, u, start)?;
        let sn = int(b, "stages", s)?;
        let k = b.binary("repeat_slot", BinaryOp::Div, rem, sn)?;
        let ks = b.binary("repeat_start", BinaryOp::Mul, k, sn)?;
        let i = b.binary("in_group", BinaryOp::Sub, rem, ks)?;
        let repeat = match turned {
            false => k,
            true => {
                let last = int(b, "last_repeat", r - 1)?;
                b.binary("repeat_turned", BinaryOp::Sub, last, k)?
            }
        };
        let qs = b.binary("entered_before", BinaryOp::Mul, q, sn)?;
        let n = b.binary("entering", BinaryOp::Add, qs, i)?;
        let zero = int(b, "zero", 0)?;
        let started = b.compare("unit_started", CmpPred::Ge, u, zero)?;
        let mbs = int(b, "microbatches", m)?;
        let real = b.compare("unit_real", CmpPred::Lt, n, mbs)?;
        let here = b.select("unit_here", started, real, started)?;
        Ok((here, k, repeat, n))
    }

    /// GPipe's item of repeat `repeat` of entering number `n`, microbatch `M-1-n`: `-1`
    /// where nothing runs.
    fn item(
        self,
        b: &mut Builder,
        here: ValueId,
        repeat: ValueId,
        n: ValueId,
    ) -> Result<ValueId, Diagnostic> {
        let m = self.microbatches;
        let last = int(b, "last_microbatch", m - 1)?;
        let mb = b.binary("unit_microbatch", BinaryOp::Sub, last, n)?;
        let mbs = int(b, "microbatches", m)?;
        let before = b.binary("items_before", BinaryOp::Mul, repeat, mbs)?;
        let item = b.binary("unit_item", BinaryOp::Add, before, mb)?;
        let none = int(b, "none", -1)?;
        b.select("item_here", here, item, none)
    }
}

/// `x mod k` (`k > 0`), in `[0, k)` for any `x`.
pub(super) fn modulo(b: &mut Builder, x: ValueId, k: i64) -> Result<ValueId, Diagnostic> {
    let k = int(b, "modulus", k)?;
    let laps = b.binary("laps", BinaryOp::Div, x, k)?;
    let lapped = b.binary("lapped", BinaryOp::Mul, laps, k)?;
    b.binary("remainder", BinaryOp::Sub, x, lapped)
}

fn int(b: &mut Builder, hint: &str, v: i64) -> Result<ValueId, Diagnostic> {
    b.scalar(hint, v as f64, DType::I32)
}
