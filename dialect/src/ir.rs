//! The module structure: named dimensions, the pipeline's shape, and functions of SSA ops.
//!
//! A function owns two arenas, values and ops. Its body is a [`Block`]: arguments, ops in
//! order, returned values. A `loop` op owns a nested block, whose values live in the same arenas.
//! Every value is defined before it is used, in arena order. Spans sit in side tables.

use crate::arena::{Arena, Id};
use crate::op::OpKind;
pub use crate::setting::Setting;
use crate::span::SpanTable;
use crate::types::Type;
pub use ppc_tensor::Init;
use std::collections::{HashMap, HashSet};

pub type ValueId = Id<Value>;
pub type OpId = Id<Op>;
/// A function of the module; `call` refers to its callee by this id, which stays valid as
/// passes add functions (they only append).
pub type FuncId = Id<Func>;

/// A whole model file, or the output of any pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    pub dims: Vec<DimDef>,
    pub pipeline: Pipeline,
    /// The type of one microbatch of input: `@embed`'s argument if the model has one, else
    /// `@layer`'s.
    pub input: Type,
    /// How synthetic inputs are drawn (`input i32[b, t] = uniform(0, vocab)`), if the file says.
    pub input_init: Option<WrittenInit>,
    /// The type of one microbatch of targets, for training.
    pub target: Option<Type>,
    pub loss: Option<Loss>,
    /// `softmax_cross_entropy` only: the target value (padding) whose rows the loss skips.
    pub ignore_index: Option<i32>,
    /// The `train { ... }` block's settings as written (optimizer and its hyper-parameters).
    pub train: Vec<(String, String)>,
    /// The training schedule the `pipeline` block names (`schedule = 1f1b`), one of
    /// [`crate::setting::SCHEDULES`]; the command line's `--schedule` overrides it.
    pub schedule: Option<String>,
    /// In definition order: a function calls only functions before it.
    pub funcs: Arena<Func>,
    /// Spans of module-level items.
    pub spans: SpanTable<Item>,
}

/// An initializer and, when an argument names a dimension, its text as written
/// (`uniform(0, vocab)`), which `ppc fmt` keeps.
#[derive(Clone, Debug, PartialEq)]
pub struct WrittenInit {
    pub init: Init,
    pub written: Option<String>,
}

/// A module-level item of the text format, as a key of [`Module::spans`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Item {
    /// The `dims { ... }` block.
    Dims,
    /// The name of `dims[i]` where it is declared.
    Dim(usize),
    /// The `pipeline { ... }` block.
    Pipeline,
    /// The value of a pipeline setting, where the file gives the one in effect (not where
    /// the command line overrides it).
    Setting(Setting),
    /// The value of the pipeline's `schedule`.
    Schedule,
    Input,
    Target,
    Loss,
    Train,
    /// The name and the value of `train` setting `i`.
    TrainKey(usize),
    TrainValue(usize),
    /// The name of a function where the model file defines it.
    Func(FuncId),
}

impl Item {
    /// The keyword that starts the item in the text format.
    pub fn keyword(self) -> &'static str {
        match self {
            Item::Dims | Item::Dim(_) => "dims",
            Item::Pipeline | Item::Setting(_) | Item::Schedule => "pipeline",
            Item::Input => "input",
            Item::Target => "target",
            Item::Loss => "loss",
            Item::Train | Item::TrainKey(_) | Item::TrainValue(_) => "train",
            Item::Func(_) => "func",
        }
    }
}

/// `name = 4` or `name = heads * 64`: a named dimension and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct DimDef {
    pub name: String,
    /// As written, over numbers and earlier dimensions (a `--dim` override: its number).
    pub expr: crate::expr::Expr,
    pub value: u64,
}

/// The pipeline's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipeline {
    pub stages: u64,
    /// Layers of the whole model, any number: the stages hold `layers_per_stage()` slots per
    /// repeat, and slots `layers..` (the last ones, in layer order) are empty.
    pub layers: u64,
    pub microbatches: u64,
    /// Circular repeats: layer `(r*S + s)*k + j` runs on stage `s` in repeat `r`.
    pub repeats: u64,
    /// Processes the stage axis is split over (`shard-stages`); divides `stages`.
    pub ranks: u64,
    /// How the file gave the depth; kept so that printing keeps the meaning of overrides
    /// (`layers = 8` stays 8 under `--stages 2`; `layers_per_stage = 1` scales with it).
    pub depth: Depth,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// `layers = L`.
    Layers,
    /// `layers_per_stage = k`, or nothing (k = 1).
    PerStage,
}

impl Pipeline {
    /// `k`: layer slots each stage runs, one after the other, per repeat: ⌈L / (S·R)⌉.
    pub fn layers_per_stage(&self) -> u64 {
        self.layers.div_ceil(self.stages * self.repeats)
    }

    /// Whether some slots are empty: the layers do not fill `stages × repeats × k` slots.
    pub fn uneven(&self) -> bool {
        self.layers != self.stages * self.repeats * self.layers_per_stage()
    }

    /// Iterations of the GPipe loop: `R*M + S - 1`.
    pub fn iterations(&self) -> u64 {
        self.repeats * self.microbatches + self.stages - 1
    }

    /// Stages each rank holds.
    pub fn stages_per_rank(&self) -> u64 {
        self.stages / self.ranks
    }

    /// The value of a setting in effect.
    pub fn get(&self, s: Setting) -> u64 {
        match s {
            Setting::Stages => self.stages,
            Setting::Layers => self.layers,
            Setting::LayersPerStage => self.layers_per_stage(),
            Setting::Microbatches => self.microbatches,
            Setting::Repeats => self.repeats,
            Setting::Ranks => self.ranks,
        }
    }

    /// The settings as printed, in canonical order: the depth as the file gave it, `ranks`
    /// only when it is not 1.
    pub fn settings(&self) -> Vec<(Setting, u64)> {
        let written = |s: Setting| match s {
            Setting::Layers => self.depth == Depth::Layers,
            Setting::LayersPerStage => self.depth == Depth::PerStage,
            Setting::Ranks => self.ranks != 1,
            Setting::Stages | Setting::Microbatches | Setting::Repeats => true,
        };
        Setting::ALL
            .into_iter()
            .filter(|&s| written(s))
            .map(|s| (s, self.get(s)))
            .collect()
    }

    /// Settings usable as dimension names in shapes.
    pub fn dim_names(&self) -> [(&'static str, u64); 7] {
        let [a, b, c, d, e, f] = Setting::ALL.map(|s| (s.name(), self.get(s)));
        [a, b, c, d, e, f, (STAGES_PER_RANK, self.stages_per_rank())]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    Mse,
    SoftmaxCrossEntropy,
}

impl Loss {
    pub fn name(self) -> &'static str {
        match self {
            Loss::Mse => "mse",
            Loss::SoftmaxCrossEntropy => "softmax_cross_entropy",
        }
    }
}

/// An SSA value: a function argument, a parameter, a block argument or an op result.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// The name without `%`; unique within its function.
    pub name: String,
    pub ty: Type,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub kind: OpKind,
    pub results: Vec<ValueId>,
}

/// A straight-line list of ops with arguments and results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub args: Vec<ValueId>,
    pub ops: Vec<OpId>,
    /// The values returned (function body) or yielded (loop body).
    pub results: Vec<ValueId>,
}

/// A trainable parameter: its value, initializer, and how many leading axes index layers.
///
/// A parameter with `layer_axes = 0` belongs to whichever layer runs the function. With
/// `layer_axes = n`, the first `n` axes enumerate layers in row-major order: element `l` of
/// those axes holds the weights of layer `l`, drawn from the generator stream `(name, l)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub value: ValueId,
    pub init: Init,
    pub layer_axes: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    /// The name without `@`.
    pub name: String,
    pub params: Vec<Param>,
    pub body: Block,
    pub values: Arena<Value>,
    pub ops: Arena<Op>,
    pub value_spans: SpanTable<ValueId>,
    pub op_spans: SpanTable<OpId>,
    /// What the model file wrote as expressions or `f32!` (`as_written.rs`).
    pub written: crate::as_written::AsWritten,
}

impl Func {
    /// The functions this one calls, in its body and its loops' bodies, once per call.
    pub fn callees(&self) -> Vec<FuncId> {
        fn walk(f: &Func, block: &Block, out: &mut Vec<FuncId>) {
            for &id in &block.ops {
                match &f.ops[id].kind {
                    OpKind::Call { callee, .. } => out.push(*callee),
                    OpKind::Loop { body, .. } => walk(f, body, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(self, &self.body, &mut out);
        out
    }

    /// The loop over ticks of `--schedule 1f1b` among the top-level ops (the one carrying
    /// [`names::TICK_RING`]): its trip count and the ring.
    pub fn tick_loop(&self) -> Option<(u64, ValueId)> {
        (self.body.ops.iter()).find_map(|&id| match &self.ops[id].kind {
            OpKind::Loop { trips, body, .. } => (body.args.iter())
                .find(|&&a| names::is_tick_ring(&self.values[a].name))
                .map(|&ring| (*trips, ring)),
            _ => None,
        })
    }

    pub fn new(name: &str) -> Func {
        Func {
            name: name.to_string(),
            params: Vec::new(),
            body: Block::default(),
            values: Arena::default(),
            ops: Arena::default(),
            value_spans: SpanTable::default(),
            op_spans: SpanTable::default(),
            written: Default::default(),
        }
    }

    pub fn ty(&self, v: ValueId) -> &Type {
        &self.values[v].ty
    }

    /// Floating-point operations of the matrix products of one call (2·m·n·k each), nested
    /// loops counted once: the measure of work that FLOP rates report.
    pub fn matmul_flops(&self) -> u64 {
        self.ops
            .values()
            .filter_map(|op| match &op.kind {
                OpKind::MatMul { lhs, .. } => {
                    let out = self.ty(op.results[0]);
                    let k = self.ty(*lhs).dims.last().map_or(0, |d| d.size);
                    Some(2 * out.elements() * k)
                }
                _ => None,
            })
            .sum()
    }

    pub fn arg_types(&self) -> Vec<Type> {
        self.body.args.iter().map(|&v| self.ty(v).clone()).collect()
    }

    pub fn result_types(&self) -> Vec<Type> {
        self.body
            .results
            .iter()
            .map(|&v| self.ty(v).clone())
            .collect()
    }

    /// The op (of any block) whose results include `v`; `None` for an argument.
    pub fn producer(&self, v: ValueId) -> Option<&Op> {
        self.ops.values().find(|op| op.results.contains(&v))
    }

    /// How many times `block` (nested loop bodies included) reads `v`: as an operand, or as a
    /// block's result.
    pub fn uses(&self, block: &Block, v: ValueId) -> usize {
        let mut n = block.results.iter().filter(|&&r| r == v).count();
        for &id in &block.ops {
            let op = &self.ops[id];
            n += op.kind.operands().iter().filter(|&&o| o == v).count();
            if let OpKind::Loop { body, .. } = &op.kind {
                n += self.uses(body, v);
            }
        }
        n
    }

    /// Every value some op (nested loops included) or block result reads.
    pub fn read_values(&self) -> HashSet<ValueId> {
        fn walk(f: &Func, block: &Block, out: &mut HashSet<ValueId>) {
            out.extend(&block.results);
            for &id in &block.ops {
                let kind = &f.ops[id].kind;
                out.extend(kind.operands());
                if let OpKind::Loop { body, .. } = kind {
                    walk(f, body, out);
                }
            }
        }
        let mut out = HashSet::new();
        walk(self, &self.body, &mut out);
        out
    }

    /// Removes the ops whose results nothing reads (a loop stays whole while any of its
    /// results is read), and their values: the arenas keep the rest in definition order, as
    /// parsing the printed function would make them. Exchanges stay: every rank takes part.
    pub fn remove_dead_ops(&mut self) {
        fn mark(f: &Func, block: &Block, live: &mut HashSet<ValueId>, keep: &mut HashSet<OpId>) {
            live.extend(block.results.iter().copied());
            for &id in block.ops.iter().rev() {
                let op = &f.ops[id];
                let exchange = matches!(op.kind, OpKind::Exchange { .. });
                if !exchange && !op.results.iter().any(|r| live.contains(r)) {
                    continue;
                }
                keep.insert(id);
                live.extend(op.kind.operands());
                if let OpKind::Loop { body, .. } = &op.kind {
                    mark(f, body, live, keep);
                }
            }
        }
        /// The values `block` defines with the kept ops: its arguments, their results.
        fn defined(f: &Func, block: &Block, keep: &HashSet<OpId>, out: &mut HashSet<ValueId>) {
            out.extend(block.args.iter().copied());
            for id in block.ops.iter().filter(|id| keep.contains(id)) {
                out.extend(f.ops[*id].results.iter().copied());
                if let OpKind::Loop { body, .. } = &f.ops[*id].kind {
                    defined(f, body, keep, out);
                }
            }
        }
        let (mut live, mut keep) = (HashSet::new(), HashSet::new());
        mark(self, &self.body, &mut live, &mut keep);
        let mut values = HashSet::new();
        defined(self, &self.body, &keep, &mut values);
        values.extend(self.params.iter().map(|p| p.value));
        // New ids, in the old order.
        let mut new_values: Arena<Value> = Arena::default();
        let mut vmap: HashMap<ValueId, ValueId> = HashMap::new();
        for (id, v) in self.values.iter().filter(|(id, _)| values.contains(id)) {
            vmap.insert(id, new_values.push(v.clone()));
        }
        let mut new_ops: Arena<Op> = Arena::default();
        let mut omap: HashMap<OpId, OpId> = HashMap::new();
        for (id, op) in self.ops.iter().filter(|(id, _)| keep.contains(id)) {
            let op = Op {
                kind: op.kind.map_operands(|v| vmap[&v]),
                results: op.results.iter().map(|r| vmap[r]).collect(),
            };
            omap.insert(id, new_ops.push(op));
        }
        let block = |b: &Block| Block {
            args: b.args.iter().map(|v| vmap[v]).collect(),
            ops: b
                .ops
                .iter()
                .filter_map(|id| omap.get(id).copied())
                .collect(),
            results: b.results.iter().map(|v| vmap[v]).collect(),
        };
        for op in new_ops.values_mut() {
            if let OpKind::Loop { body, .. } = &mut op.kind {
                *body = block(body);
            }
        }
        self.body = block(&self.body);
        for p in &mut self.params {
            p.value = vmap[&p.value];
        }
        self.value_spans = self.value_spans.remapped(&vmap);
        self.op_spans = self.op_spans.remapped(&omap);
        self.values = new_values;
        self.ops = new_ops;
    }
}

/// The names of the functions that passes read and write.
pub mod names {
    /// The one-stage compute written by the user.
    pub const LAYER: &str = "layer";
    /// The stage program vectorized over the stage axis (`vmap-stages`).
    pub const STAGE: &str = "stage";
    /// The GPipe loop over all microbatches (`gpipe-loop`).
    pub const PIPELINE: &str = "pipeline";
    /// The pipeline followed by the model's loss (`loss`, training only).
    pub const TRAIN: &str = "train";
    /// The model's loss of its outputs against the targets (`loss`), which `@train` calls on
    /// the last rank.
    pub const LOSS: &str = "loss";
    /// `@head` (if any) and the loss of one microbatch, summed over its elements and divided by
    /// a normalizer given as an argument (`loss`, for `--schedule 1f1b`): its VJP is one
    /// microbatch's slice of `@loss`'s, bit for bit.
    pub const MICROBATCH_LOSS: &str = "microbatch_loss";
    /// What `@loss` divides its sum by, from all microbatches' targets (`loss`, for
    /// `--schedule 1f1b`).
    pub const LOSS_NORMALIZER: &str = "loss_normalizer";
    /// Written by the user, optional: runs on each microbatch before the pipelined layers
    /// (token ids to activations).
    pub const EMBED: &str = "embed";
    /// Written by the user, optional: runs on each microbatch after the pipelined layers
    /// (final norm, logits).
    pub const HEAD: &str = "head";
    /// `@embed`, the GPipe loop and `@head` over all microbatches (`embed-head`).
    pub const MODEL: &str = "model";
    /// The functions a model file writes, in the order a microbatch runs them; `@layer` runs
    /// once per layer.
    pub const ROOTS: [&str; 3] = [EMBED, LAYER, HEAD];

    /// `@stage`'s argument that gives each stage the repeat it runs (circular pipelines).
    pub const REPEAT: &str = "repeat";

    /// The ring of stage inputs that the loops over ticks of `--schedule 1f1b` carry (a tape,
    /// as the report counts it); the lowering numbers those loops' iterations by tick.
    pub const TICK_RING: &str = "tape_ring";

    /// The residuals of `@stage_recompute` that the loop over ticks carries for one tick, to
    /// the backward of the next (a tape, as the report counts what the step keeps).
    pub const RECOMPUTED: &str = "tape_recomputed";

    /// The names a stage's forward has: `@stage`, `@stage_fwd` (keeping residuals), and each
    /// masked for the ticked schedules' loop ([`masked`]).
    pub fn stage_forwards() -> [String; 4] {
        let (stage, fwd) = (STAGE.to_string(), fwd(STAGE));
        [masked(&stage), masked(&fwd), stage, fwd]
    }

    /// The names a stage's backward has: `@stage_vjp` (recomputing its forward) or
    /// `@stage_bwd` (from kept residuals).
    pub fn stage_backwards() -> [String; 2] {
        [vjp(STAGE), bwd(STAGE)]
    }

    /// Whether `name` is the weight-gradient half of a stage's backward (`--schedule zb-h1`).
    pub fn is_stage_weight_grad(name: &str) -> bool {
        stage_backwards().iter().any(|b| name == weight_grad(b))
    }

    /// What `@f_input` stashed for `@f_weight`, which the loop over ticks of `--schedule
    /// zb-h1` carries for one tick (a tape, as the report counts what the step keeps).
    pub const STASHED: &str = "tape_stashed";

    /// Whether a value's name is [`STASHED`]'s (or a renaming `tape_stashed.N`).
    pub fn is_stashed(name: &str) -> bool {
        name.split('.').next() == Some(STASHED)
    }

    /// Whether a value's name is [`RECOMPUTED`]'s (or a renaming `tape_recomputed.N`).
    pub fn is_recomputed(name: &str) -> bool {
        name.split('.').next() == Some(RECOMPUTED)
    }

    /// Whether a value's name is [`TICK_RING`]'s (or its renaming `tape_ring.N`).
    pub fn is_tick_ring(name: &str) -> bool {
        name.split('.').next() == Some(TICK_RING)
    }

    /// The reverse-mode gradient of function `f` (`autodiff`): `@f_vjp`.
    pub fn vjp(f: &str) -> String {
        format!("{f}_vjp")
    }

    /// `@f` returning also what its backward reads (`autodiff --remat=none`): `@f_fwd`.
    pub fn fwd(f: &str) -> String {
        format!("{f}_fwd")
    }

    /// `@f`'s backward from what `@f_fwd` kept (`autodiff --remat=none`): `@f_bwd`.
    pub fn bwd(f: &str) -> String {
        format!("{f}_bwd")
    }

    /// The input-gradient half of a stage's backward `@f` (`--schedule zb-h1`): `@f_input`.
    pub fn input_grad(f: &str) -> String {
        format!("{f}_input")
    }

    /// The weight-gradient half of a stage's backward `@f` (`--schedule zb-h1`), which reads
    /// what `@f_input` stashed: `@f_weight`.
    pub fn weight_grad(f: &str) -> String {
        format!("{f}_weight")
    }

    /// A stage's forward `@f` with its results `-0.0` where the stage does not run (the ticked
    /// schedules' loop, `--schedule 1f1b` and `zb-h1`): `@f_masked`.
    pub fn masked(f: &str) -> String {
        format!("{f}_masked")
    }

    /// `@f_fwd` run again for `@f_bwd`, not as a forward (`autodiff --remat=tick`, for
    /// `--schedule 1f1b`, which runs it a tick before the backward): `@f_recompute`.
    pub fn recompute(f: &str) -> String {
        format!("{f}_recompute")
    }
}

/// The setting `stages / ranks`, usable as a dimension though no `pipeline` block gives it.
pub const STAGES_PER_RANK: &str = "stages_per_rank";

impl Module {
    pub fn func(&self, name: &str) -> Option<&Func> {
        self.funcs.values().find(|f| f.name == name)
    }

    /// Drops from every function that calls alone run (one that something calls) the results
    /// that no call reads, then the ops that computed only those, until none is left: a
    /// function that nothing calls is an entry point and keeps its signature. A call keeps
    /// one result even when none is read (dead-op removal drops such calls).
    pub fn remove_unused_results(&mut self) {
        loop {
            // Per callee, whether any call reads each of its results.
            let mut read: HashMap<FuncId, Vec<bool>> = HashMap::new();
            for f in self.funcs.values() {
                let values = f.read_values();
                for op in f.ops.values() {
                    if let OpKind::Call { callee, .. } = op.kind {
                        let any = read
                            .entry(callee)
                            .or_insert_with(|| vec![false; op.results.len()]);
                        for (a, r) in any.iter_mut().zip(&op.results) {
                            *a |= values.contains(r);
                        }
                    }
                }
            }
            read.retain(|_, any| any.contains(&false) && any.contains(&true));
            if read.is_empty() {
                return;
            }
            let keep = |any: &[bool], rs: &[ValueId]| -> Vec<ValueId> {
                rs.iter()
                    .zip(any)
                    .filter(|(_, &a)| a)
                    .map(|(&r, _)| r)
                    .collect()
            };
            for (id, f) in self.funcs.iter_mut() {
                let mut changed = false;
                if let Some(any) = read.get(&id) {
                    f.body.results = keep(any, &f.body.results);
                    changed = true;
                }
                for op in f.ops.values_mut() {
                    if let OpKind::Call { callee, .. } = op.kind {
                        if let Some(any) = read.get(&callee) {
                            op.results = keep(any, &op.results);
                            changed = true;
                        }
                    }
                }
                if changed {
                    f.remove_dead_ops();
                }
            }
        }
    }

    /// The id of the function called `name`.
    /// `from` and every function it calls, directly or not.
    pub fn reachable(&self, from: FuncId) -> std::collections::BTreeSet<FuncId> {
        let mut seen = std::collections::BTreeSet::from([from]);
        let mut todo = vec![from];
        while let Some(f) = todo.pop() {
            for callee in self.funcs[f].callees() {
                if seen.insert(callee) {
                    todo.push(callee);
                }
            }
        }
        seen
    }

    pub fn func_id(&self, name: &str) -> Option<FuncId> {
        self.funcs
            .iter()
            .find(|(_, f)| f.name == name)
            .map(|(id, _)| id)
    }

    /// The loss as declared, or `mse`, the default.
    pub fn loss_or_default(&self) -> Loss {
        self.loss.unwrap_or(Loss::Mse)
    }

    /// The type of one microbatch of targets: as declared, or what the loss compares outputs
    /// with: the output's type for `mse`, one class index per row of outputs for
    /// `softmax_cross_entropy`.
    pub fn target_type(&self) -> Type {
        let out = self.output_type();
        self.target
            .clone()
            .unwrap_or_else(|| match self.loss_or_default() {
                Loss::Mse => out,
                Loss::SoftmaxCrossEntropy => {
                    let rows = out.remove(out.rank() - 1);
                    rows.with_dtype(crate::DType::I32)
                }
            })
    }

    /// How synthetic inputs are drawn: as the `input` line says, else normal(1).
    pub fn input_init(&self) -> Init {
        self.input_init
            .as_ref()
            .map_or(ppc_tensor::init::INPUT_INIT, |i| i.init)
    }

    /// The type one microbatch has between stages: `@embed`'s result if the model has an
    /// `@embed`, else the input's.
    pub fn stage_type(&self) -> Type {
        self.func(names::EMBED)
            .and_then(|f| f.result_types().first().cloned())
            .unwrap_or_else(|| self.input.clone())
    }

    /// Floating-point operations of one forward step of the model as written (no bubbles):
    /// every microbatch through `@embed`, every layer and `@head`.
    pub fn flops(&self) -> u64 {
        let p = self.pipeline;
        let of = |name| self.func(name).map_or(0, Func::matmul_flops);
        (of(names::EMBED) + of(names::LAYER) * p.layers + of(names::HEAD)) * p.microbatches
    }

    /// The type of one microbatch of the model's outputs: `@head`'s result if the model has a
    /// `@head`, else what the stages chain.
    pub fn output_type(&self) -> Type {
        self.func(names::HEAD)
            .and_then(|f| f.result_types().first().cloned())
            .unwrap_or_else(|| self.stage_type())
    }

    /// The size of a named dimension: a `dims` entry or a pipeline setting.
    pub fn dim(&self, name: &str) -> Option<u64> {
        self.dims
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.value)
            .or_else(|| {
                self.pipeline
                    .dim_names()
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| *v)
            })
    }
}
