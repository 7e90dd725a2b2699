//! The batching rules of `vmap-stages` and `embed-head`: one arm per op, rewriting an op of a
//! function on one microbatch into the same op over a leading axis (the stages, or the
//! microbatches).
//!
//! A value is *batched* when it carries that axis in front (activations, and a stage's
//! parameters) and *unbatched* when it is the same for every entry (constants, iotas, the
//! parameters of `@embed` and `@head`, and what is computed from them only). Unbatched operands broadcast against batched ones by NumPy's trailing-axis
//! rule, so they stay as they are; a batched operand of lower rank than the result gets unit axes
//! after the stage axis so that its own axes stay aligned with the result's trailing axes.

use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::{Block, Func, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::{Dim, Type};
use std::collections::HashMap;

/// A value of the stage program and whether it carries the stage axis.
#[derive(Clone, Copy, Debug)]
pub struct Batched {
    pub value: ValueId,
    pub batched: bool,
}

/// The axis ops are vectorized over, the builder of the vectorized function, and which
/// matmuls are skipped.
pub struct Ctx<'b> {
    pub b: &'b mut Builder,
    pub stage: Dim,
    pub mask: Mask,
}

/// Which entries of the axis skip their matmuls.
#[derive(Clone, Copy, Debug)]
pub enum Mask {
    /// `%active: i1[S]`, false for stages in a bubble slot, which batched matmuls take so
    /// bubbles cost nothing.
    PerEntry(ValueId),
    /// Every entry runs (the microbatches of `@embed` and `@head`, on the ranks that run
    /// them). A matmul of a batched operand by an unbatched matrix (a weight of `@head`) is
    /// then one GEMM over every row of every entry, not one per entry.
    Whole,
}

impl Ctx<'_> {
    fn stacked(&self, t: &Type) -> Type {
        t.insert(0, self.stage.clone())
    }

    /// `v` (batched) with unit axes inserted after the stage axis up to rank `rank` + 1.
    fn align(&mut self, v: ValueId, rank: usize) -> Result<ValueId, Diagnostic> {
        let t = self.b.ty(v).clone();
        if t.rank() > rank {
            return Ok(v);
        }
        let mut dims = vec![t.dims[0].clone()];
        dims.extend((0..rank + 1 - t.rank()).map(|_| Dim::lit(1)));
        dims.extend(t.dims[1..].iter().cloned());
        let name = self.b.func.values[v].name.clone();
        self.b.op(
            &format!("{name}_aligned"),
            OpKind::Reshape { x: v },
            Some(Type::new(t.dtype, dims)),
        )
    }

    /// `v` with the stage axis, broadcasting it if it is unbatched.
    fn ensure(&mut self, v: Batched) -> Result<ValueId, Diagnostic> {
        if v.batched {
            return Ok(v.value);
        }
        let t = self.stacked(self.b.ty(v.value));
        let name = self.b.func.values[v.value].name.clone();
        self.b.op(
            &format!("{name}_stages"),
            OpKind::Broadcast { x: v.value },
            Some(t),
        )
    }

    /// With [`Mask::Whole`], a batched `[A, ..., k]` times an unbatched matrix `[k, n]` as one
    /// GEMM over all `A·...` rows.
    fn flat_matmul(
        &mut self,
        ins: &[Batched],
        result: &Type,
    ) -> Result<Option<Batched>, Diagnostic> {
        let Mask::Whole = self.mask else {
            return Ok(None);
        };
        let (lhs, rhs) = (ins[0], ins[1]);
        if !lhs.batched || rhs.batched || self.b.ty(rhs.value).rank() != 2 {
            return Ok(None);
        }
        let lt = self.b.ty(lhs.value).clone();
        let k = lt.dims[lt.rank() - 1].clone();
        let n = result.dims[result.rank() - 1].clone();
        let rows: u64 = lt.dims[..lt.rank() - 1].iter().map(|d| d.size).product();
        let flat = |last: Dim| vec![Dim::lit(rows), last];
        let rows_ty = Type::new(lt.dtype, flat(k));
        let x = self
            .b
            .op("rows", OpKind::Reshape { x: lhs.value }, Some(rows_ty))?;
        let out_ty = Type::new(result.dtype, flat(n));
        let y = self.b.op(
            "rows_out",
            OpKind::MatMul {
                lhs: x,
                rhs: rhs.value,
                mask: None,
            },
            Some(out_ty),
        )?;
        let value = self
            .b
            .op("out", OpKind::Reshape { x: y }, Some(self.stacked(result)))?;
        Ok(Some(Batched {
            value,
            batched: true,
        }))
    }

    /// Operands of an elementwise op, batched ones aligned to `rank` (the result's rank).
    fn elementwise(&mut self, xs: &[Batched], rank: usize) -> Result<Vec<ValueId>, Diagnostic> {
        xs.iter()
            .map(|x| {
                if x.batched {
                    self.align(x.value, rank)
                } else {
                    Ok(x.value)
                }
            })
            .collect()
    }
}

/// Rewrites one op of the layer. `ins` are its operands in the stage program, `result` the
/// op's result type in the layer. Returns the result in the stage program.
pub fn batch(
    cx: &mut Ctx,
    hint: &str,
    kind: &OpKind,
    ins: &[Batched],
    result: &Type,
) -> Result<Batched, Diagnostic> {
    let any = ins.iter().any(|x| x.batched);
    let declared = |cx: &Ctx, any: bool| {
        Some(if any {
            cx.stacked(result)
        } else {
            result.clone()
        })
    };
    let rank = result.rank();
    let v = |i: usize| ins[i].value;
    let kind = match kind {
        OpKind::Unary { op, .. } => OpKind::Unary { op: *op, x: v(0) },
        OpKind::Binary { op, .. } => {
            let a = cx.elementwise(ins, rank)?;
            OpKind::Binary {
                op: *op,
                lhs: a[0],
                rhs: a[1],
            }
        }
        OpKind::Compare { pred, .. } => {
            let a = cx.elementwise(ins, rank)?;
            OpKind::Compare {
                pred: *pred,
                lhs: a[0],
                rhs: a[1],
            }
        }
        OpKind::Select { .. } => {
            let a = cx.elementwise(ins, rank)?;
            OpKind::Select {
                cond: a[0],
                on_true: a[1],
                on_false: a[2],
            }
        }
        OpKind::MatMul { mask: Some(_), .. } => {
            return Err(Diagnostic::error(
                "a masked `matmul` cannot be vectorized over stages",
                cx.b.span,
                "inside `@layer`",
            )
            .with_note(
                "masks are how the pipeline skips bubbles; write the plain `matmul %a, %b`",
            ))
        }
        OpKind::MatMul { mask: None, .. } => {
            if let Some(v) = cx.flat_matmul(ins, result)? {
                return Ok(v);
            }
            let a = cx.elementwise(ins, rank)?;
            let mask = match cx.mask {
                _ if !any => None,
                Mask::PerEntry(active) => Some(active),
                Mask::Whole => None,
            };
            OpKind::MatMul {
                lhs: a[0],
                rhs: a[1],
                mask,
            }
        }
        OpKind::Transpose { perm, .. } => {
            let perm = if any {
                std::iter::once(0)
                    .chain(perm.iter().map(|p| p + 1))
                    .collect()
            } else {
                perm.clone()
            };
            OpKind::Transpose { x: v(0), perm }
        }
        OpKind::Reshape { .. } => OpKind::Reshape { x: v(0) },
        OpKind::Convert { .. } => OpKind::Convert { x: v(0) },
        OpKind::Broadcast { .. } => {
            let x = if any { cx.align(v(0), rank)? } else { v(0) };
            OpKind::Broadcast { x }
        }
        OpKind::Slice { start, end, .. } => {
            let (mut s, mut e) = (start.clone(), end.clone());
            if any {
                s.insert(0, 0);
                e.insert(0, cx.stage.size);
            }
            OpKind::Slice {
                x: v(0),
                start: s,
                end: e,
            }
        }
        OpKind::Concat { axis, .. } => {
            let xs = if any {
                ins.iter()
                    .map(|&x| cx.ensure(x))
                    .collect::<Result<_, _>>()?
            } else {
                ins.iter().map(|x| x.value).collect()
            };
            OpKind::Concat {
                xs,
                axis: axis + usize::from(any),
            }
        }
        OpKind::Reduce { op, axes, .. } => {
            let axes = axes.iter().map(|a| a + usize::from(any)).collect();
            OpKind::Reduce {
                op: *op,
                x: v(0),
                axes,
            }
        }
        OpKind::Softmax { axis, log, .. } => OpKind::Softmax {
            x: v(0),
            axis: axis + usize::from(any),
            log: *log,
        },
        OpKind::LayerNorm { axis, eps, .. } => OpKind::LayerNorm {
            x: v(0),
            axis: axis + usize::from(any),
            eps: *eps,
        },
        OpKind::Iota { axis } => OpKind::Iota { axis: *axis },
        OpKind::Constant { value } => OpKind::Constant { value: *value },
        OpKind::Pad {
            axis,
            low,
            high,
            fill,
            ..
        } => OpKind::Pad {
            x: v(0),
            axis: axis + usize::from(any),
            low: *low,
            high: *high,
            fill: *fill,
        },
        OpKind::Shift { axis, fill, .. } => OpKind::Shift {
            x: v(0),
            axis: axis + usize::from(any),
            fill: *fill,
        },
        OpKind::Index { axis, .. } => {
            let (x, index) = if any {
                (cx.ensure(ins[0])?, cx.ensure(ins[1])?)
            } else {
                (v(0), v(1))
            };
            OpKind::Index {
                x,
                index,
                axis: axis + usize::from(any),
            }
        }
        // Rows of a table every entry shares (an embedding) by batched ids: the ids' new
        // leading axis is the result's, nothing is copied.
        OpKind::Gather { axis: 0, .. } if !ins[0].batched => OpKind::Gather {
            table: v(0),
            ids: v(1),
            axis: 0,
        },
        OpKind::Gather { axis, .. } => {
            let (table, ids) = if any {
                (cx.ensure(ins[0])?, cx.ensure(ins[1])?)
            } else {
                (v(0), v(1))
            };
            OpKind::Gather {
                table,
                ids,
                axis: axis + usize::from(any),
            }
        }
        OpKind::Update { axis, .. } => {
            let (x, update, index) = if any {
                (cx.ensure(ins[0])?, cx.ensure(ins[1])?, cx.ensure(ins[2])?)
            } else {
                (v(0), v(1), v(2))
            };
            OpKind::Update {
                x,
                update,
                index,
                axis: axis + usize::from(any),
            }
        }
        OpKind::Call { .. } | OpKind::Loop { .. } | OpKind::Rank | OpKind::Exchange { .. } => return Err(Diagnostic::error(
            format!("`{}` cannot be vectorized over stages", kind.name()),
            cx.b.span,
            "inside `@layer`",
        )
        .with_note(
            "the one-stage compute must be straight-line ops; loops, calls, ranks and exchanges belong to the passes",
        )),
    };
    let declared = if kind.has_declared_type() {
        declared(cx, any)
    } else {
        None
    };
    let value = cx.b.op(hint, kind, declared)?;
    Ok(Batched {
        value,
        batched: any,
    })
}

/// Rewrites the ops of `block` of `f` (straight-line: a model function after inlining) by
/// [`batch`], `env` holding its arguments and parameters; returns its one result, batched.
pub fn batch_block(
    cx: &mut Ctx,
    f: &Func,
    block: &Block,
    env: &mut HashMap<ValueId, Batched>,
) -> Result<ValueId, Diagnostic> {
    for &id in &block.ops {
        let op = &f.ops[id];
        cx.b.span = f.op_spans.get(&id);
        let ins: Vec<Batched> = op.kind.operands().iter().map(|v| env[v]).collect();
        let result = op.results[0];
        let out = batch(cx, &f.values[result].name, &op.kind, &ins, f.ty(result))?;
        env.insert(result, out);
    }
    let ret = env[&block.results[0]];
    cx.ensure(ret)
}
