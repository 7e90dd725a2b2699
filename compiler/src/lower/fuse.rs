//! Elementwise fusion: a chain of elementwise ops (`add`, `mul`, `gelu`, `select`, compares,
//! converts, broadcasts) whose intermediate values have one use each becomes one
//! `linalg.generic` that reads the chain's inputs and writes only its last value. The bias add
//! and GELU after a matmul, or the scale and causal mask before a softmax, then make one pass
//! over memory instead of one each, and one parallel loop instead of one each.
//!
//! Each fused op still rounds its value to its dtype, as when it had a buffer of its own, so
//! fusion changes no bit (`--exact` stays bit-identical to the interpreter).
//!
//! ```text
//! %ub = add %u, %b1        ──▶   linalg.generic ins(%u, %b1) outs(%a) {
//! %a = gelu %ub                    gelu(add(u, b1))
//!                                }
//! ```

use super::buf::Buf;
use super::emit::Emitter;
use super::fast_math::Numerics;
use super::ops::elementwise_value;
use super::text::identity;
use ppc_dialect::ir::{Block, Func, OpId, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::DType;
use std::collections::{HashMap, HashSet};

/// The values of `block` that are not given a buffer: results of elementwise ops whose only
/// use is an elementwise op of the same block, which computes them in its own loop. (A select
/// that guards an update, one of `guarded` (`in_place::guarded_updates`), is a conditional
/// write, not a loop.)
pub fn deferred(f: &Func, block: &Block, guarded: &HashMap<OpId, OpId>) -> HashSet<ValueId> {
    let fuses = |id: &OpId| f.ops[*id].kind.is_elementwise() && !guarded.contains_key(id);
    let mut fusable_uses: HashMap<ValueId, usize> = HashMap::new();
    let mut other_uses: HashSet<ValueId> = HashSet::new();
    for id in &block.ops {
        let kind = &f.ops[*id].kind;
        for v in kind.operands() {
            if fuses(id) {
                *fusable_uses.entry(v).or_default() += 1;
            } else {
                other_uses.insert(v);
            }
        }
        if let OpKind::Loop { body, .. } = kind {
            used_in(f, body, &mut other_uses);
        }
    }
    other_uses.extend(&block.results);
    block
        .ops
        .iter()
        .filter(|id| fuses(id))
        .map(|&id| f.ops[id].results[0])
        .filter(|v| fusable_uses.get(v) == Some(&1) && !other_uses.contains(v))
        .collect()
}

/// The values of `block` that exactly one op of it reads, with that op; a deferred value's
/// reads count as its consumer's. An elementwise op may write its result over such a value's
/// buffer (of the same type): its loop nest reads each element just before writing it.
pub fn sole_readers(
    f: &Func,
    block: &Block,
    deferred: &HashSet<ValueId>,
) -> HashMap<ValueId, OpId> {
    let mut readers: HashMap<ValueId, Vec<OpId>> = HashMap::new();
    for &id in &block.ops {
        if f.ops[id]
            .results
            .first()
            .is_some_and(|v| deferred.contains(v))
        {
            continue;
        }
        let mut read = HashSet::new();
        leaves(f, block, deferred, id, &mut read);
        for v in read {
            readers.entry(v).or_default().push(id);
        }
    }
    readers
        .into_iter()
        .filter(|(v, ids)| ids.len() == 1 && !block.results.contains(v))
        .map(|(v, ids)| (v, ids[0]))
        .collect()
}

/// What op `id` of `block` reads, with the deferred values among its operands replaced by what
/// they are computed from.
fn leaves(
    f: &Func,
    block: &Block,
    deferred: &HashSet<ValueId>,
    id: OpId,
    out: &mut HashSet<ValueId>,
) {
    let mut read = HashSet::new();
    used_in_op(f, &f.ops[id].kind, &mut read);
    for v in read {
        match producer(f, block, v).filter(|_| deferred.contains(&v)) {
            Some(p) => leaves(f, block, deferred, p, out),
            None => {
                out.insert(v);
            }
        }
    }
}

/// The op of `block` whose result is `v`, if `v` is made there.
pub fn producer(f: &Func, block: &Block, v: ValueId) -> Option<OpId> {
    block
        .ops
        .iter()
        .copied()
        .find(|&id| f.ops[id].results.first() == Some(&v))
}

/// Every value a block and the blocks inside it read.
pub fn used_in(f: &Func, block: &Block, used: &mut HashSet<ValueId>) {
    for &id in &block.ops {
        used_in_op(f, &f.ops[id].kind, used);
    }
    used.extend(&block.results);
}

/// Every value an op reads: its operands, and what the blocks inside it read.
pub fn used_in_op(f: &Func, kind: &OpKind, used: &mut HashSet<ValueId>) {
    used.extend(kind.operands());
    if let OpKind::Loop { body, .. } = kind {
        used_in(f, body, used);
    }
}

/// Where each loop dimension of an operand comes from in the fused loop nest: `Some(i)` is
/// loop `i`, `None` the constant 0 of a broadcast axis.
type Map = Vec<Option<usize>>;

/// The map reading an operand of shape `src` (NumPy-broadcast) at each index of `dst`.
fn broadcast(src: &[u64], dst: &[u64]) -> Map {
    let off = dst.len() - src.len();
    (0..src.len())
        .map(|i| (src[i] != 1 || dst[i + off] == 1).then_some(i + off))
        .collect()
}

/// One value of the fused computation.
enum Node<'f> {
    /// Input `i` of the generic.
    Input(usize),
    /// The output's element where it is written: a value whose buffer is the output itself
    /// (an elementwise op computed in the slice it reads, `Decision::ElementwiseIntoSlice`),
    /// read through the output's block argument. As an input besides the output it would
    /// alias it, and LLVM would not vectorize the loop.
    Output,
    Op {
        kind: &'f OpKind,
        ins: Vec<Node<'f>>,
        in_dtypes: Vec<DType>,
        out: DType,
    },
}

/// Builds the fused tree of one root op and the generic's inputs.
struct Fusion<'f, 'e> {
    f: &'f Func,
    env: &'e HashMap<ValueId, Buf>,
    deferred: &'e HashSet<ValueId>,
    block: &'f Block,
    /// The buffer the generic writes.
    out: &'e Buf,
    /// The generic's inputs: a buffer and its map, each once.
    inputs: Vec<(Buf, Map)>,
}

impl<'f> Fusion<'f, '_> {
    /// `v` read through `map` (its dimensions in terms of the fused loops).
    fn value(&mut self, v: ValueId, map: Map) -> Node<'f> {
        if self.deferred.contains(&v) {
            let id = producer(self.f, self.block, v).expect("invariant: deferred in this block");
            let op = &self.f.ops[id];
            return self.op(&op.kind, self.f.ty(v).dtype, &self.f.ty(v).shape(), &map);
        }
        let buf = &self.env[&v];
        if buf.name == self.out.name && map.iter().enumerate().all(|(i, d)| *d == Some(i)) {
            return Node::Output;
        }
        let at = self
            .inputs
            .iter()
            .position(|(b, m)| b.name == buf.name && *m == map);
        Node::Input(at.unwrap_or_else(|| {
            self.inputs.push((buf.clone(), map));
            self.inputs.len() - 1
        }))
    }

    /// An elementwise op of shape `shape` whose dimensions are `map` of the fused loops.
    fn op(&mut self, kind: &'f OpKind, out: DType, shape: &[u64], map: &Map) -> Node<'f> {
        let operands = kind.operands();
        let in_dtypes = operands.iter().map(|&x| self.f.ty(x).dtype).collect();
        let ins = operands
            .iter()
            .map(|&x| {
                let inner = broadcast(&self.f.ty(x).shape(), shape);
                let composed = inner.iter().map(|d| d.and_then(|j| map[j])).collect();
                self.value(x, composed)
            })
            .collect();
        Node::Op {
            kind,
            ins,
            in_dtypes,
            out,
        }
    }
}

fn eval(e: &mut Emitter, numerics: Numerics, node: &Node, args: &[String]) -> String {
    match node {
        Node::Input(i) => args[*i].clone(),
        Node::Output => args.last().expect("the output's block argument").clone(),
        Node::Op {
            kind,
            ins,
            in_dtypes,
            out,
        } => {
            let values: Vec<String> = ins.iter().map(|n| eval(e, numerics, n, args)).collect();
            elementwise_value(e, numerics, kind, &values, in_dtypes, *out)
        }
    }
}

/// Where an elementwise op is lowered: its block, the buffers of the values computed so far,
/// and the block's [`deferred`] values.
pub struct Scope<'a> {
    pub f: &'a Func,
    pub block: &'a Block,
    pub env: &'a HashMap<ValueId, Buf>,
    pub deferred: &'a HashSet<ValueId>,
}

/// The names of the ops that the loop nest of `root` computes: `root`'s, then those of the
/// deferred values it reads, depth first (`gelu+add`).
pub fn ops_of(scope: &Scope, root: OpId) -> Vec<String> {
    let op = &scope.f.ops[root];
    let mut names = vec![op.kind.name().to_string()];
    for v in op.kind.operands() {
        if scope.deferred.contains(&v) {
            if let Some(p) = producer(scope.f, scope.block, v) {
                names.extend(ops_of(scope, p));
            }
        }
    }
    names
}

/// Writes the elementwise op `root` of the scope's block into `out`, computing the deferred
/// values it reads (and those they read) in the same loop nest.
pub fn emit(e: &mut Emitter, numerics: Numerics, scope: &Scope, root: OpId, out: &Buf) {
    let Scope {
        f,
        block,
        env,
        deferred,
    } = *scope;
    let mut fusion = Fusion {
        f,
        env,
        deferred,
        block,
        out,
        inputs: Vec::new(),
    };
    let shape = out.ty.shape();
    let r = shape.len();
    let tree = fusion.op(
        &f.ops[root].kind,
        out.ty.dtype,
        &shape,
        &(0..r).map(Some).collect(),
    );
    let text = |m: &Map| {
        m.iter()
            .map(|d| d.map_or("0".to_string(), |i| format!("d{i}")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ins: Vec<(&Buf, String)> = fusion.inputs.iter().map(|(b, m)| (b, text(m))).collect();
    e.generic(r, &ins, (out, identity(r)), &vec!["parallel"; r], |e, a| {
        eval(e, numerics, &tree, a)
    });
}
