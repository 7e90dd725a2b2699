//! Where a rank holds one stage of a circular pipeline, each weight gradient of the stage's
//! backward is added into its repeat's slice of the accumulator, not over all repeats (the
//! last step of `autodiff`).
//!
//! The stage runs repeat `r` of its weights `[R, 1, ...]`, read as `index (transpose %w),
//! %repeat, axis = 1`. The rule for `index` makes the gradient `[1, R, ...]` zeros with the
//! slice written, transposed back and masked, and the caller adds all of it to its
//! accumulator: five passes over R times the stage's weights per call, for one slice of data
//! (on 2 ranks the MLP's circular step spent more time in them than in its GEMMs). Here the
//! backward returns the masked slice, and the caller adds it into its slice in place:
//!
//! ```text
//! %u = update %zero, %g, %repeat, axis = 1        %r = reshape %repeat : i32[]
//! %t = transpose %u, perm = [1, 0, ..]       ──▶  %slice = index %acc, %r, axis = 0
//! %d = select %active_at, %t, -0.0                %sum = add %slice, %d     (%d: %g masked)
//! caller: %acc.1 = add %acc, %d                   %acc.1 = update %acc, %sum, %r, axis = 0
//! ```
//!
//! The same bits: every other slice of the accumulator gained `-0.0`, which changes no float,
//! and the slice gains the same masked value. With several stages on a rank their repeats
//! differ, the slices are no view of the accumulator, and the program is left as it is.

use super::stage_mask::mask_inactive;
use ppc_dialect::build::Builder;
use ppc_dialect::ir::{names, Block, Func, FuncId, Module, Op, OpId, Value, ValueId};
use ppc_dialect::op::{BinaryOp, OpKind};
use ppc_dialect::{DType, Type};
use std::collections::{HashMap, HashSet};

/// A result of a stage's backward that is its repeat's slice spread over all repeats.
struct Spread {
    result: usize,
    /// The stage's slice, `[1, ...]`.
    slice: ValueId,
}

pub fn repeat_grads(m: &mut Module) {
    if m.pipeline.repeats == 1 {
        return;
    }
    for name in names::stage_backwards() {
        let Some(g) = m.func_id(&name) else { continue };
        let f = &m.funcs[g];
        let args = &f.body.args;
        let repeat_at = args.iter().position(|&a| f.values[a].name == names::REPEAT);
        let active = args.iter().copied().find(|&a| f.ty(a).dtype == DType::I1);
        let (Some(repeat_at), Some(active)) = (repeat_at, active) else {
            continue;
        };
        let spread = spreads(f, args[repeat_at]);
        // Only where every caller adds each of them to an accumulator and reads it nowhere else.
        let added = (m.funcs.values()).all(|c| added_only(c, g, &spread));
        if spread.is_empty() || !added {
            continue;
        }
        for s in &spread {
            return_masked_slice(&mut m.funcs[g], s, active);
        }
        let slice_types: Vec<Type> = spread
            .iter()
            .map(|s| m.funcs[g].ty(s.slice).clone())
            .collect();
        for f in m.funcs.values_mut() {
            let mut rewrite = Rewrite {
                g,
                repeat_at,
                spread: &spread,
                slice_types: &slice_types,
                calls: HashMap::new(),
                names: f.values.values().map(|v| v.name.clone()).collect(),
            };
            let ops = std::mem::take(&mut f.body.ops);
            f.body.ops = rewrite.block(f, ops);
        }
    }
}

/// The results of `g` that are `select %c, (transpose (update %zeros, %slice, %repeat,
/// axis = 1)), -0.0` with `%slice` stage-major.
fn spreads(g: &Func, repeat: ValueId) -> Vec<Spread> {
    let producer = |v: ValueId| {
        (g.body.ops.iter().map(|&id| &g.ops[id]))
            .find(|op| op.results.contains(&v))
            .map(|op| &op.kind)
    };
    let zero =
        |v: ValueId| matches!(producer(v), Some(OpKind::Constant { value }) if value.0 == 0.0);
    let mut out = Vec::new();
    for (result, &r) in g.body.results.iter().enumerate() {
        let Some(OpKind::Select {
            on_true, on_false, ..
        }) = producer(r)
        else {
            continue;
        };
        let Some(OpKind::Transpose { x, perm }) = producer(*on_true) else {
            continue;
        };
        let Some(OpKind::Update {
            x: zeros,
            update,
            index,
            axis: 1,
        }) = producer(*x)
        else {
            continue;
        };
        // One stage, first: `[1, ...]`, the slice of `[R, 1, ...]` at its repeat.
        let one_stage = g.ty(*update).stage_axis().map(|(at, _)| at) == Some(0)
            && g.ty(*update).dims[0].size == 1;
        let swap = perm[..2] == [1, 0] && perm[2..].iter().enumerate().all(|(i, &p)| p == i + 2);
        if *index == repeat && zero(*zeros) && zero(*on_false) && one_stage && swap {
            out.push(Spread {
                result,
                slice: *update,
            });
        }
    }
    out
}

/// Whether in `f` each spread result of every call of `g` is read once, by an `add` to
/// another value (its accumulator).
fn added_only(f: &Func, g: FuncId, spread: &[Spread]) -> bool {
    fn walk(f: &Func, block: &Block, out: &mut Vec<OpId>) {
        for &id in &block.ops {
            out.push(id);
            if let OpKind::Loop { body, .. } = &f.ops[id].kind {
                walk(f, body, out);
            }
        }
    }
    let mut ops = Vec::new();
    walk(f, &f.body, &mut ops);
    let added = |r: ValueId| {
        ops.iter().any(|&a| {
            matches!(f.ops[a].kind, OpKind::Binary { op: BinaryOp::Add, lhs, rhs } if rhs == r && lhs != r)
        })
    };
    ops.iter().all(|&id| match &f.ops[id].kind {
        OpKind::Call { callee, .. } if *callee == g => spread.iter().all(|s| {
            let r = f.ops[id].results[s.result];
            f.uses(&f.body, r) == 1 && added(r)
        }),
        _ => true,
    })
}

/// Makes `g` return `s`'s slice, `-0.0` where `active` is false, as autodiff masks a stage
/// backward's results (`stage_mask.rs`).
fn return_masked_slice(g: &mut Func, s: &Spread, active: ValueId) {
    let mut b = Builder::resume(std::mem::replace(g, Func::new(&g.name)));
    let masked = mask_inactive(&mut b, Some(active), s.slice)
        .expect("invariant: a select of the stage's slice on its mask type-checks");
    let mut results = b.func.body.results.clone();
    results[s.result] = masked;
    *g = b.finish(results);
    g.remove_dead_ops();
}

/// What rewrites a function's calls of `g` and the additions of their spread results.
struct Rewrite<'a> {
    g: FuncId,
    repeat_at: usize,
    spread: &'a [Spread],
    /// The types of the results of `g` that now return a slice.
    slice_types: &'a [Type],
    /// Each spread result of a call met so far, with the call's repeat.
    calls: HashMap<ValueId, ValueId>,
    names: HashSet<String>,
}

/// One op as the rewrite sees it.
enum Seen {
    Loop,
    Call { repeat: ValueId },
    Added { acc: ValueId, d: ValueId },
    Other,
}

impl Rewrite<'_> {
    /// `ops` of `f`, loop bodies included, with each spread result of a call of `g` added into
    /// its repeat's slice of the accumulator.
    fn block(&mut self, f: &mut Func, ops: Vec<OpId>) -> Vec<OpId> {
        let mut out = Vec::new();
        for id in ops {
            let seen = match &f.ops[id].kind {
                OpKind::Loop { .. } => Seen::Loop,
                OpKind::Call { callee, args, .. } if *callee == self.g => Seen::Call {
                    repeat: args[self.repeat_at],
                },
                OpKind::Binary {
                    op: BinaryOp::Add,
                    lhs,
                    rhs,
                } if self.calls.contains_key(rhs) => Seen::Added { acc: *lhs, d: *rhs },
                _ => Seen::Other,
            };
            match seen {
                Seen::Loop => {
                    let inner = std::mem::take(loop_ops(f, id));
                    *loop_ops(f, id) = self.block(f, inner);
                }
                Seen::Call { repeat } => {
                    for (s, ty) in self.spread.iter().zip(self.slice_types) {
                        let r = f.ops[id].results[s.result];
                        f.values[r].ty = ty.clone();
                        self.calls.insert(r, repeat);
                    }
                }
                Seen::Added { acc, d } => self.add_into_slice(f, &mut out, id, acc, d),
                Seen::Other => {}
            }
            out.push(id);
        }
        out
    }

    /// Turns `add %acc, %d` (op `id`) into an update of `%acc`'s slice at the call's repeat,
    /// the ops before it appended to `out`.
    fn add_into_slice(
        &mut self,
        f: &mut Func,
        out: &mut Vec<OpId>,
        id: OpId,
        acc: ValueId,
        d: ValueId,
    ) {
        let repeat = self.calls[&d];
        let slice_ty = f.ty(d).clone();
        // The new ops are the accumulation's: its line in diagnostics and traces.
        let span = f.op_spans.lookup(&id);
        let names = &mut self.names;
        let mut new = |f: &mut Func, name: &str, ty: Type, kind: OpKind| {
            let v = push(f, out, names, name, ty, kind);
            if let (Some(span), Some(&op)) = (span, out.last()) {
                f.op_spans.set(op, span);
            }
            v
        };
        let kind = OpKind::Reshape { x: repeat };
        let at = new(f, "repeat_here", Type::scalar(DType::I32), kind);
        let (index, axis) = (at, 0);
        let kind = OpKind::Index {
            x: acc,
            index,
            axis,
        };
        let slice = new(f, "d_repeat", slice_ty.clone(), kind);
        let (op, lhs, rhs) = (BinaryOp::Add, slice, d);
        let sum = new(f, "d_repeat", slice_ty, OpKind::Binary { op, lhs, rhs });
        f.ops[id].kind = OpKind::Update {
            x: acc,
            update: sum,
            index,
            axis,
        };
    }
}

fn loop_ops(f: &mut Func, id: OpId) -> &mut Vec<OpId> {
    match &mut f.ops[id].kind {
        OpKind::Loop { body, .. } => &mut body.ops,
        _ => unreachable!("invariant: a loop"),
    }
}

/// Adds an op of one result, named after `name` (unique in `f`), to `f` and to `ops`.
fn push(
    f: &mut Func,
    ops: &mut Vec<OpId>,
    names: &mut HashSet<String>,
    name: &str,
    ty: Type,
    kind: OpKind,
) -> ValueId {
    let name = (0..)
        .map(|i| match i {
            0 => name.to_string(),
            i => format!("{name}.{i}"),
        })
        .find(|n| !names.contains(n))
        .expect("a free name");
    names.insert(name.clone());
    let v = f.values.push(Value { name, ty });
    ops.push(f.ops.push(Op {
        kind,
        results: vec![v],
    }));
    v
}
