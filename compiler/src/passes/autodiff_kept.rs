//! What the forward keeps for the backward: the values the reverse code reads, per block, and
//! where a loop's tape or a call's residual holds them.

use super::differ::Diff;
use super::remat::{backward_reads, recomputable, Remat};
use super::vjp::{self, Env};
use ppc_dialect::ir::{Block, Func, FuncId, OpId, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::{Dim, Type};
use std::collections::{HashMap, HashSet};

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

impl Diff<'_> {
    /// What the forward of `block` keeps for its backward, in order. `available`: the block's
    /// arguments the backward has anyway (a loop's iteration number).
    pub(super) fn kept(&self, block: &Block, available: &[ValueId]) -> Vec<Kept> {
        let args = block.args.iter().filter(|a| !available.contains(a));
        if self.remat != Remat::None {
            // The carried values the recomputation starts from.
            let (_, needed) = needed(self.f, &self.fixed, block);
            return args
                .filter(|a| needed.contains(a))
                .map(|&a| Kept::Value(a))
                .collect();
        }
        let recomputed = recomputable(self.f, block, available);
        let reads = backward_reads(self.f, &self.fixed, block, &recomputed);
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
    pub(super) fn kept_by_body(&self) -> Vec<Kept> {
        let mut kept = self.kept(&self.f.body, &[]);
        if let Some(a) = self.active_arg() {
            if !kept.iter().any(|k| matches!(k, Kept::Value(v) if *v == a)) {
                kept.insert(0, Kept::Value(a));
            }
        }
        kept
    }

    /// The types of the residuals `@g_fwd` returns after `@g`'s results.
    pub(super) fn residual_types(&self, g: FuncId) -> Vec<Type> {
        let fwd = &self.m.funcs[self.splits[&g].fwd];
        let n = self.m.funcs[g].body.results.len();
        fwd.result_types().split_off(n)
    }

    /// The `k`-th value a loop or a call keeps: `(its loop body's Kept, trips)`, or the call's
    /// residual `(callee, k)`.
    pub(super) fn nested(&self, op: OpId, k: usize) -> Result<(Kept, u64), (FuncId, usize)> {
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

/// What the backward of `block` reads: the ops to recompute and the values they need (the
/// primal values the rules read, closed over their producers in `block`).
pub(super) fn needed(
    f: &Func,
    fixed: &HashSet<ValueId>,
    block: &Block,
) -> (HashSet<OpId>, HashSet<ValueId>) {
    let producer: HashMap<ValueId, OpId> = block
        .ops
        .iter()
        .flat_map(|&id| f.ops[id].results.iter().map(move |&r| (r, id)))
        .collect();
    let mut want: Vec<ValueId> = block
        .ops
        .iter()
        .flat_map(|&id| vjp::reads(f, fixed, &f.ops[id]))
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
