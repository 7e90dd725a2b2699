//! `lower-mlir`: the pipelined program `@pipeline` becomes an MLIR module (func, arith, math,
//! memref, linalg, scf), with its manifest. The only code that uses melior is `mlir.rs`.
//!
//! Preconditions: `gpipe-loop` has run. Postconditions: one entry
//! `@ppc_forward(inputs, params..., output)` with `llvm.emit_c_interface` (for a module compiled
//! for training, [`Entry::Train`]: `(inputs, targets, params..., loss, output, grads...)`,
//! lowered from `@train_vjp`; a training step for the CPU also has
//! `@ppc_evaluate(inputs, targets, params..., loss, output)`, from `@train`), every value in a
//! statically shaped buffer or a view of one (`views.rs`), chains of elementwise ops fused into
//! one `linalg.generic` (`fuse.rs`), big loop nests marked for the module's transform script to
//! make parallel (`emit.rs`), calls inlined (so `@stage`'s weights become entry arguments;
//! the calls the pipeline's loops make, a stage's body, then become functions of their own
//! again, `@ppc_stage…`, by the transform script's `loop.outline`, not inlined by LLVM) and,
//! where a stage's values are too small for a parallel loop nest each, run as one parallel loop
//! over the stages (`stage_split.rs`; in the training step's backward, bubble stages skip it and
//! each stage adds its weight gradients into the accumulators, `accumulate.rs`; inside a call
//! made only for an active stage its masking selects are their operands' buffers, `plan.rs`'s
//! `Decision::Alias`; a `call_if` adds its results into accumulators inside its test), chains of
//! batched matmuls and what lies between them
//! (attention, a decoder's MLP) as one parallel loop over their batch entries
//! (`batch_split.rs`), reductions along the innermost axis as register loops
//! (`row_reduce.rs`; on the GPU a block of threads per row, `gpu_reduce.rs`, which makes a
//! softmax or a layernorm one kernel, `gpu_norm.rs`), loops
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
pub mod buf;
mod destinations;
pub mod emit;
mod emit_gpu;
mod emit_loops;
mod entry;
mod fast_math;
mod fuse;
pub mod gpu_map;
mod gpu_norm;
mod gpu_reduce;
mod grad_squares;
mod idle_keep;
mod in_place;
mod init_array;
pub mod machine;
mod matmul;
pub mod mlir;
mod nest;
mod ops;
mod parallel_write;
mod params;
pub mod partition;
mod plan;
pub mod residency;
mod reuse;
mod row_blocks;
mod row_reduce;
mod slabs;
mod stage_split;
mod summed_matmul;
mod text;
mod update;
mod views;
mod walk;
mod widen;

use emit::{Emitter, Written};
pub use entry::Entry;
pub use fast_math::Numerics;
use ppc_dialect::ir::{Item, Module};
use ppc_dialect::{DType, Diagnostic};
use ppc_runtime::abi;
use ppc_runtime::gpu_update;
use ppc_runtime::manifest::Manifest;
use ppc_runtime::optim::Kind;
use std::fmt::Write;
use text::{escape, Lines};
use walk::Walker;

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
    /// With `gpu`: the kernels will run as CPU loops (tests), so kernels written as a
    /// `gpu.launch` are written as the loops that compute the same (`row_blocks.rs`).
    pub gpu_kernels_on_cpu: bool,
}

/// The MLIR module text and the manifest of its entry.
pub struct Lowered {
    pub mlir: String,
    pub manifest: Manifest,
}

/// Lowers a module that went through `gpipe-loop`; its training step ([`Entry::of`]) if it
/// went through `autodiff`, and then on the CPU also the step without its gradients ([`Entry::Evaluate`], `@ppc_evaluate`).
/// `file` and `source` give locations.
pub fn lower(m: &Module, opts: &Options, file: &str, source: &str) -> Result<Lowered, Diagnostic> {
    let entry = Entry::of(m);
    let lines = Lines::new(source);
    // Traced loop nests are numbered across the entries, which share one list of names.
    let mut groups = Vec::new();
    let main = entry_function(m, opts, entry, file, &lines, &mut groups)?;
    // Not for the GPU yet: there the synthetic task is labelled by the training step.
    let evaluate = match entry == Entry::Train && opts.gpu.is_none() {
        true => Some(entry_function(
            m,
            opts,
            Entry::Evaluate,
            file,
            &lines,
            &mut groups,
        )?),
        false => None,
    };
    let p = m.pipeline;
    let manifest = Manifest {
        model: file.to_string(),
        stages: p.stages,
        microbatches: p.microbatches,
        repeats: p.repeats,
        layers: p.layers,
        ranks: p.ranks,
        replicas: opts.replicas,
        flops: m.flops(),
        // Each tick of 1F1B's parity order offers every stage a forward and a backward, of
        // which it takes one; the interleaved order's ticks (`repeats` > 1) have a slot for each.
        calls_per_slot: if main.ticks && p.repeats == 1 { 2 } else { 1 },
        target: opts.target.clone(),
        gpu: opts.gpu.clone(),
        args: main.manifest_args(),
        evaluate: evaluate
            .as_ref()
            .map_or(Vec::new(), Function::manifest_args),
        flush_to_zero: opts.numerics == Numerics::Fast && opts.gpu.is_none(),
        groups,
        kernels: Vec::new(),
        train: match entry {
            Entry::Train => m.train.clone(),
            Entry::Forward | Entry::Evaluate => Vec::new(),
        },
        cross_entropy: entry == Entry::Train
            && m.loss_or_default() == ppc_dialect::ir::Loss::SoftmaxCrossEntropy,
        ignore_index: m.ignore_index.filter(|_| entry == Entry::Train),
        dims: m.dims.iter().map(|d| (d.name.clone(), d.value)).collect(),
    };
    // Entry arguments are located at the pipeline block, return and frees at the end.
    let (l, c) = lines.line_col(m.spans.get(&Item::Pipeline).start as usize);
    let loc = format!(" loc(\"{}\":{l}:{c})", escape(file));
    let updates = match gpu_update::built(&manifest) {
        true => update_functions(m, opts, &manifest, file, &lines),
        false => Vec::new(),
    };
    let functions: Vec<(&str, &Function)> = [
        (abi::FORWARD, Some(&main)),
        (abi::EVALUATE, evaluate.as_ref()),
    ]
    .into_iter()
    .filter_map(|(name, f)| Some((name, f?)))
    .chain(updates.iter().map(|(name, f)| (*name, f)))
    .collect();
    let mut out = module_text(&functions, &loc, opts.executable);
    match &main.written.tilings {
        Some(tilings) => out.push_str(&gpu_map::script(tilings)),
        None => out.push_str(emit::TRANSFORM_SCRIPT),
    }
    out.push_str("}\n");
    Ok(Lowered {
        mlir: out,
        manifest,
    })
}

/// One entry function as written, with its arguments.
struct Function {
    written: Written,
    args: Vec<entry::Argument>,
    /// Whether it runs 1F1B's loop over ticks.
    ticks: bool,
}

impl Function {
    fn manifest_args(&self) -> Vec<ppc_runtime::manifest::Arg> {
        self.args.iter().map(entry::Argument::manifest).collect()
    }
}

/// A CUDA training step's optimizer entries, named: AdamW's and SGD's update (`update.rs`), the
/// gradients' sums of squares (`grad_squares.rs`).
fn update_functions(
    m: &Module,
    opts: &Options,
    manifest: &Manifest,
    file: &str,
    lines: &Lines,
) -> Vec<(&'static str, Function)> {
    let emitter = || {
        let mut e = Emitter::new(file, lines).for_gpu(opts.gpu_kernels_on_cpu);
        e.at(m.spans.get(&Item::Pipeline));
        e
    };
    let function = |(written, args)| Function {
        written,
        args,
        ticks: false,
    };
    let updates = [
        (gpu_update::ADAMW, Kind::AdamW),
        (gpu_update::SGD, Kind::Sgd),
    ]
    .map(|(name, kind)| (name, function(update::write(manifest, kind, emitter()))));
    let squares = (
        gpu_update::SQUARES,
        function(grad_squares::write(manifest, emitter())),
    );
    updates.into_iter().chain([squares]).collect()
}

/// Writes the entry function that runs `entry`'s function of `m`, numbering its traced loop
/// nests after those of `groups`, to which it adds their names.
fn entry_function(
    m: &Module,
    opts: &Options,
    entry: Entry,
    file: &str,
    lines: &Lines,
    groups: &mut Vec<String>,
) -> Result<Function, Diagnostic> {
    let name = entry.func(m);
    let id = m.func_id(&name).ok_or_else(|| {
        Diagnostic::plain(format!(
            "lower-mlir needs `@{name}`: run `gpipe-loop` (and `loss`, `autodiff` for training) first"
        ))
    })?;
    let f = &m.funcs[id];
    let mut e = Emitter::new(file, lines);
    if opts.gpu.is_some() {
        e = e.for_gpu(opts.gpu_kernels_on_cpu);
    }
    e.share_buffers = entry == Entry::Train;
    let mut w = Walker {
        m,
        entry: f,
        e,
        numerics: opts.numerics,
        params: params::Params::of(m, id)?,
        bound: Vec::new(),
        groups: std::mem::take(groups),
        calls: 0,
        true_masks: Default::default(),
    };
    let args = entry::write(&mut w, id, entry)?;
    *groups = std::mem::take(&mut w.groups);
    Ok(Function {
        written: w.e.finish(),
        args,
        ticks: f.tick_loop().is_some(),
    })
}

/// The module up to its transform script: runtime declarations, the entry functions (each
/// with its name, signature and the emitter's body) and for an executable `main`.
fn module_text(functions: &[(&str, &Function)], loc: &str, executable: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "module attributes {{transform.with_named_sequence}} {{"
    );
    let always = [false, true]
        .map(|masked| abi::matmul(DType::F32, false, masked))
        .into_iter()
        .chain(&abi::TRACE_ITERATION)
        .chain(&abi::TRACE_GROUP)
        .map(|f| f.declaration());
    let declared: std::collections::BTreeSet<String> = functions
        .iter()
        .flat_map(|(_, f)| f.written.declarations.iter().cloned())
        .collect();
    for d in always.chain(declared) {
        let _ = writeln!(out, "  {d}");
    }
    for (name, f) in functions {
        let sig: Vec<String> = f
            .args
            .iter()
            .map(|a| format!("{}: {}{loc}", a.buf.name, a.buf.mty()))
            .collect();
        let _ = writeln!(
            out,
            "  func.func @{name}({}) attributes {{llvm.emit_c_interface}} {{",
            sig.join(", ")
        );
        let w = &f.written;
        for l in w.allocs.iter().chain(&w.body).chain(&w.frees) {
            let _ = writeln!(out, "{l}");
        }
        let _ = writeln!(out, "    return{loc}\n  }}{loc}");
    }
    if executable {
        let main = abi::MAIN;
        let _ = writeln!(out, "  func.func private @{main}(i32, !llvm.ptr) -> i32");
        let _ = writeln!(out, "  func.func @main(%argc: i32, %argv: !llvm.ptr) -> i32 {{\n    %r = func.call @{main}(%argc, %argv) : (i32, !llvm.ptr) -> i32\n    return %r : i32\n  }}");
    }
    out
}

/// An LLVM IR module linked into an executable's, once the MLIR pipelines ran (they may add to
/// the manifest: `kernels`): the embedded manifest, `ppc_manifest()` returning it, and
/// `_mlir__mlir_ciface_ppc_forward(void **args)`, the packed entry the runtime calls,
/// forwarding `*args[i]` as argument `i` of the C interface (MLIR's JIT makes that one for
/// itself); the same for `ppc_evaluate` and a CUDA training step's optimizer entries
/// (`ppc_update_adamw`, `ppc_update_sgd`, `ppc_grad_squares`), which every executable defines, as its runtime
/// names them, but which trap where the program has no such entry (it was not built).
/// It declares the C interfaces it calls, which the executable's module defines.
pub fn executable_ir(manifest: &Manifest) -> String {
    let text = format!("{}\0", manifest.to_text());
    let bytes: String = text
        .bytes()
        .map(|b| match b {
            b' '..=b'~' if b != b'"' && b != b'\\' => (b as char).to_string(),
            _ => format!("\\{b:02X}"),
        })
        .collect();
    let manifest_fn = abi::MANIFEST;
    let mut s = format!(
        "\n@{manifest_fn}_text = internal constant [{} x i8] c\"{bytes}\"\n\
         define ptr @{manifest_fn}() {{\n  ret ptr @{manifest_fn}_text\n}}\n",
        text.len()
    );
    s.push_str(&packed_entry(abi::FORWARD, manifest.args.len()));
    let (adamw, sgd) = (gpu_update::ADAMW, gpu_update::SGD);
    let built = gpu_update::built(manifest);
    let entries = [
        (abi::EVALUATE, manifest.evaluate.len()),
        (
            adamw,
            usize::from(built) * gpu_update::args(manifest, Kind::AdamW).len(),
        ),
        (
            sgd,
            usize::from(built) * gpu_update::args(manifest, Kind::Sgd).len(),
        ),
        (
            gpu_update::SQUARES,
            usize::from(built) * gpu_update::squares_args(manifest).len(),
        ),
    ];
    for (entry, n) in entries {
        match n {
            0 => {
                let _ = write!(
                    s,
                    "\ndefine void @_mlir__mlir_ciface_{entry}(ptr %args) {{\n  call void @llvm.trap()\n  unreachable\n}}\n"
                );
            }
            n => s.push_str(&packed_entry(entry, n)),
        }
    }
    s.push_str("declare void @llvm.trap()\n");
    s
}

/// `_mlir__mlir_ciface_<entry>(void **args)`: calls the C interface of `entry`, whose `n`
/// arguments are memref descriptors, with `*args[i]` as argument `i`.
fn packed_entry(entry: &str, n: usize) -> String {
    let mut s = format!("\ndefine void @_mlir__mlir_ciface_{entry}(ptr %args) {{\n");
    for i in 0..n {
        let _ = writeln!(s, "  %slot{i} = getelementptr ptr, ptr %args, i64 {i}");
        let _ = writeln!(s, "  %arg{i} = load ptr, ptr %slot{i}");
        let _ = writeln!(s, "  %desc{i} = load ptr, ptr %arg{i}");
    }
    let call: Vec<String> = (0..n).map(|i| format!("ptr %desc{i}")).collect();
    let _ = writeln!(s, "  call void @_mlir_ciface_{entry}({})", call.join(", "));
    s.push_str("  ret void\n}\n");
    let params = vec!["ptr"; n].join(", ");
    let _ = writeln!(s, "declare void @_mlir_ciface_{entry}({params})");
    s
}
