//! Values that are views of other buffers instead of copies: a stage's layer loop picking its
//! layer's slice of the stacked weights, and reshapes. Views carry a strided layout with a
//! dynamic offset (`strided<[…], offset: ?>`), which every consumer of a buffer accepts:
//! `linalg.generic` operands, the runtime's GEMM (unranked memrefs carry their strides), copies.
//!
//! Copying each weight slice once per layer and iteration took a fifth of the transformer's step
//! (`--trace`: the `index` loop nests, 1.3 of 6.8 ms).

use super::buf::{list, Buf, Layout};
use super::emit::Emitter;
use ppc_dialect::ir::{Func, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::Type;

/// If `index` is one position for every slice (a scalar, a scalar broadcast to every
/// position: `broadcast %t`, or an index of one element: a stage's repeat where a rank holds
/// one stage, or in a call split into stages, `in_split`, where each stage's slice of it is
/// one element), the value that holds it.
pub fn uniform(f: &Func, index: ValueId, in_split: bool) -> Option<ValueId> {
    let ty = f.ty(index);
    if ty.rank() == 0 {
        return Some(index);
    }
    let elements = match in_split {
        true => super::stage_split::slice_type(ty).elements(),
        false => ty.elements(),
    };
    let broadcast = f.ops.iter().find_map(|(_, op)| match op.kind {
        OpKind::Broadcast { x } if op.results.first() == Some(&index) && f.ty(x).rank() == 0 => {
            Some(x)
        }
        _ => None,
    });
    broadcast.or((elements == 1).then_some(index))
}

/// The layout of a view with these strides at a run-time offset.
fn dynamic_layout(strides: &[usize]) -> Layout {
    Layout {
        strides: strides.to_vec(),
        offset: None,
    }
}

/// `x[.., k, ..]` (position `k`, clamped, of `axis`) for the i32 buffer `k` of one element,
/// as a view.
pub fn index(e: &mut Emitter, x: &Buf, k: &Buf, axis: usize) -> Buf {
    let shape = x.ty.shape();
    e.host_reads(k);
    let at: Vec<String> = (0..k.ty.rank()).map(|_| e.index(0)).collect();
    let v = e.let_(&format!(
        "memref.load {}[{}] : {}",
        k.name,
        at.join(", "),
        k.mty()
    ));
    let at = e.clamped_index(&v, shape[axis]);
    e.slot(x, &at, axis, false)
}

/// `x` reshaped to `ty`: a view. A strided `x` is viewed in place when the reshape only adds or
/// drops axes of size 1 (the stage-aligned weights, `[stages, d, d]` to `[stages, 1, d, d]`), and
/// copied to a contiguous buffer first otherwise.
pub fn reshape(e: &mut Emitter, x: &Buf, ty: &Type) -> Buf {
    if x.layout.is_none() {
        let strides = ppc_runtime::tensor::strides(&ty.shape_usize());
        return reinterpret(e, x, ty, "0", &strides);
    }
    if contiguous(x) {
        // A stage's slice of a buffer (`stage_split.rs`): row-major at an offset.
        let strides = ppc_runtime::tensor::strides(&ty.shape_usize());
        let offset = dynamic_offset(e, x);
        return reinterpret(e, x, ty, &offset, &strides);
    }
    let non_unit = |t: &Type| -> Vec<u64> { t.shape().into_iter().filter(|&d| d != 1).collect() };
    if non_unit(&x.ty) != non_unit(ty) {
        let copy = e.alloc(&x.ty);
        e.copy(x, &copy);
        return reshape(e, &copy, ty);
    }
    // The view's strides for its axes of size > 1, in order.
    let mut kept =
        x.ty.shape()
            .into_iter()
            .zip(x.strides())
            .filter(|&(d, _)| d != 1)
            .map(|(_, s)| s);
    // Axes of size 1 are never stepped along: any stride will do.
    let strides: Vec<usize> = ty
        .shape()
        .into_iter()
        .map(|d| {
            if d == 1 {
                1
            } else {
                kept.next().expect("same non-unit axes")
            }
        })
        .collect();
    let offset = dynamic_offset(e, x);
    reinterpret(e, x, ty, &offset, &strides)
}

/// True when `x`'s elements lie row-major without gaps (axes of size 1 have any stride).
fn contiguous(x: &Buf) -> bool {
    let dense = ppc_runtime::tensor::strides(&x.ty.shape_usize());
    x.ty.shape()
        .iter()
        .zip(x.strides().iter().zip(&dense))
        .all(|(&d, (s, t))| d == 1 || s == t)
}

/// `x`'s offset (in elements) as an SSA value, read from its descriptor.
fn dynamic_offset(e: &mut Emitter, x: &Buf) -> String {
    let rank = x.ty.rank();
    let meta = e.fresh();
    let sizes_strides = if rank == 0 {
        String::new()
    } else {
        format!(", {meta}_sizes:{rank}, {meta}_strides:{rank}")
    };
    let index_types = vec!["index"; 1 + 2 * rank].join(", ");
    e.op(&format!(
        "{meta}_base, {meta}_offset{sizes_strides} = memref.extract_strided_metadata {} : {} -> memref<{}>, {index_types}",
        x.name,
        x.mty(),
        super::buf::elt(x.ty.dtype)
    ));
    format!("{meta}_offset")
}

/// True for a transpose of the last two axes only (a batch of transposed matrices): the
/// transposes autodiff puts before matmuls, which the GEMM reads through strides at no cost
/// (measured: the MLP's training step 1.5x faster). Other permutations (the attention's head
/// splits) are copied: their batched GEMMs measured 10-25% slower on strided operands.
pub fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && (0..r - 2).all(|i| perm[i] == i)
}

/// `x` with its axes permuted (result axis `i` is `x`'s axis `perm[i]`): a view with permuted
/// strides, no copy.
pub fn transpose(e: &mut Emitter, x: &Buf, perm: &[usize], ty: &Type) -> Buf {
    let s = x.strides();
    let strides: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
    let (offset, known) = match x.layout.as_ref().map(|l| l.offset) {
        None => ("0".to_string(), Some(0)),
        Some(Some(o)) => (o.to_string(), Some(o)),
        Some(None) => (dynamic_offset(e, x), None),
    };
    let view = Buf {
        name: e.fresh(),
        base: x.base,
        ty: ty.clone(),
        layout: Some(Layout {
            strides: strides.clone(),
            offset: known,
        }),
    };
    e.op(&format!(
        "{} = memref.reinterpret_cast {} to offset: [{offset}], sizes: [{}], strides: [{}] : {} to {}",
        view.name,
        x.name,
        list(&view.ty.shape()),
        list(&strides),
        x.mty(),
        view.mty()
    ));
    view
}

/// `x`'s memory as a buffer of `ty` at `offset` with `strides`.
fn reinterpret(e: &mut Emitter, x: &Buf, ty: &Type, offset: &str, strides: &[usize]) -> Buf {
    let view = Buf {
        name: e.fresh(),
        base: x.base,
        ty: ty.clone(),
        layout: (offset != "0").then(|| dynamic_layout(strides)),
    };
    e.op(&format!(
        "{} = memref.reinterpret_cast {} to offset: [{offset}], sizes: [{}], strides: [{}] : {} to {}",
        view.name,
        x.name,
        list(&view.ty.shape()),
        list(strides),
        x.mty(),
        view.mty()
    ));
    view
}
