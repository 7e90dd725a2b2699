//! `autodiff`: reverse mode on ppc IR. For every function `@f` of the module (callees first) it
//! adds `@f_vjp`, its vector-Jacobian product:
//!
//! ```text
//! @f_vjp(args..., d_results...) -> (results..., d_args..., d_params...)
//! ```
//!
//! `d_args` are the cotangents of `@f`'s float arguments; `d_params` those of its trainable
//! parameters ([`trainables`]: its own, then its callees', each once), always f32, so that
//! gradients accumulate in f32 whatever the storage dtype. `@f_vjp` declares `@f`'s parameters
//! again, so it reads the same weights.
//!
//! The per-op rules are one table (`vjp.rs`); this file handles what needs the whole program:
//! - **call**: a call of `@g_vjp`, which recomputes `@g` inside (rematerialization: a stage's
//!   activations live only while its backward runs); the callee's parameter cotangents add up
//!   in the caller. With `--remat=none` (`remat.rs`) the forward calls `@g_fwd`, which also
//!   returns what the backward reads, and the backward `@g_bwd` on those residuals. Inside a
//!   called function (a stage) nothing is recomputed in either mode (`remat_of`), and the
//!   results of `@g_vjp` that no caller reads (the stage's output) are dropped, with what only
//!   they needed. Under `--remat=tick` (`--schedule 1f1b`), the backward of a stage call
//!   is `@g_recompute` (`@g_fwd` by the name of what it does there) then `@g_bwd`, the same
//!   ops as `@g_vjp`, which `1f1b` runs a tick apart.
//! - **loop** into a reverse loop of the same trip count. The forward loop keeps, per
//!   iteration, only the carried values the backward reads (a "tape" `[trips, ...]`); the
//!   reverse body recomputes from them what the rules need. For the GPipe loop that is the state
//!   buffer, i.e. each iteration's stage input (GPipe's choice); with `--remat=none`, every
//!   value the reverse body reads. Cotangents of values the body reads from outside,
//!   parameters included, accumulate in the reverse loop's carried values.
//! - **`@stage`** computes only where `%active`: its VJP returns zero cotangents (`-0.0`) for the
//!   inactive stages, so bubble slots contribute exactly nothing, even when poisoned with NaN
//!   (a select, except for cotangents of matmuls masked by `%active`, already `-0.0` there).
//!
//! Accumulators start at `-0.0` and add contributions in reverse iteration order, so the
//! pipelined gradient of a parameter is the same sum, in the same order, as the sequential
//! model's over microbatches `M-1, ..., 0`: equal bit for bit (tested).

use super::autodiff_kept::{bind, resolve, Residues};
pub use super::differ::Slot;
use super::differ::{Cots, Diff, Split};
use super::options::Options;
use super::remat::{recomputable, Remat};
use super::stage_mask::mask_inactive;
use super::vjp::{self, bin, zeros, Env};
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Block, Func, FuncId, Module, Op, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, OpKind};
use ppc_dialect::{DType, Type};
use std::collections::{HashMap, HashSet};

pub fn autodiff(m: &mut Module, opts: &Options) -> Result<(), Diagnostics> {
    if m.funcs
        .values()
        .any(|f| m.func(&names::vjp(&f.name)).is_some())
    {
        return Err(vec![Diagnostic::plain(
            "the module already has VJP functions: `autodiff` has run",
        )]);
    }
    let ids: Vec<FuncId> = m.funcs.iter().map(|(id, _)| id).collect();
    let called: HashSet<FuncId> = m.funcs.values().flat_map(Func::callees).collect();
    // What the functions that keep everything (the called ones, see `remat_of`) call.
    let nested: HashSet<FuncId> = called.iter().flat_map(|&g| m.funcs[g].callees()).collect();
    // Rematerializing saves what a loop would keep once per iteration; a function called
    // outside every loop (a model's ends) runs once a step, so its backward reads what its
    // forward kept, as if it were inlined.
    let once: HashSet<FuncId> = m.funcs.values().flat_map(called_outside_loops).collect();
    let mut vjps = HashMap::new();
    let mut splits = HashMap::new();
    for id in ids {
        let remat = remat_of(opts.remat, called.contains(&id));
        let diff = Diff {
            m,
            id,
            f: &m.funcs[id],
            fixed: vjp::fixed_values(&m.funcs[id]),
            remat,
            vjps: &vjps,
            splits: &splits,
        };
        let vjp = diff.build().map_err(|d| vec![d])?;
        let keeps = opts.remat == Remat::None || nested.contains(&id) || once.contains(&id);
        let recomputed = !keeps && opts.remat == Remat::Tick;
        let split = if called.contains(&id) && (keeps || recomputed) {
            let name = match recomputed {
                true => names::recompute(&m.funcs[id].name),
                false => names::fwd(&m.funcs[id].name),
            };
            let fwd = diff.build_fwd(&name).map_err(|d| vec![d])?;
            Some((fwd, diff.build_bwd().map_err(|d| vec![d])?))
        } else {
            None
        };
        let mut push = |mut g: Func| {
            // Rules give operands cotangents that may go nowhere (a select's mask value).
            g.remove_dead_ops();
            m.funcs.push(g)
        };
        vjps.insert(id, push(vjp));
        if let Some((fwd, bwd)) = split {
            splits.insert(
                id,
                Split {
                    fwd: push(fwd),
                    bwd: push(bwd),
                    once: once.contains(&id),
                    recomputed,
                },
            );
        }
    }
    // The reverse GPipe loop reads the cotangents `@stage_vjp` returns, not the stage's
    // output: without it the stage's last products are dead.
    m.remove_unused_results();
    Ok(())
}

/// How a function's backward rematerializes: the functions that something calls (a stage)
/// keep what their backward reads while it runs, in every mode, since that backward runs
/// within one iteration of their caller's reverse loop; `--remat` decides for the loops of
/// the functions nothing calls (the GPipe loop), so that `stage` recomputes each stage's
/// forward once, in its backward (GPipe's choice), not once more per layer inside it; `tick`
/// is `stage` for the loops (only where the stage's backward runs differs).
fn remat_of(option: Remat, called: bool) -> Remat {
    match option {
        _ if called => Remat::None,
        Remat::Tick => Remat::Stage,
        option => option,
    }
}

/// The functions `f`'s body calls outside its loops.
fn called_outside_loops(f: &Func) -> Vec<FuncId> {
    (f.body.ops.iter())
        .filter_map(|&id| match &f.ops[id].kind {
            OpKind::Call { callee, .. } => Some(*callee),
            _ => None,
        })
        .collect()
}

/// The parameters whose cotangents `@f_vjp` returns, in order: `f`'s own, then those of the
/// functions it calls (transitively), each once.
pub fn trainables(m: &Module, f: FuncId) -> Vec<Slot> {
    let func = &m.funcs[f];
    let mut out: Vec<Slot> = (0..func.params.len()).map(|i| (f, i)).collect();
    for slot in callee_slots(m, func, &func.body) {
        if !out.contains(&slot) {
            out.push(slot);
        }
    }
    out
}

/// The trainable parameters of the functions called in `block` (nested loops included).
pub(super) fn callee_slots(m: &Module, f: &Func, block: &Block) -> Vec<Slot> {
    let mut out = Vec::new();
    for &id in &block.ops {
        let found = match &f.ops[id].kind {
            OpKind::Call { callee, .. } => trainables(m, *callee),
            OpKind::Loop { body, .. } => callee_slots(m, f, body),
            _ => continue,
        };
        for s in found {
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

/// The type of a slot's cotangent: its parameter's, in f32.
pub(super) fn slot_type(m: &Module, (f, i): Slot) -> Type {
    let func = &m.funcs[f];
    func.ty(func.params[i].value).with_dtype(DType::F32)
}

impl Diff<'_> {
    pub(super) fn name(&self, v: ValueId) -> &str {
        &self.f.values[v].name
    }

    pub(super) fn is_float(&self, v: ValueId) -> bool {
        self.f.ty(v).dtype.is_float()
    }

    /// `@g_fwd` and `@g_bwd`, where this function's backward reads what its forward kept.
    fn split(&self, g: FuncId) -> Option<&Split> {
        self.splits
            .get(&g)
            .filter(|s| s.once || self.remat == Remat::None)
    }

    /// `@f_vjp`: the forward, then the backward.
    fn build(&self) -> Result<Func, Diagnostic> {
        let f = self.f;
        let mut b = Builder::new(&names::vjp(&f.name));
        let mut env = self.args(&mut b);
        let ds = self.d_results(&mut b);
        self.params(&mut b, &mut env);
        let residues = self.forward(&mut b, &f.body, &mut env, None)?;
        let mut outs: Vec<ValueId> = f.body.results.iter().map(|r| env[r]).collect();
        outs.extend(self.gradients(&mut b, &env, &residues, &ds)?);
        Ok(b.finish(outs))
    }

    /// `@f_fwd(args...) -> (results..., kept...)` (or named `name`): `@f`, also returning what
    /// `@f_bwd` reads.
    fn build_fwd(&self, name: &str) -> Result<Func, Diagnostic> {
        let f = self.f;
        let mut b = Builder::new(name);
        let mut env = self.args(&mut b);
        self.params(&mut b, &mut env);
        let residues = self.forward(&mut b, &f.body, &mut env, None)?;
        let mut outs: Vec<ValueId> = f.body.results.iter().map(|r| env[r]).collect();
        for k in self.kept_by_body() {
            outs.push(resolve(k, &env, &residues));
        }
        Ok(b.finish(outs))
    }

    /// `@f_bwd(kept..., d_results...) -> (d_args..., d_params...)`: `@f_vjp`'s gradients from
    /// what `@f_fwd` kept, recomputing only what costs nothing.
    fn build_bwd(&self) -> Result<Func, Diagnostic> {
        let f = self.f;
        let mut b = Builder::new(&names::bwd(&f.name));
        let (mut env, mut residues) = (Env::new(), Residues::new());
        for k in self.kept_by_body() {
            let x = b.arg(&self.kept_name(k), self.kept_type(k));
            bind(k, x, &mut env, &mut residues);
        }
        let ds = self.d_results(&mut b);
        self.params(&mut b, &mut env);
        let recompute = recomputable(f, &f.body, &[]);
        self.forward(&mut b, &f.body, &mut env, Some(&recompute))?;
        let outs = self.gradients(&mut b, &env, &residues, &ds)?;
        Ok(b.finish(outs))
    }

    /// `@f`'s arguments, declared again.
    fn args(&self, b: &mut Builder) -> Env {
        let f = self.f;
        let mut env = Env::new();
        for &a in &f.body.args {
            b.span = f.value_spans.get(&a);
            let v = b.arg(self.name(a), f.ty(a).clone());
            env.insert(a, v);
        }
        env
    }

    /// The cotangents of `@f`'s results, as arguments.
    fn d_results(&self, b: &mut Builder) -> Vec<ValueId> {
        let f = self.f;
        f.body
            .results
            .iter()
            .map(|&r| b.arg(&format!("d_{}", self.name(r)), f.ty(r).clone()))
            .collect()
    }

    /// `@f`'s parameters, declared again (the same weights).
    fn params(&self, b: &mut Builder, env: &mut Env) {
        let f = self.f;
        for p in &f.params {
            b.span = f.value_spans.get(&p.value);
            let v = b.param(
                self.name(p.value),
                f.ty(p.value).clone(),
                p.init,
                p.layer_axes,
            );
            env.insert(p.value, v);
        }
    }

    /// `@stage`'s `%active`, which masks its gradients.
    pub(super) fn active_arg(&self) -> Option<ValueId> {
        (self.f.name == names::STAGE).then(|| self.f.body.args[1])
    }

    /// The backward of `@f`'s body given the cotangents `ds` of its results: the cotangents of
    /// its float arguments, then of its trainable parameters.
    fn gradients(
        &self,
        b: &mut Builder,
        env: &Env,
        residues: &Residues,
        ds: &[ValueId],
    ) -> Result<Vec<ValueId>, Diagnostic> {
        let f = self.f;
        let mut cots = Cots::default();
        for (&r, &d) in f.body.results.iter().zip(ds) {
            self.add(b, &mut cots, r, d)?;
        }
        self.backward(b, &f.body, env, residues, &mut cots)?;
        let active = self.active_arg().map(|a| env[&a]);
        let mut outs = Vec::new();
        for &a in f.body.args.iter().filter(|&&a| self.is_float(a)) {
            let d = match cots.values.get(&a) {
                Some(&d) => d,
                None => zeros(b, f.ty(a))?,
            };
            outs.push(mask_inactive(b, active, d)?);
        }
        for slot in trainables(self.m, self.id) {
            let own = (slot.0 == self.id).then(|| f.params[slot.1].value);
            let d = match own.and_then(|p| cots.values.get(&p)) {
                Some(&d) => to_f32(b, d)?,
                None => match cots.slots.get(&slot) {
                    Some(&d) => d,
                    None => zeros(b, &slot_type(self.m, slot))?,
                },
            };
            outs.push(mask_inactive(b, active, d)?);
        }
        Ok(outs)
    }

    /// Copies `block`'s ops (those in `only`, if given) into `b`, extending `env`; loops keep
    /// the tapes their reverse loops read.
    pub(super) fn forward(
        &self,
        b: &mut Builder,
        block: &Block,
        env: &mut Env,
        only: Option<&HashSet<OpId>>,
    ) -> Result<Residues, Diagnostic> {
        let mut residues = Residues::new();
        for &id in &block.ops {
            if only.is_some_and(|o| !o.contains(&id)) {
                continue;
            }
            let op = &self.f.ops[id];
            b.span = self.f.op_spans.get(&id);
            let hint = self.name(op.results[0]).to_string();
            let outs = match &op.kind {
                OpKind::Loop { .. } => {
                    let (outs, tapes) = self.forward_loop(b, op, env)?;
                    residues.insert(id, tapes);
                    outs
                }
                OpKind::Call { callee, args, on } => {
                    let args = args.iter().map(|a| env[a]).collect();
                    let on = on.map(|c| env[&c]);
                    match self.split(*callee) {
                        Some(s) => {
                            let mut outs = b.call_if(&hint, self.m, s.fwd, args, on)?;
                            residues.insert(id, outs.split_off(op.results.len()));
                            outs
                        }
                        None => b.call_if(&hint, self.m, *callee, args, on)?,
                    }
                }
                kind => {
                    let kind = kind.map_operands(|v| env[&v]);
                    let declared = kind
                        .has_declared_type()
                        .then(|| self.f.ty(op.results[0]).clone());
                    vec![b.op(&hint, kind, declared)?]
                }
            };
            for (&r, v) in op.results.iter().zip(outs) {
                env.insert(r, v);
            }
        }
        Ok(residues)
    }

    /// Adds the cotangents of `block`'s operands and outer values to `cots`, from those of its
    /// results, op by op in reverse.
    pub(super) fn backward(
        &self,
        b: &mut Builder,
        block: &Block,
        env: &Env,
        residues: &Residues,
        cots: &mut Cots,
    ) -> Result<(), Diagnostic> {
        for &id in block.ops.iter().rev() {
            let op = &self.f.ops[id];
            b.span = self.f.op_spans.get(&id);
            let kept = residues.get(&id).map_or(&[][..], Vec::as_slice);
            match &op.kind {
                OpKind::Loop { .. } => self.loop_vjp(b, op, env, kept, cots)?,
                OpKind::Call { .. } => self.call_vjp(b, op, env, kept, cots)?,
                // `index`'s transpose adds into the slice it read, not a zero buffer's worth.
                OpKind::Index { x, index, axis } if self.is_float(*x) => {
                    if let Some(&d) = cots.values.get(&op.results[0]) {
                        self.add_slice(b, cots, *x, d, env[index], *axis)?;
                    }
                }
                kind => {
                    let r = op.results[0];
                    let Some(&d) = cots.values.get(&r) else {
                        continue;
                    };
                    if !self.is_float(r) {
                        continue;
                    }
                    let cotangents = match (kind, vjp::guarding(self.f, kind)) {
                        (OpKind::Select { cond, .. }, Some(update)) => {
                            vjp::guarded_update(b, self.f, env, (*cond, &update), d)?
                        }
                        _ => vjp::rule(b, (self.f, &self.fixed), env, kind, r, d)?,
                    };
                    for (v, c) in cotangents {
                        self.add(b, cots, v, c)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `call @g(args)`: `call @g_vjp(args, d_results)`, or `call @g_bwd(residuals, d_results)`
    /// with `--remat=none`.
    fn call_vjp(
        &self,
        b: &mut Builder,
        op: &Op,
        env: &Env,
        residuals: &[ValueId],
        cots: &mut Cots,
    ) -> Result<(), Diagnostic> {
        let OpKind::Call { callee, args, on } = &op.kind else {
            unreachable!("invariant: called on calls")
        };
        if op.results.iter().all(|r| !cots.values.contains_key(r)) {
            return Ok(());
        }
        let g = &self.m.funcs[*callee];
        // A `call_if`'s backward runs where its forward did; elsewhere its cotangents are
        // -0.0 and add nothing.
        let on = on.map(|c| env[&c]);
        let recomputed = self.splits.get(callee).filter(|s| s.recomputed);
        let (vjp, mut vjp_args, results) = match (self.split(*callee), recomputed) {
            (Some(s), _) => (s.bwd, residuals.to_vec(), 0),
            (None, Some(s)) => {
                let args = args.iter().map(|a| env[a]).collect();
                let mut outs = b.call_if(names::RECOMPUTED, self.m, s.fwd, args, on)?;
                (s.bwd, outs.split_off(op.results.len()), 0)
            }
            (None, None) => {
                let args = args.iter().map(|a| env[a]).collect();
                (self.vjps[callee], args, op.results.len())
            }
        };
        for &r in &op.results {
            vjp_args.push(match cots.values.get(&r) {
                Some(&d) => d,
                None => zeros(b, self.f.ty(r))?,
            });
        }
        let outs = b.call_if(&format!("vjp_{}", g.name), self.m, vjp, vjp_args, on)?;
        let mut outs = outs[results..].iter().copied();
        for &a in args.iter().filter(|&&a| self.is_float(a)) {
            let d = outs
                .next()
                .expect("invariant: a cotangent per float argument");
            self.add(b, cots, a, d)?;
        }
        for (slot, d) in trainables(self.m, *callee).into_iter().zip(outs) {
            self.add_slot(b, cots, slot, d)?;
        }
        Ok(())
    }

    /// `cots[v] += c` (non-float values have no cotangent).
    pub(super) fn add(
        &self,
        b: &mut Builder,
        cots: &mut Cots,
        v: ValueId,
        c: ValueId,
    ) -> Result<(), Diagnostic> {
        if !self.is_float(v) {
            return Ok(());
        }
        // A parameter's gradient is f32 (`slot_type`). Where it has several uses (a tied
        // weight, in `@embed` and `@head`), their cotangents add in f32, as ranks that each
        // hold one use add theirs across the pipeline: the rank count changes no bit.
        let is_param = self.f.params.iter().any(|p| p.value == v);
        let sum = match cots.values.get(&v) {
            Some(&e) if is_param => {
                let (e, c) = (to_f32(b, e)?, to_f32(b, c)?);
                bin(b, BinaryOp::Add, e, c)?
            }
            Some(&e) => bin(b, BinaryOp::Add, e, c)?,
            None => c,
        };
        cots.values.insert(v, sum);
        Ok(())
    }

    /// `cots[x][.., index, ..] += d` along `axis` (zeros elsewhere if `x` has no cotangent yet):
    /// the same bits as adding `update(zeros, d, index)`, since `-0.0` adds nothing. Into a
    /// fresh slice ([`Cots::fresh`]) `d` is written, for the same reason.
    fn add_slice(
        &self,
        b: &mut Builder,
        cots: &mut Cots,
        x: ValueId,
        d: ValueId,
        index: ValueId,
        axis: usize,
    ) -> Result<(), Diagnostic> {
        // Into a parameter's cotangent already summed in f32 ([`Diff::add`]), in f32.
        let d = match cots.values.get(&x) {
            Some(&e) if b.ty(e).dtype != b.ty(d).dtype => to_f32(b, d)?,
            _ => d,
        };
        let (base, update) = match cots.values.get(&x) {
            Some(&e) if cots.fresh.remove(&e) => (e, d),
            Some(&e) => {
                let read = OpKind::Index { x: e, index, axis };
                let old = b.op("d", read, None)?;
                (e, bin(b, BinaryOp::Add, old, d)?)
            }
            None => (zeros(b, self.f.ty(x))?, d),
        };
        let write = OpKind::Update {
            x: base,
            update,
            index,
            axis,
        };
        let sum = b.op("d", write, None)?;
        cots.values.insert(x, sum);
        Ok(())
    }

    pub(super) fn add_slot(
        &self,
        b: &mut Builder,
        cots: &mut Cots,
        slot: Slot,
        c: ValueId,
    ) -> Result<(), Diagnostic> {
        let sum = match cots.slots.get(&slot) {
            Some(&e) => bin(b, BinaryOp::Add, e, c)?,
            None => c,
        };
        cots.slots.insert(slot, sum);
        Ok(())
    }
}

fn to_f32(b: &mut Builder, d: ValueId) -> Result<ValueId, Diagnostic> {
    let ty = b.ty(d).clone();
    if ty.dtype == DType::F32 {
        return Ok(d);
    }
    b.op(
        "d",
        OpKind::Convert { x: d },
        Some(ty.with_dtype(DType::F32)),
    )
}
