//! Writes the loops over parts of values the plan chose: a call as one loop over its stages
//! (`stage_split.rs`), a chain of batched ops as one loop over its batch entries
//! (`batch_split.rs`).

use super::batch_split;
use super::buf::Buf;
use super::stage_split::{self, StageLoop};
use super::walk::{self, Walker};
use super::{ops, views};
use ppc_dialect::ir::{Func, FuncId, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::{Diagnostic, Type};
use std::collections::HashMap;

/// A chain's loop over entries being written (`batch_split.rs`): its trace span, the buffers of
/// the values it slices (to restore), and its outputs' whole buffers.
pub(super) struct OpenChain {
    group: Option<usize>,
    saved: Vec<(ValueId, Option<Buf>)>,
    wholes: Vec<(ValueId, Buf)>,
}

impl Walker<'_, '_> {
    /// Emits a call of `callee` (`g`) as one loop over its stages (`stage_split.rs`); returns
    /// the whole result buffers. `read[i]`: whether the caller reads result `i`; results in
    /// `into` (by index) are computed in the given buffer, those in `add_into` added into it,
    /// stage by stage.
    pub(super) fn split_call(
        &mut self,
        callee: FuncId,
        (args, at_slots): (Vec<Buf>, &HashMap<usize, walk::StageSlot>),
        read: &[bool],
        (into, add_into): (&HashMap<usize, Buf>, &HashMap<usize, Buf>),
        stages: StageLoop,
    ) -> Result<Vec<Buf>, Diagnostic> {
        let g = &self.m.funcs[callee];
        let results: Vec<Buf> = g
            .body
            .results
            .iter()
            .enumerate()
            .map(|(i, &r)| match (add_into.get(&i), into.get(&i)) {
                (Some(acc), _) => acc.clone(),
                (None, Some(b)) => b.clone(),
                (None, None) => self.e.alloc(g.ty(r)),
            })
            .collect();
        // A bubble stage of a callee whose every result it masks skips the body; an
        // accumulator is then left as it is, which needs its result's constant to be -0.0
        // (the additive identity: `acc + -0.0` is `acc`, bit for bit).
        let minus_zero = |c: &Option<ppc_dialect::op::Float>| {
            c.is_none_or(|c| c.0.to_bits() == (-0.0f64).to_bits())
        };
        let masked = stage_split::masked_results(g, read)
            .filter(|(_, fills)| add_into.keys().all(|&i| minus_zero(&fills[i])));
        // Such a call's stages in parallel are dealt out by its mask, so that the active ones
        // spread over the threads (`Emitter::begin_stage_split`).
        let mask = masked.as_ref().map(|(at, _)| &args[*at]);
        self.e
            .begin_stage_split(stages.stages, stages.parallel, mask);
        // A stage's body is a function of its own, called by the parallel loop: LLVM's loop
        // passes and code generation cost more than linearly in the loops one function nests
        // in another (the transformer example's stage backward: 672 loops in the region).
        let outline = self.e.gpu.is_none();
        if outline {
            self.e.begin_outlined();
        }
        // An argument read at a slot per stage (`Decision::AtStageSlot`) is the stage's slot
        // of its indexed buffer.
        let args: Vec<Buf> = (args.iter().zip(&g.body.args).enumerate())
            .map(|(i, (a, &v))| match at_slots.get(&i) {
                Some(at) => {
                    let stage = self.e.stage_slice(a, &a.ty);
                    let slot = self.e.stage_slice(&at.index, &at.index.ty);
                    let kept = views::index(&mut self.e, &stage, &slot, at.axis);
                    match &at.perm {
                        Some(perm) => {
                            let ty = stage_split::slice_type(g.ty(v));
                            views::transpose(&mut self.e, &kept, perm, &ty)
                        }
                        None => kept,
                    }
                }
                None => self.e.stage_slice(a, g.ty(v)),
            })
            .collect();
        if let Some((at, _)) = &masked {
            let (mask, zero) = (&args[*at], self.e.index(0));
            let active = self.e.let_(&format!(
                "memref.load {}[{zero}] : {}",
                mask.name,
                mask.mty()
            ));
            self.e.open(&format!("scf.if {active} {{"));
        }
        // Inside the bubble test the stage's mask holds only `true`. Not used for stages in
        // turn: there the transformer's d = 1024 training step runs 2.6–3.2% slower with its
        // selects gone, and why is not established (`./t --steps 1 --bench 2`, with and without
        // them; BENCHMARKS.md, 2026-12-06, "three whole-weight passes gone from every training
        // step").
        let true_args: Vec<usize> = (masked.iter())
            .filter(|_| stages.parallel)
            .map(|&(at, _)| at)
            .collect();
        let slots: Vec<Buf> = (results.iter().zip(&g.body.results))
            .map(|(whole, &v)| self.e.stage_slice(whole, g.ty(v)))
            .collect();
        // A stage computes the results its layer loop carries (its activations, the tapes it
        // keeps of each layer) in their slots, and the others in buffers of its own, copied
        // there: a value given a buffer from outside is left out of the loops over batch
        // entries (`Context::carried`), which would split attention's chain.
        let sums = (add_into.keys()).map(|&i| (i, slots[i].clone())).collect();
        let looped = |v: &ValueId| {
            (g.body.ops.iter()).any(|&o| {
                matches!(g.ops[o].kind, OpKind::Loop { .. }) && g.ops[o].results.contains(v)
            })
        };
        let into: HashMap<usize, Buf> = (slots.iter().enumerate())
            .filter(|&(i, _)| !add_into.contains_key(&i) && looped(&g.body.results[i]))
            .map(|(i, slot)| (i, slot.clone()))
            .collect();
        let none = HashMap::new();
        let outs = self.func_adding(callee, args, (&into, &none), &true_args, &sums)?;
        for (i, (out, slot)) in outs.iter().zip(&slots).enumerate() {
            if !add_into.contains_key(&i) && out.name != slot.name {
                self.e.copy(out, slot);
            }
        }
        if let Some((_, fills)) = masked {
            self.e.begin_else();
            let kept = results.iter().zip(&g.body.results).zip(fills).enumerate();
            for (_, ((whole, &v), value)) in kept.filter(|(i, _)| !add_into.contains_key(i)) {
                let Some(value) = value else { continue };
                let slot = self.e.stage_slice(whole, g.ty(v));
                let fill = OpKind::Constant { value };
                ops::lower(&mut self.e, self.numerics, &fill, &[], &slot);
            }
            self.e.end_bubble_if();
        }
        if outline {
            self.e.end_outlined();
        }
        self.e.end_stage_split();
        Ok(results)
    }

    /// Opens `chain`'s loop over its entries (`batch_split.rs`): the values it reads along its
    /// leading axes become their entry's slices in `env`, its outputs (`wholes`: their whole
    /// buffers) their entry's in `slices`, and a bubble stage's entries skip it.
    pub(super) fn begin_chain(
        &mut self,
        f: &Func,
        chain: &batch_split::Chain,
        wholes: Vec<(ValueId, Buf)>,
        env: &mut HashMap<ValueId, Buf>,
        slices: &mut HashMap<ValueId, Buf>,
    ) -> OpenChain {
        self.e.at(f.op_spans.get(&chain.ops[0]));
        let names: Vec<&str> = chain.ops.iter().map(|&o| f.ops[o].kind.name()).collect();
        let group = self.begin_group(f, chain.ops[0], names.join("+"));
        // Inside a loop over a call's stages (in turn), over the current stage's entries.
        let (mut prefix, mut tile) = (chain.prefix.clone(), chain.tile.clone());
        let first = f.ty(f.ops[chain.ops[0]].results[0]);
        let in_stage = self.e.nest.in_stage_split();
        if let Some((at, _)) = first
            .stage_axis()
            .filter(|&(at, _)| in_stage && at < prefix.len())
        {
            (prefix[at], tile[at]) = (1, 1);
        }
        let types: HashMap<ValueId, Type> =
            (chain.sliced.iter().chain(wholes.iter().map(|(v, _)| v)))
                .map(|&v| (v, walk::value_type(&self.e, f, v)))
                .collect();
        let ivs = self.e.begin_entries(&prefix, &tile);
        let mut saved = Vec::new();
        for &v in &chain.sliced {
            let entry = self.entry(&env[&v], &types[&v], &ivs, &tile);
            saved.push((v, env.insert(v, entry)));
        }
        for (v, whole) in &wholes {
            let entry = self.entry(whole, &types[v], &ivs, &tile);
            slices.insert(*v, entry);
        }
        if let Some((mask, at)) = chain.mask {
            let entry = self.e.slot(&env[&mask], &ivs[at], 0, true);
            if chain.skip_bubbles {
                let zero = self.e.index(0);
                let active = self.e.let_(&format!(
                    "memref.load {}[{zero}] : {}",
                    entry.name,
                    entry.mty()
                ));
                self.e.open(&format!("scf.if {active} {{"));
            }
            saved.push((mask, env.insert(mask, entry)));
        }
        OpenChain {
            group,
            saved,
            wholes,
        }
    }

    /// Closes `chain`'s loop: a bubble stage's entries get what the masked GEMM writes (-0.0),
    /// and `env` the whole buffers again.
    pub(super) fn end_chain(
        &mut self,
        chain: &batch_split::Chain,
        open: OpenChain,
        env: &mut HashMap<ValueId, Buf>,
        slices: &mut HashMap<ValueId, Buf>,
    ) {
        if chain.skip_bubbles {
            self.e.begin_else();
            for (v, _) in &open.wholes {
                let zero = self.e.constant(-0.0, slices[v].ty.dtype);
                self.e.fill(&zero, &slices[v]);
            }
            self.e.end_bubble_if();
        }
        self.e.end_entries();
        for (v, before) in open.saved {
            if let Some(b) = before {
                env.insert(v, b);
            }
        }
        for (v, whole) in open.wholes {
            slices.remove(&v);
            env.insert(v, whole);
        }
        self.end_group(open.group);
    }

    /// The entry at `ivs` (indices of the leading axes) of buffer `b` of a value of type `ty`,
    /// `tile` elements along each: axes of size 1 (broadcast) at 0, every leading axis kept.
    fn entry(&mut self, b: &Buf, ty: &Type, ivs: &[String], tile: &[u64]) -> Buf {
        let at = ivs
            .iter()
            .zip(tile)
            .enumerate()
            .map(|(axis, (iv, &size))| match ty.dims[axis].size {
                1 => (axis, self.e.index(0), 1),
                _ => (axis, iv.clone(), size),
            })
            .collect::<Vec<_>>();
        self.e.blocks(b, &at, true)
    }
}
