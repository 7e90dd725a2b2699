//! `autodiff` of a `loop`: the forward loop keeps, per iteration, what the reverse body reads
//! (a tape `[trips, ...]`), and the reverse loop runs the same trip count backwards,
//! accumulating the cotangents of what the body reads from outside in its carried values.

use super::autodiff::{callee_slots, slot_type};
use super::autodiff_kept::{bind, free_values, needed, resolve, Residues};
use super::differ::{Cots, Diff};
use super::remat::{recomputable, Remat};
use super::vjp::{bin, zeros, Env};
use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{Block, Func, Op, ValueId};
use ppc_dialect::op::{BinaryOp, Float, OpKind};
use ppc_dialect::{DType, Dim, Type};

impl Diff<'_> {
    /// The loop `op` with one more carried value per value it keeps ([`Diff::kept`]): a tape
    /// `[trips, ...]`, slot `t` holding iteration `t`'s value. Returns its results and tapes.
    pub(super) fn forward_loop(
        &self,
        b: &mut Builder,
        op: &Op,
        env: &Env,
    ) -> Result<(Vec<ValueId>, Vec<ValueId>), Diagnostic> {
        let OpKind::Loop { trips, inits, body } = &op.kind else {
            unreachable!("invariant: called on loops")
        };
        let carried = &body.args[1..];
        let kept = self.kept(body, &body.args[..1]);
        let mut all_inits: Vec<ValueId> = inits.iter().map(|v| env[v]).collect();
        let mut hints: Vec<String> = carried.iter().map(|&c| self.name(c).to_string()).collect();
        for &k in &kept {
            let ty = self.kept_type(k).insert(0, Dim::lit(*trips));
            all_inits.push(zeros(b, &ty)?);
            hints.push(format!("tape_{}", self.kept_name(k)));
        }
        let hints: Vec<&str> = hints.iter().map(String::as_str).collect();
        let mut outs = b.loop_op(*trips, all_inits, &hints, |b, t, car| {
            let mut env = env.clone();
            env.insert(body.args[0], t);
            for (&a, &c) in carried.iter().zip(car) {
                env.insert(a, c);
            }
            let residues = self.forward(b, body, &mut env, None)?;
            let mut yields: Vec<ValueId> = body.results.iter().map(|v| env[v]).collect();
            for (&k, &tape) in kept.iter().zip(&car[carried.len()..]) {
                let write = OpKind::Update {
                    x: tape,
                    update: resolve(k, &env, &residues),
                    index: t,
                    axis: 0,
                };
                yields.push(b.op("tape", write, None)?);
            }
            Ok(yields)
        })?;
        let tapes = outs.split_off(carried.len());
        Ok((outs, tapes))
    }

    /// A loop into a reverse loop of the same trip count (see the module docs).
    pub(super) fn loop_vjp(
        &self,
        b: &mut Builder,
        op: &Op,
        env: &Env,
        tapes: &[ValueId],
        cots: &mut Cots,
    ) -> Result<(), Diagnostic> {
        let OpKind::Loop { trips, inits, body } = &op.kind else {
            unreachable!("invariant: called on loops")
        };
        let carried = &body.args[1..];
        let floats: Vec<usize> = (0..carried.len())
            .filter(|&i| self.is_float(carried[i]))
            .collect();
        if floats
            .iter()
            .all(|&i| !cots.values.contains_key(&op.results[i]))
        {
            return Ok(());
        }
        let captured: Vec<ValueId> = free_values(self.f, body)
            .into_iter()
            .filter(|&v| self.is_float(v))
            .collect();
        let sliced: Vec<bool> = captured
            .iter()
            .map(|&v| only_indexed(self.f, body, v))
            .collect();
        let own_slices: Vec<bool> = captured
            .iter()
            .map(|&v| indexed_by_counter(self.f, body, v))
            .collect();
        let slots = callee_slots(self.m, self.f, body);
        let mut inits_r = Vec::new();
        let mut hints = Vec::new();
        for &i in &floats {
            inits_r.push(match cots.values.get(&op.results[i]) {
                Some(&d) => d,
                None => zeros(b, self.f.ty(carried[i]))?,
            });
            hints.push(format!("d_{}", self.name(carried[i])));
        }
        for &v in &captured {
            inits_r.push(zeros(b, self.f.ty(v))?);
            hints.push(format!("d_{}", self.name(v)));
        }
        for &s in &slots {
            inits_r.push(zeros(b, &slot_type(self.m, s))?);
            let g = &self.m.funcs[s.0];
            hints.push(format!(
                "d_{}_{}",
                g.name, g.values[g.params[s.1].value].name
            ));
        }
        let hints: Vec<&str> = hints.iter().map(String::as_str).collect();
        let kept = self.kept(body, &body.args[..1]);
        let recompute = match self.remat {
            Remat::Stage | Remat::Tick => needed(self.f, &self.fixed, body).0,
            Remat::None => recomputable(self.f, body, &body.args[..1]),
        };
        let outs = b.loop_op(*trips, inits_r, &hints, |b, tr, car| {
            // Iteration `trips - 1 - tr` of the forward loop.
            let last = b.op(
                "last_trip",
                OpKind::Constant {
                    value: Float((*trips - 1) as f64),
                },
                Some(Type::scalar(DType::I32)),
            )?;
            let sub = OpKind::Binary {
                op: BinaryOp::Sub,
                lhs: last,
                rhs: tr,
            };
            let t = b.op("t_fwd", sub, None)?;
            let mut env = env.clone();
            env.insert(body.args[0], t);
            let mut inner = Residues::new();
            for (&k, &tape) in kept.iter().zip(tapes) {
                let read = OpKind::Index {
                    x: tape,
                    index: t,
                    axis: 0,
                };
                let x = b.op(&self.kept_name(k), read, None)?;
                bind(k, x, &mut env, &mut inner);
            }
            inner.extend(self.forward(b, body, &mut env, Some(&recompute))?);
            let mut bc = Cots::default();
            for (k, &i) in floats.iter().enumerate() {
                self.add(b, &mut bc, body.results[i], car[k])?;
            }
            // A captured value read by one `index` only gets its cotangent added into the slice
            // that was read, straight into its accumulator (same bits: one term per iteration);
            // written, where each iteration reads its own slice (a layer's weights).
            for (k, &v) in captured.iter().enumerate() {
                if sliced[k] {
                    let acc = car[floats.len() + k];
                    bc.values.insert(v, acc);
                    if own_slices[k] {
                        bc.fresh.insert(acc);
                    }
                }
            }
            self.backward(b, body, &env, &inner, &mut bc)?;
            let mut next = Vec::new();
            for &i in &floats {
                next.push(match bc.values.get(&carried[i]) {
                    Some(&d) => d,
                    None => zeros(b, self.f.ty(carried[i]))?,
                });
            }
            let mut acc = car[floats.len()..].iter().copied();
            for (&v, &seeded) in captured.iter().zip(&sliced) {
                let a = acc
                    .next()
                    .expect("invariant: an accumulator per captured value");
                next.push(match bc.values.get(&v) {
                    Some(&d) if seeded => d,
                    Some(&d) => bin(b, BinaryOp::Add, a, d)?,
                    None => a,
                });
            }
            for s in &slots {
                let a = acc.next().expect("invariant: an accumulator per parameter");
                next.push(match bc.slots.get(s) {
                    Some(&d) => bin(b, BinaryOp::Add, a, d)?,
                    None => a,
                });
            }
            Ok(next)
        })?;
        let mut outs = outs.into_iter();
        for &i in &floats {
            let d = outs
                .next()
                .expect("invariant: a result per carried cotangent");
            self.add(b, cots, inits[i], d)?;
        }
        for &v in &captured {
            let d = outs.next().expect("invariant: a result per captured value");
            self.add(b, cots, v, d)?;
        }
        for &s in &slots {
            let d = outs.next().expect("invariant: a result per parameter");
            self.add_slot(b, cots, s, d)?;
        }
        Ok(())
    }
}

/// Whether loop body `body` indexes `v` at the iteration's counter (or at the counter
/// broadcast over the stages): each iteration reads a slice of its own.
fn indexed_by_counter(f: &Func, body: &Block, v: ValueId) -> bool {
    let counter = body.args[0];
    let is_counter = |i: ValueId| {
        i == counter
            || body.ops.iter().any(|&id| {
                f.ops[id].results == [i]
                    && matches!(f.ops[id].kind, OpKind::Broadcast { x } if x == counter)
            })
    };
    body.ops.iter().any(
        |&id| matches!(&f.ops[id].kind, OpKind::Index { x, index, .. } if *x == v && is_counter(*index)),
    )
}

/// Whether the only use of `v` in `block` (nested blocks and yields included) is one `index`
/// of `block` itself.
fn only_indexed(f: &Func, block: &Block, v: ValueId) -> bool {
    let indexed = block
        .ops
        .iter()
        .any(|&id| matches!(&f.ops[id].kind, OpKind::Index { x, .. } if *x == v));
    indexed && f.uses(block, v) == 1
}
