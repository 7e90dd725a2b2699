//! A select that keeps a slice where a stage is idle, `select(mask, new, slice)` computed in
//! that slice (`Decision::ElementwiseIntoSlice`: the ticked schedules writing a stage's input
//! into its ring slot), as a loop over the stages that copies `new` into the active stages'
//! parts only. As one loop nest it read the mask, `new` and the slice at every element and
//! wrote every element back, though under the parity order only half of the stages are in
//! their forward phase in a tick.

use super::buf::Buf;
use super::fuse;
use super::walk::Walker;
use ppc_dialect::ir::{Block, Func, OpId, ValueId};
use ppc_dialect::op::OpKind;
use std::collections::{HashMap, HashSet};

impl Walker<'_, '_> {
    /// Writes op `id` into `slice` as such a loop if it is `select(reshape(m), new, slice)`
    /// with `m` a stage mask (`[stages]`, along one axis of the slice) and `new` a buffer;
    /// false, with nothing written, otherwise.
    pub(super) fn keep_idle_stages(
        &mut self,
        (f, block, deferred): (&Func, &Block, &HashSet<ValueId>),
        env: &HashMap<ValueId, Buf>,
        id: OpId,
        slice: &Buf,
    ) -> bool {
        let OpKind::Select {
            cond,
            on_true,
            on_false,
        } = &f.ops[id].kind
        else {
            return false;
        };
        let mask = match fuse::producer(f, block, *cond).map(|p| &f.ops[p].kind) {
            Some(OpKind::Reshape { x }) => *x,
            _ => return false,
        };
        let stages = f.ty(mask).shape();
        // The mask's one axis, the stage axis, where the select reads it (`[stages, 1, ...]`,
        // or after a stage's layer axis, `[1, stages, 1, ...]`).
        let wide: Vec<usize> = (f.ty(*cond).shape().iter().enumerate())
            .filter(|&(_, &d)| d != 1)
            .map(|(i, _)| i)
            .collect();
        let kept = env.get(on_false).is_some_and(|b| b.name == slice.name);
        let fresh = !deferred.contains(on_true) && env.contains_key(on_true);
        let stage_axis = match wide[..] {
            [at] if f.ty(mask).is_stage_mask() && slice.ty.shape().get(at) == stages.first() => at,
            _ => return false,
        };
        if !(kept && fresh && env.contains_key(&mask))
            || env[on_true].ty.shape() != slice.ty.shape()
        {
            return false;
        }
        let (mask, new) = (&env[&mask], &env[on_true]);
        let group = self.begin_group(f, id, "select".to_string());
        let s = self.e.begin_for(stages[0]);
        let active = self
            .e
            .let_(&format!("memref.load {}[{s}] : {}", mask.name, mask.mty()));
        self.e.open(&format!("scf.if {active} {{"));
        let from = self.e.slot(new, &s, stage_axis, true);
        let to = self.e.slot(slice, &s, stage_axis, true);
        self.e.copy(&from, &to);
        self.e.close();
        self.e.end_for();
        self.end_group(group);
        true
    }
}
