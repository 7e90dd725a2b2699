//! The reference interpreter: runs any verified module on host tensors.
//!
//! It defines what a model means. Parameters and synthetic inputs come from the seeded
//! generator of `ppc-runtime`, keyed by name and layer (or microbatch), so a layer's weights are
//! the same numbers in the sequential model, in the stage-vectorized program and in every
//! backend. Two entry points matter to users: [`Interp::sequential`] (each microbatch through
//! layers `0..L` in order: the meaning of a model file) and [`Interp::forward`] (the pipelined
//! program if there is one).
//!
//! A run that cannot go on is an [`InterpError`]: a function missing from the module, arguments
//! that do not fit, parameters that cannot be read, or a rank of a sharded run that stopped.

use crate::ir::{names, Block, Func, Module, Param, ValueId};
use crate::kernels as k;
use crate::op::OpKind;
use crate::types::{Axis, DType, Type};
use ppc_tensor::init::{Layers, Shard, Source};
use ppc_tensor::params::ParamError;
use ppc_tensor::Tensor;
use std::collections::HashMap;

/// The fill used for poisoned bubbles, as a number the text format can hold.
pub const POISON: f64 = f64::NAN;

/// Why the interpreter could not run (part of) a module.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("the module has no `@{func}`")]
    NoFunc { func: String },
    /// A function that a pass makes is missing: `needs` says which.
    #[error("the module has no `@{func}`: {needs}")]
    NotTransformed { func: String, needs: &'static str },
    /// A sharded program run as one process: `instead` says what runs it.
    #[error("the program is split over {ranks} ranks: {instead}")]
    SplitOverRanks { ranks: u64, instead: &'static str },
    #[error("`@{func}` takes {want} arguments, got {got}")]
    Arity {
        func: String,
        want: usize,
        got: usize,
    },
    #[error("argument `%{arg}` of `@{func}` must be {want}, got {dtype}{shape:?}")]
    Argument {
        func: String,
        arg: String,
        want: Type,
        dtype: DType,
        shape: Vec<usize>,
    },
    #[error(transparent)]
    Param(#[from] ParamError),
    /// What a rank's exchange meets when a neighbour ended first (its own error is the cause).
    #[error("rank {rank}: a neighbouring rank stopped")]
    NeighbourStopped { rank: usize },
    #[error("rank {rank} panicked")]
    Panicked { rank: usize },
    #[error("no rank holds layer {layer} of `{param}`")]
    LayerNotHeld { layer: usize, param: String },
    #[error("no ranks")]
    NoRanks,
}

/// How one rank of a sharded program reaches the others: `exchange(x, false)` sends to the next
/// rank and returns what the previous one sent; `exchange(x, true)` the other way round; an
/// error if a neighbour is gone.
pub type Exchange<'m> = Box<dyn FnMut(Tensor, bool) -> Result<Tensor, InterpError> + 'm>;

/// An interpreter for one module and one seed (and one rank of a sharded module); caches
/// materialized parameters.
pub struct Interp<'m> {
    module: &'m Module,
    seed: u64,
    source: Source,
    rank: u64,
    exchange: Option<Exchange<'m>>,
    params: HashMap<(String, usize, u64), Tensor>,
}

impl<'m> Interp<'m> {
    /// The whole program in one process (rank 0 of 1: `exchange` returns its operand).
    pub fn new(module: &'m Module, seed: u64) -> Interp<'m> {
        Interp::with_params(module, seed, Source::Seeded(seed))
    }

    /// The whole program in one process, its parameters from `source` (inputs still seeded).
    pub fn with_params(module: &'m Module, seed: u64, source: Source) -> Interp<'m> {
        Interp {
            module,
            seed,
            source,
            rank: 0,
            exchange: None,
            params: HashMap::new(),
        }
    }

    /// Rank `rank` of a module sharded over `module.pipeline.ranks` ranks.
    pub fn on_rank(
        module: &'m Module,
        seed: u64,
        source: Source,
        rank: u64,
        exchange: Exchange<'m>,
    ) -> Interp<'m> {
        Interp {
            rank,
            exchange: Some(exchange),
            ..Interp::with_params(module, seed, source)
        }
    }

    /// The rank this interpreter runs (0 of 1 for a program in one process).
    pub fn rank(&self) -> u64 {
        self.rank
    }

    /// The module this interpreter runs.
    pub fn module(&self) -> &'m Module {
        self.module
    }

    /// `M` seeded synthetic microbatches stacked as `[M, ...input]`, drawn per microbatch from
    /// the stream `("input", m)`.
    pub fn synthetic_inputs(&self) -> Tensor {
        synthetic_inputs(self.module, self.seed)
    }

    /// The model as written: each microbatch through `@embed`, layers `0..L` in order, and
    /// `@head` (those the model has).
    pub fn sequential(&mut self, inputs: &Tensor) -> Result<Tensor, InterpError> {
        let module = self.module;
        let layer = module
            .func(names::LAYER)
            .ok_or_else(|| InterpError::NoFunc {
                func: names::LAYER.into(),
            })?;
        let m = module.pipeline.microbatches as usize;
        let mut outs = Vec::with_capacity(m);
        for mb in 0..m {
            let mut x = microbatch(inputs, mb);
            if let Some(embed) = module.func(names::EMBED) {
                x = self.call(embed, vec![x], 0)?.remove(0);
            }
            for l in 0..module.pipeline.layers {
                x = self.call(layer, vec![x], l)?.remove(0);
            }
            if let Some(head) = module.func(names::HEAD) {
                x = self.call(head, vec![x], 0)?.remove(0);
            }
            outs.push(x);
        }
        Ok(stack(&outs))
    }

    /// The pipelined program (`@model`, else `@pipeline`) if the module has one, else
    /// [`Interp::sequential`].
    pub fn forward(&mut self, inputs: &Tensor) -> Result<Tensor, InterpError> {
        let ranks = self.module.pipeline.ranks;
        if ranks > 1 && self.exchange.is_none() {
            return Err(InterpError::SplitOverRanks {
                ranks,
                instead: "run it with `forward_on_ranks`",
            });
        }
        let pipelined = self
            .module
            .func(names::MODEL)
            .or_else(|| self.module.func(names::PIPELINE));
        match pipelined {
            Some(p) => Ok(self.call(p, vec![inputs.clone()], 0)?.remove(0)),
            None => self.sequential(inputs),
        }
    }

    /// Replaces the weights that parameter `index` of `@func` has in layer `layer` (for
    /// finite differences).
    pub fn set_param(&mut self, func: &str, index: usize, layer: u64, t: Tensor) {
        self.params.insert((func.to_string(), index, layer), t);
    }

    /// Runs `f` on `args`; unstacked parameters take the weights of layer `layer`.
    pub fn call(
        &mut self,
        f: &Func,
        args: Vec<Tensor>,
        layer: u64,
    ) -> Result<Vec<Tensor>, InterpError> {
        if args.len() != f.body.args.len() {
            return Err(InterpError::Arity {
                func: f.name.clone(),
                want: f.body.args.len(),
                got: args.len(),
            });
        }
        let mut env: Vec<Option<Tensor>> = vec![None; f.values.len()];
        for (&a, t) in f.body.args.iter().zip(args) {
            let ty = f.ty(a);
            if t.dtype != ty.dtype || t.shape != ty.shape_usize() {
                return Err(InterpError::Argument {
                    func: f.name.clone(),
                    arg: f.values[a].name.clone(),
                    want: ty.clone(),
                    dtype: t.dtype,
                    shape: t.shape,
                });
            }
            env[a.index()] = Some(t);
        }
        for (i, p) in f.params.iter().enumerate() {
            let t = self.param(f, i, p, layer)?;
            env[p.value.index()] = Some(t);
        }
        self.block(f, &f.body, &mut env, layer)?;
        Ok(f.body
            .results
            .iter()
            .map(|&v| take(&env, v).clone())
            .collect())
    }

    fn param(&mut self, f: &Func, i: usize, p: &Param, layer: u64) -> Result<Tensor, ParamError> {
        let key = (f.name.clone(), i, if p.layer_axes == 0 { layer } else { 0 });
        if let Some(t) = self.params.get(&key) {
            return Ok(t.clone());
        }
        let t = materialize(
            &self.source,
            &f.values[p.value].name,
            f.ty(p.value),
            p,
            layer,
            shard(self.module, f.ty(p.value), self.rank),
            self.module.pipeline.layers,
        )?;
        self.params.insert(key, t.clone());
        Ok(t)
    }

    fn block(
        &mut self,
        f: &Func,
        block: &Block,
        env: &mut [Option<Tensor>],
        layer: u64,
    ) -> Result<(), InterpError> {
        for &id in &block.ops {
            let op = &f.ops[id];
            let ty = f.ty(op.results[0]);
            let shape = ty.shape_usize();
            let get = |v: ValueId| take(env, v);
            let out: Vec<Tensor> = match &op.kind {
                OpKind::Unary { op, x } => vec![k::unary(*op, get(*x))],
                OpKind::Binary { op, lhs, rhs } => {
                    vec![k::binary(*op, get(*lhs), get(*rhs), &shape)]
                }
                OpKind::Compare { pred, lhs, rhs } => {
                    vec![k::compare(*pred, get(*lhs), get(*rhs), &shape)]
                }
                OpKind::Select {
                    cond,
                    on_true,
                    on_false,
                } => vec![k::select(get(*cond), get(*on_true), get(*on_false), &shape)],
                OpKind::MatMul { lhs, rhs, mask } => {
                    vec![k::matmul(get(*lhs), get(*rhs), mask.map(get), &shape)]
                }
                OpKind::Transpose { x, perm } => vec![k::transpose(get(*x), perm)],
                OpKind::Reshape { x } => vec![Tensor::new(ty.dtype, shape, get(*x).data.clone())],
                OpKind::Broadcast { x } => vec![k::broadcast(get(*x), ty.dtype, &shape)],
                OpKind::Convert { x } => {
                    vec![Tensor::from_values(ty.dtype, shape, get(*x).values())]
                }
                OpKind::Slice { x, start, end } => vec![k::slice(get(*x), start, end)],
                OpKind::Concat { xs, axis } => vec![k::concat(
                    &xs.iter().map(|&v| get(v)).collect::<Vec<_>>(),
                    *axis,
                )],
                OpKind::Reduce { op, x, axes } => vec![k::reduce(*op, get(*x), axes)],
                OpKind::Softmax { x, axis, log } => vec![k::softmax(get(*x), *axis, *log)],
                OpKind::LayerNorm { x, axis, eps } => vec![k::layernorm(get(*x), *axis, eps.0)],
                OpKind::Iota { axis } => vec![k::iota(ty.dtype, &shape, *axis)],
                OpKind::Constant { value } => vec![Tensor::splat(ty.dtype, shape, value.0)],
                OpKind::Pad {
                    x,
                    axis,
                    low,
                    high,
                    fill,
                } => vec![k::pad(
                    get(*x),
                    *axis,
                    *low as usize,
                    *high as usize,
                    fill.0,
                )],
                OpKind::Shift { x, axis, fill } => vec![k::shift(get(*x), *axis, fill.0)],
                OpKind::Index { x, index, axis } => vec![k::index(get(*x), get(*index), *axis)],
                OpKind::Gather { table, ids, axis } => {
                    vec![k::gather(get(*table), get(*ids), *axis)]
                }
                OpKind::Update {
                    x,
                    update,
                    index,
                    axis,
                } => vec![k::update(get(*x), get(*update), get(*index), *axis)],
                OpKind::Rank => vec![Tensor::scalar(DType::I32, self.rank as f64)],
                OpKind::Exchange { x, reverse } => {
                    let x = get(*x).clone();
                    vec![match &mut self.exchange {
                        Some(exchange) => exchange(x, *reverse)?,
                        None => x,
                    }]
                }
                OpKind::Call { callee, args, on } => {
                    let g = &self.module.funcs[*callee];
                    if on.is_some_and(|c| get(c).value(0) == 0.0) {
                        g.result_types().iter().map(identity).collect()
                    } else {
                        let args = args.iter().map(|&v| get(v).clone()).collect();
                        self.call(g, args, layer)?
                    }
                }
                OpKind::Loop { trips, inits, body } => {
                    let mut carried: Vec<Tensor> = inits.iter().map(|&v| get(v).clone()).collect();
                    for t in 0..*trips {
                        env[body.args[0].index()] = Some(Tensor::scalar(DType::I32, t as f64));
                        for (&a, c) in body.args[1..].iter().zip(carried) {
                            env[a.index()] = Some(c);
                        }
                        self.block(f, body, env, layer)?;
                        carried = body.results.iter().map(|&v| take(env, v).clone()).collect();
                    }
                    carried
                }
            };
            for (&r, t) in op.results.iter().zip(out) {
                env[r.index()] = Some(t);
            }
        }
        Ok(())
    }
}

fn take(env: &[Option<Tensor>], v: ValueId) -> &Tensor {
    env[v.index()]
        .as_ref()
        .expect("invariant: verified IR defines values before use")
}

/// A parameter's values: each layer's slice from `source` (the seeded stream `(name, layer)`,
/// or the file's `layers.{layer}.{name}`).
pub fn materialize(
    source: &Source,
    name: &str,
    ty: &Type,
    p: &Param,
    layer: u64,
    shard: Option<Shard>,
    model_layers: u64,
) -> Result<Tensor, ParamError> {
    let layers = match p.layer_axes {
        0 => Layers::One(layer),
        axes => Layers::Stacked {
            axes,
            shard,
            model_layers,
        },
    };
    ppc_tensor::init::param_from(source, name, ty.dtype, &ty.shape_usize(), layers, p.init)
}

/// The part of the full parameter that rank `rank` holds, for a parameter of type `ty` of a
/// sharded module: its `#stages_per_rank` axis is that rank's slice of the stage axis.
pub fn shard(m: &Module, ty: &Type, rank: u64) -> Option<Shard> {
    let axis = ty.axis(Axis::RankStages)?;
    let p = m.pipeline;
    Some(Shard {
        axis,
        full: p.stages as usize,
        offset: (rank * p.stages_per_rank()) as usize,
    })
}

/// Runs a module sharded over `ranks` ranks, one thread per rank, `exchange` passing tensors
/// around the ring, and returns the last rank's result (the rank that holds the last stage), or
/// the error of the first rank that failed.
pub fn forward_on_ranks(
    m: &Module,
    seed: u64,
    source: &Source,
    inputs: &Tensor,
) -> Result<Tensor, InterpError> {
    let mut all = on_ranks(m, seed, source, |interp| interp.forward(inputs))?;
    Ok(all.pop().expect("invariant: at least one rank"))
}

/// Runs `run` on an interpreter for each rank of a module sharded over `ranks` ranks, one
/// thread per rank, exchanges passing tensors around the ring; returns every rank's result in
/// rank order, or the error of the first rank that failed.
pub fn on_ranks<T: Send>(
    m: &Module,
    seed: u64,
    source: &Source,
    run: impl Fn(&mut Interp) -> Result<T, InterpError> + Sync,
) -> Result<Vec<T>, InterpError> {
    use std::sync::mpsc::channel;
    let ranks = m.pipeline.ranks as usize;
    // Channel `r` of a ring carries what rank `r` receives in that direction.
    let ring = || -> (Vec<_>, Vec<_>) { (0..ranks).map(|_| channel::<Tensor>()).unzip() };
    let ((forward_tx, forward_rx), (back_tx, back_rx)) = (ring(), ring());
    let gone = |rank: usize| InterpError::NeighbourStopped { rank };
    let run = &run;
    let results: Vec<Result<T, InterpError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = forward_rx
            .into_iter()
            .zip(back_rx)
            .enumerate()
            .map(|(rank, (from_prev, from_next))| {
                let to_next = forward_tx[(rank + 1) % ranks].clone();
                let to_prev = back_tx[(rank + ranks - 1) % ranks].clone();
                scope.spawn(move || {
                    let exchange: Exchange = Box::new(move |x, reverse| {
                        let (to, from) = if reverse {
                            (&to_prev, &from_next)
                        } else {
                            (&to_next, &from_prev)
                        };
                        to.send(x).map_err(|_| gone(rank))?;
                        from.recv().map_err(|_| gone(rank))
                    });
                    let mut interp =
                        Interp::on_rank(m, seed, source.clone(), rank as u64, exchange);
                    run(&mut interp)
                })
            })
            .collect();
        // Only the ranks hold senders now: a rank that stops early ends its neighbours' waits.
        drop((forward_tx, back_tx));
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().unwrap_or(Err(InterpError::Panicked { rank })))
            .collect()
    });
    // A rank's own error comes before the neighbours' reports of it having stopped.
    let is_cause = |r: &Result<T, InterpError>| {
        r.as_ref()
            .is_err_and(|e| !matches!(e, InterpError::NeighbourStopped { .. }))
    };
    let first = results
        .iter()
        .position(is_cause)
        .or_else(|| results.iter().position(Result::is_err));
    let mut results = results;
    if let Some(Err(e)) = first.map(|i| results.swap_remove(i)) {
        return Err(e);
    }
    results.into_iter().collect()
}

/// The model's parameters as files hold them: each of `@layer`'s, for every layer, then each
/// of `@embed`'s and `@head`'s, once (a name both declare is one parameter).
pub fn param_specs(m: &Module) -> Vec<ppc_tensor::params::Spec> {
    let mut specs = Vec::new();
    for root in names::ROOTS {
        let Some(f) = m.func(root) else { continue };
        let layers = (root == names::LAYER).then_some(m.pipeline.layers);
        for p in &f.params {
            let name = &f.values[p.value].name;
            if specs
                .iter()
                .any(|s: &ppc_tensor::params::Spec| &s.name == name)
            {
                continue;
            }
            specs.push(ppc_tensor::params::Spec {
                name: name.clone(),
                shape: f.ty(p.value).shape_usize(),
                layers,
                dtype: f.ty(p.value).dtype,
                init: p.init,
            });
        }
    }
    specs
}

/// Where the parameters of a run of `m` come from: the file `params`, checked against the
/// model, or the generator seeded with `seed`.
pub fn param_source(
    m: &Module,
    seed: u64,
    params: Option<&std::path::Path>,
) -> Result<Source, ParamError> {
    match params {
        None => Ok(Source::Seeded(seed)),
        Some(path) => match ppc_tensor::params::ParamFile::open(path, &param_specs(m)) {
            Ok(f) => Ok(Source::File(std::sync::Arc::new(f))),
            Err(e) => {
                let dims: Vec<(String, u64)> =
                    m.dims.iter().map(|d| (d.name.clone(), d.value)).collect();
                Err(ppc_tensor::params::other_dims(path, &dims).unwrap_or(e))
            }
        },
    }
}

/// `[M, ...input]` synthetic inputs for `seed`: microbatch `m` from the stream `("input", m)`.
pub fn synthetic_inputs(m: &Module, seed: u64) -> Tensor {
    ppc_tensor::init::synthetic_inputs(
        seed,
        m.input.dtype,
        m.input_init(),
        &m.input.shape_usize(),
        m.pipeline.microbatches as usize,
    )
}

/// `[M, ...target]` seeded targets for `seed` (the model's `target` type, or its input's): class
/// indices below the outputs' last axis for i32 targets, standard normal values otherwise.
pub fn synthetic_targets(m: &Module, seed: u64) -> Tensor {
    let t = m.target_type();
    let mut shape = vec![m.pipeline.microbatches as usize];
    shape.extend(t.shape_usize());
    let n = shape.iter().product();
    let mut rng = ppc_tensor::Rng::stream(seed, "target", 0);
    if t.dtype == DType::I32 {
        let classes = m.output_type().shape_usize().last().copied().unwrap_or(1) as u64;
        Tensor::from_ints(shape, (0..n).map(|_| (rng.next_u64() % classes) as i32))
    } else {
        Tensor::new(t.dtype, shape, rng.fill(ppc_tensor::Init::Normal(1.0), n))
    }
}

/// Slice `i` of the leading axis.
pub fn microbatch(t: &Tensor, i: usize) -> Tensor {
    let inner: usize = t.shape[1..].iter().product();
    Tensor::new(
        t.dtype,
        t.shape[1..].to_vec(),
        t.data[i * inner..(i + 1) * inner].to_vec(),
    )
}

/// Stacks equal-shaped tensors along a new leading axis.
pub fn stack(ts: &[Tensor]) -> Tensor {
    let mut shape = vec![ts.len()];
    shape.extend(&ts[0].shape);
    Tensor::new(
        ts[0].dtype,
        shape,
        ts.iter().flat_map(|t| t.data.iter().copied()).collect(),
    )
}

/// What a `call_if` that does not run returns: `-0.0` (the additive identity), integers 0.
fn identity(ty: &Type) -> Tensor {
    let fill = if ty.dtype.is_float() { -0.0 } else { 0.0 };
    Tensor::new(
        ty.dtype,
        ty.shape_usize(),
        vec![fill; ty.elements() as usize],
    )
}
