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

use ppc_dialect::ir::{names, Func, FuncId, Module, Op, OpId, Value, ValueId};
use ppc_dialect::op::{BinaryOp, Float, OpKind};
use ppc_dialect::{DType, Dim, Type};
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
            let mut calls = HashMap::new();
            let ops = std::mem::take(&mut f.body.ops);
            f.body.ops = add_into_slices(f, ops, g, repeat_at, &spread, &slice_types, &mut calls);
        }
    }
}

/// The results of `g` that are `select %c, (transpose (update %zeros, %slice, %repeat,
/// axis = 1)), -0.0` with `%slice` stage-major.
fn spreads(g: &Func, repeat: ValueId) -> Vec<Spread> {
    let producer = |v: ValueId| {
        (g.body.ops.iter().map(|&id| &g.ops[id].kind))
            .zip(g.body.ops.iter().map(|&id| &g.ops[id].results))
            .find_map(|(k, r)| r.contains(&v).then_some(k))
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
/// another value (its accumulator), at the same block.
fn added_only(f: &Func, g: FuncId, spread: &[Spread]) -> bool {
    let reads = |v: ValueId| {
        f.ops
            .values()
            .filter(|op| op.kind.operands().contains(&v))
            .count()
    };
    f.ops.values().all(|op| match &op.kind {
        OpKind::Call { callee, .. } if *callee == g => spread.iter().all(|s| {
            let r = op.results[s.result];
            let adds = f.ops.values().filter(|a| {
                matches!(a.kind, OpKind::Binary { op: BinaryOp::Add, lhs, rhs } if rhs == r && lhs != r)
            });
            reads(r) == 1 && adds.count() == 1
        }),
        _ => true,
    })
}

/// Makes `g` return `s`'s slice, `-0.0` where `active` is false (as a matmul masked by it
/// already is).
fn return_masked_slice(g: &mut Func, s: &Spread, active: ValueId) {
    let masked = g.ops.values().any(|op| {
        op.results.contains(&s.slice)
            && matches!(op.kind, OpKind::MatMul { mask: Some(m), .. } if m == active)
    });
    if masked {
        g.body.results[s.result] = s.slice;
        g.remove_dead_ops();
        return;
    }
    let ty = g.ty(s.slice).clone();
    let dims = (0..ty.rank())
        .map(|a| {
            if a == 0 {
                ty.dims[0].clone()
            } else {
                Dim::lit(1)
            }
        })
        .collect();
    let mut names: HashSet<String> = g.values.values().map(|v| v.name.clone()).collect();
    let mut ops = Vec::new();
    let mut new = |g: &mut Func, name: &str, ty: Type, kind: OpKind| {
        push(g, &mut ops, &mut names, name, ty, kind)
    };
    let mask = new(
        g,
        "active_at",
        Type::new(DType::I1, dims),
        OpKind::Reshape { x: active },
    );
    let value = Float(-0.0);
    let zero = new(
        g,
        "zero",
        Type::scalar(ty.dtype),
        OpKind::Constant { value },
    );
    let (cond, on_true, on_false) = (mask, s.slice, zero);
    let masked = new(
        g,
        "d",
        ty,
        OpKind::Select {
            cond,
            on_true,
            on_false,
        },
    );
    g.body.ops.extend(ops);
    g.body.results[s.result] = masked;
    g.remove_dead_ops();
}

/// `ops` of `f` with each spread result of a call of `g` (whose results now have
/// `slice_types`) added into its repeat's slice of the accumulator; loop bodies too.
/// `calls` maps each such result to the call's repeat.
fn add_into_slices(
    f: &mut Func,
    ops: Vec<OpId>,
    g: FuncId,
    repeat_at: usize,
    spread: &[Spread],
    slice_types: &[Type],
    calls: &mut HashMap<ValueId, ValueId>,
) -> Vec<OpId> {
    let mut names: HashSet<String> = f.values.values().map(|v| v.name.clone()).collect();
    let mut out = Vec::new();
    for id in ops {
        match f.ops[id].kind.clone() {
            OpKind::Loop { .. } => {
                let OpKind::Loop { body, .. } = &mut f.ops[id].kind else {
                    unreachable!()
                };
                let inner = std::mem::take(&mut body.ops);
                let inner = add_into_slices(f, inner, g, repeat_at, spread, slice_types, calls);
                let OpKind::Loop { body, .. } = &mut f.ops[id].kind else {
                    unreachable!()
                };
                body.ops = inner;
            }
            OpKind::Call { callee, args, .. } if callee == g => {
                for (s, ty) in spread.iter().zip(slice_types) {
                    let r = f.ops[id].results[s.result];
                    f.values[r].ty = ty.clone();
                    calls.insert(r, args[repeat_at]);
                }
            }
            OpKind::Binary {
                op: BinaryOp::Add,
                lhs: acc,
                rhs,
            } if calls.contains_key(&rhs) => {
                let repeat = calls[&rhs];
                let slice_ty = f.ty(rhs).clone();
                // The new ops are the accumulation's: its line in diagnostics and traces.
                let span = f.op_spans.lookup(&id);
                let mut new = |f: &mut Func, name: &str, ty: Type, kind: OpKind| {
                    let v = push(f, &mut out, &mut names, name, ty, kind);
                    if let (Some(span), Some(&op)) = (span, out.last()) {
                        f.op_spans.set(op, span);
                    }
                    v
                };
                let kind = OpKind::Reshape { x: repeat };
                let at = new(f, "repeat_here", Type::scalar(DType::I32), kind);
                let kind = OpKind::Index {
                    x: acc,
                    index: at,
                    axis: 0,
                };
                let slice = new(f, "d_repeat", slice_ty.clone(), kind);
                let kind = OpKind::Binary {
                    op: BinaryOp::Add,
                    lhs: slice,
                    rhs,
                };
                let sum = new(f, "d_repeat", slice_ty, kind);
                f.ops[id].kind = OpKind::Update {
                    x: acc,
                    update: sum,
                    index: at,
                    axis: 0,
                };
            }
            _ => {}
        }
        out.push(id);
    }
    out
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
