//! The VJP of `gather` with respect to its table: a scatter-add, each row of the table
//! receiving the sum of the cotangents of the positions that read it.
//!
//! Written as a one-hot matrix product, `d_table[p, v, r] = Σ_q [clamp(ids[p, q]) = v] · d[p, q, r]`,
//! so that the sum over positions runs in the GEMM's fixed order: the same bytes on every
//! thread and rank count, with no atomic adds and no op of its own to lower. Its cost is
//! `2·V·Q·R` per shared index `p` (V rows, Q positions, R elements a row), which for a
//! byte-level or small vocabulary is below the forward layers' matmuls.
//!
//! ```text
//! %e = gather %w, %ids, axis = 0 : f32[b, t, d]        %hot = eq %clamped, %rows : i1[1, b·t, V]
//!                                            ──▶       %d_w = matmul (transpose %hot), %d_e : f32[1, V, d]
//! ```

use ppc_dialect::build::Builder;
use ppc_dialect::diag::Diagnostic;
use ppc_dialect::ir::ValueId;
use ppc_dialect::op::{BinaryOp, CmpPred, Float, OpKind};
use ppc_dialect::{DType, Type};

/// The cotangent of `table` (of type `table_ty`) for `gather(table, ids, axis)` with result
/// cotangent `d`.
pub fn scatter_add(
    b: &mut Builder,
    table_ty: &Type,
    ids: ValueId,
    d: ValueId,
    axis: usize,
) -> Result<ValueId, Diagnostic> {
    let shape = table_ty.shape();
    let shared: u64 = shape[..axis].iter().product();
    let rows = shape[axis];
    let row: u64 = shape[axis + 1..].iter().product();
    let positions = b.ty(ids).elements() / shared;
    let dt = b.ty(d).dtype;
    let reshape = |b: &mut Builder, x: ValueId, dtype: DType, dims: &[u64]| {
        b.op("r", OpKind::Reshape { x }, Some(Type::of(dtype, dims)))
    };
    let constant = |b: &mut Builder, v: u64| {
        let value = Float(v as f64);
        b.op(
            "c",
            OpKind::Constant { value },
            Some(Type::scalar(DType::I32)),
        )
    };
    // The ids as the forward read them: clamped into the table.
    let ids = reshape(b, ids, DType::I32, &[shared, positions, 1])?;
    let (lo, hi) = (constant(b, 0)?, constant(b, rows - 1)?);
    let below = b.op(
        "ids",
        OpKind::Binary {
            op: BinaryOp::Min,
            lhs: ids,
            rhs: hi,
        },
        None,
    )?;
    let ids = b.op(
        "ids",
        OpKind::Binary {
            op: BinaryOp::Max,
            lhs: below,
            rhs: lo,
        },
        None,
    )?;
    let each_row = b.op(
        "rows",
        OpKind::Iota { axis: 2 },
        Some(Type::of(DType::I32, &[1, 1, rows])),
    )?;
    let hot = b.op(
        "hot",
        OpKind::Compare {
            pred: CmpPred::Eq,
            lhs: ids,
            rhs: each_row,
        },
        None,
    )?;
    let hot = b.op(
        "hot",
        OpKind::Convert { x: hot },
        Some(Type::of(dt, &[shared, positions, rows])),
    )?;
    let hot_t = b.op(
        "hot_t",
        OpKind::Transpose {
            x: hot,
            perm: vec![0, 2, 1],
        },
        None,
    )?;
    let d = reshape(b, d, dt, &[shared, positions, row])?;
    let sums = b.op(
        "d",
        OpKind::MatMul {
            lhs: hot_t,
            rhs: d,
            mask: None,
        },
        None,
    )?;
    b.op(
        "d",
        OpKind::Reshape { x: sums },
        Some(table_ty.with_dtype(dt)),
    )
}
