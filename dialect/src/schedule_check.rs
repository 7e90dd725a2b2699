//! The compile-time proof that a pipeline program's schedule is right, from the IR, before
//! lowering: every rank's program is run in lockstep on [`provenance`] values, which follow
//! which microbatch each stage slot, tape entry and inbox holds, tick by tick.
//!
//! What it proves, for the function that is lowered (`@pipeline`/`@model`, or `@train_vjp`):
//! - each active stage call computes on exactly one microbatch's activation, and on the one its
//!   place requires: stage `s` in repeat `r` runs layer group `r·S + s`, so its input must be
//!   that microbatch after `r·S + s` groups; a backward's kept inputs and its cotangent must be
//!   the same microbatch's, the cotangent one group later;
//! - every (microbatch, layer group) forward runs exactly once, and so does every backward
//!   (and every recomputation of a forward for a backward's residuals, where there are some);
//! - the forward program's output slot `m` holds microbatch `m` after all groups.
//!
//! Exchanges need no search for a matching partner: the verifier already requires that every
//! rank runs every `exchange` (none under `call_if`) and loops have static trip counts, so the
//! `n`-th exchange of each rank meets its neighbour's `n`-th in the same tick and direction and
//! no rank can wait on one waiting on it. The lockstep run delivers each exchange that way, so
//! what a rank receives is proved with everything else. A violation names the tick, the rank
//! and the stage.

use crate::ir::{names, Block, Func, Module, ValueId};
use crate::op::OpKind;
use crate::provenance::{self as p, stage_axis, Abs, Tag, TagSets};
use crate::schedule_memory;
use crate::types::{DType, Label};
use crate::Diagnostic;
use ppc_tensor::Tensor;
use std::collections::BTreeMap;

/// What the proof covered.
#[derive(Debug, Default, PartialEq)]
pub struct Proof {
    /// The function proved.
    pub func: String,
    /// (microbatch, layer group) forwards and backwards, each run exactly once.
    pub forwards: usize,
    pub backwards: usize,
    /// How many (microbatch, layer group) weight gradients ran apart from their backward
    /// (`--schedule zb-h1`; 0 elsewhere).
    pub weights: usize,
    /// The share of stage time idle with each call weighed by its work ([`work`]: matrix
    /// products), a tick as long as its busiest stage's work and the work after the loops as
    /// one tick more: what a schedule that evens out a tick's work (ZB-H1) gains, which
    /// [`Proof::bubble_fraction`]'s unit slots do not show.
    pub work_bubble: f64,
    /// Exchanges each rank made, and ticks (iterations of the function's outermost loops).
    pub exchanges: usize,
    pub ticks: u64,
    /// Training: per stage, the most microbatches whose stage input the program holds at the
    /// end of a tick for a backward still to run ([`crate::schedule_memory`]).
    pub inputs_held: Vec<usize>,
    /// Every stage call the loops over ticks run, in no particular order.
    pub runs: Vec<StageRun>,
}

/// One stage's forward or backward of one microbatch in one tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageRun {
    pub tick: u64,
    pub stage: u64,
    pub phase: Phase,
    pub microbatch: u32,
    /// The layer group it runs: `r·S + stage` in repeat `r`.
    pub group: u32,
}

/// What a stage call computes: a forward, a backward (or under `--schedule zb-h1` its input
/// gradient), or a weight gradient (ZB-H1's other half of a backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Forward,
    Backward,
    Weight,
}

impl Proof {
    /// The share of stage time idle, with a forward and a backward one unit each (a weight
    /// gradient is part of its backward's): a tick lasts as long as its busiest stage's work
    /// there, and every stage waits for it (the ranks exchange at its end). GPipe's, 1F1B's
    /// and ZB-H1's programs reach `(S-1)/(M+S-1)`.
    pub fn bubble_fraction(&self, stages: u64) -> f64 {
        let slots = || self.runs.iter().filter(|r| r.phase != Phase::Weight);
        let mut work: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for r in slots() {
            *work.entry((r.tick, r.stage)).or_default() += 1;
        }
        let mut longest: BTreeMap<u64, u64> = BTreeMap::new();
        for (&(tick, _), &w) in &work {
            let l = longest.entry(tick).or_default();
            *l = (*l).max(w);
        }
        let span: u64 = longest.values().sum();
        1.0 - slots().count() as f64 / (stages * span.max(1)) as f64
    }
}

/// Where a stage call ran.
#[derive(Clone, Copy, Debug)]
struct At {
    tick: Option<u64>,
    rank: usize,
    stage: u64,
    /// The call's matrix-product FLOPs per stage ([`work`]).
    work: u64,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self.tick {
            Some(t) => write!(f, "tick {t}, rank {}, stage {}", self.rank, self.stage),
            None => write!(
                f,
                "rank {}, stage {} (outside the loops)",
                self.rank, self.stage
            ),
        }
    }
}

/// Proves the schedule of the function that `lower` would lower, if the module has one.
pub fn check(m: &Module) -> Result<Option<Proof>, Diagnostic> {
    let train = names::vjp(names::TRAIN);
    let Some(f) = [train.as_str(), names::MODEL, names::PIPELINE]
        .into_iter()
        .find_map(|n| m.func(n))
    else {
        return Ok(None);
    };
    let mut run = Lockstep::new(m);
    run.function(f).map_err(|e| {
        Diagnostic::plain(format!("the schedule of @{} is wrong: {e}", f.name)).with_note(
            "this is a bug in ppc's pipeline passes, found before lowering: please report it \
             with the model file and the command",
        )
    })
}

type Env = Vec<Option<Abs>>;

struct Lockstep<'m> {
    m: &'m Module,
    sets: TagSets,
    ranks: usize,
    stages: u64,
    microbatches: u32,
    groups: u32,
    tick: Option<u64>,
    next_tick: u64,
    exchanges: usize,
    forwards: BTreeMap<Tag, Vec<At>>,
    backwards: BTreeMap<Tag, Vec<At>>,
    recomputations: BTreeMap<Tag, Vec<At>>,
    weights: BTreeMap<Tag, Vec<At>>,
    /// Whether to measure [`Proof::inputs_held`], and its figures so far.
    training: bool,
    inputs_held: Vec<usize>,
}

/// What a call to a stage function computes.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    Forward,
    Backward,
    /// A forward again, for the residuals a backward reads (`@stage_recompute`).
    Recompute,
    /// The input-gradient half of a backward (`--schedule zb-h1`: `@stage_vjp_input`), which
    /// also returns what its weight-gradient half reads: every result is its microbatch's.
    Input,
    /// The weight-gradient half (`@stage_vjp_weight`), on what an `Input` stashed.
    Weight,
}

impl<'m> Lockstep<'m> {
    fn new(m: &'m Module) -> Lockstep<'m> {
        let pl = m.pipeline;
        Lockstep {
            m,
            sets: TagSets::new(),
            ranks: pl.ranks as usize,
            stages: pl.stages,
            microbatches: pl.microbatches as u32,
            groups: (pl.stages * pl.repeats) as u32,
            tick: None,
            next_tick: 0,
            exchanges: 0,
            forwards: BTreeMap::new(),
            backwards: BTreeMap::new(),
            recomputations: BTreeMap::new(),
            weights: BTreeMap::new(),
            training: false,
            inputs_held: Vec::new(),
        }
    }

    fn function(&mut self, f: &Func) -> Result<Option<Proof>, String> {
        self.training = f.name == names::vjp(names::TRAIN);
        let mut envs: Vec<Env> = vec![vec![None; f.values.len()]; self.ranks];
        for (i, &a) in f.body.args.iter().enumerate() {
            let ty = f.ty(a);
            let shape = p::coarse(ty);
            let rows = self.microbatch_rows(ty);
            let mut t = p::splat(&shape, 0);
            if i == 0 && rows {
                for m in 0..shape[0] {
                    let id = self.sets.intern(vec![tag(m as u32, 0)]);
                    p::fill_slot(&mut t, 0, m, id);
                }
            }
            for env in &mut envs {
                env[a.index()] = Some(Abs::Tags(t.clone()));
            }
        }
        for prm in &f.params {
            let empty = p::splat(&p::coarse(f.ty(prm.value)), 0);
            for env in &mut envs {
                env[prm.value.index()] = Some(Abs::Tags(empty.clone()));
            }
        }
        self.block(f, &f.body, &mut envs, 0)?;
        if self.forwards.is_empty() && self.backwards.is_empty() {
            return Ok(None);
        }
        self.exactly_once("forward", &self.forwards)?;
        if self.training {
            self.exactly_once("backward", &self.backwards)?;
            if !self.recomputations.is_empty() {
                self.exactly_once("recomputation", &self.recomputations)?;
            }
            if !self.weights.is_empty() {
                self.exactly_once("weight gradient", &self.weights)?;
            }
        } else {
            self.outputs_in_place(f, &envs)?;
        }
        Ok(Some(Proof {
            func: f.name.clone(),
            forwards: self.forwards.len(),
            backwards: self.backwards.len(),
            weights: self.weights.len(),
            work_bubble: self.work_bubble(),
            exchanges: self.exchanges,
            ticks: self.next_tick,
            inputs_held: std::mem::take(&mut self.inputs_held),
            runs: self.runs(),
        }))
    }

    fn microbatch_rows(&self, ty: &crate::Type) -> bool {
        ty.dims
            .first()
            .is_some_and(|d| d.label == Label::Named("microbatches".into()))
    }

    fn block(&mut self, f: &Func, b: &Block, envs: &mut [Env], depth: usize) -> Result<(), String> {
        for &id in &b.ops {
            let op = &f.ops[id];
            match &op.kind {
                OpKind::Loop { trips, inits, body } => {
                    let mut carried: Vec<Vec<Abs>> = envs
                        .iter()
                        .map(|env| inits.iter().map(|&v| take(env, v)).collect())
                        .collect();
                    for t in 0..*trips {
                        if depth == 0 {
                            self.tick = Some(self.next_tick);
                            self.next_tick += 1;
                        }
                        for (env, c) in envs.iter_mut().zip(carried) {
                            let t = Tensor::scalar(DType::I32, t as f64);
                            env[body.args[0].index()] = Some(Abs::Known(t));
                            for (&a, v) in body.args[1..].iter().zip(c) {
                                env[a.index()] = Some(v);
                            }
                        }
                        self.block(f, body, envs, depth + 1)?;
                        if depth == 0 && self.training {
                            self.measure_held(f, envs);
                        }
                        carried = envs
                            .iter()
                            .map(|env| body.results.iter().map(|&v| take(env, v)).collect())
                            .collect();
                    }
                    if depth == 0 {
                        self.tick = None;
                    }
                    for (env, c) in envs.iter_mut().zip(carried) {
                        for (&r, v) in op.results.iter().zip(c) {
                            env[r.index()] = Some(v);
                        }
                    }
                }
                OpKind::Exchange { x, reverse } => {
                    self.exchanges += 1;
                    let sent: Vec<Abs> = envs.iter().map(|env| take(env, *x)).collect();
                    let n = self.ranks;
                    for (r, env) in envs.iter_mut().enumerate() {
                        let from = if *reverse {
                            (r + 1) % n
                        } else {
                            (r + n - 1) % n
                        };
                        env[op.results[0].index()] = Some(sent[from].clone());
                    }
                }
                kind => {
                    for (rank, env) in envs.iter_mut().enumerate() {
                        let out = match kind {
                            OpKind::Rank => {
                                vec![Abs::Known(Tensor::scalar(DType::I32, rank as f64))]
                            }
                            OpKind::Call { callee, args, on } => {
                                let args: Vec<Abs> = args.iter().map(|&v| take(env, v)).collect();
                                let on = on.map(|c| take(env, c));
                                self.call(*callee, &args, on, rank)?
                            }
                            kind => {
                                let get = |v: ValueId| take(env, v);
                                let ty = f.ty(op.results[0]);
                                vec![p::eval(&mut self.sets, f, kind, ty, &get)]
                            }
                        };
                        for (&r, v) in op.results.iter().zip(out) {
                            env[r.index()] = Some(v);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The floating-point operations of `block`'s matrix products (2·m·n·k each), a loop's
/// body counted once per trip: the work of one call, as the proof weighs it.
fn work(f: &Func, block: &Block) -> u64 {
    (block.ops.iter())
        .map(|&id| match &f.ops[id].kind {
            OpKind::MatMul { lhs, .. } => {
                let k = f.ty(*lhs).dims.last().map_or(0, |d| d.size);
                2 * f.ty(f.ops[id].results[0]).elements() * k
            }
            OpKind::Loop { trips, body, .. } => trips * work(f, body),
            _ => 0,
        })
        .sum()
}

fn take(env: &Env, v: ValueId) -> Abs {
    env[v.index()]
        .clone()
        .expect("invariant: verified IR defines values before use")
}

fn tag(microbatch: u32, groups: u32) -> Tag {
    Tag { microbatch, groups }
}

impl Lockstep<'_> {
    /// The results of a call on one rank: a stage function's by its [`Role`], any other's as
    /// the union of what it reads: row by row along a leading `microbatches` axis, since the
    /// passes batch `@embed`, `@head` and the loss over microbatches, and a result without that
    /// axis (a loss, a weight or its gradient) from the arguments without it, since a sum over
    /// every microbatch belongs to none. A result that is one of the callee's own arguments
    /// passes that argument on as it is.
    fn call(
        &mut self,
        callee: crate::ir::FuncId,
        args: &[Abs],
        on: Option<Abs>,
        rank: usize,
    ) -> Result<Vec<Abs>, String> {
        let g = &self.m.funcs[callee];
        let skipped = on
            .as_ref()
            .and_then(Abs::known)
            .is_some_and(|c| c.int(0) == 0);
        if skipped {
            // A call that does not run gives zeros: known masks and indices, no activation.
            let empty = |ty: &crate::Type| match ty.dtype {
                DType::I1 | DType::I32 => {
                    let shape = ty.shape_usize();
                    let n = shape.iter().product();
                    Abs::Known(Tensor::new(ty.dtype, shape, vec![0.0; n]))
                }
                _ => Abs::Tags(p::splat(&p::coarse(ty), 0)),
            };
            return Ok(g.result_types().iter().map(empty).collect());
        }
        let stage = names::STAGE;
        let backwards = names::stage_backwards();
        let role = match g.name.as_str() {
            n if names::stage_forwards().iter().any(|f| n == f) => Some(Role::Forward),
            n if backwards.iter().any(|b| n == b) => Some(Role::Backward),
            n if n == names::recompute(stage) => Some(Role::Recompute),
            n if backwards.iter().any(|b| n == names::input_grad(b)) => Some(Role::Input),
            n if backwards.iter().any(|b| n == names::weight_grad(b)) => Some(Role::Weight),
            _ => None,
        };
        let mut out = match role {
            Some(role) => self.stage_call(g, role, args, rank)?,
            None => self.other_call(g, args),
        };
        for (j, r) in g.body.results.iter().enumerate() {
            if let Some(i) = g.body.args.iter().position(|a| a == r) {
                out[j] = args[i].clone();
            }
        }
        Ok(out)
    }

    fn other_call(&mut self, g: &Func, args: &[Abs]) -> Vec<Abs> {
        let tys = g.arg_types();
        let mb = self.microbatches as usize;
        let mut whole = 0;
        let mut rows = vec![0u32; mb];
        for (a, ty) in args.iter().zip(&tys) {
            let t = a.tags(&mut self.sets, &p::coarse(ty));
            if self.microbatch_rows(ty) && t.shape[0] == mb {
                for (m, row) in rows.iter_mut().enumerate() {
                    let id = self.row(&t, m);
                    *row = self.sets.union(*row, id);
                }
            } else {
                let id = self.sets.union_all(&t);
                whole = self.sets.union(whole, id);
            }
        }
        let results = g.result_types();
        results
            .iter()
            .map(|ty| {
                let shape = p::coarse(ty);
                let mut t = p::splat(&shape, whole);
                if self.microbatch_rows(ty) && shape[0] == mb {
                    for (m, &row) in rows.iter().enumerate() {
                        let id = self.sets.union(whole, row);
                        p::fill_slot(&mut t, 0, m, id);
                    }
                }
                Abs::Tags(t)
            })
            .collect()
    }

    /// A call of `@stage` (or its forward half) or of its backward, on one rank: checks what
    /// each active stage computes on, records it, and tags the results.
    fn stage_call(
        &mut self,
        g: &Func,
        role: Role,
        args: &[Abs],
        rank: usize,
    ) -> Result<Vec<Abs>, String> {
        let tys = g.arg_types();
        let on_stages = |ty: &crate::Type| stage_axis(ty).is_some();
        let mask = (tys.iter())
            .position(|t| t.dtype == DType::I1 && on_stages(t))
            .ok_or_else(|| format!("@{} has no stage mask", g.name))?;
        let repeat = (0..args.len()).find(|&i| g.values[g.body.args[i]].name == names::REPEAT);
        let cotangent = matches!(role, Role::Backward | Role::Input).then(|| args.len() - 1);
        let primal: Vec<usize> = (0..args.len())
            .filter(|&i| i != mask && Some(i) != repeat && Some(i) != cotangent)
            .filter(|&i| on_stages(&tys[i]) && !matches!(tys[i].dtype, DType::I1 | DType::I32))
            .collect();
        let unknown = |what: &str| {
            format!(
                "at {}: {what} of @{} is not known",
                self.tick_name(),
                g.name
            )
        };
        let active = args[mask]
            .known()
            .ok_or_else(|| unknown("which stages run"))?
            .clone();
        let repeats = match repeat {
            Some(i) => Some(
                args[i]
                    .known()
                    .ok_or_else(|| unknown("the repeat"))?
                    .clone(),
            ),
            None => None,
        };
        let per_rank = active.len();
        let mut ran: Vec<Option<Tag>> = vec![None; per_rank];
        for s in (0..per_rank).filter(|&s| active.int(s) != 0) {
            let at = At {
                tick: self.tick,
                rank,
                stage: (rank * per_rank + s) as u64,
                work: work(g, &g.body) / per_rank as u64,
            };
            let r = repeats.as_ref().map_or(0, |t| t.int(s) as u64);
            let group = (r * self.stages + at.stage) as u32;
            let mut input = None;
            for &i in &primal {
                let mut read = self.stage_row(&args[i], &tys[i], s);
                // What an input gradient stashed holds its microbatch's cotangent too.
                if role == Role::Weight {
                    for t in &mut read {
                        if t.groups == group + 1 {
                            t.groups = group;
                        }
                    }
                }
                match (read.as_slice(), input) {
                    ([t], None) if t.groups == group => input = Some(*t),
                    ([t], Some(first)) if *t == first => {}
                    (read, _) => {
                        return Err(format!(
                            "at {at}: the {} of layer group {group} reads {} as its input",
                            role.name(),
                            describe(read)
                        ))
                    }
                }
            }
            let input = input.ok_or_else(|| format!("@{} reads no activation", g.name))?;
            if let Some(c) = cotangent {
                let read = self.stage_row(&args[c], &tys[c], s);
                if read != [tag(input.microbatch, group + 1)] {
                    return Err(format!(
                        "at {at}: the backward of microbatch {} through layer group {group} gets \
                         the cotangent of {}",
                        input.microbatch,
                        describe(&read)
                    ));
                }
            }
            let events = match role {
                Role::Forward => &mut self.forwards,
                Role::Backward | Role::Input => &mut self.backwards,
                Role::Recompute => &mut self.recomputations,
                Role::Weight => &mut self.weights,
            };
            events.entry(input).or_default().push(at);
            ran[s] = Some(input);
        }
        let results = g.result_types();
        Ok(results
            .iter()
            .enumerate()
            .map(|(j, ty)| {
                let shape = p::coarse(ty);
                let mut t = p::splat(&shape, 0);
                if let Some(axis) = stage_axis(ty) {
                    for (s, input) in ran.iter().enumerate() {
                        let Some(x) = input else { continue };
                        let made = match (role, j) {
                            (Role::Forward, 0) => tag(x.microbatch, x.groups + 1),
                            (Role::Forward, _)
                            | (Role::Backward, 0)
                            | (Role::Recompute, _)
                            | (Role::Input, _) => *x,
                            (Role::Backward | Role::Weight, _) => continue,
                        };
                        let id = self.sets.intern(vec![made]);
                        p::fill_slot(&mut t, axis, s, id);
                    }
                }
                Abs::Tags(t)
            })
            .collect())
    }

    /// The tags of stage slot `s` of a value on the stage axis.
    fn stage_row(&mut self, a: &Abs, ty: &crate::Type, s: usize) -> Vec<Tag> {
        let t = a.tags(&mut self.sets, &p::coarse(ty));
        let axis = stage_axis(ty).expect("invariant: a value on the stage axis");
        let id = p::slot_union(&mut self.sets, &t, axis, s);
        self.sets.get(id).to_vec()
    }

    /// The union of row `i` (along the first axis) of coarse tags `t`.
    fn row(&mut self, t: &Tensor, i: usize) -> u32 {
        p::slot_union(&mut self.sets, t, 0, i)
    }

    fn runs(&self) -> Vec<StageRun> {
        let all = [
            (Phase::Forward, &self.forwards),
            (Phase::Backward, &self.backwards),
            (Phase::Weight, &self.weights),
        ];
        let each = all.into_iter().flat_map(|(phase, events)| {
            events.iter().flat_map(move |(t, ats)| {
                ats.iter().filter_map(move |at| {
                    Some(StageRun {
                        tick: at.tick?,
                        stage: at.stage,
                        phase,
                        microbatch: t.microbatch,
                        group: t.groups,
                    })
                })
            })
        });
        each.collect()
    }

    fn measure_held(&mut self, f: &Func, envs: &[Env]) {
        for (rank, env) in envs.iter().enumerate() {
            let now = self.tick;
            let before = |ats: &Vec<At>| ats.iter().any(|a| a.tick < now);
            let done = |t: &Tag| self.backwards.get(t).is_some_and(before);
            let held = schedule_memory::held(f, env, &self.sets, done);
            let first = rank * held.len();
            if self.inputs_held.len() < first + held.len() {
                self.inputs_held.resize(first + held.len(), 0);
            }
            for (s, n) in held.into_iter().enumerate() {
                let most = &mut self.inputs_held[first + s];
                *most = (*most).max(n);
            }
        }
    }

    /// [`Proof::work_bubble`] of the calls recorded.
    fn work_bubble(&self) -> f64 {
        let maps = [
            &self.forwards,
            &self.backwards,
            &self.recomputations,
            &self.weights,
        ];
        let mut per: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for at in maps.iter().flat_map(|m| m.values()).flatten() {
            *per.entry((at.tick.unwrap_or(self.next_tick), at.stage))
                .or_default() += at.work;
        }
        let mut longest: BTreeMap<u64, u64> = BTreeMap::new();
        for (&(tick, _), &w) in &per {
            let l = longest.entry(tick).or_default();
            *l = (*l).max(w);
        }
        let span: u64 = longest.values().sum();
        let done: u64 = per.values().sum();
        1.0 - done as f64 / (self.stages * span.max(1)) as f64
    }

    fn tick_name(&self) -> String {
        self.tick
            .map_or("the start or end of the step".into(), |t| {
                format!("tick {t}")
            })
    }

    /// Every (microbatch, layer group) ran once.
    fn exactly_once(&self, what: &str, events: &BTreeMap<Tag, Vec<At>>) -> Result<(), String> {
        for m in 0..self.microbatches {
            for g in 0..self.groups {
                let ats = events.get(&tag(m, g)).map_or(&[][..], Vec::as_slice);
                match ats {
                    [_] => {}
                    [] => {
                        return Err(format!(
                            "the {what} of microbatch {m} through layer group {g} never runs"
                        ))
                    }
                    [a, b, ..] => {
                        return Err(format!(
                            "the {what} of microbatch {m} through layer group {g} runs {} \
                             times: at {a} and at {b}",
                            ats.len()
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// The forward program's output slot `m` holds microbatch `m` after every layer group, on
    /// the last rank (the one that holds the last stage).
    fn outputs_in_place(&mut self, f: &Func, envs: &[Env]) -> Result<(), String> {
        let out = f.body.results[0];
        let ty = f.ty(out);
        let last = take(&envs[self.ranks - 1], out).tags(&mut self.sets, &p::coarse(ty));
        for m in 0..self.microbatches {
            let id = self.row(&last, m as usize);
            let held = self.sets.get(id);
            if held != [tag(m, self.groups)] {
                return Err(format!(
                    "output slot {m} holds {}, not microbatch {m} after all {} layer groups",
                    describe(held),
                    self.groups
                ));
            }
        }
        Ok(())
    }
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Forward => "forward",
            Role::Backward => "backward",
            Role::Recompute => "recomputation for the backward",
            Role::Input => "input gradient",
            Role::Weight => "weight gradient",
        }
    }
}

/// A tag set in words.
fn describe(set: &[Tag]) -> String {
    match set {
        [] => "nothing (a bubble slot)".into(),
        [t] => format!(
            "microbatch {} after {} layer group{}",
            t.microbatch,
            t.groups,
            if t.groups == 1 { "" } else { "s" }
        ),
        many => {
            let each: Vec<String> = many
                .iter()
                .take(4)
                .map(|t| format!("({}, {})", t.microbatch, t.groups))
                .collect();
            format!(
                "a mix of {} microbatch activations (microbatch, groups): {}{}",
                many.len(),
                each.join(", "),
                if many.len() > 4 { ", ..." } else { "" }
            )
        }
    }
}
