//! The MLIR text writer behind `lower-mlir`: SSA names, buffers, locations, `linalg.generic`.
//!
//! Every IR value lives in one statically shaped buffer (`memref`), allocated once at function
//! entry and freed at exit (a pipeline loop's values: right before that loop and after it; in a
//! training step, shared by values whose lives do not overlap, `reuse.rs`), so values computed
//! in a loop body reuse their buffer each iteration.
//! Ops become `linalg.generic`s over those buffers; the per-op rules are in `ops.rs`.

use super::buf::{elt, list, memref_type, Buf, BufId, Layout, Scalar};
use super::nest::{LoopBuffers, Nest};

use super::residency::{GpuCode, Residency, WaitId};
use super::text::{escape, float_literal, identity, Lines};
use ppc_dialect::span::Span;
use ppc_dialect::{DType, Dim, Type};
use ppc_runtime::abi;
use std::collections::HashMap;

/// A line of the function's body.
pub enum Line {
    Text(String),
    /// A wait for the GPU before the host writes this buffer, needed only if GPU work anywhere
    /// in the program uses it (`residency.rs`).
    WaitIfTouched(BufId, String),
    /// A wait for the GPU before the host reads a buffer it wrote last, needed only if GPU work
    /// later in a loop around the read writes it (`residency.rs`).
    WaitIfRewritten(WaitId, String),
}

/// A function's body as written: module-level declarations, allocations at entry, the body,
/// frees at exit, and (`--target cuda`) the tilings of its kernels (`gpu_map.rs`).
pub struct Written {
    pub declarations: std::collections::BTreeSet<String>,
    pub allocs: Vec<String>,
    pub body: Vec<String>,
    pub frees: Vec<String>,
    pub tilings: Option<Vec<super::gpu_map::Tiling>>,
}

/// Writes one function's body: its text (SSA names, locations, allocations, lines), with
/// two pieces of state the text depends on kept apart: where in the loops it is (`nest`: a
/// buffer is allocated per stage or per thread inside a parallel loop) and, for `--target
/// cuda`, what the GPU holds (`gpu`: the host waits before touching a buffer a kernel wrote).
/// What to write is decided before (`plan.rs`); the emitter only writes it.
pub struct Emitter<'a> {
    pub(super) file: &'a str,
    pub lines: &'a Lines,
    pub allocs: Vec<String>,
    pub frees: Vec<String>,
    pub body: Vec<Line>,
    /// Runtime functions the body calls besides the GEMMs, declared once at module level.
    pub declarations: std::collections::BTreeSet<String>,
    /// `--target cuda`; `None` for the CPU.
    pub gpu: Option<GpuCode>,
    /// Where in the loops the code written now is (`nest.rs`).
    pub(super) nest: Nest,
    /// Whether values of a pipeline loop share buffers (`reuse.rs`): in a training step, whose
    /// backward keeps gigabytes of temporaries (and whose transformer example ran 5% faster);
    /// not in a forward pass (the transformer example's ran 3% slower, interleaved runs).
    pub share_buffers: bool,
    pub(super) next: usize,
    /// The names of the allocations made so far: placed where every later op sees them.
    allocated: std::collections::HashSet<String>,
    /// Allocations and entry arguments so far ([`BufId`]).
    buffers: u32,
    pub(super) indent: usize,
    pub(super) loc: String,
}

impl<'a> Emitter<'a> {
    pub fn new(file: &'a str, lines: &'a Lines) -> Emitter<'a> {
        Emitter {
            file,
            lines,
            allocs: vec![],
            frees: vec![],
            body: vec![],
            declarations: Default::default(),
            gpu: None,
            nest: Nest::default(),
            share_buffers: false,
            next: 0,
            allocated: Default::default(),
            buffers: 0,
            indent: 2,
            loc: String::new(),
        }
    }

    /// Locations of everything emitted until the next call point at `span` of the model file.
    pub fn at(&mut self, span: Span) {
        let (l, c) = self.lines.line_col(span.start as usize);
        self.loc = format!(" loc(\"{}\":{l}:{c})", escape(self.file));
    }

    /// A new allocation's (or entry argument's) identity.
    pub fn buffer_id(&mut self) -> BufId {
        self.buffers += 1;
        BufId(self.buffers)
    }

    pub fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    /// A mark of the names made so far, for [`Emitter::defined_since`].
    pub fn mark(&self) -> usize {
        self.next
    }

    /// Whether `b` was defined after `mark` by an op other than an allocation: inside a region
    /// opened there, so code after the region cannot name it.
    pub fn defined_since(&self, b: &Buf, mark: usize) -> bool {
        let made = b
            .name
            .strip_prefix("%v")
            .and_then(|n| n.parse::<usize>().ok());
        made.is_some_and(|n| n > mark) && !self.allocated.contains(&b.name)
    }

    /// An op line, with the current location.
    pub fn op(&mut self, text: &str) {
        let line = self.indented(text);
        self.body.push(Line::Text(line));
    }

    /// `text` indented to the current depth, with the current location.
    pub(super) fn indented(&self, text: &str) -> String {
        format!("{}{text}{}", "  ".repeat(self.indent), self.loc)
    }

    /// A line without a location (block headers).
    pub fn raw(&mut self, text: &str) {
        let line = format!("{}{text}", "  ".repeat(self.indent));
        self.body.push(Line::Text(line));
    }

    /// What was written, with every wait for the GPU that turned out to be needed
    /// (`residency.rs`), and the tilings of its kernels (`--target cuda`).
    pub fn finish(mut self) -> Written {
        let gpu = self.gpu.take();
        let residency =
            |needs: &dyn Fn(&Residency) -> bool| gpu.as_ref().is_some_and(|g| needs(&g.residency));
        let mut body = Vec::with_capacity(self.body.len());
        for line in self.body {
            let wait = match line {
                Line::Text(text) => {
                    body.push(text);
                    continue;
                }
                Line::WaitIfTouched(id, text) => residency(&|r| r.touches(id)).then_some(text),
                Line::WaitIfRewritten(id, text) => residency(&|r| r.needs(id)).then_some(text),
            };
            if let Some(text) = wait {
                self.declarations.insert(abi::GPU_SYNC.declaration());
                body.push(text);
            }
        }
        Written {
            declarations: self.declarations,
            allocs: self.allocs,
            body,
            frees: self.frees,
            tilings: gpu.map(|g| g.tilings),
        }
    }

    /// Opens a region with its header line (`... {`); [`Emitter::close`] ends it.
    pub fn open(&mut self, header: &str) {
        self.raw(header);
        self.indent += 1;
    }

    /// Ends the region [`Emitter::open`] began.
    pub fn close(&mut self) {
        self.indent -= 1;
        let close = format!("}}{}", self.loc);
        self.raw(&close);
    }

    /// `%r = <rhs>`, returning `%r`.
    pub fn let_(&mut self, rhs: &str) -> String {
        let r = self.fresh();
        self.op(&format!("{r} = {rhs}"));
        r
    }

    /// A new buffer of `ty`, allocated at function entry (or before the pipeline loop being
    /// written, or one of its buffers given back, [`Emitter::begin_loop_buffers`]). Inside a
    /// stage-parallel loop, the current stage's slot of a buffer with one per stage, so that
    /// threads share no scratch; inside a loop over a chain's entries, one buffer per thread.
    pub fn alloc(&mut self, ty: &Type) -> Buf {
        if self.nest.entries.is_some() {
            return self.alloc_per_thread(ty);
        }
        match &self.nest.split {
            Some(split) if split.parallel => {
                let (stages, iv) = (split.stages, split.iv.clone());
                let whole = self.alloc_whole(&ty.insert(0, Dim::lit(stages)));
                self.slot(&whole, &iv, 0, false)
            }
            _ => self.alloc_whole(ty),
        }
    }

    /// Inside a loop over entries: a buffer of the current thread, allocated where its part of
    /// the loop begins and freed where it ends, reused by each of its entries.
    pub(super) fn alloc_per_thread(&mut self, ty: &Type) -> Buf {
        let (buf, alloc, free) = self.new_buffer(ty);
        let (at, indent) = self.nest.thread_body;
        self.body
            .insert(at, Line::Text(format!("{}{alloc}", "  ".repeat(indent))));
        self.nest.thread_body.0 += 1;
        self.nest
            .entries
            .as_mut()
            .expect("called inside a loop over entries")
            .frees
            .push(free);
        buf
    }

    pub(super) fn alloc_whole(&mut self, ty: &Type) -> Buf {
        if let Some(own) = self.nest.loop_buffers.as_mut() {
            let given_back = own.free.get_mut(&memref_type(ty, None)).and_then(Vec::pop);
            if let Some(buf) = given_back {
                return buf;
            }
        }
        let (buf, alloc, free) = self.new_buffer(ty);
        match self.nest.loop_buffers.as_mut() {
            Some(own) => {
                own.made.insert(buf.base, buf.clone());
                let line = format!("{}{alloc}", "  ".repeat(own.indent));
                self.body.insert(own.at, Line::Text(line));
                if self.nest.thread_body.0 >= own.at {
                    self.nest.thread_body.0 += 1;
                }
                own.at += 1;
                own.frees.push(free);
            }
            None => {
                self.allocs.push(format!("    {alloc}"));
                self.frees.push(format!("    {free}"));
            }
        }
        buf
    }

    /// Until [`Emitter::end_loop_buffers`], buffers are allocated here, before the pipeline
    /// loop about to be written, and freed after it (on the CPU; the GPU's residency analysis
    /// assumes buffers of the whole function): a value computed in the loop is dead after it,
    /// as the loop's results are its carried buffers, allocated before this.
    pub fn begin_loop_buffers(&mut self) {
        if self.gpu.is_none() {
            if let Some(outer) = self.nest.loop_buffers.take() {
                self.nest.outer_buffers.push(outer);
            }
            self.nest.loop_buffers = Some(LoopBuffers {
                at: self.body.len(),
                indent: self.indent,
                frees: Vec::new(),
                made: HashMap::new(),
                free: HashMap::new(),
            });
        }
    }

    /// Gives the loop's allocation `base` back for a later value of its type to take
    /// (`reuse.rs`), in a training step's loops ([`Emitter::share_buffers`]); nothing where it
    /// is not one (an argument, a buffer of the whole function).
    pub(super) fn release(&mut self, base: BufId) {
        if !self.share_buffers {
            return;
        }
        if let Some(own) = self.nest.loop_buffers.as_mut() {
            if let Some(buf) = own.made.get(&base) {
                let key = memref_type(&buf.ty, None);
                let free = own.free.entry(key).or_default();
                if !free.iter().any(|b| b.base == base) {
                    free.push(buf.clone());
                }
            }
        }
    }

    /// The id the next allocation will get.
    pub(super) fn next_buffer(&self) -> BufId {
        BufId(self.buffers + 1)
    }

    /// Frees the buffers of the loop written since [`Emitter::begin_loop_buffers`].
    pub fn end_loop_buffers(&mut self) {
        if let Some(own) = self.nest.loop_buffers.take() {
            for free in own.frees {
                self.raw(&free);
            }
        }
        self.nest.loop_buffers = self.nest.outer_buffers.pop();
    }

    /// A buffer of `ty` and the lines (unindented, located) that allocate and free it.
    pub(super) fn new_buffer(&mut self, ty: &Type) -> (Buf, String, String) {
        let name = self.fresh();
        self.allocated.insert(name.clone());
        let mty = memref_type(ty, None);
        let loc = &self.loc;
        let alloc = format!("{name} = memref.alloc() {{alignment = 64 : i64}} : {mty}{loc}");
        let free = format!("memref.dealloc {name} : {mty}{loc}");
        let buf = Buf {
            base: self.buffer_id(),
            name,
            ty: ty.clone(),
            layout: None,
        };
        (buf, alloc, free)
    }

    /// Position `at` (an `index` SSA value) of `b`'s axis `axis` as a view: with that axis of
    /// size 1 when `keep`, without it otherwise.
    pub fn slot(&mut self, b: &Buf, at: &str, axis: usize, keep: bool) -> Buf {
        self.slots(b, &[(axis, at.to_string())], keep)
    }

    /// As [`Emitter::slot`], at several axes (`(axis, index)`, in increasing axis order).
    pub fn slots(&mut self, b: &Buf, at: &[(usize, String)], keep: bool) -> Buf {
        let at: Vec<(usize, String, u64)> = at.iter().map(|(a, i)| (*a, i.clone(), 1)).collect();
        self.blocks(b, &at, keep)
    }

    /// As [`Emitter::slots`], taking `size` elements from `index` along each axis
    /// (`(axis, index, size)`); an axis of a size above 1 is kept whatever `keep` says.
    pub fn blocks(&mut self, b: &Buf, at: &[(usize, String, u64)], keep: bool) -> Buf {
        let shape = b.ty.shape();
        let mut offsets = vec!["0".to_string(); shape.len()];
        let mut sizes = shape.clone();
        let mut strides = b.strides();
        let mut ty = b.ty.clone();
        for (axis, index, size) in at.iter().rev() {
            offsets[*axis] = index.clone();
            sizes[*axis] = *size;
            if keep || *size > 1 {
                ty.dims[*axis].size = *size;
            } else {
                strides.remove(*axis);
                ty = ty.remove(*axis);
            }
        }
        let view = Buf {
            name: self.fresh(),
            base: b.base,
            ty,
            layout: Some(Layout {
                strides,
                offset: None,
            }),
        };
        self.op(&format!(
            "{} = memref.subview {}[{}] [{}] [{}] : {} to {}",
            view.name,
            b.name,
            offsets.join(", "),
            list(&sizes),
            list(&vec![1; sizes.len()]),
            b.mty(),
            view.mty()
        ));
        view
    }

    pub fn index(&mut self, v: u64) -> String {
        self.let_(&format!("arith.constant {v} : index"))
    }

    /// The position `[0, n)` of the i32 index value `v` (clamped, as XLA does), as an `index`.
    pub fn clamped_index(&mut self, v: &str, n: u64) -> String {
        let i = self.let_(&format!("arith.index_cast {v} : i32 to index"));
        let (zero, last) = (self.index(0), self.index(n - 1));
        let lo = self.let_(&format!("arith.maxsi {i}, {zero} : index"));
        self.let_(&format!("arith.minsi {lo}, {last} : index"))
    }

    /// A scalar constant of an MLIR element type given by name.
    pub fn constant(&mut self, value: f64, ty: impl Into<Scalar>) -> String {
        let ty = ty.into();
        let lit = match ty {
            // `true : i1` does not parse: a bool attribute carries its type.
            Scalar::Elem(DType::I1) => u8::from(value != 0.0).to_string(),
            Scalar::Elem(DType::I32) | Scalar::I16 => format!("{}", value as i64),
            Scalar::Elem(DType::F32 | DType::BF16 | DType::F16) => float_literal(value as f32),
        };
        self.let_(&format!("arith.constant {lit} : {}", ty.name()))
    }

    /// `linalg.generic` over `out`'s shape. `ins` are buffers with their indexing maps (as
    /// `(d0, ..) -> (..)` bodies); `iters` the iterator types of the domain `dims`. `body` gets
    /// the block argument names (inputs, then the output) and returns the yielded value.
    pub fn generic(
        &mut self,
        dims: usize,
        ins: &[(&Buf, String)],
        out: (&Buf, String),
        iters: &[&str],
        body: impl FnOnce(&mut Emitter, &[String]) -> String,
    ) {
        let domain: Vec<String> = (0..dims).map(|i| format!("d{i}")).collect();
        let domain = domain.join(", ");
        // On the GPU, scalars the host wrote reach a kernel by value, not through memory.
        let mut captured: Vec<Option<String>> = vec![None; ins.len()];
        let attrs = match self.gpu_tag(ins, &out, iters) {
            Some(Some(tag)) => {
                for (c, (b, _)) in captured.iter_mut().zip(ins) {
                    if b.ty.rank() == 0
                        && self.gpu_residency().is_some_and(|r| r.host_wrote_last(b))
                    {
                        self.host_reads(b);
                        *c = Some(self.let_(&format!("memref.load {}[] : {}", b.name, b.mty())));
                    }
                }
                let reads: Vec<&Buf> = ins
                    .iter()
                    .zip(&captured)
                    .filter(|(_, c)| c.is_none())
                    .map(|((b, _), _)| *b)
                    .collect();
                self.device_uses(&reads, out.0);
                format!(" attrs = {{{tag}}}")
            }
            Some(None) => {
                let reads: Vec<&Buf> = ins.iter().map(|(b, _)| *b).collect();
                self.host_computes(&reads, out.0);
                String::new()
            }
            None if self.nest.in_parallel_loop() => String::new(),
            None => match parallel_dims(ins, &out, iters) {
                0 => String::new(),
                n => format!(" attrs = {{{}}}", PARALLEL_ATTRS[n - 1]),
            },
        };
        let kept: Vec<usize> = (0..ins.len()).filter(|&i| captured[i].is_none()).collect();
        let maps: Vec<String> = kept
            .iter()
            .map(|&i| ins[i].1.clone())
            .chain([out.1.clone()])
            .map(|m| format!("affine_map<({domain}) -> ({m})>"))
            .collect();
        let iters: Vec<String> = iters.iter().map(|i| format!("\"{i}\"")).collect();
        let ins_names: Vec<&str> = kept.iter().map(|&i| ins[i].0.name.as_str()).collect();
        let ins_types: Vec<String> = kept.iter().map(|&i| ins[i].0.mty()).collect();
        let ins_clause = if kept.is_empty() {
            String::new()
        } else {
            format!(" ins({} : {})", ins_names.join(", "), ins_types.join(", "))
        };
        self.raw(&format!(
            "linalg.generic {{indexing_maps = [{}], iterator_types = [{}]}}{ins_clause} outs({} : {}){attrs} {{",
            maps.join(", "),
            iters.join(", "),
            out.0.name,
            out.0.mty()
        ));
        // Block arguments of the kept operands and the output; captured scalars in place.
        let block_args: Vec<(String, DType)> = kept
            .iter()
            .map(|&i| ins[i].0.ty.dtype)
            .chain([out.0.ty.dtype])
            .map(|d| (self.fresh(), d))
            .collect();
        let mut fresh = block_args.iter().map(|(a, _)| a.clone());
        let mut args: Vec<String> = captured
            .into_iter()
            .map(|c| c.unwrap_or_else(|| fresh.next().expect("one per kept operand")))
            .collect();
        args.extend(fresh);
        let decls: Vec<String> = block_args
            .iter()
            .map(|(a, d)| format!("{a}: {}{}", elt(*d), self.loc))
            .collect();
        self.raw(&format!("^bb0({}):", decls.join(", ")));
        self.indent += 1;
        let y = body(self, &args);
        self.op(&format!("linalg.yield {y} : {}", elt(out.0.ty.dtype)));
        self.close();
    }

    /// Declares a runtime entry point at module level (once, however often it is called).
    pub fn declare(&mut self, f: &abi::EntryPoint) {
        self.declarations.insert(f.declaration());
    }

    /// Fills `out` with a scalar SSA value of its element type.
    pub fn fill(&mut self, value: &str, out: &Buf) {
        if self.gpu.is_some() {
            // A generic, so that it becomes a kernel like the others.
            let r = out.ty.rank();
            let v = value.to_string();
            self.generic(r, &[], (out, identity(r)), &vec!["parallel"; r], |_, _| v);
            return;
        }
        self.op(&format!(
            "linalg.fill ins({value} : {}) outs({} : {})",
            elt(out.ty.dtype),
            out.name,
            out.mty()
        ));
    }

    /// `dst = src` elementwise over `dst`'s shape (both identity-indexed); nothing where they
    /// are the same buffer (a value computed where its copy would go).
    pub fn copy(&mut self, src: &Buf, dst: &Buf) {
        if src.name == dst.name {
            return;
        }
        self.update_with(src, dst, |_, a| a[0].clone());
    }

    /// `acc += x` elementwise (f32, both identity-indexed).
    pub fn add_to(&mut self, acc: &Buf, x: &Buf) {
        self.update_with(x, acc, |e, a| {
            e.let_(&format!("arith.addf {}, {} : f32", a[1], a[0]))
        });
    }

    /// `dst = body(src, dst)` elementwise over `dst`'s shape (both identity-indexed); `body`
    /// gets the two elements' SSA names in that order. Where `src` is `dst` itself it is read
    /// through the output's block argument: as an input besides the output it would alias it.
    pub(super) fn update_with(
        &mut self,
        src: &Buf,
        dst: &Buf,
        body: impl FnOnce(&mut Emitter, &[String]) -> String,
    ) {
        let r = dst.ty.rank();
        let id = identity(r);
        let itself = src.name == dst.name;
        let ins = match itself {
            true => Vec::new(),
            false => vec![(src, id.clone())],
        };
        self.generic(
            r,
            &ins,
            (dst, id),
            &vec!["parallel"; r],
            |e, a| match itself {
                true => body(e, &[a[0].clone(), a[0].clone()]),
                false => body(e, a),
            },
        );
    }

    /// A strided view of `b` (itself maybe a view) starting at `offsets` with `sizes`.
    pub fn subview(&mut self, b: &Buf, offsets: &[u64], sizes: &[u64]) -> Buf {
        let strides = b.strides();
        let base = b.layout.as_ref().map_or(Some(0), |l| l.offset);
        let offset = base.map(|o| {
            o + offsets
                .iter()
                .zip(&strides)
                .map(|(&i, &s)| i * s as u64)
                .sum::<u64>()
        });
        let name = self.fresh();
        let view = Buf {
            name: name.clone(),
            ty: Type::of(b.ty.dtype, sizes),
            layout: Some(Layout { strides, offset }),
            base: b.base,
        };
        self.op(&format!(
            "{name} = memref.subview {}[{}] [{}] [{}] : {} to {}",
            b.name,
            list(offsets),
            list(sizes),
            list(&vec![1; sizes.len()]),
            b.mty(),
            view.mty()
        ));
        view
    }
}

/// Loop nests that touch fewer elements than this run on one thread: below it, starting the
/// team cost more than it saved (BENCHMARKS.md: 4 K and 64 K were both slower on the
/// transformer).
pub const MIN_PARALLEL_ELEMENTS: u64 = 16_384;

/// The attributes that mark a `linalg.generic` for [`TRANSFORM_SCRIPT`]: its first one or two
/// loops become a parallel loop over the threads.
const PARALLEL_ATTRS: [&str; 2] = ["ppc.parallel_1", "ppc.parallel_2"];

/// How many leading loops of a generic to run in parallel: none for small nests; the first
/// (when it is parallel and indexes the output's first axis), and the second too when the
/// first has fewer than 8 iterations (a stage axis of 4 would leave threads idle).
fn parallel_dims(ins: &[(&Buf, String)], out: &(&Buf, String), iters: &[&str]) -> usize {
    let work = ins
        .iter()
        .map(|(b, _)| b.ty.elements())
        .chain([out.0.ty.elements()])
        .max()
        .unwrap_or(0);
    let leading: Vec<&str> = out.1.split(", ").collect();
    let is =
        |i: usize| iters.get(i) == Some(&"parallel") && leading.get(i) == Some(&&*format!("d{i}"));
    if work < MIN_PARALLEL_ELEMENTS || !is(0) {
        return 0;
    }
    let first = out.0.ty.shape()[0];
    if first < 8 && is(1) {
        2
    } else {
        1
    }
}

/// The transform-dialect script the CPU pipeline interprets (`transform-interpreter`): each
/// marked generic becomes an `scf.forall` over its leading loops (later OpenMP's parallel loop)
/// around the same generic on one tile; each region marked `ppc.outline` becomes a private
/// function `@ppc_stage…` that LLVM does not inline, called where the region was. Private, so
/// that `symbol-dce` drops the script afterwards.
pub const TRANSFORM_SCRIPT: &str = r#"  transform.named_sequence private @__transform_main(%m: !transform.any_op {transform.readonly}) {
    %one = transform.structured.match attributes {ppc.parallel_1} in %m : (!transform.any_op) -> !transform.any_op
    %t1, %l1 = transform.structured.tile_using_forall %one tile_sizes [1] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %two = transform.structured.match attributes {ppc.parallel_2} in %m : (!transform.any_op) -> !transform.any_op
    %t2, %l2 = transform.structured.tile_using_forall %two tile_sizes [1, 1] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %bodies = transform.structured.match attributes {ppc.outline} in %m : (!transform.any_op) -> !transform.any_op
    %stages, %calls = transform.loop.outline %bodies {func_name = "ppc_stage"} : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
    %noinline = transform.param.constant ["noinline"] -> !transform.any_param
    transform.annotate %stages "passthrough" = %noinline : !transform.any_op, !transform.any_param
    %private = transform.param.constant "private" -> !transform.any_param
    transform.annotate %stages "sym_visibility" = %private : !transform.any_op, !transform.any_param
    transform.yield
  }
"#;
