//! Shape inference: the result types of an op from its operand types, or why there are none.
//!
//! The parser uses it to type what users write, passes use it to type what they build, and the
//! verifier uses it to re-check every op. Errors name both shapes involved and, where one operand
//! is at fault, which one, so the diagnostic can point at it.

use crate::ir::Func;
use crate::op::{OpKind, ReduceOp};
use crate::types::{sizes, DType, Dim, Label, Type};

/// The most elements one tensor may have (2^32): anything larger is a typo, not a model.
pub const MAX_ELEMENTS: u64 = 1 << 32;

/// The most axes of a `matmul` operand (the runtime's GEMM keeps shapes inline).
pub use ppc_tensor::tensor::MAX_MATMUL_RANK;

/// Why an op's operands do not fit it.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeError {
    pub message: String,
    /// The operand to point at, by position, if one is at fault.
    pub operand: Option<usize>,
}

fn err<T>(message: impl Into<String>, operand: Option<usize>) -> Result<T, TypeError> {
    Err(TypeError {
        message: message.into(),
        operand,
    })
}

/// Why a shape cannot be a tensor's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("shape {shape:?} overflows a 64-bit element count")]
    Overflow { shape: Vec<u64> },
    #[error("shape {shape:?} has {elements} elements, more than the limit of {MAX_ELEMENTS}")]
    TooLarge { shape: Vec<u64>, elements: u64 },
    #[error("shape {shape:?} has a zero-sized dimension")]
    ZeroSized { shape: Vec<u64> },
}

/// Element count of `shape`, or an error if it overflows or exceeds [`MAX_ELEMENTS`].
pub fn checked_elements(shape: &[u64]) -> Result<u64, ShapeError> {
    let n = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| ShapeError::Overflow {
            shape: shape.to_vec(),
        })?;
    if n > MAX_ELEMENTS {
        return Err(ShapeError::TooLarge {
            shape: shape.to_vec(),
            elements: n,
        });
    }
    if shape.contains(&0) {
        return Err(ShapeError::ZeroSized {
            shape: shape.to_vec(),
        });
    }
    Ok(n)
}

/// The NumPy broadcast of two types' shapes (dtype of `a`), or `None`.
pub fn broadcast_types(a: &Type, b: &Type) -> Option<Type> {
    let rank = a.rank().max(b.rank());
    let mut dims = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = (i + a.rank()).checked_sub(rank).map(|j| &a.dims[j]);
        let db = (i + b.rank()).checked_sub(rank).map(|j| &b.dims[j]);
        dims.push(match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            // Equal sizes: keep the more telling label (a pipeline axis, then a name).
            (Some(x), Some(y)) if x.size == y.size => {
                let rank = |d: &Dim| match d.label {
                    Label::Axis(_) => 2,
                    Label::Named(_) => 1,
                    Label::Size => 0,
                };
                if rank(x) >= rank(y) {
                    x.clone()
                } else {
                    y.clone()
                }
            }
            (Some(x), Some(y)) if y.size == 1 => x.clone(),
            (Some(x), Some(y)) if x.size == 1 => y.clone(),
            _ => return None,
        });
    }
    Some(Type::new(a.dtype, dims))
}

fn same_dtype(op: &str, a: &Type, b: &Type, operand: usize) -> Result<(), TypeError> {
    if a.dtype != b.dtype {
        return err(
            format!("dtype mismatch in `{op}`: {} and {}", sizes(a), sizes(b)),
            Some(operand),
        );
    }
    Ok(())
}

fn broadcast2(op: &str, a: &Type, b: &Type) -> Result<Type, TypeError> {
    broadcast_types(a, b).ok_or_else(|| TypeError {
        message: format!(
            "shape mismatch in `{op}`: {} and {} do not broadcast",
            sizes(a),
            sizes(b)
        ),
        operand: Some(1),
    })
}

fn axis_in(op: &str, t: &Type, axis: usize, operand: usize) -> Result<(), TypeError> {
    if axis >= t.rank() {
        return err(
            format!(
                "axis {axis} is out of range for `{op}` on {} (rank {})",
                sizes(t),
                t.rank()
            ),
            Some(operand),
        );
    }
    Ok(())
}

fn need_float(op: &str, t: &Type) -> Result<(), TypeError> {
    if !t.dtype.is_float() {
        return err(
            format!("`{op}` needs a floating-point operand, got {}", sizes(t)),
            Some(0),
        );
    }
    Ok(())
}

/// Result types of `kind`. `operands` are the operand types in text order; `declared` the
/// written result types (required by ops with [`OpKind::has_declared_type`]); `callee` the
/// function a `call` calls.
pub fn infer(
    kind: &OpKind,
    operands: &[&Type],
    declared: &[Type],
    callee: Option<&Func>,
) -> Result<Vec<Type>, TypeError> {
    let name = kind.name();
    let x = || operands[0];
    let one = |t: Type| Ok(vec![t]);
    let declared_one = || -> Result<&Type, TypeError> {
        match declared {
            [t] => Ok(t),
            _ => err(
                format!("`{name}` needs exactly one result type after `:`"),
                None,
            ),
        }
    };
    match kind {
        OpKind::Unary { .. } => {
            need_float(name, x())?;
            one(x().clone())
        }
        OpKind::Binary { .. } => {
            same_dtype(name, x(), operands[1], 1)?;
            if x().dtype == DType::I1 {
                return err(format!("`{name}` does not take i1 operands"), Some(0));
            }
            one(broadcast2(name, x(), operands[1])?)
        }
        OpKind::Compare { .. } => {
            same_dtype(name, x(), operands[1], 1)?;
            one(broadcast2(name, x(), operands[1])?.with_dtype(DType::I1))
        }
        OpKind::Select { .. } => {
            let (c, t, f) = (x(), operands[1], operands[2]);
            if c.dtype != DType::I1 {
                return err(
                    format!("`select` needs an i1 condition, got {}", sizes(c)),
                    Some(0),
                );
            }
            same_dtype(name, t, f, 2)?;
            let tf = broadcast2(name, t, f)?;
            let all = broadcast_types(&tf, &c.with_dtype(t.dtype)).ok_or_else(|| TypeError {
                message: format!(
                    "shape mismatch in `select`: condition {} does not broadcast with {}",
                    sizes(c),
                    sizes(&tf)
                ),
                operand: Some(0),
            })?;
            one(all)
        }
        OpKind::MatMul { .. } => {
            let (a, b) = (x(), operands[1]);
            same_dtype(name, a, b, 1)?;
            need_float(name, a)?;
            if a.rank() < 2 || b.rank() < 2 {
                return err(
                    format!(
                        "`matmul` needs operands of rank 2 or more, got {} and {}",
                        sizes(a),
                        sizes(b)
                    ),
                    Some(if a.rank() < 2 { 0 } else { 1 }),
                );
            }
            if a.rank().max(b.rank()) > MAX_MATMUL_RANK {
                return err(
                    format!(
                        "`matmul` supports operands of rank {MAX_MATMUL_RANK} or less, got {} and {}",
                        sizes(a),
                        sizes(b)
                    ),
                    Some(if a.rank() > MAX_MATMUL_RANK { 0 } else { 1 }),
                );
            }
            let (m, k) = (&a.dims[a.rank() - 2], &a.dims[a.rank() - 1]);
            let (k2, n) = (&b.dims[b.rank() - 2], &b.dims[b.rank() - 1]);
            if k.size != k2.size {
                return err(
                    format!(
                        "shape mismatch in `matmul`: {} and {} (contracting sizes {} and {} differ)",
                        sizes(a),
                        sizes(b),
                        k.size,
                        k2.size
                    ),
                    Some(1),
                );
            }
            let ba = Type::new(a.dtype, a.dims[..a.rank() - 2].to_vec());
            let bb = Type::new(b.dtype, b.dims[..b.rank() - 2].to_vec());
            let batch = broadcast_types(&ba, &bb).ok_or_else(|| TypeError {
                message: format!(
                    "shape mismatch in `matmul`: batch axes of {} and {} do not broadcast",
                    sizes(a),
                    sizes(b)
                ),
                operand: Some(1),
            })?;
            let mut dims = batch.dims;
            dims.push(m.clone());
            dims.push(n.clone());
            if let Some(mask) = operands.get(2) {
                if dims.len() < 3 || mask.dtype != DType::I1 || mask.shape() != [dims[0].size] {
                    return err(
                        format!("the mask of a batched `matmul` must be i1[{}] over its first batch axis, got {}", dims[0].size, sizes(mask)),
                        Some(2),
                    );
                }
            }
            one(Type::new(a.dtype, dims))
        }
        OpKind::Transpose { perm, .. } => {
            let mut seen = perm.clone();
            seen.sort_unstable();
            if seen != (0..x().rank()).collect::<Vec<_>>() {
                return err(
                    format!(
                        "`transpose` perm {perm:?} is not a permutation of the {} axes of {}",
                        x().rank(),
                        sizes(x())
                    ),
                    None,
                );
            }
            one(Type::new(
                x().dtype,
                perm.iter().map(|&p| x().dims[p].clone()).collect(),
            ))
        }
        OpKind::Reshape { .. } => {
            let t = declared_one()?;
            if t.dtype != x().dtype || t.elements() != x().elements() {
                return err(
                    format!(
                        "`reshape` cannot turn {} ({} elements) into {} ({} elements)",
                        sizes(x()),
                        x().elements(),
                        sizes(t),
                        t.elements()
                    ),
                    Some(0),
                );
            }
            one(t.clone())
        }
        OpKind::Broadcast { .. } => {
            let t = declared_one()?;
            match broadcast_types(t, &x().with_dtype(t.dtype)) {
                Some(b) if b.shape() == t.shape() && t.dtype == x().dtype => one(t.clone()),
                _ => err(
                    format!("`broadcast` cannot turn {} into {}", sizes(x()), sizes(t)),
                    Some(0),
                ),
            }
        }
        OpKind::Convert { .. } => {
            let t = declared_one()?;
            if t.shape() != x().shape() {
                return err(
                    format!(
                        "`convert` changes only the dtype, but {} and {} differ in shape",
                        sizes(x()),
                        sizes(t)
                    ),
                    Some(0),
                );
            }
            one(t.clone())
        }
        OpKind::Slice { start, end, .. } => {
            if start.len() != x().rank() || end.len() != x().rank() {
                return err(
                    format!(
                        "`slice` of {} needs {} start and end values",
                        sizes(x()),
                        x().rank()
                    ),
                    None,
                );
            }
            let mut dims = Vec::new();
            for (i, d) in x().dims.iter().enumerate() {
                if start[i] >= end[i] || end[i] > d.size {
                    return err(
                        format!(
                            "`slice` {}..{} on axis {i} is empty or outside {}",
                            start[i],
                            end[i],
                            sizes(x())
                        ),
                        None,
                    );
                }
                dims.push(if start[i] == 0 && end[i] == d.size {
                    d.clone()
                } else {
                    Dim::lit(end[i] - start[i])
                });
            }
            one(Type::new(x().dtype, dims))
        }
        OpKind::Concat { axis, .. } => {
            axis_in(name, x(), *axis, 0)?;
            let mut total = 0u64;
            for (i, t) in operands.iter().enumerate() {
                if t.dtype != x().dtype
                    || t.rank() != x().rank()
                    || (0..t.rank()).any(|a| a != *axis && t.dims[a].size != x().dims[a].size)
                {
                    return err(
                        format!(
                            "shape mismatch in `concat` on axis {axis}: {} and {}",
                            sizes(x()),
                            sizes(t)
                        ),
                        Some(i),
                    );
                }
                total += t.dims[*axis].size;
            }
            let mut dims = x().dims.clone();
            dims[*axis] = Dim::lit(total);
            one(Type::new(x().dtype, dims))
        }
        OpKind::Reduce { op, axes, .. } => {
            if *op != ReduceOp::Max {
                need_float(name, x())?;
            }
            let mut sorted = axes.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != axes.len() || axes.is_empty() {
                return err(
                    format!("`{name}` axes {axes:?} must be distinct and non-empty"),
                    None,
                );
            }
            for &a in axes {
                axis_in(name, x(), a, 0)?;
            }
            let dims = x()
                .dims
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, d)| d.clone())
                .collect();
            one(Type::new(x().dtype, dims))
        }
        OpKind::Softmax { axis, .. } | OpKind::LayerNorm { axis, .. } => {
            need_float(name, x())?;
            axis_in(name, x(), *axis, 0)?;
            one(x().clone())
        }
        OpKind::Iota { axis } => {
            let t = declared_one()?;
            if *axis >= t.rank() {
                return err(
                    format!("`iota` axis {axis} is out of range for {}", sizes(t)),
                    None,
                );
            }
            one(t.clone())
        }
        OpKind::Constant { .. } => one(declared_one()?.clone()),
        OpKind::Pad {
            axis, low, high, ..
        } => {
            axis_in(name, x(), *axis, 0)?;
            let mut t = x().clone();
            t.dims[*axis] = Dim::lit(t.dims[*axis].size + low + high);
            one(t)
        }
        OpKind::Shift { axis, .. } => {
            axis_in(name, x(), *axis, 0)?;
            one(x().clone())
        }
        OpKind::Rank => one(Type::of(DType::I32, &[])),
        OpKind::Exchange { .. } => one(x().clone()),
        OpKind::Gather { axis, .. } => {
            let (table, ids) = (x(), operands[1]);
            axis_in(name, table, *axis, 0)?;
            let shared = &table.shape()[..*axis];
            if ids.dtype != DType::I32 || ids.rank() < *axis || ids.shape()[..*axis] != *shared {
                let leading = match axis {
                    0 => String::new(),
                    n => format!(" whose first {n} axes are the table's {shared:?}"),
                };
                return err(
                    format!(
                        "`gather` from {} on axis {axis} needs i32 ids{leading}, got {}",
                        sizes(table),
                        sizes(ids)
                    ),
                    Some(1),
                );
            }
            let mut dims = ids.dims.clone();
            dims.extend(table.dims[*axis + 1..].iter().cloned());
            one(Type::new(table.dtype, dims))
        }
        OpKind::Index { axis, .. } | OpKind::Update { axis, .. } => {
            let idx = *operands
                .last()
                .expect("invariant: index ops have an index operand");
            axis_in(name, x(), *axis, 0)?;
            if idx.dtype != DType::I32 || idx.shape() != x().shape()[..*axis] {
                return err(
                    format!(
                        "`{name}` on axis {axis} of {} needs an i32 index of shape {}, got {}",
                        sizes(x()),
                        sizes(&Type::of(DType::I32, &x().shape()[..*axis])),
                        sizes(idx)
                    ),
                    Some(operands.len() - 1),
                );
            }
            let slice = x().remove(*axis);
            if let OpKind::Update { .. } = kind {
                if !operands[1].same_as(&slice) {
                    return err(
                        format!(
                            "`update` of {} on axis {axis} needs an update of {}, got {}",
                            sizes(x()),
                            sizes(&slice),
                            sizes(operands[1])
                        ),
                        Some(1),
                    );
                }
                return one(x().clone());
            }
            one(slice)
        }
        OpKind::Call { on, .. } => {
            let f = callee.ok_or_else(|| TypeError {
                message: "the callee is not a function defined before the caller".into(),
                operand: None,
            })?;
            let operands = match on {
                Some(_) if operands[0].dtype != DType::I1 || operands[0].rank() != 0 => {
                    return err(
                        format!("`call_if`'s flag must be i1[], got {}", operands[0]),
                        Some(0),
                    )
                }
                Some(_) => &operands[1..],
                None => operands,
            };
            let (cname, args, results) = (&f.name, f.arg_types(), f.result_types());
            if args.len() != operands.len() {
                return err(
                    format!(
                        "`@{cname}` takes {} arguments, got {}",
                        args.len(),
                        operands.len()
                    ),
                    None,
                );
            }
            for (i, (a, o)) in args.iter().zip(operands).enumerate() {
                if !a.same_as(o) {
                    return err(
                        format!(
                            "argument {i} of `@{cname}` must be {}, got {}",
                            sizes(a),
                            sizes(o)
                        ),
                        Some(i + usize::from(on.is_some())),
                    );
                }
            }
            Ok(results)
        }
        OpKind::Loop { .. } => Ok(operands.iter().map(|t| (*t).clone()).collect()),
    }
}
