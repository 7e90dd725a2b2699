//! `lower-mlir`: the pipelined program `@pipeline` becomes an MLIR module (func, arith, math,
//! memref, linalg, scf), with its manifest. The only code that uses melior is `mlir.rs`.
//!
//! Preconditions: `gpipe-loop` has run. Postconditions: one entry
//! `@ppc_forward(inputs, params..., output)` with `llvm.emit_c_interface` (for a module compiled
//! for training, [`Entry::Train`]: `(inputs, targets, params..., loss, output, grads...)`,
//! lowered from `@train_vjp`), every value in a
//! statically shaped buffer or a view of one (`views.rs`), chains of elementwise ops fused into
//! one `linalg.generic` (`fuse.rs`), big loop nests marked for the module's transform script to
//! make parallel (`emit.rs`), calls inlined (so `@stage`'s weights become entry arguments;
//! the calls the pipeline's loops make, a stage's body, then become functions of their own
//! again, `@ppc_stage…`, by the transform script's `loop.outline`, not inlined by LLVM) and,
//! where a stage's values are too small for a parallel loop nest each, run as one parallel loop
//! over the stages (`stage_split.rs`; in the training step's backward, bubble stages skip it and
//! each stage adds its weight gradients into the accumulators, `accumulate.rs`), chains of
//! batched matmuls and what lies between them
//! (attention, a decoder's MLP) as one parallel loop over their batch entries
//! (`batch_split.rs`), reductions along the innermost axis as register loops
//! (`row_reduce.rs`), loops
//! as `scf.for` with their carried values computed in place where safe and tapes left unfilled
//! (`in_place.rs`), each
//! loop nest between `--trace` calls, and every op located at its model-file span, so an MLIR
//! error points at the `.ppc` line that caused it.
//!
//! ```text
//! %out = call @stage, %stage_in : f32[#stages, b, d]      ──▶   linalg.generic ... loc("mlp.ppc":12:3)
//! %state_out, ... = loop ..., trips = 11 { ... }          ──▶   scf.for %i = 0 to 11 { ... }
//! ```

mod accumulate;
mod batch_split;
pub mod emit;
mod fast_math;
mod fuse;
pub mod gpu_map;
mod in_place;
pub mod machine;
pub mod mlir;
mod ops;
mod residency;
mod row_reduce;
mod stage_split;
mod views;

use emit::{escape, Buf, Emitter, Lines};
use ppc_dialect::ir::{names, Block, Func, Item, Module, ValueId};
use ppc_dialect::op::OpKind;
use ppc_dialect::{DType, Diagnostic, Type};
use ppc_runtime::abi;
use ppc_runtime::manifest::{Arg, Manifest, Role};
use residency::Residency;
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// How the generated code computes: as the interpreter does, or as fast as it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// The runtime's tuned GEMM and vectorizable `exp`/`tanh` written in `arith`
    /// (`fast_math.rs`): equal to the interpreter up to rounding (1e-5 normwise in f32).
    Fast,
    /// Matmuls as `linalg.generic` loops in the interpreter's order and libm's `exp`/`tanh`:
    /// slow; bit-identical to the interpreter.
    Exact,
}

/// What the entry function computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `@pipeline`: `output = f(input, params)`.
    Forward,
    /// `@train_vjp` (after `loss` and `autodiff`): `loss, output, grads = f(input, target,
    /// params)`, the gradients in f32, one per parameter.
    Train,
}

impl Entry {
    /// The training step for a module compiled for training (it has `@train_vjp`), else the
    /// forward pass.
    pub fn of(m: &Module) -> Entry {
        if m.func(&names::vjp(names::TRAIN)).is_some() {
            Entry::Train
        } else {
            Entry::Forward
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub numerics: Numerics,
    /// Also emit `main` (calling the runtime's `ppc_main`) for a standalone executable.
    pub executable: bool,
    /// Pipelines side by side (`--replicas`, training only), recorded in the manifest.
    pub replicas: u64,
    /// The CPU the code is compiled for, recorded in the manifest; `None`: this one (the JIT).
    pub target: Option<ppc_runtime::manifest::Target>,
    /// `--target cuda`: the GPU architecture (`sm_90`) the kernels are compiled for; loop nests
    /// are tagged for GPU blocks and threads (`gpu_map.rs`) and buffers shared with the host.
    pub gpu: Option<String>,
}

/// The MLIR module text and the manifest of its entry.
pub struct Lowered {
    pub mlir: String,
    pub manifest: Manifest,
}

/// Name of the entry function.
pub const ENTRY: &str = abi::FORWARD;

/// Lowers a module that went through `gpipe-loop`; its training step ([`Entry::of`]) if it
/// went through `autodiff`.
/// `file` and `source` give locations.
pub fn lower(m: &Module, opts: &Options, file: &str, source: &str) -> Result<Lowered, Diagnostic> {
    if opts.gpu.is_none() {
        return lower_once(m, opts, file, source, None).map(|(l, _)| l);
    }
    // Where the host must wait depends on what the GPU touches anywhere (`residency.rs`).
    let (_, touched) = lower_once(m, opts, file, source, Some(Residency::default()))?;
    let (lowered, again) = lower_once(
        m,
        opts,
        file,
        source,
        Some(Residency::knowing(touched.clone())),
    )?;
    debug_assert_eq!(touched, again, "both passes write the same program");
    Ok(lowered)
}

/// One pass of [`lower`]: the program, and (`--target cuda`) the buffers the GPU touches.
fn lower_once(
    m: &Module,
    opts: &Options,
    file: &str,
    source: &str,
    residency: Option<Residency>,
) -> Result<(Lowered, HashSet<String>), Diagnostic> {
    let entry = Entry::of(m);
    let name = match entry {
        Entry::Forward => names::PIPELINE.to_string(),
        Entry::Train => names::vjp(names::TRAIN),
    };
    let f = m.func(&name).ok_or_else(|| {
        Diagnostic::plain(format!(
            "lower-mlir needs `@{name}`: run `gpipe-loop` (and `loss`, `autodiff` for training) first"
        ))
    })?;
    let lines = Lines::new(source);
    let mut w = Walker {
        m,
        e: Emitter::new(file, &lines).for_gpu(residency),
        numerics: opts.numerics,
        params: Vec::new(),
        param_bufs: HashMap::new(),
        groups: Vec::new(),
        calls: 0,
    };
    // Entry arguments are located at the pipeline block, return and frees at the end.
    let (l, c) = lines.line_col(m.spans.get(&Item::Pipeline).start as usize);
    let loc = format!(" loc(\"{}\":{l}:{c})", escape(file));
    let entry_buf = |name: &str, ty: &Type| Buf {
        name: format!("%{name}"),
        base: format!("%{name}"),
        ty: ty.clone(),
        layout: None,
    };
    // The entry's own arguments: (role, name, buffer); the rest of `f`'s are constants.
    let mut inputs = vec![(
        Role::Input,
        "input",
        entry_buf("input", f.ty(f.body.args[0])),
    )];
    let mut args: Vec<Buf> = vec![inputs[0].2.clone()];
    if entry == Entry::Train {
        // (x, target, d_loss, d_outputs): the loss's cotangent is 1, the outputs' zero.
        let target = entry_buf("target", f.ty(f.body.args[1]));
        args.push(target.clone());
        inputs.push((Role::Target, "target", target));
        w.e.at(m.spans.get(&Item::Pipeline));
        for (&a, v) in f.body.args[2..].iter().zip([1.0, -0.0]) {
            let b = w.e.alloc(f.ty(a));
            let fill = OpKind::Constant {
                value: ppc_dialect::op::Float(v),
            };
            ops::lower(&mut w.e, w.numerics, &fill, &[], &b);
            args.push(b);
        }
    }
    let results = w.func(f, args)?;
    // The results that leave the entry: (role, name, index in `f`'s results).
    let mut outputs: Vec<(Role, String, usize)> = Vec::new();
    match entry {
        Entry::Forward => outputs.push((Role::Output, "output".into(), 0)),
        Entry::Train => {
            outputs.push((Role::Loss, "loss".into(), 0));
            outputs.push((Role::Output, "output".into(), 1));
            // Then the inputs' (and float targets') cotangents, then one per parameter of
            // `@stage`, named as the parameter.
            let stage = m
                .func(names::STAGE)
                .ok_or_else(|| Diagnostic::plain("no `@stage`"))?;
            let first = results.len() - stage.params.len();
            for (i, p) in stage.params.iter().enumerate() {
                outputs.push((Role::Grad, stage.values[p.value].name.clone(), first + i));
            }
        }
    }
    let out_bufs: Vec<Buf> = outputs
        .iter()
        .enumerate()
        .map(|(i, (role, name, r))| {
            let id = match role {
                Role::Grad => format!("grad{i}"),
                _ => name.clone(),
            };
            entry_buf(&id, &results[*r].ty)
        })
        .collect();
    w.e.at(m.spans.get(&Item::Pipeline));
    for ((_, _, r), out) in outputs.iter().zip(&out_bufs) {
        w.e.copy(&results[*r], out);
    }

    let mut args = Vec::new();
    let mut sig = Vec::new();
    for (role, name, buf) in &inputs {
        args.push(arg(*role, name, &buf.ty, None));
        sig.push(format!("{}: {}{loc}", buf.name, buf.mty()));
    }
    for (name, buf, p) in &w.params {
        args.push(arg(Role::Param, name, &buf.ty, Some(p)));
        sig.push(format!("{}: {}{loc}", buf.name, buf.mty()));
    }
    for ((role, name, _), buf) in outputs.iter().zip(&out_bufs) {
        args.push(arg(*role, name, &buf.ty, None));
        sig.push(format!("{}: {}{loc}", buf.name, buf.mty()));
    }
    let p = m.pipeline;
    let manifest = Manifest {
        model: file.to_string(),
        stages: p.stages,
        microbatches: p.microbatches,
        repeats: p.repeats,
        layers: p.layers,
        ranks: p.ranks,
        replicas: opts.replicas,
        flops: model_flops(m),
        target: opts.target.clone(),
        gpu: opts.gpu.clone(),
        args,
        groups: w.groups,
        train: match entry {
            Entry::Train => m.train.clone(),
            Entry::Forward => Vec::new(),
        },
    };

    let mut out = String::new();
    let _ = writeln!(
        out,
        "module attributes {{transform.with_named_sequence}} {{"
    );
    let always = [false, true]
        .map(|masked| abi::matmul(DType::F32, false, masked))
        .into_iter()
        .chain(&abi::TRACE_ITERATION)
        .chain(&abi::TRACE_GROUP);
    for f in always {
        let _ = writeln!(out, "  {}", f.declaration());
    }
    for d in &w.e.declarations {
        let _ = writeln!(out, "  {d}");
    }
    let _ = writeln!(
        out,
        "  func.func @{ENTRY}({}) attributes {{llvm.emit_c_interface}} {{",
        sig.join(", ")
    );
    for l in w.e.allocs.iter().chain(&w.e.body).chain(&w.e.frees) {
        let _ = writeln!(out, "{l}");
    }
    let _ = writeln!(out, "    return{loc}\n  }}{loc}");
    if opts.executable {
        let text = format!("{}\0", manifest.to_text());
        let (manifest_fn, main) = (abi::MANIFEST, abi::MAIN);
        let _ = writeln!(out, "  llvm.mlir.global internal constant @{manifest_fn}_text(\"{}\") {{addr_space = 0 : i32}} : !llvm.array<{} x i8>", escape(&text), text.len());
        let _ = writeln!(out, "  func.func @{manifest_fn}() -> !llvm.ptr {{\n    %p = llvm.mlir.addressof @{manifest_fn}_text : !llvm.ptr\n    return %p : !llvm.ptr\n  }}");
        let _ = writeln!(out, "  func.func private @{main}(i32, !llvm.ptr) -> i32");
        let _ = writeln!(out, "  func.func @main(%argc: i32, %argv: !llvm.ptr) -> i32 {{\n    %r = func.call @{main}(%argc, %argv) : (i32, !llvm.ptr) -> i32\n    return %r : i32\n  }}");
    }
    let touched = match w.e.gpu {
        Some(gpu) => {
            out.push_str(&gpu_map::script(&gpu.tilings));
            gpu.residency.touched
        }
        None => {
            out.push_str(emit::TRANSFORM_SCRIPT);
            HashSet::new()
        }
    };
    out.push_str("}\n");
    Ok((
        Lowered {
            mlir: out,
            manifest,
        },
        touched,
    ))
}

/// LLVM IR of `_mlir__mlir_ciface_ENTRY(void **args)`: the packed entry the runtime calls,
/// forwarding `*args[i]` as argument `i` of the C interface. MLIR's JIT makes it for itself;
/// executables get this one, appended to the module's LLVM IR.
pub fn packed_entry(manifest: &Manifest) -> String {
    let n = manifest.args.len();
    let mut s = format!("\ndefine void @_mlir__mlir_ciface_{ENTRY}(ptr %args) {{\n");
    for i in 0..n {
        let _ = writeln!(s, "  %slot{i} = getelementptr ptr, ptr %args, i64 {i}");
        let _ = writeln!(s, "  %arg{i} = load ptr, ptr %slot{i}");
        let _ = writeln!(s, "  %desc{i} = load ptr, ptr %arg{i}");
    }
    let call: Vec<String> = (0..n).map(|i| format!("ptr %desc{i}")).collect();
    let _ = writeln!(s, "  call void @_mlir_ciface_{ENTRY}({})", call.join(", "));
    s.push_str("  ret void\n}\n");
    s
}

/// The type of `v`'s buffer: its stage's slice inside a stage-parallel loop, its entry's
/// inside a loop over a batched chain's entries.
fn value_type(e: &Emitter, f: &Func, v: ValueId) -> Type {
    if e.in_stage_split() {
        stage_split::slice_type(f.ty(v))
    } else {
        e.entry_type(f.ty(v))
    }
}

fn arg(role: Role, name: &str, ty: &Type, p: Option<&ppc_dialect::ir::Param>) -> Arg {
    Arg {
        role,
        name: name.to_string(),
        dtype: ty.dtype,
        shape: ty.shape_usize(),
        init: p.map_or(ppc_runtime::Init::Zeros, |p| p.init),
        layer_axes: p.map_or(0, |p| p.layer_axes),
        shard_axis: ty.axis(ppc_dialect::Axis::RankStages),
    }
}

/// Useful floating-point work of one forward step: the matmuls of every layer on every
/// microbatch, as the sequential model does them (no bubbles).
fn model_flops(m: &Module) -> u64 {
    let Some(layer) = m.func(names::LAYER) else {
        return 0;
    };
    let per_layer: u64 = layer
        .ops
        .iter()
        .filter_map(|(_, op)| match &op.kind {
            OpKind::MatMul { lhs, .. } => {
                let out = layer.ty(op.results[0]);
                let k = layer.ty(*lhs).dims.last().map_or(0, |d| d.size);
                Some(2 * out.elements() * k)
            }
            _ => None,
        })
        .sum();
    per_layer * m.pipeline.layers * m.pipeline.microbatches
}

/// A chain's loop over entries being written (`batch_split.rs`): its trace span, the buffers of
/// the values it slices (to restore), and its outputs' whole buffers.
struct OpenChain {
    group: Option<usize>,
    saved: Vec<(ValueId, Option<Buf>)>,
    wholes: Vec<(ValueId, Buf)>,
}

/// Walks functions, inlining calls; values map to buffers.
struct Walker<'m, 'a> {
    m: &'m Module,
    e: Emitter<'a>,
    numerics: Numerics,
    /// Entry arguments for parameters, in first-use order: (name, buffer, param).
    params: Vec<(String, Buf, ppc_dialect::ir::Param)>,
    param_bufs: HashMap<(String, String), Buf>,
    /// Names of the loop nests marked for `--trace`, in the order of their numbers.
    groups: Vec<String>,
    /// Calls being emitted around what is written now.
    calls: usize,
}

impl Walker<'_, '_> {
    /// Emits `f`'s body with `args` bound; returns its result buffers.
    fn func(&mut self, f: &Func, args: Vec<Buf>) -> Result<Vec<Buf>, Diagnostic> {
        self.func_into(f, args, &HashMap::new())
    }

    /// As [`Walker::func`], with results computed by adding into the given buffers (by result
    /// index; `accumulate.rs`).
    fn func_into(
        &mut self,
        f: &Func,
        args: Vec<Buf>,
        add_into: &HashMap<usize, Buf>,
    ) -> Result<Vec<Buf>, Diagnostic> {
        let mut env: HashMap<ValueId, Buf> = f.body.args.iter().copied().zip(args).collect();
        for p in &f.params {
            // Keyed by name and type: `@stage` and `@stage_vjp` declare the same weights.
            let key = (f.values[p.value].name.clone(), f.ty(p.value).to_string());
            let buf = match self.param_bufs.get(&key) {
                Some(b) => b.clone(),
                None => {
                    let name = f.values[p.value].name.clone();
                    let name_of = format!("%p{}", self.params.len());
                    let b = Buf {
                        base: name_of.clone(),
                        name: name_of,
                        ty: f.ty(p.value).clone(),
                        layout: None,
                    };
                    let unique = if self.params.iter().any(|(n, _, _)| *n == name) {
                        format!("{}.{name}", f.name)
                    } else {
                        name
                    };
                    self.params.push((unique, b.clone(), p.clone()));
                    self.param_bufs.insert(key, b.clone());
                    b
                }
            };
            let buf = self.e.stage_slice(&buf, f.ty(p.value));
            env.insert(p.value, buf);
        }
        let add_into: HashMap<ValueId, Buf> = add_into
            .iter()
            .map(|(&i, b)| (f.body.results[i], b.clone()))
            .collect();
        self.block_into(f, &f.body, &mut env, &HashMap::new(), &add_into)?;
        Ok(f.body.results.iter().map(|v| env[v].clone()).collect())
    }

    /// Emits `block`'s ops. `into` gives the values computed straight into a loop's carried
    /// buffer (`in_place.rs`) and that buffer.
    fn block(
        &mut self,
        f: &Func,
        block: &Block,
        env: &mut HashMap<ValueId, Buf>,
        into: &HashMap<ValueId, Buf>,
    ) -> Result<(), Diagnostic> {
        self.block_into(f, block, env, into, &HashMap::new())
    }

    /// As [`Walker::block`]; the matmuls of `add_into` add into the given buffers.
    fn block_into(
        &mut self,
        f: &Func,
        block: &Block,
        env: &mut HashMap<ValueId, Buf>,
        into: &HashMap<ValueId, Buf>,
        add_into: &HashMap<ValueId, Buf>,
    ) -> Result<(), Diagnostic> {
        let deferred = fuse::deferred(f, block);
        // Whether `v` goes into a buffer given from outside: a carried one or a chain output's.
        let placed = |slices: &HashMap<ValueId, Buf>, v: ValueId| {
            into.contains_key(&v) || slices.contains_key(&v)
        };
        // Where a value is computed: a loop's carried buffer (`into`), its entry of a chain's
        // output (`slices`), or a new buffer.
        let output = |e: &mut Emitter, slices: &HashMap<ValueId, Buf>, v: ValueId| {
            into.get(&v)
                .or_else(|| slices.get(&v))
                .cloned()
                .unwrap_or_else(|| e.alloc(&value_type(e, f, v)))
        };
        // Adds into accumulators that GEMMs do (fast numerics only: another order of sums) and
        // that stage-parallel calls do where each stage ends (the same sums).
        let gemm_accumulations = match self.numerics {
            Numerics::Fast => accumulate::find(self.m, f, block, &deferred, accumulate::Fold::Gemm),
            Numerics::Exact => Vec::new(),
        };
        let stage_accumulations =
            accumulate::find(self.m, f, block, &deferred, accumulate::Fold::StageEnd);
        // Adds already done by the GEMM of the call before them, and updates done by the
        // select after them.
        let mut folded: HashSet<ppc_dialect::ir::OpId> = HashSet::new();
        let guarded = in_place::guarded_updates(f, block);
        folded.extend(guarded.values());
        let unread = in_place::unread_inits(f, block);
        // The GPipe loops of this block written so far (`--trace` spans).
        let mut gpipe_loops = 0;
        let chains = if self.numerics == Numerics::Fast
            && self.e.gpu.is_none()
            && !self.e.in_parallel_loop()
        {
            let excluded = guarded.keys().chain(guarded.values()).copied().collect();
            let carried = into.keys().chain(add_into.keys()).copied().collect();
            batch_split::find(f, block, &deferred, &excluded, &carried)
        } else {
            Vec::new()
        };
        let strided = batch_split::matmul_operands(f, block, &chains);
        let mut slices: HashMap<ValueId, Buf> = HashMap::new();
        let mut open: Option<OpenChain> = None;
        // Values whose buffers this block allocated for them (no view, no caller's buffer),
        // and the one op that reads each value read once: elementwise ops write over those.
        // (A list, in the order they were made: which one an op writes over must not depend on
        // a hash order, or the same model would compile to different code from run to run.)
        let mut fresh: Vec<ValueId> = Vec::new();
        let sole_readers = match self.e.gpu {
            None => fuse::sole_readers(f, block, &deferred),
            Some(_) => HashMap::new(),
        };
        for step in batch_split::schedule(block, &chains) {
            let id = match step {
                batch_split::Step::Begin(c) => {
                    let wholes = chains[c]
                        .outputs
                        .iter()
                        .map(|&v| (v, output(&mut self.e, &slices, v)))
                        .collect();
                    open = Some(self.begin_chain(f, &chains[c], wholes, env, &mut slices));
                    continue;
                }
                batch_split::Step::End(c) => {
                    let chain = open.take().expect("invariant: Begin comes before End");
                    self.end_chain(&chains[c], chain, env, &mut slices);
                    continue;
                }
                batch_split::Step::Op(id) => id,
            };
            let op = &f.ops[id];
            if op.results.first().is_some_and(|v| deferred.contains(v)) || folded.contains(&id) {
                continue; // computed inside its consumer's loop nest, or by a GEMM
            }
            self.e.at(f.op_spans.get(&id));
            // Deferred values have no buffer; only elementwise ops, which fuse them, read them.
            let ins: Vec<Buf> = if op.kind.is_elementwise() {
                Vec::new()
            } else {
                op.kind.operands().iter().map(|v| env[v].clone()).collect()
            };
            match &op.kind {
                OpKind::Reshape { .. } => {
                    let ty = value_type(&self.e, f, op.results[0]);
                    let view = views::reshape(&mut self.e, &ins[0], &ty);
                    env.insert(op.results[0], view);
                }
                OpKind::Transpose { perm, .. }
                    if views::swaps_last_two(perm) || strided.contains(&op.results[0]) =>
                {
                    let ty = value_type(&self.e, f, op.results[0]);
                    let view = views::transpose(&mut self.e, &ins[0], perm, &ty);
                    env.insert(op.results[0], view);
                }
                OpKind::Update { x, index, axis, .. } if views::uniform(f, *index).is_some() => {
                    // The same position for every stage: the slice is a view; only it is
                    // written, after a copy of `x` unless `x` is the output buffer itself (a
                    // carried accumulator updated in place).
                    let scalar = views::uniform(f, *index).expect("checked by the guard");
                    let out = output(&mut self.e, &slices, op.results[0]);
                    let group = self.begin_group(f, id, "update".to_string());
                    if env[x].name != out.name {
                        self.e.copy(&env[x], &out);
                    }
                    let slice = views::index(&mut self.e, &out, &env[&scalar], *axis);
                    self.e.copy(&ins[1], &slice);
                    self.end_group(group);
                    env.insert(op.results[0], out);
                }
                OpKind::Select { cond, on_false, .. } if guarded.contains_key(&id) => {
                    // `select(c, update(x, u, i), x)`: `x` with slice `i` written if `c`.
                    let OpKind::Update {
                        update,
                        index,
                        axis,
                        ..
                    } = &f.ops[guarded[&id]].kind
                    else {
                        unreachable!("invariant: guarded_updates pairs selects with updates")
                    };
                    let scalar = views::uniform(f, *index).expect("checked by guarded_updates");
                    let out = output(&mut self.e, &slices, op.results[0]);
                    let group = self.begin_group(f, id, "update".to_string());
                    if env[on_false].name != out.name {
                        self.e.copy(&env[on_false], &out);
                    }
                    self.e.begin_if(&env[cond]);
                    let slice = views::index(&mut self.e, &out, &env[&scalar], *axis);
                    self.e.copy(&env[update], &slice);
                    self.e.end_if();
                    self.end_group(group);
                    env.insert(op.results[0], out);
                }
                OpKind::Index { x, index, axis } if views::uniform(f, *index).is_some() => {
                    // The same position for every stage (a stage's layer loop picking its
                    // layer's weights): a view of the stacked weights, no copy.
                    let scalar = views::uniform(f, *index).expect("checked by the guard");
                    let view = views::index(&mut self.e, &env[x], &env[&scalar], *axis);
                    env.insert(op.results[0], view);
                }
                OpKind::Call { callee, .. } => {
                    let g = &self.m.funcs[*callee];
                    let gemm_adds = gemm_accumulations.iter().any(|a| a.call == id);
                    let split = match (&self.e.gpu, self.e.in_parallel_loop()) {
                        (None, false) if !gemm_adds => stage_split::stages(self.m, g),
                        _ => None,
                    };
                    // The adds this call's results fold into: into the accumulator's own
                    // buffer, or a fresh one holding a copy of it.
                    let accumulations = match split {
                        Some(_) => &stage_accumulations,
                        None => &gemm_accumulations,
                    };
                    let mut adds = HashMap::new();
                    for a in accumulations.iter().filter(|a| a.call == id) {
                        let sum = f.ops[a.add].results[0];
                        let acc = env[&a.acc].clone();
                        let out = match into.get(&sum) {
                            Some(b) if b.name != acc.name => continue,
                            Some(b) => b.clone(),
                            None => {
                                let b = self.e.alloc(&value_type(&self.e, f, sum));
                                self.e.copy(&acc, &b);
                                b
                            }
                        };
                        adds.insert(a.result, (a.add, out));
                    }
                    let add_into = adds.iter().map(|(&i, (_, b))| (i, b.clone())).collect();
                    // The calls the pipeline's loops make (a stage's body) are functions of
                    // their own on the CPU; the calls inside them are inlined.
                    let outline = self.calls == 0 && self.e.gpu.is_none();
                    if outline {
                        self.e.begin_outlined();
                    }
                    self.calls += 1;
                    let outs = match split {
                        Some(stages) => {
                            let read: Vec<bool> =
                                op.results.iter().map(|&r| f.uses(&f.body, r) > 0).collect();
                            self.split_call(g, ins, &read, &add_into, stages)?
                        }
                        None => self.func_into(g, ins, &add_into)?,
                    };
                    self.calls -= 1;
                    // The results are buffers allocated at function entry (a stage's layer
                    // loop's carried values, a split call's wholes), so code after the region
                    // can name them; MLIR's verifier would reject a view made inside it.
                    if outline {
                        self.e.end_outlined();
                    }
                    env.extend(op.results.iter().copied().zip(outs));
                    for (add, out) in adds.into_values() {
                        env.insert(f.ops[add].results[0], out);
                        folded.insert(add);
                    }
                }
                OpKind::MatMul { .. } if add_into.contains_key(&op.results[0]) => {
                    let acc = add_into[&op.results[0]].clone();
                    ops::matmul_into(&mut self.e, &ins[0], &ins[1], ins.get(2), &acc);
                    env.insert(op.results[0], acc);
                }
                OpKind::Constant { .. } if unread.contains(&op.results[0]) => {
                    let out = output(&mut self.e, &slices, op.results[0]);
                    env.insert(op.results[0], out);
                }
                OpKind::Loop { trips, body, .. } => {
                    let carried: Vec<Buf> = ins.iter().map(|b| self.e.alloc(&b.ty)).collect();
                    let overwritten = in_place::overwritten(f, body, *trips);
                    for (j, (src, dst)) in ins.iter().zip(&carried).enumerate() {
                        if !overwritten.contains(&j) {
                            self.e.copy(src, dst);
                        }
                    }
                    let t = self.e.alloc(&f.ty(body.args[0]).clone());
                    let iv = self.e.begin_host_loop(*trips);
                    let ti = self
                        .e
                        .let_(&format!("arith.index_cast {iv} : index to i32"));
                    self.e.host_writes(&t);
                    self.e
                        .op(&format!("memref.store {ti}, {}[] : {}", t.name, t.mty()));
                    // The GPipe loop's iterations are spans of `--trace` (a flag test when
                    // tracing is off); a stage's loop over its layers is not. The training
                    // step runs the forward loop, then the backward loop, which takes forward
                    // iteration `trips - 1 - t` back at its iteration `t` and is numbered so.
                    let gpipe = f.name == names::PIPELINE
                        || (f.name == names::vjp(names::TRAIN) && std::ptr::eq(block, &f.body));
                    let span = match (gpipe, gpipe_loops) {
                        (false, _) => None,
                        (true, 0) => Some((&abi::TRACE_ITERATION, ti.clone())),
                        (true, _) => {
                            for f in &abi::TRACE_BACKWARD {
                                self.e.declare(f);
                            }
                            let last = self.e.constant((*trips - 1) as f64, "i32");
                            let reversed = self.e.let_(&format!("arith.subi {last}, {ti} : i32"));
                            Some((&abi::TRACE_BACKWARD, reversed))
                        }
                    };
                    gpipe_loops += usize::from(gpipe);
                    let trace = |e: &mut Emitter, end: usize| {
                        if let Some((calls, index)) = &span {
                            e.op(&calls[end].call(&[index]));
                        }
                    };
                    trace(&mut self.e, 0);
                    env.insert(body.args[0], t);
                    env.extend(body.args[1..].iter().copied().zip(carried.iter().cloned()));
                    let into = in_place::plan(f, body)
                        .into_iter()
                        .map(|(v, j)| (v, carried[j].clone()))
                        .collect();
                    self.block(f, body, env, &into)?;
                    self.e.at(f.op_spans.get(&id));
                    let yields: Vec<Buf> = body.results.iter().map(|v| env[v].clone()).collect();
                    self.carry(&yields, &carried);
                    trace(&mut self.e, 1);
                    self.e.end_host_loop();
                    env.extend(op.results.iter().copied().zip(carried));
                }
                kind if kind.is_elementwise() => {
                    // Over a buffer of this block that only this op reads, if one has its
                    // type (a GELU over its matmul's result); else where `output` says.
                    let result = op.results[0];
                    let own = !placed(&slices, result);
                    let dying = own
                        .then(|| {
                            let ty = value_type(&self.e, f, result);
                            fresh
                                .iter()
                                .copied()
                                .find(|w| sole_readers.get(w) == Some(&id) && env[w].ty == ty)
                        })
                        .flatten();
                    let out = match dying {
                        Some(w) => env[&w].clone(),
                        None => output(&mut self.e, &slices, result),
                    };
                    let scope = fuse::Scope {
                        f,
                        block,
                        env,
                        deferred: &deferred,
                    };
                    let name = fuse::ops_of(&scope, id).join("+");
                    let group = self.begin_group(f, id, name);
                    fuse::emit(&mut self.e, self.numerics, &scope, id, &out);
                    self.end_group(group);
                    if let Some(w) = dying {
                        fresh.retain(|&v| v != w);
                    }
                    if own {
                        fresh.push(result);
                    }
                    env.insert(result, out);
                }
                kind => {
                    let out = output(&mut self.e, &slices, op.results[0]);
                    if !placed(&slices, op.results[0]) {
                        fresh.push(op.results[0]);
                    }
                    // GEMMs have spans of their own, from the runtime.
                    let group = (!matches!(kind, OpKind::MatMul { .. }))
                        .then(|| self.begin_group(f, id, kind.name().to_string()))
                        .flatten();
                    ops::lower(&mut self.e, self.numerics, kind, &ins, &out);
                    self.end_group(group);
                    env.insert(op.results[0], out);
                }
            }
        }
        Ok(())
    }

    /// Emits a call of `g` as one parallel loop over its `stages` (`stage_split.rs`); returns
    /// the whole result buffers. `read[i]`: whether the caller reads result `i`; results in
    /// `add_into` (by index) are added into the given buffer, stage by stage.
    fn split_call(
        &mut self,
        g: &Func,
        args: Vec<Buf>,
        read: &[bool],
        add_into: &HashMap<usize, Buf>,
        stages: u64,
    ) -> Result<Vec<Buf>, Diagnostic> {
        let results: Vec<Buf> = g
            .body
            .results
            .iter()
            .enumerate()
            .map(|(i, &r)| match add_into.get(&i) {
                Some(acc) => acc.clone(),
                None => self.e.alloc(g.ty(r)),
            })
            .collect();
        self.e.begin_stage_split(stages);
        let args: Vec<Buf> = args
            .iter()
            .zip(&g.body.args)
            .map(|(a, &v)| self.e.stage_slice(a, g.ty(v)))
            .collect();
        // A bubble stage of a callee whose every result it masks skips the body; an
        // accumulator is then left as it is, which needs its result's constant to be -0.0
        // (the additive identity: `acc + -0.0` is `acc`, bit for bit).
        let minus_zero = |c: &Option<ppc_dialect::op::Float>| {
            c.is_none_or(|c| c.0.to_bits() == (-0.0f64).to_bits())
        };
        let masked = stage_split::masked_results(g, read)
            .filter(|(_, fills)| add_into.keys().all(|&i| minus_zero(&fills[i])));
        if let Some((at, _)) = &masked {
            let (mask, zero) = (&args[*at], self.e.index(0));
            let active = self.e.let_(&format!(
                "memref.load {}[{zero}] : {}",
                mask.name,
                mask.mty()
            ));
            self.e.open(&format!("scf.if {active} {{"));
        }
        let outs = self.func(g, args)?;
        for (i, ((out, whole), &v)) in outs.iter().zip(&results).zip(&g.body.results).enumerate() {
            let slot = self.e.stage_slice(whole, g.ty(v));
            if add_into.contains_key(&i) {
                self.e.add_to(&slot, out);
            } else {
                self.e.copy(out, &slot);
            }
        }
        if let Some((_, fills)) = masked {
            self.e.begin_else();
            let kept = results.iter().zip(&g.body.results).zip(fills).enumerate();
            for (_, ((whole, &v), value)) in kept.filter(|(i, _)| !add_into.contains_key(i)) {
                let Some(value) = value else { continue };
                let slot = self.e.stage_slice(whole, g.ty(v));
                let fill = OpKind::Constant { value };
                ops::lower(&mut self.e, self.numerics, &fill, &[], &slot);
            }
            self.e.end_bubble_if();
        }
        self.e.end_stage_split();
        Ok(results)
    }

    /// Opens `chain`'s loop over its entries (`batch_split.rs`): the values it reads along its
    /// leading axes become their entry's slices in `env`, its outputs (`wholes`: their whole
    /// buffers) their entry's in `slices`, and a bubble stage's entries skip it.
    fn begin_chain(
        &mut self,
        f: &Func,
        chain: &batch_split::Chain,
        wholes: Vec<(ValueId, Buf)>,
        env: &mut HashMap<ValueId, Buf>,
        slices: &mut HashMap<ValueId, Buf>,
    ) -> OpenChain {
        self.e.at(f.op_spans.get(&chain.ops[0]));
        let names: Vec<&str> = chain.ops.iter().map(|&o| f.ops[o].kind.name()).collect();
        let group = self.begin_group(f, chain.ops[0], names.join("+"));
        let ivs = self.e.begin_entries(&chain.prefix, &chain.tile);
        let mut saved = Vec::new();
        for &v in &chain.sliced {
            let entry = self.entry(&env[&v], f.ty(v), &ivs, &chain.tile);
            saved.push((v, env.insert(v, entry)));
        }
        for (v, whole) in &wholes {
            let entry = self.entry(whole, f.ty(*v), &ivs, &chain.tile);
            slices.insert(*v, entry);
        }
        if let Some((mask, at)) = chain.mask {
            let entry = self.e.slot(&env[&mask], &ivs[at], 0, true);
            if chain.skip_bubbles {
                let zero = self.e.index(0);
                let active = self.e.let_(&format!(
                    "memref.load {}[{zero}] : {}",
                    entry.name,
                    entry.mty()
                ));
                self.e.open(&format!("scf.if {active} {{"));
            }
            saved.push((mask, env.insert(mask, entry)));
        }
        OpenChain {
            group,
            saved,
            wholes,
        }
    }

    /// Closes `chain`'s loop: a bubble stage's entries get what the masked GEMM writes (-0.0),
    /// and `env` the whole buffers again.
    fn end_chain(
        &mut self,
        chain: &batch_split::Chain,
        open: OpenChain,
        env: &mut HashMap<ValueId, Buf>,
        slices: &mut HashMap<ValueId, Buf>,
    ) {
        if chain.skip_bubbles {
            self.e.begin_else();
            for (v, _) in &open.wholes {
                let zero = self.e.constant(-0.0, emit::elt(slices[v].ty.dtype));
                self.e.fill(&zero, &slices[v]);
            }
            self.e.end_bubble_if();
        }
        self.e.end_entries();
        for (v, before) in open.saved {
            if let Some(b) = before {
                env.insert(v, b);
            }
        }
        for (v, whole) in open.wholes {
            slices.remove(&v);
            env.insert(v, whole);
        }
        self.end_group(open.group);
    }

    /// The entry at `ivs` (indices of the leading axes) of buffer `b` of a value of type `ty`,
    /// `tile` elements along each: axes of size 1 (broadcast) at 0, every leading axis kept.
    fn entry(&mut self, b: &Buf, ty: &Type, ivs: &[String], tile: &[u64]) -> Buf {
        let at = ivs
            .iter()
            .zip(tile)
            .enumerate()
            .map(|(axis, (iv, &size))| match ty.dims[axis].size {
                1 => (axis, self.e.index(0), 1),
                _ => (axis, iv.clone(), size),
            })
            .collect::<Vec<_>>();
        self.e.blocks(b, &at, true)
    }

    /// Starts the `--trace` span of the loop nests op `id` of `f` lowers to, named `name` and
    /// its model line; returns its number. `None` inside a chain's loop over entries: the chain
    /// has one span of its own.
    fn begin_group(&mut self, f: &Func, id: ppc_dialect::ir::OpId, name: String) -> Option<usize> {
        if self.e.in_entries() {
            return None;
        }
        let (line, _) = self.e.lines.line_col(f.op_spans.get(&id).start as usize);
        let n = self.groups.len();
        self.groups.push(format!("{name}, line {line}"));
        let c = self.e.constant(n as f64, "i32");
        self.e.op(&abi::TRACE_GROUP[0].call(&[&c]));
        Some(n)
    }

    fn end_group(&mut self, n: Option<usize>) {
        let Some(n) = n else {
            return;
        };
        let c = self.e.constant(n as f64, "i32");
        self.e.op(&abi::TRACE_GROUP[1].call(&[&c]));
    }

    /// Copies the yielded values into the carried buffers for the next iteration. A yield that
    /// is itself another carried buffer goes through a scratch copy first.
    fn carry(&mut self, yields: &[Buf], carried: &[Buf]) {
        let staged: Vec<Buf> = yields
            .iter()
            .enumerate()
            .map(|(i, y)| {
                if carried
                    .iter()
                    .enumerate()
                    .any(|(j, c)| j != i && c.name == y.name)
                {
                    let s = self.e.alloc(&y.ty);
                    self.e.copy(y, &s);
                    s
                } else {
                    y.clone()
                }
            })
            .collect();
        for (y, c) in staged.iter().zip(carried) {
            if y.name != c.name {
                self.e.copy(y, c);
            }
        }
    }
}
