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
//!   they needed.
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

use super::options::Options;
use super::remat::{backward_reads, recomputable, Remat};
use super::vjp::{self, bin, select, zeros, Env};
use ppc_dialect::build::Builder;
use ppc_dialect::diag::{Diagnostic, Diagnostics};
use ppc_dialect::ir::{names, Block, Func, FuncId, Module, Op, OpId, ValueId};
use ppc_dialect::op::{BinaryOp, Float, OpKind};
use ppc_dialect::{DType, Dim, Type};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A trainable parameter: the function that declares it and its index among its parameters.
pub type Slot = (FuncId, usize);

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
    let called: HashSet<FuncId> = m.funcs.values().flat_map(callees).collect();
    // What the functions that keep everything (the called ones, see `remat_of`) call.
    let nested: HashSet<FuncId> = called.iter().flat_map(|&g| callees(&m.funcs[g])).collect();
    let mut vjps = HashMap::new();
    let mut splits = HashMap::new();
    for id in ids {
        let remat = remat_of(opts.remat, called.contains(&id));
        let diff = Diff {
            m,
            id,
            f: &m.funcs[id],
            remat,
            vjps: &vjps,
            splits: &splits,
        };
        let vjp = diff.build().map_err(|d| vec![d])?;
        let split = if called.contains(&id) && (opts.remat == Remat::None || nested.contains(&id)) {
            let fwd = diff.build_fwd().map_err(|d| vec![d])?;
            Some((fwd, diff.build_bwd().map_err(|d| vec![d])?))
        } else {
            None
        };
        let mut push = |mut g: Func| {
            // Rules give every operand a cotangent; those of constants (a mask value, a
            // scale) go nowhere.
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
/// forward once, in its backward (GPipe's choice), not once more per layer inside it.
fn remat_of(option: Remat, called: bool) -> Remat {
    if called {
        Remat::None
    } else {
        option
    }
}

/// The functions `f` calls (nested loops included).
fn callees(f: &Func) -> Vec<FuncId> {
    fn walk(f: &Func, block: &Block, out: &mut Vec<FuncId>) {
        for &id in &block.ops {
            match &f.ops[id].kind {
                OpKind::Call { callee, .. } => out.push(*callee),
                OpKind::Loop { body, .. } => walk(f, body, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(f, &f.body, &mut out);
    out
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

/// Cotangents built so far: of source values, and of callees' parameters.
#[derive(Default)]
pub(super) struct Cots {
    pub(super) values: HashMap<ValueId, ValueId>,
    pub(super) slots: BTreeMap<Slot, ValueId>,
}

/// What the forward keeps for the backward: a value of the block, or the `k`-th value kept by
/// one of its loops (a tape) or calls (a residual of `@g_fwd`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Kept {
    Value(ValueId),
    Of(OpId, usize),
}

/// The values kept by a block's loops (their tapes, `[trips, ...]`) and calls (their
/// residuals), by op, in the order of [`Diff::kept`].
pub(super) type Residues = HashMap<OpId, Vec<ValueId>>;

/// The functions `@g_fwd` and `@g_bwd` of a function `@g` (`--remat=none`).
pub(super) struct Split {
    pub(super) fwd: FuncId,
    pub(super) bwd: FuncId,
}

pub(super) struct Diff<'a> {
    pub(super) m: &'a Module,
    pub(super) id: FuncId,
    pub(super) f: &'a Func,
    pub(super) remat: Remat,
    pub(super) vjps: &'a HashMap<FuncId, FuncId>,
    pub(super) splits: &'a HashMap<FuncId, Split>,
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
        (self.remat == Remat::None).then(|| self.splits.get(&g))?
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

    /// `@f_fwd(args...) -> (results..., kept...)`: `@f`, also returning what `@f_bwd` reads.
    fn build_fwd(&self) -> Result<Func, Diagnostic> {
        let f = self.f;
        let mut b = Builder::new(&names::fwd(&f.name));
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
    fn active_arg(&self) -> Option<ValueId> {
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

    /// What the forward of `block` keeps for its backward, in order. `available`: the block's
    /// arguments the backward has anyway (a loop's iteration number).
    pub(super) fn kept(&self, block: &Block, available: &[ValueId]) -> Vec<Kept> {
        let args = block.args.iter().filter(|a| !available.contains(a));
        if self.remat == Remat::Stage {
            // The carried values the recomputation starts from.
            let (_, needed) = needed(self.f, block);
            return args
                .filter(|a| needed.contains(a))
                .map(|&a| Kept::Value(a))
                .collect();
        }
        let recomputed = recomputable(self.f, block, available);
        let reads = backward_reads(self.f, block, &recomputed);
        let fresh: HashSet<ValueId> = recomputed
            .iter()
            .flat_map(|&id| self.f.ops[id].results.iter().copied())
            .collect();
        let results = block.ops.iter().flat_map(|&id| &self.f.ops[id].results);
        let mut out: Vec<Kept> = args
            .chain(results)
            .filter(|v| reads.contains(v) && !fresh.contains(v))
            .map(|&v| Kept::Value(v))
            .collect();
        for &id in &block.ops {
            let n = match &self.f.ops[id].kind {
                OpKind::Loop { body, .. } => self.kept(body, &body.args[..1]).len(),
                OpKind::Call { callee, .. } => self.residual_types(*callee).len(),
                _ => 0,
            };
            out.extend((0..n).map(|k| Kept::Of(id, k)));
        }
        out
    }

    /// What `@f_fwd` returns for `@f_bwd`: [`Diff::kept`] of the body, `%active` included.
    fn kept_by_body(&self) -> Vec<Kept> {
        let mut kept = self.kept(&self.f.body, &[]);
        if let Some(a) = self.active_arg() {
            if !kept.iter().any(|k| matches!(k, Kept::Value(v) if *v == a)) {
                kept.insert(0, Kept::Value(a));
            }
        }
        kept
    }

    /// The types of the residuals `@g_fwd` returns after `@g`'s results.
    fn residual_types(&self, g: FuncId) -> Vec<Type> {
        let fwd = &self.m.funcs[self.splits[&g].fwd];
        let n = self.m.funcs[g].body.results.len();
        fwd.result_types().split_off(n)
    }

    /// The `k`-th value a loop or a call keeps: `(its loop body's Kept, trips)`, or the call's
    /// residual `(callee, k)`.
    fn nested(&self, op: OpId, k: usize) -> Result<(Kept, u64), (FuncId, usize)> {
        match &self.f.ops[op].kind {
            OpKind::Loop { trips, body, .. } => Ok((self.kept(body, &body.args[..1])[k], *trips)),
            OpKind::Call { callee, .. } => Err((*callee, k)),
            _ => unreachable!("invariant: only loops and calls keep values"),
        }
    }

    pub(super) fn kept_type(&self, k: Kept) -> Type {
        match k {
            Kept::Value(v) => self.f.ty(v).clone(),
            Kept::Of(op, k) => match self.nested(op, k) {
                Ok((inner, trips)) => self.kept_type(inner).insert(0, Dim::lit(trips)),
                Err((g, k)) => self.residual_types(g)[k].clone(),
            },
        }
    }

    pub(super) fn kept_name(&self, k: Kept) -> String {
        match k {
            Kept::Value(v) => self.name(v).to_string(),
            Kept::Of(op, k) => match self.nested(op, k) {
                Ok((inner, _)) => self.kept_name(inner),
                Err((g, k)) => {
                    let fwd = &self.m.funcs[self.splits[&g].fwd];
                    let n = self.m.funcs[g].body.results.len();
                    fwd.values[fwd.body.results[n + k]].name.clone()
                }
            },
        }
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
                OpKind::Call { callee, args } => {
                    let args = args.iter().map(|a| env[a]).collect();
                    match self.split(*callee) {
                        Some(s) => {
                            let mut outs = b.call_n(&hint, self.m, s.fwd, args)?;
                            residues.insert(id, outs.split_off(op.results.len()));
                            outs
                        }
                        None => b.call_n(&hint, self.m, *callee, args)?,
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
                    for (v, c) in vjp::rule(b, self.f, env, kind, r, d)? {
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
        let OpKind::Call { callee, args } = &op.kind else {
            unreachable!("invariant: called on calls")
        };
        if op.results.iter().all(|r| !cots.values.contains_key(r)) {
            return Ok(());
        }
        let (vjp, mut vjp_args, results) = match self.split(*callee) {
            Some(s) => (s.bwd, residuals.to_vec(), 0),
            None => {
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
        let g = &self.m.funcs[*callee];
        let outs = b.call_n(&format!("vjp_{}", g.name), self.m, vjp, vjp_args)?;
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
        let sum = match cots.values.get(&v) {
            Some(&e) => bin(b, BinaryOp::Add, e, c)?,
            None => c,
        };
        cots.values.insert(v, sum);
        Ok(())
    }

    /// `cots[x][.., index, ..] += d` along `axis` (zeros elsewhere if `x` has no cotangent yet):
    /// the same bits as adding `update(zeros, d, index)`, since `-0.0` adds nothing.
    fn add_slice(
        &self,
        b: &mut Builder,
        cots: &mut Cots,
        x: ValueId,
        d: ValueId,
        index: ValueId,
        axis: usize,
    ) -> Result<(), Diagnostic> {
        let (base, update) = match cots.values.get(&x) {
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

/// The value `k` stands for in a forward that built `env` and `residues`.
pub(super) fn resolve(k: Kept, env: &Env, residues: &Residues) -> ValueId {
    match k {
        Kept::Value(v) => env[&v],
        Kept::Of(op, i) => residues[&op][i],
    }
}

/// Makes `x` the value `k` stands for (the inverse of [`resolve`]; `k`s come in order).
pub(super) fn bind(k: Kept, x: ValueId, env: &mut Env, residues: &mut Residues) {
    match k {
        Kept::Value(v) => {
            env.insert(v, x);
        }
        Kept::Of(op, _) => residues.entry(op).or_default().push(x),
    }
}

/// `d` where the stage of its stage axis is active, `-0.0` elsewhere (no-op outside `@stage`).
fn mask_inactive(
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

/// What the backward of `block` reads: the ops to recompute and the values they need (the
/// primal values the rules read, closed over their producers in `block`).
pub(super) fn needed(f: &Func, block: &Block) -> (HashSet<OpId>, HashSet<ValueId>) {
    let producer: HashMap<ValueId, OpId> = block
        .ops
        .iter()
        .flat_map(|&id| f.ops[id].results.iter().map(move |&r| (r, id)))
        .collect();
    let mut want: Vec<ValueId> = block
        .ops
        .iter()
        .flat_map(|&id| vjp::reads(f, &f.ops[id]))
        .collect();
    let (mut ops, mut values) = (HashSet::new(), HashSet::new());
    while let Some(v) = want.pop() {
        if !values.insert(v) {
            continue;
        }
        if let Some(&id) = producer.get(&v) {
            if ops.insert(id) {
                let op = &f.ops[id];
                want.extend(op.kind.operands());
                if let OpKind::Loop { body, .. } = &op.kind {
                    want.extend(free_values(f, body));
                }
            }
        }
    }
    (ops, values)
}

/// The values `block` (nested blocks included) reads but does not define, in id order.
pub(super) fn free_values(f: &Func, block: &Block) -> Vec<ValueId> {
    fn walk(f: &Func, block: &Block, defined: &mut HashSet<ValueId>, used: &mut Vec<ValueId>) {
        defined.extend(&block.args);
        for &id in &block.ops {
            let op = &f.ops[id];
            used.extend(op.kind.operands());
            if let OpKind::Loop { body, .. } = &op.kind {
                walk(f, body, defined, used);
            }
            defined.extend(&op.results);
        }
        used.extend(&block.results);
    }
    let (mut defined, mut used) = (HashSet::new(), Vec::new());
    walk(f, block, &mut defined, &mut used);
    let mut free: Vec<ValueId> = used.into_iter().filter(|v| !defined.contains(v)).collect();
    free.sort_by_key(|v| v.index());
    free.dedup();
    free
}
