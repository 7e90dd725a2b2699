//! A stage's backward cut in two, for `--schedule zb-h1` (Qi et al. 2023): `@g` (`@stage_vjp`
//! or `@stage_bwd`), whose last `weights` results are its parameters' gradients, becomes
//!
//! ```text
//! @g_input(args...) -> (the other results..., stash...)    B: what the previous stage waits for
//! @g_weight(stash...) -> (the parameters' gradients...)     W: what nothing waits for
//! ```
//!
//! so that `W` can run later than `B`, where the stage would otherwise idle.
//!
//! **How it is cut**, by slicing backwards from the results:
//! - `B` is every op the first results need; `W` every other op the gradients need. What `W`
//!   reads of `B`'s values and of `@g`'s arguments is the stash, which `B` returns. Cheap ops
//!   (views, constants, integer scalars) that `W` needs of `B`'s share are computed again in `W` rather than
//!   stashed.
//! - A loop that computes both (a stage's reverse layer loop: it carries the activation's
//!   cotangent, which `B` needs, and accumulates the weights' gradients, which only `W` needs)
//!   is cut into two loops of the same trips. `B`'s carries what `B` needs and writes, in each
//!   iteration, the values of its own that `W`'s iteration reads (a tape, slot `t` holding
//!   iteration `t`'s); `W`'s carries the accumulators and reads the tape at the same `t`.
//!
//! - An idle stage's stash is -0.0 (`B` masks it by the stage mask, as its other results are),
//!   so that a loop over the stages skips an idle stage's `B` whole; `W` masks what it
//!   computes from it.
//!
//! Every value is computed by the same ops from the same operands as in `@g`, and `W` adds
//! its terms in the same order, so the two halves give `@g`'s results bit for bit (tested).

use super::autodiff_kept::free_values;
use super::gpipe_step::unexpected;
use super::stage_mask::mask_inactive;
use super::vjp::zeros;
use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{names, Block, Func, Module, Op, OpId, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::{Dim, Type};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Cuts `g`, whose last `weights` results are the gradients `W` computes: `@g_input` and
/// `@g_weight`.
pub(super) fn split(m: &Module, g: &Func, weights: usize) -> Result<(Func, Func), Diagnostic> {
    let results = &g.body.results;
    let first = results
        .len()
        .checked_sub(weights)
        .filter(|&n| n > 0)
        .ok_or_else(|| unexpected(&format!("@{} returns an input gradient", g.name)))?;
    let cut = Cut::new(g, &results[..first], &results[first..]);
    Ok((cut.input(m)?, cut.weight(m)?))
}

/// What a value of the stash is in `@g`: one of its values, or the `i`th tape of the loop
/// `op` cut in two. The stash is in this order: values by id, then tapes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stashed {
    Value(ValueId),
    Tape(OpId, usize),
}

/// A loop computed by both halves, cut in two.
struct LoopCut {
    /// The carried values (by position) of `B`'s loop and of `W`'s.
    input: Vec<usize>,
    weight: Vec<usize>,
    /// The body's ops in each half (`W`'s includes the cheap ops it computes again).
    input_ops: HashSet<OpId>,
    weight_ops: HashSet<OpId>,
    /// The body values `W` reads from `B`'s iteration: `B` tapes them.
    taped: Vec<ValueId>,
}

/// How `@g` is cut: the top-level ops of each half, the loops cut in two, the stash.
struct Cut<'a> {
    g: &'a Func,
    input_results: &'a [ValueId],
    weight_results: &'a [ValueId],
    input_ops: HashSet<OpId>,
    weight_ops: HashSet<OpId>,
    loops: HashMap<OpId, LoopCut>,
    stash: Vec<Stashed>,
}

/// What op `id` reads, the free values of a loop's body included.
fn reads(f: &Func, id: OpId) -> Vec<ValueId> {
    let op = &f.ops[id];
    let mut r = op.kind.operands();
    if let OpKind::Loop { body, .. } = &op.kind {
        r.extend(free_values(f, body));
    }
    r
}

/// The ops of `ops` that `wanted` needs, directly or not, and every value they read.
fn slice(f: &Func, ops: &[OpId], wanted: &[ValueId]) -> (HashSet<OpId>, HashSet<ValueId>) {
    let mut need: HashSet<ValueId> = wanted.iter().copied().collect();
    let mut out = HashSet::new();
    for &id in ops.iter().rev() {
        if f.ops[id].results.iter().any(|r| need.contains(r)) {
            need.extend(reads(f, id));
            out.insert(id);
        }
    }
    (out, need)
}

/// Ops that cost less to compute again than to keep: views, constants and integer scalars.
fn cheap(g: &Func, op: &Op) -> bool {
    // Integer scalar arithmetic: a reverse loop's `trips - 1 - t`.
    let index_arithmetic = matches!(op.kind, OpKind::Binary { .. })
        && (op.results.iter()).all(|&r| g.ty(r).rank() == 0 && !g.ty(r).dtype.is_float());
    index_arithmetic
        || matches!(
            &op.kind,
            OpKind::Constant { .. }
                | OpKind::Iota { .. }
                | OpKind::Reshape { .. }
                | OpKind::Broadcast { .. }
                | OpKind::Transpose { .. }
                | OpKind::Index { .. }
                | OpKind::Slice { .. }
        )
}

fn positions(body: &Block, values: &HashSet<ValueId>) -> BTreeSet<usize> {
    (0..body.args.len() - 1)
        .filter(|&j| values.contains(&body.args[1 + j]))
        .collect()
}

impl<'a> Cut<'a> {
    fn new(g: &'a Func, input_results: &'a [ValueId], weight_results: &'a [ValueId]) -> Cut<'a> {
        let ops = &g.body.ops;
        let (input_ops, input_need) = slice(g, ops, input_results);
        let mut cut = Cut {
            g,
            input_results,
            weight_results,
            input_ops,
            weight_ops: HashSet::new(),
            loops: HashMap::new(),
            stash: Vec::new(),
        };
        let mut need: HashSet<ValueId> = weight_results.iter().copied().collect();
        let mut stash = BTreeSet::new();
        for &id in ops.iter().rev() {
            let op = &g.ops[id];
            let wanted: Vec<usize> = (0..op.results.len())
                .filter(|&j| need.contains(&op.results[j]))
                .collect();
            if wanted.is_empty() {
                continue;
            }
            if !cut.input_ops.contains(&id) || cheap(g, op) {
                need.extend(reads(g, id));
                cut.weight_ops.insert(id);
                continue;
            }
            if let OpKind::Loop { inits, body, .. } = &op.kind {
                let by_input: BTreeSet<usize> = (0..op.results.len())
                    .filter(|&j| input_need.contains(&op.results[j]))
                    .collect();
                if let Some(lc) = cut_loop(g, body, &by_input, &wanted) {
                    need.extend(lc.weight.iter().map(|&j| inits[j]));
                    let w_body = ops_of(body, &lc.weight_ops);
                    let inner = Block {
                        args: body.args.clone(),
                        ops: w_body,
                        results: vec![],
                    };
                    need.extend(free_values(g, &inner));
                    for &j in wanted.iter().filter(|j| !lc.weight.contains(j)) {
                        stash.insert(Stashed::Value(op.results[j]));
                    }
                    for i in 0..lc.taped.len() {
                        stash.insert(Stashed::Tape(id, i));
                    }
                    cut.weight_ops.insert(id);
                    cut.loops.insert(id, lc);
                    continue;
                }
            }
            stash.extend(wanted.iter().map(|&j| Stashed::Value(op.results[j])));
        }
        // What `W` reads of `@g`'s arguments (its parameters it declares again).
        for &a in &g.body.args {
            if need.contains(&a) {
                stash.insert(Stashed::Value(a));
            }
        }
        cut.stash = stash.into_iter().collect();
        cut
    }

    /// `@g_input`: `B`'s ops, its loops cut to what it carries, returning the first results
    /// and the stash.
    fn input(&self, m: &Module) -> Result<Func, Diagnostic> {
        let g = self.g;
        let mut b = Builder::new(&names::input_grad(&g.name));
        let mut env = HashMap::new();
        b.signature_of(g, &mut env)?;
        let mut tapes: HashMap<OpId, Vec<ValueId>> = HashMap::new();
        for &id in g.body.ops.iter().filter(|o| self.input_ops.contains(o)) {
            match self.loops.get(&id) {
                None => b.copy_ops(m, g, &[id], &mut env)?,
                Some(lc) => {
                    let t = input_loop(&mut b, m, g, id, lc, &mut env)?;
                    tapes.insert(id, t);
                }
            }
        }
        let mut outs: Vec<ValueId> = self.input_results.iter().map(|v| env[v]).collect();
        // A bubble stage stashes nothing: each stash value is -0.0 (false) where the stage is
        // idle, as the first results are, so that a loop over the stages skips an idle stage's
        // `B` whole (`stage_split::masked_results`) instead of computing it for `W` to mask.
        let active = (g.body.args.iter())
            .find(|&&a| g.ty(a).is_stage_mask())
            .map(|a| env[a]);
        for s in &self.stash {
            let v = match *s {
                Stashed::Value(v) => env[&v],
                Stashed::Tape(id, i) => tapes[&id][i],
            };
            match Some(v) == active {
                true => outs.push(v), // false where the stage is idle already
                false => outs.push(mask_inactive(&mut b, active, v)?),
            }
        }
        let mut f = b.finish(outs);
        f.remove_dead_ops();
        Ok(f)
    }

    /// `@g_weight`: the stash as its arguments, `W`'s ops, returning the gradients.
    fn weight(&self, m: &Module) -> Result<Func, Diagnostic> {
        let g = self.g;
        let mut b = Builder::new(&names::weight_grad(&g.name));
        let mut env = HashMap::new();
        let mut tapes: HashMap<OpId, Vec<ValueId>> = HashMap::new();
        for s in &self.stash {
            match *s {
                Stashed::Value(v) => {
                    b.span = g.value_spans.get(&v);
                    let a = b.arg(&g.values[v].name, g.ty(v).clone());
                    env.insert(v, a);
                }
                Stashed::Tape(id, i) => {
                    let lc = &self.loops[&id];
                    let v = lc.taped[i];
                    let ty = tape_type(g, id, v);
                    let a = b.arg(&format!("tape_{}", g.values[v].name), ty);
                    tapes.entry(id).or_default().push(a);
                }
            }
        }
        b.bind_params_of(g, &mut env)?;
        for &id in g.body.ops.iter().filter(|o| self.weight_ops.contains(o)) {
            match self.loops.get(&id) {
                None => b.copy_ops(m, g, &[id], &mut env)?,
                Some(lc) => weight_loop(&mut b, m, g, id, lc, &tapes[&id], &mut env)?,
            }
        }
        let outs = self.weight_results.iter().map(|v| env[v]).collect();
        let mut f = b.finish(outs);
        f.remove_dead_ops();
        Ok(f)
    }
}

/// The tape of body value `v` of the loop `id`: `[trips, ...]`.
fn tape_type(g: &Func, id: OpId, v: ValueId) -> Type {
    let OpKind::Loop { trips, .. } = &g.ops[id].kind else {
        unreachable!("invariant: a loop")
    };
    g.ty(v).insert(0, Dim::lit(*trips))
}

/// How to cut the loop with `body` whose results at `by_input` `B` needs and at `wanted` `W`
/// does; `None` where `W` needs nothing that `B`'s loop would not compute anyway.
fn cut_loop(
    g: &Func,
    body: &Block,
    by_input: &BTreeSet<usize>,
    wanted: &[usize],
) -> Option<LoopCut> {
    // `B`'s carried values: what its results need, closed under what their iterations read.
    let mut input = by_input.clone();
    let input_ops = loop {
        let yields: Vec<ValueId> = input.iter().map(|&j| body.results[j]).collect();
        let (ops, need) = slice(g, &body.ops, &yields);
        let more = positions(body, &need);
        if more.is_subset(&input) {
            break ops;
        }
        input.extend(more);
    };
    let mut weight: BTreeSet<usize> = wanted
        .iter()
        .copied()
        .filter(|j| !input.contains(j))
        .collect();
    if weight.is_empty() {
        return None;
    }
    // The values of `B`'s carried state, and those computed from them.
    let mut tainted: HashSet<ValueId> = input.iter().map(|&j| body.args[1 + j]).collect();
    for &id in &body.ops {
        if reads(g, id).iter().any(|v| tainted.contains(v)) {
            tainted.extend(g.ops[id].results.iter().copied());
        }
    }
    loop {
        let mut need: HashSet<ValueId> = weight.iter().map(|&j| body.results[j]).collect();
        let mut weight_ops = HashSet::new();
        let mut taped = BTreeSet::new();
        for &id in body.ops.iter().rev() {
            let op = &g.ops[id];
            let used: Vec<ValueId> = (op.results.iter())
                .filter(|r| need.contains(r))
                .copied()
                .collect();
            if used.is_empty() {
                continue;
            }
            let from_input = input_ops.contains(&id)
                && (!cheap(g, op) || op.results.iter().any(|r| tainted.contains(r)));
            if from_input {
                taped.extend(used);
            } else {
                need.extend(reads(g, id));
                weight_ops.insert(id);
            }
        }
        // `B`'s carried values that `W` reads are taped as they enter the iteration.
        for &j in &input {
            if need.contains(&body.args[1 + j]) {
                taped.insert(body.args[1 + j]);
            }
        }
        let more = positions(body, &need);
        let more: BTreeSet<usize> = more.difference(&input).copied().collect();
        if more.is_subset(&weight) {
            let mut taped: Vec<ValueId> = taped.into_iter().collect();
            taped.sort_by_key(|v| v.index());
            return Some(LoopCut {
                input: input.into_iter().collect(),
                weight: weight.into_iter().collect(),
                input_ops,
                weight_ops,
                taped,
            });
        }
        weight.extend(more);
    }
}

/// The ops of loop body `body` in `share`, in body order.
fn ops_of(body: &Block, share: &HashSet<OpId>) -> Vec<OpId> {
    (body.ops.iter())
        .filter(|o| share.contains(o))
        .copied()
        .collect()
}

/// Binds an iteration of a half's loop in `env`: `body`'s counter to `t`, its carried values at
/// `positions` to the half's `carried`, in order.
fn bind_iteration(
    env: &mut HashMap<ValueId, ValueId>,
    body: &Block,
    positions: &[usize],
    t: ValueId,
    carried: &[ValueId],
) {
    env.insert(body.args[0], t);
    for (&j, &c) in positions.iter().zip(carried) {
        env.insert(body.args[1 + j], c);
    }
}

/// `B`'s share of the loop `id`: its carried values, and a tape per value `W` reads; binds
/// the loop's results that `B` carries in `env` and returns the tapes.
fn input_loop(
    b: &mut Builder,
    m: &Module,
    g: &Func,
    id: OpId,
    lc: &LoopCut,
    env: &mut HashMap<ValueId, ValueId>,
) -> Result<Vec<ValueId>, Diagnostic> {
    let op = &g.ops[id];
    let OpKind::Loop { trips, inits, body } = &op.kind else {
        unreachable!("invariant: a loop")
    };
    let mut all = Vec::new();
    let mut hints: Vec<String> = Vec::new();
    for &j in &lc.input {
        all.push(env[&inits[j]]);
        hints.push(g.values[body.args[1 + j]].name.clone());
    }
    for &v in &lc.taped {
        all.push(zeros(b, &tape_type(g, id, v))?);
        hints.push(format!("tape_{}", g.values[v].name));
    }
    let hints: Vec<&str> = hints.iter().map(String::as_str).collect();
    let carried = lc.input.len();
    let ops = ops_of(body, &lc.input_ops);
    let outs = b.loop_op(*trips, all, &hints, |b, t, car| {
        bind_iteration(env, body, &lc.input, t, car);
        b.copy_ops(m, g, &ops, env)?;
        let mut yields: Vec<ValueId> = lc.input.iter().map(|&j| env[&body.results[j]]).collect();
        for (&v, &tape) in lc.taped.iter().zip(&car[carried..]) {
            let write = OpKind::Update {
                x: tape,
                update: env[&v],
                index: t,
                axis: 0,
            };
            yields.push(b.op("tape", write, None)?);
        }
        Ok(yields)
    })?;
    for (k, &j) in lc.input.iter().enumerate() {
        env.insert(op.results[j], outs[k]);
    }
    Ok(outs[carried..].to_vec())
}

/// `W`'s share of the loop `id`, reading `B`'s `tapes` at its iteration; binds the loop's
/// results that it carries in `env`.
fn weight_loop(
    b: &mut Builder,
    m: &Module,
    g: &Func,
    id: OpId,
    lc: &LoopCut,
    tapes: &[ValueId],
    env: &mut HashMap<ValueId, ValueId>,
) -> Result<(), Diagnostic> {
    let op = &g.ops[id];
    let OpKind::Loop { trips, inits, body } = &op.kind else {
        unreachable!("invariant: a loop")
    };
    let all: Vec<ValueId> = lc.weight.iter().map(|&j| env[&inits[j]]).collect();
    let hints: Vec<&str> = (lc.weight.iter())
        .map(|&j| g.values[body.args[1 + j]].name.as_str())
        .collect();
    let ops = ops_of(body, &lc.weight_ops);
    let outs = b.loop_op(*trips, all, &hints, |b, t, car| {
        bind_iteration(env, body, &lc.weight, t, car);
        for (&v, &tape) in lc.taped.iter().zip(tapes) {
            let read = OpKind::Index {
                x: tape,
                index: t,
                axis: 0,
            };
            let x = b.op(&g.values[v].name, read, None)?;
            env.insert(v, x);
        }
        b.copy_ops(m, g, &ops, env)?;
        Ok(lc.weight.iter().map(|&j| env[&body.results[j]]).collect())
    })?;
    for (k, &j) in lc.weight.iter().enumerate() {
        env.insert(op.results[j], outs[k]);
    }
    Ok(())
}
