//! A `reduce_sum` over batch axes of the matmul it alone reads, as one GEMM whose contraction
//! runs over those axes too: the weight gradients of a batched product (`Σ_b x[b]ᵀ · dy[b]`,
//! what autodiff writes for weights broadcast over the batch).
//!
//! ```text
//! %g = matmul %xt, %dy : f32[S, b, d, f]    ──▶  Decision::Skip
//! %w = reduce_sum %g, axes = [1] : f32[S, d, f]   Decision::SummedMatMul { matmul: %g's op }
//! ```
//!
//! The runtime folds the summed axes into k where the strides allow (`gemm.rs`): one GEMM
//! with k = b·t instead of b GEMMs with k = t, then a pass over `[S, b, d, f]` partial sums
//! that no longer exist (at d = 1024, BENCHMARKS.md). Fast numerics only: the sum is rounded
//! in another order than the interpreter's (one chain over b and t).

use ppc_dialect::ir::{Block, Func, OpId, ValueId};
use ppc_dialect::op::{OpKind, ReduceOp};
use ppc_dialect::{DType, Type};
use std::collections::{HashMap, HashSet};

/// The reduces of `block` that are one GEMM with the matmul they read: reduce → matmul.
/// `sole_readers`: each value's only reader; `excluded`: ops that must stay as they are
/// (a chain's, over batch entries) and values written into a buffer given from outside.
pub fn find(
    f: &Func,
    block: &Block,
    sole_readers: &HashMap<ValueId, OpId>,
    excluded_ops: &HashSet<OpId>,
    excluded_values: &HashSet<ValueId>,
) -> HashMap<OpId, OpId> {
    let producer: HashMap<ValueId, OpId> = (block.ops.iter())
        .flat_map(|&id| f.ops[id].results.iter().map(move |&v| (v, id)))
        .collect();
    let mut found = HashMap::new();
    for &id in &block.ops {
        let OpKind::Reduce {
            op: ReduceOp::Sum,
            x,
            axes,
        } = &f.ops[id].kind
        else {
            continue;
        };
        let Some(&mm) = producer.get(x) else { continue };
        let OpKind::MatMul { lhs, rhs, mask } = &f.ops[mm].kind else {
            continue;
        };
        let ty = f.ty(*x);
        let batch = ty.rank() - 2;
        // Each operand has every summed axis at full size (none broadcast there), and the
        // stage mask's axis is not summed.
        let full = |v: &ValueId| {
            let t = f.ty(*v);
            t.rank() == ty.rank() && axes.iter().all(|&a| t.dims[a].size == ty.dims[a].size)
        };
        let summable = ty.dtype == DType::F32
            && !axes.is_empty()
            && axes.iter().all(|&a| a < batch)
            && !(mask.is_some() && axes.contains(&0))
            && full(lhs)
            && full(rhs);
        if summable
            && sole_readers.get(x) == Some(&id)
            && !excluded_ops.contains(&id)
            && !excluded_ops.contains(&mm)
            && !excluded_values.contains(x)
        {
            found.insert(id, mm);
        }
    }
    found
}

/// The order of an operand's axes that puts the summed `axes` just before the matrix axes
/// (the runtime's contract), the other batch axes first, each group in its own order.
pub fn operand_order(rank: usize, axes: &[usize]) -> Vec<usize> {
    let batch = rank - 2;
    let kept = (0..batch).filter(|a| !axes.contains(a));
    let summed = (0..batch).filter(|a| axes.contains(a));
    kept.chain(summed).chain([batch, batch + 1]).collect()
}

/// `ty` with its axes in `order` (result axis `i` is axis `order[i]`).
pub fn permuted(ty: &Type, order: &[usize]) -> Type {
    let mut t = ty.clone();
    t.dims = order.iter().map(|&a| ty.dims[a].clone()).collect();
    t
}
