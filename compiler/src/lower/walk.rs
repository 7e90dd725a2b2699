//! Writes a function's blocks as the plan of each says (`plan.rs`), inlining calls: one arm
//! per [`Decision`]. Values map to buffers (`env`); what is decided here is only what depends
//! on buffers already written: which accumulator buffer a call's adds fold into, which
//! buffer read for the last time an elementwise op writes over, and whether the update that
//! reads a matmul writes in place (then the matmul is computed in its slice).

use super::accumulate::{self, Accumulation};
use super::batch_split::Step;
use super::buf::Buf;
use super::emit::Emitter;
use super::fast_math::Numerics;
use super::params::{ParamId, Params};
use super::plan::{self, BlockPlan, Decision, Fusion};
use super::stage_split::{self, StageLoop};
use super::{destinations, fuse, in_place, matmul, ops, summed_matmul, views};
use ppc_dialect::ir::{names, Block, Func, FuncId, Module, OpId, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::{DType, Diagnostic, Type};
use ppc_runtime::abi;
use std::collections::{HashMap, HashSet};

/// The block being written, its plan and where its values go besides new buffers.
struct Scope<'s> {
    f: &'s Func,
    block: &'s Block,
    plan: &'s BlockPlan,
    into: &'s HashMap<ValueId, Buf>,
    /// Among them, those in a buffer given from outside that nothing else reads, and the
    /// values computed in place on the way to them (`destinations.rs`).
    dest: &'s HashMap<ValueId, Buf>,
    /// The slot each update of `BlockPlan::in_slots` writes, where its value goes there.
    slots: &'s HashMap<OpId, Buf>,
    add_into: &'s HashMap<ValueId, Buf>,
    /// Values the caller adds into these accumulators, slice by slice where their loop writes
    /// each (`accumulate::summed_by_slices`).
    sums: &'s HashMap<ValueId, Buf>,
}

impl Scope<'_> {
    /// Whether `v` goes into a buffer given from outside: a carried one or a chain output's.
    fn placed(&self, st: &Written, v: ValueId) -> bool {
        self.into.contains_key(&v) || st.slices.contains_key(&v)
    }
}

/// What writing a block has done so far.
#[derive(Default)]
struct Written {
    /// The values of the open chain's outputs: their entry's slices.
    slices: HashMap<ValueId, Buf>,
    /// Values whose buffers this block allocated for them (no view, no caller's buffer), in
    /// the order they were made: an elementwise op may write over one that only it reads
    /// (which one must not depend on a hash order, or the same model would compile to
    /// different code from run to run).
    fresh: Vec<ValueId>,
    /// Adds the call before them did.
    folded: HashSet<OpId>,
    /// Values a split call reads at each stage's slot (`AtStageSlot`); their buffer in `env`
    /// is the indexed one.
    per_stage: HashMap<ValueId, StageSlot>,
    /// In-place updates whose value was computed in their slice (`MatMulIntoSlice`,
    /// `ElementwiseIntoSlice`).
    in_slice: HashSet<OpId>,
    /// The GPipe loops written so far (`--trace` spans).
    gpipe_loops: usize,
    /// The ticks of the loops over ticks (`--schedule 1f1b`) written so far.
    ticks: u64,
}

/// Where a split call's argument is read at each stage's own slot (`Decision::AtStageSlot`):
/// position `index[stage]` along `axis` of the stage's slice of the indexed buffer, then, where
/// the stage axis is not first in the callee's argument, permuted by `perm` (a view either way).
#[derive(Clone)]
pub(super) struct StageSlot {
    pub index: Buf,
    pub axis: usize,
    pub perm: Option<Vec<usize>>,
}

/// The type of `v`'s buffer: its stage's slice inside a loop over a call's stages, its entry's
/// inside a loop over a batched chain's entries.
pub(super) fn value_type(e: &Emitter, f: &Func, v: ValueId) -> Type {
    let ty = match e.nest.in_stage_split() {
        true => stage_split::slice_type(f.ty(v)),
        false => f.ty(v).clone(),
    };
    e.nest.entry_type(&ty)
}

/// Walks functions, inlining calls; values map to buffers.
pub(super) struct Walker<'m, 'a> {
    pub m: &'m Module,
    /// The function the entry runs (`@pipeline`, or the training step's `@train_vjp`): the
    /// loops of its body are the GPipe loops.
    pub entry: &'m Func,
    pub e: Emitter<'a>,
    pub numerics: Numerics,
    /// The weights of the functions the entry reaches (`params.rs`).
    pub params: Params,
    /// Their entry arguments, in first-use order.
    pub bound: Vec<(ParamId, Buf)>,
    /// Names of the loop nests marked for `--trace`, in the order of their numbers.
    pub groups: Vec<String>,
    /// Calls being emitted around what is written now.
    pub calls: usize,
    /// The masks of the function being written that hold only `true` there: its stage mask
    /// inside a call made only for an active stage (a `call_if` on it, a split call's
    /// bubble test), and their reshapes.
    pub true_masks: HashSet<ValueId>,
}

impl Walker<'_, '_> {
    /// Emits `f`'s body with `args` bound, its results computed straight into the buffers of
    /// `into` (by result index) where the walk can (the entry's results into its arguments);
    /// returns its result buffers.
    pub fn func(
        &mut self,
        f: FuncId,
        args: Vec<Buf>,
        into: &HashMap<usize, Buf>,
    ) -> Result<Vec<Buf>, Diagnostic> {
        let none = HashMap::new();
        self.func_into(f, args, into, &none, &none, &[])
    }

    /// As [`Walker::func_into`] (no `sum_into`), with results `sums` (by index) added into the
    /// given accumulators: slice by slice where the callee's loop writes them, if it can
    /// (`accumulate::summed_by_slices`), else after its body.
    pub(super) fn func_adding(
        &mut self,
        id: FuncId,
        args: Vec<Buf>,
        (into, add_into): (&HashMap<usize, Buf>, &HashMap<usize, Buf>),
        true_args: &[usize],
        sums: &HashMap<usize, Buf>,
    ) -> Result<Vec<Buf>, Diagnostic> {
        let g = &self.m.funcs[id];
        let known = true_masks(g, true_args.iter().map(|&i| g.body.args[i]));
        let (by_slices, after): (HashMap<usize, Buf>, HashMap<usize, Buf>) = (sums.iter())
            .map(|(&i, acc)| (i, acc.clone()))
            .partition(|&(i, _)| {
                accumulate::summed_by_slices(g, i, &known, self.e.nest.in_stage_split())
            });
        let outs = self.func_into(id, args, into, add_into, &by_slices, true_args)?;
        let mut after: Vec<(usize, Buf)> = after.into_iter().collect();
        after.sort_by_key(|&(i, _)| i);
        for (i, acc) in after {
            self.e.add_to(&acc, &outs[i]);
        }
        Ok(outs)
    }

    /// As [`Walker::func`], with results computed straight into the buffers of `into` where
    /// the plan allows, by a GEMM adding into those of `add_into`, and added into those of
    /// `sum_into` slice by slice (all by result index; `accumulate.rs`); arguments `true_args`
    /// hold only `true`.
    fn func_into(
        &mut self,
        id: FuncId,
        args: Vec<Buf>,
        into: &HashMap<usize, Buf>,
        add_into: &HashMap<usize, Buf>,
        sum_into: &HashMap<usize, Buf>,
        true_args: &[usize],
    ) -> Result<Vec<Buf>, Diagnostic> {
        let f = &self.m.funcs[id];
        let mut env: HashMap<ValueId, Buf> = f.body.args.iter().copied().zip(args).collect();
        for (i, p) in f.params.iter().enumerate() {
            let buf = self.param(self.params.id(id, i));
            let buf = self.e.stage_slice(&buf, f.ty(p.value));
            env.insert(p.value, buf);
        }
        // A value returned at several indices goes where its first one says (not where a
        // hash order does).
        let by_value = |bufs: &HashMap<usize, Buf>| -> HashMap<ValueId, Buf> {
            let mut at: Vec<(&usize, &Buf)> = bufs.iter().collect();
            at.sort_by_key(|&(&i, _)| i);
            let mut out = HashMap::new();
            for (&i, b) in at {
                out.entry(f.body.results[i]).or_insert_with(|| b.clone());
            }
            out
        };
        let fusion = Fusion::of(f, &f.body);
        let true_masks = true_masks(f, true_args.iter().map(|&i| f.body.args[i]));
        let outer = std::mem::replace(&mut self.true_masks, true_masks);
        let written = self.block(
            f,
            &f.body,
            fusion,
            &mut env,
            &by_value(into),
            &by_value(add_into),
            &by_value(sum_into),
        );
        self.true_masks = outer;
        written?;
        Ok(f.body.results.iter().map(|v| env[v].clone()).collect())
    }

    /// The entry argument of weight `id`, `%pN` in first-use order.
    fn param(&mut self, id: ParamId) -> Buf {
        if let Some((_, b)) = self.bound.iter().find(|(p, _)| *p == id) {
            return b.clone();
        }
        let b = Buf {
            base: self.e.buffer_id(),
            name: format!("%p{}", self.bound.len()),
            ty: self.params.weight(id).ty.clone(),
            layout: None,
        };
        self.bound.push((id, b.clone()));
        b
    }

    /// Plans `block` (`plan.rs`) and writes it. `into`: the values computed straight into a
    /// loop's carried buffer (`in_place.rs`) and that buffer; `add_into`: the matmul results
    /// that add into the caller's buffer; `sums`: the values added into the caller's buffer
    /// slice by slice.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &mut self,
        f: &Func,
        block: &Block,
        fusion: Fusion,
        env: &mut HashMap<ValueId, Buf>,
        into: &HashMap<ValueId, Buf>,
        add_into: &HashMap<ValueId, Buf>,
        sums: &HashMap<ValueId, Buf>,
    ) -> Result<(), Diagnostic> {
        let sums = &self.sum_chains(f, block, sums);
        let cx = plan::Context {
            numerics: self.numerics,
            gpu: self.e.gpu.is_some(),
            in_parallel_loop: self.e.nest.in_parallel_loop(),
            in_stage_split: self.e.nest.in_stage_split(),
            carried: into.keys().chain(add_into.keys()).copied().collect(),
            accumulated: add_into.keys().copied().collect(),
            true_masks: self.true_masks.clone(),
            summed: sums.keys().copied().collect(),
        };
        let plan = BlockPlan::new(self.m, f, block, fusion, &cx);
        // The plan was made without them: `Context::carried` lists `into`'s own values only.
        let dest = destinations::of(f, block, &plan, into, env);
        let mut into = into.clone();
        for (v, b) in &dest {
            into.entry(*v).or_insert_with(|| b.clone());
        }
        // A value an in-place update writes into its slot is computed there: the slot's view
        // is made first, the loop's counter being known.
        let mut slots = HashMap::new();
        for &(v, update) in &plan.in_slots {
            let OpKind::Update { x, index, axis, .. } = &f.ops[update].kind else {
                unreachable!("invariant: planned for updates")
            };
            let written = f.ops[update].results[0];
            let whole = (into.get(&written))
                .filter(|b| b.name == env[x].name && !sums.contains_key(&written));
            let Some(whole) = whole.cloned() else {
                continue;
            };
            if into.contains_key(&v) {
                continue;
            }
            let slot = views::index(&mut self.e, &whole, &env[index], *axis);
            into.insert(v, slot.clone());
            slots.insert(update, slot);
        }
        let s = Scope {
            f,
            block,
            plan: &plan,
            into: &into,
            dest: &dest,
            slots: &slots,
            add_into,
            sums,
        };
        let mut st = Written::default();
        let mut open = None;
        let mut lives = self.lives(f, block, &plan);
        for (k, step) in plan.steps.iter().enumerate() {
            match *step {
                Step::Begin(c) => {
                    let chain = &plan.chains[c];
                    let wholes = chain
                        .outputs
                        .iter()
                        .map(|&v| (v, self.output(&s, &st, v)))
                        .collect();
                    open = Some(self.begin_chain(f, chain, wholes, env, &mut st.slices));
                }
                Step::End(c) => {
                    let chain = open.take().expect("invariant: Begin comes before End");
                    self.end_chain(&plan.chains[c], chain, env, &mut st.slices);
                }
                Step::Op(id) => self.op(&s, &mut st, env, id)?,
            }
            if open.is_none() {
                self.give_back(&mut lives, env, k);
            }
        }
        Ok(())
    }

    /// `sums` (values of `block` the caller adds into its accumulators slice by slice) and the
    /// values they are made from (`accumulate::summed_by_slices`), each with the buffer it adds
    /// into: through a select the same, through a transpose the inverse view of it.
    fn sum_chains(
        &mut self,
        f: &Func,
        block: &Block,
        sums: &HashMap<ValueId, Buf>,
    ) -> HashMap<ValueId, Buf> {
        let mut chains = HashMap::new();
        // In value order: the views are emitted here, and a hash order would write the same
        // program differently from one compile to the next.
        let mut roots: Vec<(&ValueId, &Buf)> = sums.iter().collect();
        roots.sort_by_key(|&(v, _)| *v);
        for (&v, acc) in roots {
            let (mut v, mut acc) = (v, acc.clone());
            loop {
                chains.insert(v, acc.clone());
                let made = block.ops.iter().find(|&&o| f.ops[o].results.contains(&v));
                match made.map(|&o| &f.ops[o].kind) {
                    Some(OpKind::Select { on_true, .. }) => v = *on_true,
                    Some(OpKind::Transpose { x, perm }) => {
                        let mut inverse = vec![0; perm.len()];
                        for (i, &p) in perm.iter().enumerate() {
                            inverse[p] = i;
                        }
                        let ty = value_type(&self.e, f, *x);
                        acc = views::transpose(&mut self.e, &acc, &inverse, &ty);
                        v = *x;
                    }
                    _ => break,
                }
            }
        }
        chains
    }

    /// Where `v` is computed: a loop's carried buffer, its entry of a chain's output, or a new
    /// buffer.
    fn output(&mut self, s: &Scope, st: &Written, v: ValueId) -> Buf {
        s.into
            .get(&v)
            .or_else(|| st.slices.get(&v))
            .cloned()
            .unwrap_or_else(|| self.e.alloc(&value_type(&self.e, s.f, v)))
    }

    /// Writes op `id` as the plan decided.
    fn op(
        &mut self,
        s: &Scope,
        st: &mut Written,
        env: &mut HashMap<ValueId, Buf>,
        id: OpId,
    ) -> Result<(), Diagnostic> {
        let (f, op) = (s.f, &s.f.ops[id]);
        let decision = &s.plan.decisions[&id];
        if *decision == Decision::Skip || st.folded.contains(&id) {
            return Ok(()); // computed inside its consumer's loop nest, or by a GEMM
        }
        self.e.at(f.op_spans.get(&id));
        // Deferred values have no buffer; only elementwise ops, which fuse them, read them. A
        // summed matmul reads the matmul's operands.
        let ins: Vec<Buf> =
            if op.kind.is_elementwise() || matches!(decision, Decision::SummedMatMul { .. }) {
                Vec::new()
            } else {
                op.kind.operands().iter().map(|v| env[v].clone()).collect()
            };
        let result = op.results[0];
        match decision {
            Decision::Skip => unreachable!("returned above"),
            Decision::View => {
                let ty = value_type(&self.e, f, result);
                let view = match &op.kind {
                    OpKind::Transpose { perm, .. } => {
                        views::transpose(&mut self.e, &ins[0], perm, &ty)
                    }
                    _ => views::reshape(&mut self.e, &ins[0], &ty),
                };
                env.insert(result, view);
            }
            Decision::UpdateSlice { scalar } => {
                // Only the slice is written, after a copy of `x` unless `x` is the output
                // buffer itself (a carried accumulator updated in place).
                let OpKind::Update { x, axis, .. } = &op.kind else {
                    unreachable!("invariant: planned for updates")
                };
                // A slice the caller adds into its accumulator is added there: `x` is the
                // accumulator (a loop's carried value) or `-0.0`s, whose adds change nothing.
                let summed = s.sums.get(&result);
                let out = match summed {
                    Some(acc) => acc.clone(),
                    None => self.output(s, st, result),
                };
                // Where the value was computed in its slot (`BlockPlan::in_slots`), it is there.
                let in_slot = s.slots.get(&id).is_some_and(|b| b.name == ins[1].name);
                if !st.in_slice.contains(&id) && !in_slot {
                    let name = if summed.is_some() {
                        "update+add"
                    } else {
                        "update"
                    };
                    let group = self.begin_group(f, id, name.to_string());
                    if summed.is_none() && env[x].name != out.name {
                        self.e.copy(&env[x], &out);
                    }
                    let slice = views::index(&mut self.e, &out, &env[scalar], *axis);
                    match summed {
                        Some(_) => self.e.add_to(&slice, &ins[1]),
                        None => self.e.copy(&ins[1], &slice),
                    }
                    self.end_group(group);
                }
                env.insert(result, out);
            }
            Decision::MatMulIntoSlice { update } => {
                let out = match self.slice_in_place(s, st, env, *update, id) {
                    Some(slice) => slice,
                    None => {
                        let out = self.output(s, st, result);
                        if !s.placed(st, result) {
                            st.fresh.push(result);
                        }
                        out
                    }
                };
                ops::lower(&mut self.e, self.numerics, &op.kind, &ins, &out);
                env.insert(result, out);
            }
            Decision::ElementwiseIntoSlice { update } => {
                let slice = self.slice_in_place(s, st, env, *update, id);
                let scope = (f, s.block, &s.plan.fusion.deferred);
                match slice {
                    Some(slice) if self.keep_idle_stages(scope, env, id, &slice) => {
                        env.insert(result, slice);
                    }
                    slice => self.elementwise(s, st, env, id, slice),
                }
            }
            Decision::GuardedUpdate { update, scalar } => {
                let OpKind::Select { cond, on_false, .. } = &op.kind else {
                    unreachable!("invariant: planned for selects")
                };
                let OpKind::Update { update, axis, .. } = &f.ops[*update].kind else {
                    unreachable!("invariant: guarded_updates pairs selects with updates")
                };
                let out = self.output(s, st, result);
                let group = self.begin_group(f, id, "update".to_string());
                if env[on_false].name != out.name {
                    self.e.copy(&env[on_false], &out);
                }
                self.e.begin_if(&env[cond]);
                let slice = views::index(&mut self.e, &out, &env[scalar], *axis);
                self.e.copy(&env[update], &slice);
                self.e.end_if();
                self.end_group(group);
                env.insert(result, out);
            }
            Decision::IndexView { scalar } => {
                // A stage's layer loop picking its layer's weights: a view of the stacked
                // weights, no copy.
                let OpKind::Index { x, axis, .. } = &op.kind else {
                    unreachable!("invariant: planned for indexes")
                };
                let view = views::index(&mut self.e, &env[x], &env[scalar], *axis);
                env.insert(result, view);
            }
            Decision::AtStageSlot => {
                let slot = match &op.kind {
                    OpKind::Index { x, index, axis } => {
                        env.insert(result, env[x].clone());
                        StageSlot {
                            index: env[index].clone(),
                            axis: *axis,
                            perm: None,
                        }
                    }
                    OpKind::Transpose { x, perm } => {
                        env.insert(result, env[x].clone());
                        StageSlot {
                            perm: Some(perm.clone()),
                            ..st.per_stage[x].clone()
                        }
                    }
                    _ => unreachable!("invariant: planned for indexes and their transposes"),
                };
                st.per_stage.insert(result, slot);
            }
            Decision::Call { stages } => self.call(s, st, env, id, ins, *stages)?,
            Decision::Alias { of } => {
                env.insert(result, env[of].clone());
            }
            Decision::Summed => {
                env.insert(result, s.sums[&result].clone());
            }
            Decision::MatMulInto => {
                let acc = s.add_into[&result].clone();
                matmul::matmul_into(&mut self.e, &ins[0], &ins[1], ins.get(2), &acc);
                env.insert(result, acc);
            }
            Decision::SummedMatMul { matmul } => {
                let (OpKind::MatMul { lhs, rhs, mask }, OpKind::Reduce { axes, .. }) =
                    (&f.ops[*matmul].kind, &op.kind)
                else {
                    unreachable!("invariant: planned for a reduce of a matmul")
                };
                let out = self.output(s, st, result);
                if !s.placed(st, result) {
                    st.fresh.push(result);
                }
                let order = summed_matmul::operand_order(f.ty(*lhs).rank(), axes);
                let in_order = order.iter().enumerate().all(|(i, &a)| i == a);
                let mut operand = |v: &ValueId| match in_order {
                    true => env[v].clone(),
                    false => {
                        let ty = summed_matmul::permuted(&env[v].ty, &order);
                        views::transpose(&mut self.e, &env[v], &order, &ty)
                    }
                };
                let (a, b) = (operand(lhs), operand(rhs));
                let mask = mask.map(|m| env[&m].clone());
                matmul::matmul(&mut self.e, self.numerics, &a, &b, mask.as_ref(), &out);
                env.insert(result, out);
            }
            Decision::Unfilled => {
                let out = self.output(s, st, result);
                env.insert(result, out);
            }
            Decision::Loop => self.for_loop(s, st, env, id, &ins)?,
            Decision::Elementwise => self.elementwise(s, st, env, id, None),
            Decision::Compute => {
                let out = self.output(s, st, result);
                if !s.placed(st, result) {
                    st.fresh.push(result);
                }
                // GEMMs have spans of their own, from the runtime.
                let group = (!matches!(op.kind, OpKind::MatMul { .. }))
                    .then(|| self.begin_group(f, id, op.kind.name().to_string()))
                    .flatten();
                ops::lower(&mut self.e, self.numerics, &op.kind, &ins, &out);
                self.end_group(group);
                env.insert(result, out);
            }
        }
        Ok(())
    }

    /// A call, inlined (or as one loop over the callee's stages), with the adds of
    /// its results the plan found folded into it where the accumulator's buffer allows.
    fn call(
        &mut self,
        s: &Scope,
        st: &mut Written,
        env: &mut HashMap<ValueId, Buf>,
        id: OpId,
        ins: Vec<Buf>,
        split: Option<StageLoop>,
    ) -> Result<(), Diagnostic> {
        let (f, op) = (s.f, &s.f.ops[id]);
        let OpKind::Call { callee, on, args } = &op.kind else {
            unreachable!("invariant: planned for calls")
        };
        let mut ins = ins;
        let guard = on.map(|_| ins.remove(0));
        // Arguments a stage reads at its own slot: each stage's slot, in the loop over them.
        let at_slots: HashMap<usize, StageSlot> = (args.iter().enumerate())
            .filter_map(|(i, a)| st.per_stage.get(a).map(|slot| (i, slot.clone())))
            .collect();
        assert!(
            at_slots.is_empty() || split.is_some(),
            "invariant: a stage's slot is read by a call split into stages"
        );
        // A `call_if` inlined on the CPU adds the results no GEMM adds into after its body,
        // inside its test: a skipped call makes no pass over the accumulator (the ticked
        // schedules' weight gradients, whose calls run in fewer than half the ticks).
        let gemm = |a: &&Accumulation| s.plan.gemm_accumulations.iter().any(|g| g.add == a.add);
        let after_body: Vec<&Accumulation> = match (split, &guard, self.e.gpu.is_some()) {
            (None, Some(_), false) => (s.plan.stage_accumulations.iter())
                .filter(|a| a.call == id && !gemm(a))
                .collect(),
            _ => Vec::new(),
        };
        let added_in_test = |i: usize| after_body.iter().any(|a| a.result == i);
        // `call_if`: the callee computes into buffers allocated outside the `scf.if` (or the
        // loop's carried buffers, where `in_place.rs` allows), which its `else` fills with
        // -0.0; a result added in the test is read there only and needs none. Any other call
        // computes into the carried buffers `in_place.rs` allows (ZB-H1's `B`, the stash its
        // `W` reads in the next tick) or their slots (`BlockPlan::in_slots`: the training
        // forward's tapes), where it can.
        // Never into a buffer an argument is bound to (a select aliased to its operand is one
        // that `in_place.rs` cannot see): the callee would write what it still reads.
        let unread = |b: &&Buf| ins.iter().all(|a| a.base != b.base);
        let finals: HashMap<usize, Buf> = match guard {
            Some(_) => (op.results.iter().enumerate())
                .filter(|&(i, _)| !added_in_test(i))
                .map(|(i, &r)| match s.into.get(&r).filter(unread) {
                    Some(b) => (i, b.clone()),
                    None => (i, self.e.alloc(&value_type(&self.e, f, r))),
                })
                .collect(),
            None => (op.results.iter().enumerate())
                .filter_map(|(i, r)| Some((i, s.into.get(r).filter(unread)?.clone())))
                .collect(),
        };
        if self.calls == 0 && self.e.nest.loops > 0 {
            self.count_stage_slots(*callee, &ins);
        }
        // The adds this call's results fold into: into the accumulator's own buffer (where it
        // is the sum's, or the add reads it last), or a fresh one holding a copy of it (made
        // before a `call_if`'s test: where the call is skipped, the sum is the accumulator).
        let accumulations = match split {
            Some(_) => &s.plan.stage_accumulations,
            None => &s.plan.gemm_accumulations,
        };
        let mut adds = HashMap::new();
        for a in (accumulations.iter().filter(|a| a.call == id)).chain(after_body.iter().copied()) {
            let sum = f.ops[a.add].results[0];
            let acc = env[&a.acc].clone();
            let out = match s.into.get(&sum) {
                Some(b) if b.name != acc.name => continue,
                Some(b) => b.clone(),
                None if st.fresh.contains(&a.acc)
                    && s.plan.sole_readers.get(&a.acc) == Some(&a.add)
                    && acc.ty.same_as(&value_type(&self.e, f, sum)) =>
                {
                    st.fresh.retain(|&v| v != a.acc);
                    st.fresh.push(sum);
                    acc
                }
                None => {
                    let b = self.e.alloc(&value_type(&self.e, f, sum));
                    self.e.copy(&acc, &b);
                    st.fresh.push(sum);
                    b
                }
            };
            adds.insert(a.result, (a.add, out));
        }
        let add_into = (adds.iter())
            .filter(|&(&i, _)| !added_in_test(i))
            .map(|(&i, (_, b))| (i, b.clone()))
            .collect();
        let sums: HashMap<usize, Buf> = (after_body.iter())
            .map(|a| (a.result, adds[&a.result].1.clone()))
            .collect();
        if let Some(flag) = &guard {
            self.e.begin_if(flag);
        }
        // The calls the pipeline's loops make (a stage's body) are functions of their own on
        // the CPU; the calls inside them are inlined, as are those outside every loop (the
        // model's ends, the loss), which run once.
        let outline = self.calls == 0 && self.e.gpu.is_none() && self.e.nest.loops > 0;
        let mark = self.e.mark();
        if outline {
            self.e.begin_outlined();
        }
        self.calls += 1;
        let outs = match split {
            Some(stages) => {
                let read = stage_split::results_read(f, op);
                let placed = (&finals, &add_into);
                self.split_call(*callee, (ins, &at_slots), &read, placed, stages)?
            }
            None => {
                let true_args = on.map(|c| guard_args(f, c, op)).unwrap_or_default();
                let placed = (&finals, &add_into);
                self.func_adding(*callee, ins, placed, &true_args, &sums)?
            }
        };
        self.calls -= 1;
        // A `call_if`'s results are copied where the plan could not compute them into their
        // buffer (a view, an argument), inside the region, which may define the view. A
        // result added into its accumulator stays there: where a `call_if` is skipped, the
        // sum is the accumulator. Another call's result left elsewhere is copied by what
        // reads it: the loop's yield, the update writing it into its slot.
        let outs: Vec<Buf> = match guard {
            Some(_) => (outs.iter().enumerate())
                .map(|(i, out)| {
                    if adds.contains_key(&i) {
                        return out.clone();
                    }
                    if out.name != finals[&i].name {
                        self.e.copy(out, &finals[&i]);
                    }
                    finals[&i].clone()
                })
                .collect(),
            None => outs,
        };
        // The results are buffers allocated at function entry (a stage's layer loop's carried
        // values, a split call's wholes, a `call_if`'s), so code after the region can name
        // them; a view made inside it (a reshape the stage returns when it has no layer loop)
        // is copied into one.
        let outs: Vec<Buf> = if outline {
            let outs = outs
                .into_iter()
                .map(|out| match self.e.defined_since(&out, mark) {
                    true => {
                        let whole = self.e.alloc(&out.ty);
                        self.e.copy(&out, &whole);
                        whole
                    }
                    false => out,
                })
                .collect();
            self.e.end_outlined();
            outs
        } else {
            outs
        };
        if guard.is_some() {
            self.e.begin_else();
            let unfolded = (outs.iter().enumerate()).filter(|(i, _)| !adds.contains_key(i));
            for (_, out) in unfolded {
                let zero = if out.ty.dtype.is_float() { -0.0 } else { 0.0 };
                let zero = self.e.constant(zero, out.ty.dtype);
                self.e.fill(&zero, out);
            }
            self.e.end_if();
        }
        env.extend(op.results.iter().copied().zip(outs));
        for (add, out) in adds.into_values() {
            env.insert(f.ops[add].results[0], out);
            st.folded.insert(add);
        }
        Ok(())
    }

    /// A pipeline loop's call of a stage function tells the runtime which of its stages have
    /// work (`--bench`'s measured bubble): the callee's `i1` argument with the stage axis. A
    /// recomputation (`@stage_recompute`, 1F1B) and a weight gradient (`@stage_vjp_weight`,
    /// ZB-H1) are part of their backward's work, not a slot's.
    fn count_stage_slots(&mut self, callee: FuncId, ins: &[Buf]) {
        let g = &self.m.funcs[callee];
        if names::is_stage_weight_grad(&g.name) || g.name == names::recompute(names::STAGE) {
            return;
        }
        let mask = (g.body.args.iter().zip(ins))
            .find_map(|(&a, buf)| g.ty(a).is_stage_mask().then_some(buf));
        let Some(mask) = mask else { return };
        let entry = &abi::COUNT_STAGE_SLOTS;
        self.e.declare(entry);
        self.e.host_reads(mask);
        let cast = self.e.let_(&format!(
            "memref.cast {} : {} to memref<*xi1>",
            mask.name,
            mask.mty()
        ));
        self.e.op(&entry.call(&[&cast]));
    }

    /// A loop: `scf.for` over host code, its carried values in buffers of their own (copied in
    /// unless the body overwrites them first), its body's yields computed in place where
    /// `in_place.rs` allows.
    fn for_loop(
        &mut self,
        s: &Scope,
        st: &mut Written,
        env: &mut HashMap<ValueId, Buf>,
        id: OpId,
        ins: &[Buf],
    ) -> Result<(), Diagnostic> {
        let (f, op) = (s.f, &s.f.ops[id]);
        let OpKind::Loop { trips, body, .. } = &op.kind else {
            unreachable!("invariant: planned for loops")
        };
        // A carried value the caller adds into an accumulator slice by slice
        // (`accumulate::summed_by_slices`) is carried in the accumulator, and each iteration
        // adds its slice there.
        let overwritten = in_place::overwritten(f, body, *trips);
        // Else a carried value goes where the loop's result goes (`destinations.rs`), or
        // starts in its init's buffer where the loop reads that last, or in a buffer of its own.
        let carried: Vec<Buf> = (ins.iter().zip(&op.results).enumerate())
            .map(|(j, (b, r))| match (s.sums.get(r), s.dest.get(r)) {
                (Some(acc), _) => {
                    assert!(overwritten.contains(&j), "invariant: checked by the caller");
                    acc.clone()
                }
                (None, Some(d)) => d.clone(),
                (None, None) if self.init_taken_over(s, st, id, j) => b.clone(),
                (None, None) => self.e.alloc(&b.ty),
            })
            .collect();
        let sums: HashMap<ValueId, Buf> = (op.results.iter().zip(&body.results))
            .filter_map(|(r, &y)| Some((y, s.sums.get(r)?.clone())))
            .collect();
        for (j, (src, dst)) in ins.iter().zip(&carried).enumerate() {
            if !overwritten.contains(&j) {
                self.e.copy(src, dst);
            }
        }
        let t = self.e.alloc(&f.ty(body.args[0]).clone());
        // The GPipe loop's iterations are spans of `--trace` (a flag test when tracing is off);
        // a stage's loop over its layers is not. Its buffers are its own.
        let gpipe = std::ptr::eq(f, self.entry) && std::ptr::eq(s.block, &f.body);
        if gpipe {
            self.e.begin_loop_buffers();
        }
        let iv = self.e.begin_host_loop(*trips);
        let ti = self
            .e
            .let_(&format!("arith.index_cast {iv} : index to i32"));
        self.e.host_writes(&t);
        self.e
            .op(&format!("memref.store {ti}, {}[] : {}", t.name, t.mty()));
        // The training step runs the forward loop, then the backward loop, which takes forward
        // iteration `trips - 1 - t` back at its iteration `t` and is numbered so.
        // The loop over ticks of `--schedule 1f1b` is numbered by tick.
        let ticking = (body.args[1..].iter()).any(|&a| names::is_tick_ring(&f.values[a].name));
        let span = match (gpipe, st.gpipe_loops) {
            (false, _) => None,
            (true, _) if ticking => {
                let before = self.e.constant(st.ticks as f64, DType::I32);
                st.ticks += *trips;
                let tick = self.e.let_(&format!("arith.addi {before}, {ti} : i32"));
                Some((&abi::TRACE_ITERATION, tick))
            }
            (true, 0) => Some((&abi::TRACE_ITERATION, ti.clone())),
            (true, _) => {
                for f in &abi::TRACE_BACKWARD {
                    self.e.declare(f);
                }
                let last = self.e.constant((*trips - 1) as f64, DType::I32);
                let reversed = self.e.let_(&format!("arith.subi {last}, {ti} : i32"));
                Some((&abi::TRACE_BACKWARD, reversed))
            }
        };
        st.gpipe_loops += usize::from(gpipe);
        let trace = |e: &mut Emitter, end: usize| {
            if let Some((calls, index)) = &span {
                e.op(&calls[end].call(&[index]));
            }
        };
        trace(&mut self.e, 0);
        env.insert(body.args[0], t);
        env.extend(body.args[1..].iter().copied().zip(carried.iter().cloned()));
        let fusion = Fusion::of(f, body);
        let into = in_place::plan(f, body, &fusion.deferred)
            .into_iter()
            .map(|(v, j)| (v, carried[j].clone()))
            .collect();
        self.block(f, body, fusion, env, &into, &HashMap::new(), &sums)?;
        self.e.at(f.op_spans.get(&id));
        let yields: Vec<Buf> = body.results.iter().map(|v| env[v].clone()).collect();
        self.carry(&yields, &carried);
        trace(&mut self.e, 1);
        self.e.end_host_loop();
        if gpipe {
            self.e.end_loop_buffers();
        }
        // A carried buffer is the loop's own (or its init's, taken over): an elementwise op or
        // a GEMM's accumulation after the loop may write over it where it reads it last.
        let own: Vec<ValueId> = (op.results.iter().copied())
            .filter(|&r| !s.sums.contains_key(&r) && !s.placed(st, r))
            .collect();
        st.fresh.extend(own);
        env.extend(op.results.iter().copied().zip(carried));
        Ok(())
    }

    /// Whether loop `id` starts carried value `j` in its init's buffer: one this block made
    /// for it (`fresh`) that the loop reads last (`destinations::loop_takes_init`). Where the
    /// init was a fill of zeros (a gradient's accumulator), the loop then starts from it with
    /// no copy into a buffer of its own.
    fn init_taken_over(&self, s: &Scope, st: &mut Written, id: OpId, j: usize) -> bool {
        let OpKind::Loop { inits, .. } = &s.f.ops[id].kind else {
            unreachable!("invariant: planned for loops")
        };
        let v = inits[j];
        let taken =
            st.fresh.contains(&v) && destinations::loop_takes_init(s.f, s.block, s.plan, id, j);
        if taken {
            st.fresh.retain(|&w| w != v);
        }
        taken
    }

    /// An elementwise op and the deferred values it reads, as one loop nest: over a buffer of
    /// this block that only this op reads, if one has its type (a GELU over its matmul's
    /// result); else where [`Walker::output`] says.
    fn elementwise(
        &mut self,
        s: &Scope,
        st: &mut Written,
        env: &mut HashMap<ValueId, Buf>,
        id: OpId,
        into: Option<Buf>,
    ) {
        let f = s.f;
        let result = f.ops[id].results[0];
        let own = into.is_none() && !s.placed(st, result);
        let dying = own
            .then(|| {
                let ty = value_type(&self.e, f, result);
                st.fresh
                    .iter()
                    .copied()
                    .find(|w| s.plan.sole_readers.get(w) == Some(&id) && env[w].ty.same_as(&ty))
            })
            .flatten();
        let out = match (into, dying) {
            (Some(slice), _) => slice,
            (None, Some(w)) => env[&w].clone(),
            (None, None) => self.output(s, st, result),
        };
        let scope = fuse::Scope {
            f,
            block: s.block,
            env,
            deferred: &s.plan.fusion.deferred,
        };
        let name = fuse::ops_of(&scope, id).join("+");
        let group = self.begin_group(f, id, name);
        fuse::emit(&mut self.e, self.numerics, &scope, id, &out);
        self.end_group(group);
        if let Some(w) = dying {
            st.fresh.retain(|&v| v != w);
        }
        if own {
            st.fresh.push(result);
        }
        env.insert(result, out);
    }

    /// The slice of the carried buffer that `update` writes in place, where it does: the value
    /// it writes is then computed there by op `writer`, and the update copies nothing
    /// (`in_slice`). Where `writer` reads that slice through an `index`, its view is the one.
    fn slice_in_place(
        &mut self,
        s: &Scope,
        st: &mut Written,
        env: &HashMap<ValueId, Buf>,
        update: OpId,
        writer: OpId,
    ) -> Option<Buf> {
        let f = s.f;
        let OpKind::Update { x, index, axis, .. } = &f.ops[update].kind else {
            unreachable!("invariant: planned for updates")
        };
        let written = f.ops[update].results[0];
        let whole = (s.into.get(&written))
            .filter(|_| !s.sums.contains_key(&written))
            .filter(|b| b.name == env[x].name)?;
        st.in_slice.insert(update);
        let same_slice = |v: &ValueId| {
            fuse::producer(f, s.block, *v).is_some_and(|p| {
                matches!(&f.ops[p].kind, OpKind::Index { x: of, index: at, .. }
                    if of == x && at == index)
            }) && env.get(v).is_some_and(|b| b.base == whole.base)
        };
        if let Some(read) = f.ops[writer].kind.operands().iter().find(|v| same_slice(v)) {
            return Some(env[read].clone());
        }
        let split = self.e.nest.in_stage_split();
        let scalar = views::uniform(f, *index, split).expect("checked by the plan");
        Some(views::index(&mut self.e, whole, &env[&scalar], *axis))
    }

    /// Starts the `--trace` span of the loop nests op `id` of `f` lowers to, named `name` and
    /// its model line; returns its number. `None` inside a chain's loop over entries: the chain
    /// has one span of its own.
    pub(super) fn begin_group(
        &mut self,
        f: &Func,
        id: ppc_dialect::ir::OpId,
        name: String,
    ) -> Option<usize> {
        if self.e.nest.in_entries() {
            return None;
        }
        let (line, _) = self.e.lines.line_col(f.op_spans.get(&id).start as usize);
        let n = self.groups.len();
        self.groups.push(format!("{name}, line {line}"));
        let c = self.e.constant(n as f64, DType::I32);
        self.e.op(&abi::TRACE_GROUP[0].call(&[&c]));
        Some(n)
    }

    pub(super) fn end_group(&mut self, n: Option<usize>) {
        let Some(n) = n else {
            return;
        };
        let c = self.e.constant(n as f64, DType::I32);
        self.e.op(&abi::TRACE_GROUP[1].call(&[&c]));
    }

    /// Copies the yielded values into the carried buffers for the next iteration. A yield that
    /// is itself another carried buffer goes through a scratch copy first.
    fn carry(&mut self, yields: &[Buf], carried: &[Buf]) {
        let staged: Vec<Buf> = yields
            .iter()
            .enumerate()
            .map(|(i, y)| {
                if carried
                    .iter()
                    .enumerate()
                    .any(|(j, c)| j != i && c.name == y.name)
                {
                    let s = self.e.alloc(&y.ty);
                    self.e.copy(y, &s);
                    s
                } else {
                    y.clone()
                }
            })
            .collect();
        for (y, c) in staged.iter().zip(carried) {
            if y.name != c.name {
                self.e.copy(y, c);
            }
        }
    }
}

/// The masks of `f` that hold only `true` where `seeds` do: the seeds and their reshapes.
fn true_masks(f: &Func, seeds: impl Iterator<Item = ValueId>) -> HashSet<ValueId> {
    let mut known: HashSet<ValueId> = seeds.collect();
    loop {
        let more: Vec<ValueId> = (f.ops.values())
            .filter(|op| matches!(op.kind, OpKind::Reshape { x } if known.contains(&x)))
            .map(|op| op.results[0])
            .filter(|r| !known.contains(r))
            .collect();
        if more.is_empty() {
            return known;
        }
        known.extend(more);
    }
}

/// The arguments of `call_if` `op` of `f` that hold only `true` when it runs: its test `on`
/// itself, or the one-element mask `on` is a reshape of (a rank's only stage's mask).
fn guard_args(f: &Func, on: ValueId, op: &ppc_dialect::ir::Op) -> Vec<usize> {
    let OpKind::Call { args, .. } = &op.kind else {
        return Vec::new();
    };
    let reshaped = (f.ops.values())
        .find(|o| o.results.contains(&on))
        .and_then(|o| match o.kind {
            OpKind::Reshape { x } if f.ty(x).elements() == 1 => Some(x),
            _ => None,
        });
    (args.iter().enumerate())
        .filter(|&(_, &a)| a == on || Some(a) == reshaped)
        .map(|(i, _)| i)
        .collect()
}
