//! Batched chains: a batched matmul, the elementwise ops and softmaxes after it, and the
//! batched matmul that reads them (attention: scores, scale, causal mask, softmax, values; a
//! decoder's MLP: up-projection, bias, GELU, down-projection) run as one parallel loop over
//! their batch entries, each thread computing an entry's whole chain on its block (`[t, t]`
//! scores, `[t, f]` hidden units) while that block is in cache, instead of one pass over every
//! entry per op (at b=8 t=128 h=8, 16 MB of scores written and read about ten times).
//!
//! Inside the loop every buffer is one entry's slice: values with the chain's leading axes keep
//! them with size 1 (`[1, 1, 1, t, t]`), temporaries are allocated once per thread and reused
//! by its entries (`Emitter::begin_entries`), and the chain's outputs are written straight into
//! their whole buffers. The matmuls' stage mask is sliced with the stage axis, so bubble
//! stages still cost no GEMM; when every output is such a matmul's result, a bubble stage's
//! entries skip the whole chain and get the -0.0 the masked GEMM writes. Where every matmul's
//! weights are broadcast along the last leading axis (a decoder MLP's per-stage weights along
//! the batch), an entry takes several of its rows ([`Chain::tile`]): the runtime folds them
//! into one GEMM's rows, which packs the weights once for all of them.
//!
//! ```text
//! %s = matmul %qh, %kt, %active : f32[#stages, b, heads, t, t]
//! %p = softmax (select %causal, (mul %s, %scale), %neg), axis = 4
//! %o = matmul %p, %vh, %active : f32[#stages, b, heads, t, dh]
//!     ──▶  scf.parallel (%j) = 0 to threads { scf.for %e = %j to 4·b·heads step threads {
//!            if %active[stage(%e)] { GEMM, fused select, softmax, GEMM on entry %e }
//!            else { %o[entry %e] = -0.0 } } }
//! ```
//!
//! [`find`] picks the chains: a batched matmul (its left operand with the result's batch axes,
//! its right one with them or broadcast along them: per-stage weights), then the ops that read
//! the chain as long as each is elementwise, a softmax along a trailing axis or another such
//! matmul; ops in between that do not read the chain are emitted before it, and a last value
//! computed inside its consumer's loop nest is left to it. A chain needs two matmuls, enough
//! entries for the threads, and entries small enough to stay in cache.

use super::emit::MIN_PARALLEL_ELEMENTS;
use super::fuse::producer;
use super::nest::has_prefix;
use ppc_dialect::ir::{Block, Func, OpId, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::Type;
use std::collections::HashSet;

/// At least this many entries, so that every thread gets several.
const MIN_ENTRIES: u64 = 16;

/// At most this many elements in one entry of the first matmul's result (512 KB of f32, a
/// decoder MLP's `[128, 1024]` hidden units): an entry's chain then stays in a core's L2.
const MAX_ENTRY_ELEMENTS: u64 = 131_072;

/// At most this many elements in one entry of the first matmul's result when entries take
/// several batch rows (1 MB of f32: two `[128, 1024]` blocks of a decoder MLP's hidden units).
const MAX_TILE_ELEMENTS: u64 = 262_144;

/// One chain of a block.
pub struct Chain {
    /// Its ops, in block order.
    pub ops: Vec<OpId>,
    /// The ops among them in the block that do not read it: emitted before it.
    pub hoisted: Vec<OpId>,
    /// The sizes of the leading axes it runs over.
    pub prefix: Vec<u64>,
    /// An entry's size along each of them: 1, but along the last when every matmul's right
    /// operand is broadcast there (per-stage weights), as many as fit `MAX_TILE_ELEMENTS` while
    /// every thread still gets several entries. The runtime folds those into the GEMMs' rows,
    /// which packs each weight once for more rows.
    pub tile: Vec<u64>,
    /// The matmuls' stage mask and the stage axis's place among the leading axes.
    pub mask: Option<(ValueId, usize)>,
    /// Its values read after it (computed into their whole buffers).
    pub outputs: Vec<ValueId>,
    /// Values from outside it that it reads along the leading axes (sliced per entry).
    pub sliced: Vec<ValueId>,
    /// Every output is a masked matmul's result: bubble entries skip the chain.
    pub skip_bubbles: bool,
}

/// The chains of `block`. `deferred` are the values computed inside their consumers
/// (`fuse::deferred`); ops in `excluded` and values in `carried` (computed into a loop's
/// carried buffer) stay out of chains.
pub fn find(
    f: &Func,
    block: &Block,
    deferred: &HashSet<ValueId>,
    excluded: &HashSet<OpId>,
    carried: &HashSet<ValueId>,
) -> Vec<Chain> {
    let mut chains: Vec<Chain> = Vec::new();
    let mut taken: HashSet<OpId> = HashSet::new();
    for (at, &id) in block.ops.iter().enumerate() {
        if taken.contains(&id) || excluded.contains(&id) {
            continue;
        }
        if let Some(chain) = grow(f, block, at, deferred, excluded, carried) {
            taken.extend(&chain.ops);
            taken.extend(&chain.hoisted);
            chains.push(chain);
        }
    }
    chains
}

/// The chain starting at op `at` of `block`, if one does.
fn grow(
    f: &Func,
    block: &Block,
    at: usize,
    deferred: &HashSet<ValueId>,
    excluded: &HashSet<OpId>,
    carried: &HashSet<ValueId>,
) -> Option<Chain> {
    let first = &f.ops[block.ops[at]];
    let OpKind::MatMul { mask, .. } = first.kind else {
        return None;
    };
    let out = f.ty(first.results[0]);
    let k = out.rank().checked_sub(2).filter(|&k| k >= 1)?;
    let prefix = out.shape()[..k].to_vec();
    let entries: u64 = prefix.iter().product();
    if entries < MIN_ENTRIES
        || out.elements() / entries > MAX_ENTRY_ELEMENTS
        || out.elements() < MIN_PARALLEL_ELEMENTS
    {
        return None;
    }
    let stage_at = out.stage_axis().map(|(a, _)| a).filter(|&a| a < k);
    let mask = match mask {
        Some(m) => Some((m, stage_at?)),
        None => None,
    };
    let rule = Rule {
        f,
        block,
        deferred,
        prefix: &prefix,
        mask: mask.map(|(m, _)| m),
    };
    if !rule.allowed(&first.kind, out) {
        return None;
    }
    let mut ops = vec![block.ops[at]];
    let mut values: HashSet<ValueId> = first.results.iter().copied().collect();
    let mut hoisted = Vec::new();
    for &id in &block.ops[at + 1..] {
        let op = &f.ops[id];
        let mut read = HashSet::new();
        super::fuse::used_in_op(f, &op.kind, &mut read);
        if excluded.contains(&id) || op.results.iter().any(|r| carried.contains(r)) {
            break;
        }
        if read.is_disjoint(&values) {
            if matches!(op.kind, OpKind::Loop { .. } | OpKind::Call { .. }) {
                break;
            }
            hoisted.push(id);
            continue;
        }
        match op.results.first() {
            Some(&r) if rule.allowed(&op.kind, f.ty(r)) => {
                ops.push(id);
                values.extend(&op.results);
            }
            _ => break,
        }
    }
    // An output needs a buffer: one computed inside its consumer's loop nest (a deferred value)
    // is left to that consumer, and the values it reads become outputs instead.
    let outputs = loop {
        let outputs = outputs_of(f, block, &ops);
        match outputs.iter().find(|v| deferred.contains(v)) {
            Some(v) => ops.retain(|&o| !f.ops[o].results.contains(v)),
            None => break outputs,
        }
    };
    let matmuls = ops
        .iter()
        .filter(|&&o| matches!(f.ops[o].kind, OpKind::MatMul { .. }))
        .count();
    if matmuls < 2 {
        return None;
    }
    let values: HashSet<ValueId> = ops
        .iter()
        .flat_map(|&o| f.ops[o].results.iter().copied())
        .collect();
    // Ops after the chain's last stay where they are.
    let last = ops.last().copied()?;
    let end = block.ops.iter().position(|&o| o == last)?;
    hoisted.retain(|h| block.ops[..end].contains(h));
    let mut sliced = Vec::new();
    for &o in &ops {
        for v in f.ops[o].kind.operands() {
            rule.leaves(v, &values, &mut sliced);
        }
    }
    sliced.retain(|&v| has_prefix(f.ty(v), &prefix) && Some(v) != mask.map(|(m, _)| m));
    let skip_bubbles = mask.is_some()
        && outputs.iter().all(|&v| {
            producer(f, block, v)
                .is_some_and(|p| matches!(f.ops[p].kind, OpKind::MatMul { mask: Some(_), .. }))
        });
    let tile = tile(f, &ops, &prefix, stage_at, out.elements() / entries);
    Some(Chain {
        ops,
        hoisted,
        prefix,
        tile,
        mask,
        outputs,
        sliced,
        skip_bubbles,
    })
}

/// [`Chain::tile`] of a chain of `ops` over leading axes `prefix` (the stage axis at
/// `stage_at`) whose first matmul makes `elements` per entry.
fn tile(
    f: &Func,
    ops: &[OpId],
    prefix: &[u64],
    stage_at: Option<usize>,
    elements: u64,
) -> Vec<u64> {
    let mut tile = vec![1; prefix.len()];
    let last = prefix.len() - 1;
    let weights_broadcast = ops.iter().all(|&o| match f.ops[o].kind {
        OpKind::MatMul { rhs, .. } => f.ty(rhs).shape()[last] == 1,
        _ => true,
    });
    if stage_at == Some(last) || !weights_broadcast {
        return tile;
    }
    let entries: u64 = prefix.iter().product();
    tile[last] = (1..=prefix[last])
        .filter(|&g| {
            prefix[last].is_multiple_of(g)
                && elements * g <= MAX_TILE_ELEMENTS
                && entries / g >= MIN_ENTRIES
        })
        .max()
        .unwrap_or(1);
    tile
}

/// The values that `ops` (a chain of `block`) make and other ops of `block`, or its results,
/// read.
fn outputs_of(f: &Func, block: &Block, ops: &[OpId]) -> Vec<ValueId> {
    let mut read_after = HashSet::new();
    for &o in &block.ops {
        if !ops.contains(&o) {
            super::fuse::used_in_op(f, &f.ops[o].kind, &mut read_after);
        }
    }
    read_after.extend(&block.results);
    ops.iter()
        .flat_map(|&o| f.ops[o].results.iter().copied())
        .filter(|v| read_after.contains(v))
        .collect()
}

/// What may join a chain over leading axes `prefix`.
struct Rule<'a> {
    f: &'a Func,
    block: &'a Block,
    deferred: &'a HashSet<ValueId>,
    prefix: &'a [u64],
    mask: Option<ValueId>,
}

impl Rule<'_> {
    /// Whether an op with result type `out` computes each entry from that entry's slices alone.
    fn allowed(&self, kind: &OpKind, out: &Type) -> bool {
        let k = self.prefix.len();
        let exact = |t: &Type| t.rank() >= k && t.shape()[..k] == *self.prefix;
        if !exact(out) {
            return false;
        }
        match kind {
            OpKind::MatMul { lhs, rhs, mask } => {
                let (a, b) = (self.f.ty(*lhs), self.f.ty(*rhs));
                a.rank() == out.rank()
                    && b.rank() == out.rank()
                    && exact(a)
                    && has_prefix(b, self.prefix)
                    && *mask == self.mask
            }
            OpKind::Softmax { x, axis, .. } => *axis >= k && self.f.ty(*x).shape() == out.shape(),
            kind if kind.is_elementwise() => kind.operands().iter().all(|&v| self.aligned(v, out)),
            _ => false,
        }
    }

    /// Whether operand `v` of an elementwise op with result type `out` (NumPy broadcasting)
    /// has none of the leading axes, or has them in the same places, and so do the values it
    /// is computed from when it is deferred.
    fn aligned(&self, v: ValueId, out: &Type) -> bool {
        let t = self.f.ty(v);
        let k = self.prefix.len();
        if t.rank() + k <= out.rank() {
            return true; // none of the leading axes, nor anything it is computed from
        }
        t.rank() == out.rank()
            && has_prefix(t, self.prefix)
            && (!self.deferred.contains(&v)
                || producer(self.f, self.block, v).is_some_and(|p| {
                    self.f.ops[p]
                        .kind
                        .operands()
                        .iter()
                        .all(|&x| self.aligned(x, t))
                }))
    }

    /// The buffers an operand `v` is read from: `v`, or for a deferred value not made by the
    /// chain (`values`), those of its producer's operands.
    fn leaves(&self, v: ValueId, values: &HashSet<ValueId>, out: &mut Vec<ValueId>) {
        if values.contains(&v) {
            return;
        }
        match producer(self.f, self.block, v).filter(|_| self.deferred.contains(&v)) {
            Some(p) => {
                for x in self.f.ops[p].kind.operands() {
                    self.leaves(x, values, out);
                }
            }
            None if !out.contains(&v) => out.push(v),
            None => {}
        }
    }
}

/// What the walker emits, in order: ops, and chains as their ops between `Begin` and `End`.
pub enum Step {
    Op(OpId),
    Begin(usize),
    End(usize),
}

/// The emission order of `block` with its `chains`: each chain where its first op was, after
/// the ops it hoists.
pub fn schedule(block: &Block, chains: &[Chain]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut placed: HashSet<OpId> = HashSet::new();
    for &id in &block.ops {
        if let Some(c) = chains.iter().position(|c| c.ops[0] == id) {
            let chain = &chains[c];
            steps.extend(chain.hoisted.iter().map(|&h| Step::Op(h)));
            steps.push(Step::Begin(c));
            steps.extend(chain.ops.iter().map(|&o| Step::Op(o)));
            steps.push(Step::End(c));
            placed.extend(chain.hoisted.iter().chain(&chain.ops));
        } else if !placed.contains(&id) {
            steps.push(Step::Op(id));
        }
    }
    steps
}

/// Values of `block` read only as operands of its chains' matmuls: a transpose making one can
/// be a strided view instead of a copy, since each entry's GEMM reads its slice through strides
/// (and packs it) anyway.
pub fn matmul_operands(f: &Func, block: &Block, chains: &[Chain]) -> HashSet<ValueId> {
    let mut operands = HashSet::new();
    let mut other = HashSet::new();
    let in_chains: HashSet<OpId> = chains.iter().flat_map(|c| c.ops.iter().copied()).collect();
    for &id in &block.ops {
        match &f.ops[id].kind {
            OpKind::MatMul { lhs, rhs, mask } if in_chains.contains(&id) => {
                operands.extend([*lhs, *rhs]);
                other.extend(*mask);
            }
            kind => super::fuse::used_in_op(f, kind, &mut other),
        }
    }
    other.extend(&block.results);
    &operands - &other
}
