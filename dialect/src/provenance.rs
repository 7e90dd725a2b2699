//! Where a value's elements come from, as sets of (microbatch, layer groups done): the abstract
//! values of [`crate::schedule_check`].
//!
//! A pipeline program moves activations between stage slots, tapes, inboxes and ranks with a
//! few data-movement ops driven by integer arithmetic on the tick and the rank. To prove what
//! every stage computes on, it is enough to follow *which microbatch* each slot holds, not its
//! numbers: integers and masks are computed exactly ([`Abs::Known`], by the interpreter's own
//! kernels), and activations become tensors of interned tag sets ([`Abs::Tags`]) over a
//! *coarse* shape that keeps only the axes that tell microbatches and stages apart (the stage
//! axis, `microbatches`, and the literal sizes of tapes, rings and padded inputs in the first
//! two places); every other axis has length 1, its one entry the union along it. Moves use the
//! interpreter's kernels on those coarse tensors, which store set ids as their elements; every
//! other op takes the union of what it reads, which over-approximates and never forgets a
//! source.

use crate::ir::Func;
use crate::kernels as k;
use crate::op::OpKind;
use crate::types::{DType, Label, Type};
use ppc_tensor::Tensor;
use std::collections::HashMap;

/// The activation of `microbatch` after `groups` of the model's `stages · repeats` layer groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag {
    pub microbatch: u32,
    pub groups: u32,
}

/// Interned sets of tags: id 0 is the empty set (zeros, padding, bubble slots).
#[derive(Default)]
pub struct TagSets {
    sets: Vec<Vec<Tag>>,
    ids: HashMap<Vec<Tag>, u32>,
    unions: HashMap<(u32, u32), u32>,
}

impl TagSets {
    pub fn new() -> TagSets {
        let mut s = TagSets::default();
        s.intern(Vec::new());
        s
    }

    pub fn intern(&mut self, mut set: Vec<Tag>) -> u32 {
        set.sort();
        set.dedup();
        if let Some(&id) = self.ids.get(&set) {
            return id;
        }
        let id = self.sets.len() as u32;
        self.sets.push(set.clone());
        self.ids.insert(set, id);
        id
    }

    pub fn get(&self, id: u32) -> &[Tag] {
        &self.sets[id as usize]
    }

    pub fn union(&mut self, a: u32, b: u32) -> u32 {
        if a == b || b == 0 {
            return a;
        }
        if a == 0 {
            return b;
        }
        let key = (a.min(b), a.max(b));
        if let Some(&id) = self.unions.get(&key) {
            return id;
        }
        let set = [self.get(a), self.get(b)].concat();
        let id = self.intern(set);
        self.unions.insert(key, id);
        id
    }

    /// The union of every element of `t`.
    pub fn union_all(&mut self, t: &Tensor) -> u32 {
        t.data.iter().fold(0, |acc, &x| self.union(acc, x as u32))
    }
}

/// An abstract value: exact (integers and masks, small) or tag sets over the coarse shape.
#[derive(Clone, Debug)]
pub enum Abs {
    Known(Tensor),
    Tags(Tensor),
}

/// Known values larger than this are followed as tags: a mask that big is data, not control.
const MAX_KNOWN: usize = 1 << 16;

/// Whether axis `i` of a type with dimension `d` is kept in the coarse shape.
fn tracked(label: &Label, i: usize) -> bool {
    match label {
        Label::Axis(_) => true,
        Label::Named(n) => n == "microbatches",
        Label::Size => i < 2,
    }
}

/// The coarse shape of `ty`.
pub fn coarse(ty: &Type) -> Vec<usize> {
    let d = &ty.dims;
    (0..d.len())
        .map(|i| match tracked(&d[i].label, i) {
            true => d[i].size as usize,
            false => 1,
        })
        .collect()
}

/// Tag sets of `shape`, all `id`.
pub fn splat(shape: &[usize], id: u32) -> Tensor {
    Tensor::new(
        DType::F32,
        shape.to_vec(),
        vec![id as f32; shape.iter().product()],
    )
}

/// `x` as tags of coarse shape `shape`, NumPy-aligned from the right: an axis of equal length
/// is kept, a length-1 axis broadcast, an axis that `shape` collapses united; anything else
/// (a reshape that regroups axes) is the union of all of `x` everywhere.
pub fn fit(sets: &mut TagSets, x: &Tensor, shape: &[usize]) -> Tensor {
    let mut x = x.clone();
    if x.shape.len() > shape.len() {
        return splat(shape, sets.union_all(&x));
    }
    let off = shape.len() - x.shape.len();
    for a in 0..x.shape.len() {
        let (have, want) = (x.shape[a], shape[off + a]);
        if have != want && have != 1 && want == 1 {
            x = unite_axis(sets, &x, a, true);
        } else if have != want && have != 1 {
            return splat(shape, sets.union_all(&x));
        }
    }
    k::broadcast(&x, DType::F32, shape)
}

/// The union along `axis`, kept with length 1 (`keep`) or removed.
pub fn unite_axis(sets: &mut TagSets, x: &Tensor, axis: usize, keep: bool) -> Tensor {
    let mut t = fold_axis(x, axis, |ids| {
        ids.iter().fold(0, |acc, &id| sets.union(acc, id as u32)) as f32
    });
    if !keep {
        t.shape.remove(axis);
    }
    t
}

/// `x` with `axis` folded to length 1: each line along it becomes `fold(line)`.
fn fold_axis(x: &Tensor, axis: usize, mut fold: impl FnMut(&[f32]) -> f32) -> Tensor {
    let n = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let mut shape = x.shape.clone();
    shape[axis] = 1;
    let mut line = Vec::with_capacity(n);
    let data = (0..x.len() / n.max(1))
        .map(|flat| {
            let (o, i) = (flat / inner, flat % inner);
            line.clear();
            line.extend((0..n).map(|j| x.data[(o * n + j) * inner + i]));
            fold(&line)
        })
        .collect();
    Tensor::new(DType::F32, shape, data)
}

/// Where a type has its stage axis (`[k, #stages, ...]` for what a stage of `k` layers keeps).
pub fn stage_axis(ty: &Type) -> Option<usize> {
    ty.dims
        .iter()
        .position(|d| matches!(d.label, Label::Axis(_)))
}

/// The offsets of the elements at position `i` of `axis` in a tensor of `shape`.
pub fn slot(shape: &[usize], axis: usize, i: usize) -> impl Iterator<Item = usize> {
    let outer: usize = shape[..axis].iter().product();
    let (n, inner) = (shape[axis], shape[axis + 1..].iter().product::<usize>());
    (0..outer).flat_map(move |o| {
        let at = (o * n + i) * inner;
        at..at + inner
    })
}

/// The union of the tags at position `i` of `axis`.
pub fn slot_union(sets: &mut TagSets, t: &Tensor, axis: usize, i: usize) -> u32 {
    slot(&t.shape, axis, i).fold(0, |acc, o| sets.union(acc, t.data[o] as u32))
}

/// Sets the tags at position `i` of `axis` to set `id`.
pub fn fill_slot(t: &mut Tensor, axis: usize, i: usize, id: u32) {
    for o in slot(&t.shape.clone(), axis, i) {
        t.data[o] = id as f32;
    }
}

/// The elementwise union of `xs`, each fitted to `shape`.
pub fn unite(sets: &mut TagSets, xs: &[Tensor], shape: &[usize]) -> Tensor {
    let mut out = splat(shape, 0);
    for x in xs {
        let x = fit(sets, x, shape);
        for (o, v) in out.data.iter_mut().zip(&x.data) {
            *o = sets.union(*o as u32, *v as u32) as f32;
        }
    }
    out
}

impl Abs {
    /// As tags of coarse shape `shape`: known values carry no microbatch.
    pub fn tags(&self, sets: &mut TagSets, shape: &[usize]) -> Tensor {
        match self {
            Abs::Known(_) => splat(shape, 0),
            Abs::Tags(t) => fit(sets, t, shape),
        }
    }

    pub fn known(&self) -> Option<&Tensor> {
        match self {
            Abs::Known(t) => Some(t),
            Abs::Tags(_) => None,
        }
    }
}

/// One op of `f` on abstract operands (`get`), other than `rank`, `exchange`, `call` and `loop`,
/// which need the rank, the other ranks or the module.
pub fn eval(
    sets: &mut TagSets,
    f: &Func,
    kind: &OpKind,
    ty: &Type,
    get: &dyn Fn(crate::ir::ValueId) -> Abs,
) -> Abs {
    let shape = ty.shape_usize();
    let out = coarse(ty);
    if let Some(known) = eval_known(kind, ty, &shape, get) {
        return known;
    }
    let tags = |sets: &mut TagSets, v| get(v).tags(sets, &coarse(f.ty(v)));
    // Whether the coarse shape keeps `axis` whole (a collapsed one holds its union).
    let kept = |axis: usize| out[axis] == shape[axis];
    let t = match kind {
        OpKind::Iota { .. } | OpKind::Constant { .. } => splat(&out, 0),
        OpKind::Select {
            cond,
            on_true,
            on_false,
        } => match get(*cond) {
            Abs::Known(c) => {
                let (a, b) = (tags(sets, *on_true), tags(sets, *on_false));
                let (a, b) = (fit(sets, &a, &out), fit(sets, &b, &out));
                select(sets, &c, &a, &b, &out)
            }
            Abs::Tags(c) => {
                let xs = [c, tags(sets, *on_true), tags(sets, *on_false)];
                unite(sets, &xs, &out)
            }
        },
        OpKind::MatMul { lhs, rhs, mask } => {
            let (l, r) = (tags(sets, *lhs), tags(sets, *rhs));
            let (l, r) = (sets.union_all(&l), sets.union_all(&r));
            let id = sets.union(l, r);
            match mask.map(get) {
                Some(Abs::Known(m)) => {
                    let c = Tensor::new(m.dtype, lead(&out, m.len()), m.data.clone());
                    select(sets, &c, &splat(&out, id), &splat(&out, 0), &out)
                }
                _ => splat(&out, id),
            }
        }
        OpKind::Transpose { x, perm } => k::transpose(&tags(sets, *x), perm),
        OpKind::Reshape { x } => {
            let x = tags(sets, *x);
            let kept = |s: &[usize]| s.iter().copied().filter(|&n| n != 1).collect::<Vec<_>>();
            match kept(&x.shape) == kept(&out) {
                true => Tensor::new(DType::F32, out.clone(), x.data),
                false => splat(&out, sets.union_all(&x)),
            }
        }
        OpKind::Slice { x, start, end } => {
            let x = tags(sets, *x);
            let clip = |b: &[u64], full: bool| -> Vec<u64> {
                b.iter()
                    .zip(&x.shape)
                    .map(|(&v, &n)| if n == 1 { u64::from(full) } else { v })
                    .collect()
            };
            k::slice(&x, &clip(start, false), &clip(end, true))
        }
        OpKind::Concat { xs, axis } if kept(*axis) => {
            let parts: Vec<Tensor> = xs.iter().map(|&v| tags(sets, v)).collect();
            k::concat(&parts.iter().collect::<Vec<_>>(), *axis)
        }
        OpKind::Reduce { x, axes, .. } => {
            let mut x = tags(sets, *x);
            for &a in axes.iter().rev() {
                x = unite_axis(sets, &x, a, false);
            }
            x
        }
        OpKind::Softmax { x, axis, .. } | OpKind::LayerNorm { x, axis, .. } => {
            let x = tags(sets, *x);
            let along = unite_axis(sets, &x, *axis, true);
            fit(sets, &along, &out)
        }
        OpKind::Pad {
            x, axis, low, high, ..
        } if kept(*axis) => k::pad(&tags(sets, *x), *axis, *low as usize, *high as usize, 0.0),
        OpKind::Shift { x, axis, .. } if kept(*axis) => k::shift(&tags(sets, *x), *axis, 0.0),
        OpKind::Index { x, index, axis } => {
            let xt = tags(sets, *x);
            match get(*index) {
                Abs::Known(i) if xt.shape[..*axis] == i.shape[..] => k::index(&xt, &i, *axis),
                Abs::Known(_) => unite_axis(sets, &xt, *axis, false),
                Abs::Tags(i) => {
                    let along = unite_axis(sets, &xt, *axis, false);
                    unite(sets, &[along, i], &out)
                }
            }
        }
        OpKind::Update {
            x,
            update,
            index,
            axis,
        } => {
            let xt = tags(sets, *x);
            let mut inner = out.clone();
            inner.remove(*axis);
            let u = {
                let u = tags(sets, *update);
                fit(sets, &u, &inner)
            };
            match get(*index) {
                Abs::Known(i) if kept(*axis) && xt.shape[..*axis] == i.shape[..] => {
                    k::update(&xt, &u, &i, *axis)
                }
                other => {
                    let u = Tensor::new(DType::F32, with_unit(&inner, *axis), u.data);
                    let i = other.tags(sets, &[]);
                    unite(sets, &[xt, u, i], &out)
                }
            }
        }
        // Elementwise ops, gathers, and moves along collapsed axes: the union of the operands.
        other => {
            let xs: Vec<Tensor> = other
                .operands()
                .into_iter()
                .map(|v| tags(sets, v))
                .collect();
            unite(sets, &xs, &out)
        }
    };
    Abs::Tags(t)
}

/// `shape` with a length-1 axis inserted at `axis`.
fn with_unit(shape: &[usize], axis: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s.insert(axis, 1);
    s
}

/// `[n, 1, 1, ...]`, as many axes as `shape`: a mask of `n` entries over its first axis.
fn lead(shape: &[usize], n: usize) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    s[0] = n;
    s
}

/// `cond ? a : b` with a known condition over the full shape, on coarse tags: a coarse entry
/// whose condition is mixed takes both.
fn select(sets: &mut TagSets, cond: &Tensor, a: &Tensor, b: &Tensor, out: &[usize]) -> Tensor {
    let truth = (0..cond.len()).map(|i| f32::from(u8::from(cond.int(i) != 0)));
    let mut c = Tensor::new(DType::F32, cond.shape.clone(), truth.collect());
    // Fold each collapsed axis: 1 all true, 0 all false, 0.5 mixed.
    let off = out.len().saturating_sub(c.shape.len());
    for a in 0..c.shape.len() {
        if c.shape[a] != 1 && out[off + a] == 1 {
            c = fold_mask(&c, a);
        }
    }
    let c = k::broadcast(&c, DType::F32, out);
    let data = (c.data.iter().zip(&a.data).zip(&b.data))
        .map(|((&c, &a), &b)| match c {
            1.0 => a,
            0.0 => b,
            _ => sets.union(a as u32, b as u32) as f32,
        })
        .collect();
    Tensor::new(DType::F32, out.to_vec(), data)
}

/// A mask's `axis` folded to length 1: 1 where it is all true, 0 all false, 0.5 mixed.
fn fold_mask(c: &Tensor, axis: usize) -> Tensor {
    fold_axis(c, axis, |line| match line.iter().all(|&v| v == line[0]) {
        true => line[0],
        false => 0.5,
    })
}

/// An integer or mask op whose operands are all known, computed exactly.
fn eval_known(
    kind: &OpKind,
    ty: &Type,
    shape: &[usize],
    get: &dyn Fn(crate::ir::ValueId) -> Abs,
) -> Option<Abs> {
    if matches!(ty.dtype, DType::F32 | DType::BF16 | DType::F16)
        || shape.iter().product::<usize>() > MAX_KNOWN
    {
        return None;
    }
    let ops = kind.operands();
    let known: Vec<Tensor> = ops
        .iter()
        .map(|&v| get(v).known().cloned())
        .collect::<Option<_>>()?;
    let x = |i: usize| &known[i];
    let t = match kind {
        OpKind::Iota { axis } => k::iota(ty.dtype, shape, *axis),
        OpKind::Constant { value } => Tensor::splat(ty.dtype, shape.to_vec(), value.0),
        OpKind::Unary { op, .. } => k::unary(*op, x(0)),
        OpKind::Binary { op, .. } => k::binary(*op, x(0), x(1), shape),
        OpKind::Compare { pred, .. } => k::compare(*pred, x(0), x(1), shape),
        OpKind::Select { .. } => k::select(x(0), x(1), x(2), shape),
        OpKind::Reshape { .. } => Tensor::new(ty.dtype, shape.to_vec(), x(0).data.clone()),
        OpKind::Broadcast { .. } => k::broadcast(x(0), ty.dtype, shape),
        OpKind::Transpose { perm, .. } => k::transpose(x(0), perm),
        OpKind::Slice { start, end, .. } => k::slice(x(0), start, end),
        OpKind::Index { axis, .. } => k::index(x(0), x(1), *axis),
        OpKind::Update { axis, .. } => k::update(x(0), x(1), x(2), *axis),
        OpKind::Shift { axis, fill, .. } => k::shift(x(0), *axis, fill.0),
        OpKind::Pad {
            axis,
            low,
            high,
            fill,
            ..
        } => k::pad(x(0), *axis, *low as usize, *high as usize, fill.0),
        OpKind::Reduce { op, axes, .. } => k::reduce(*op, x(0), axes),
        _ => return None,
    };
    Some(Abs::Known(t))
}
