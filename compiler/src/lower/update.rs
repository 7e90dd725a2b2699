//! The optimizer's update of a CUDA training step, `@ppc_update_adamw` and `@ppc_update_sgd`
//! (their arguments are `ppc_runtime::gpu_update::args`): one kernel per parameter, one thread
//! per element, which updates the element's moments and f32 master and writes the weight in
//! its stored type. So the weights, gradients and optimizer state stay on the GPU from step to
//! step (`runtime/src/gpu_update.rs`).
//!
//! Each thread computes the host's update (`runtime/src/optim.rs`) operation by operation, in
//! its order and without fast-math flags: the kernels' PTX rounds every operation once (`.rn`,
//! no fused multiply-add, `sqrt.rn`, `div.rn`), so the GPU's update gives the host's bits.
//! Whether a parameter decays is the manifest's (`optim::decays`); the hyper-parameters are
//! read by the host from the last argument once per call and reach the kernels by value. Where
//! the kernels run as CPU loops (the tests) each kernel is a loop over the elements.
//!
//! ```text
//! gpu.launch blocks(%b) in (⌈n / 256⌉) threads(%t) in (256) {
//!   %i = %b * 256 + %t
//!   scf.if %i < n { m = β1·m + (1 − β1)·g; v = ...; w = w − lr·(m̂ / (√v̂ + ε) + λ·w); store m, v, w, bf16(w) }
//! }
//! ```

use super::buf::Buf;
use super::emit::{Emitter, Written};
use super::entry::{self, Argument};
use ppc_dialect::DType;
use ppc_runtime::gpu_update::{self, hyper};
use ppc_runtime::manifest::{Manifest, Role};
use ppc_runtime::optim::{decays, Kind};

/// Threads per block.
const THREADS: u64 = 256;

/// Writes the update of `kind` for the parameters of `m` with `e` (an emitter for the GPU);
/// returns what it wrote and the function's arguments.
pub fn write(m: &Manifest, kind: Kind, mut e: Emitter) -> (Written, Vec<Argument>) {
    let args = gpu_update::args(m, kind);
    let arguments = entry::of_runtime(&mut e, &args, "u");
    let bufs: Vec<&Buf> = arguments.iter().map(|a| &a.buf).collect();
    let hyper = bufs
        .last()
        .expect("invariant: the hyper-parameters come last");
    let h: Vec<String> = (0..hyper::COUNT)
        .map(|k| {
            let at = e.index(k as u64);
            e.let_(&format!(
                "memref.load {}[{at}] : {}",
                hyper.name,
                hyper.mty()
            ))
        })
        .collect();
    let mut i = 0;
    while args[i].role == Role::Param {
        // The parameter's arguments run to the next parameter's (or the hyper-parameters).
        let end = (i + 1..args.len())
            .find(|&j| matches!(args[j].role, Role::Param | Role::Hyper))
            .expect("invariant: the hyper-parameters come last");
        let operand = |role| (i..end).find(|&j| args[j].role == role).map(|j| bufs[j]);
        let parts = Parts {
            weight: bufs[i],
            grad: operand(Role::Grad).expect("invariant: a gradient per parameter"),
            m: operand(Role::Moment1).expect("invariant: a first moment per parameter"),
            v: operand(Role::Moment2),
            master: operand(Role::Master),
        };
        parameter(&mut e, kind, &parts, &h, decays(&args[i]));
        i = end;
    }
    (e.finish(), arguments)
}

/// One parameter's buffers in the update.
struct Parts<'b> {
    /// As stored (its own master where that is f32).
    weight: &'b Buf,
    grad: &'b Buf,
    m: &'b Buf,
    /// AdamW's second moment.
    v: Option<&'b Buf>,
    /// The f32 master of a weight stored in another type.
    master: Option<&'b Buf>,
}

/// The kernel that updates one parameter, `h` the hyper-parameters' values.
fn parameter(e: &mut Emitter, kind: Kind, p: &Parts, h: &[String], decays: bool) {
    let n = p.weight.ty.elements();
    let flat = |e: &mut Emitter, b: &Buf| flatten(e, b, n);
    let (weight, grad, m) = (flat(e, p.weight), flat(e, p.grad), flat(e, p.m));
    let v = p.v.map(|b| flat(e, b));
    let master = p.master.map(|b| flat(e, b));
    let on_cpu = e.gpu.as_ref().is_some_and(|g| g.kernels_on_cpu);
    let i = open_elementwise(e, n);
    let load =
        |e: &mut Emitter, b: &str| e.let_(&format!("memref.load {b}[{i}] : memref<{n}xf32>"));
    let f =
        |e: &mut Emitter, op: &str, a: &str, b: &str| e.let_(&format!("arith.{op} {a}, {b} : f32"));
    let raw = load(e, &grad);
    let g = f(e, "mulf", &raw, &h[hyper::SCALE]);
    let w_at = master.as_deref().unwrap_or(&weight).to_string();
    let w = load(e, &w_at);
    let m0 = load(e, &m);
    let wd = match decays {
        true => h[hyper::WEIGHT_DECAY].clone(),
        false => e.constant(0.0, DType::F32),
    };
    let (lr, beta1) = (&h[hyper::LR], &h[hyper::BETA1]);
    let (m1, w1) = match kind {
        Kind::AdamW => {
            // m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g·g
            let one = e.constant(1.0, DType::F32);
            let beta2 = &h[hyper::BETA2];
            let (a, rest) = (f(e, "mulf", beta1, &m0), f(e, "subf", &one, beta1));
            let b = f(e, "mulf", &rest, &g);
            let m1 = f(e, "addf", &a, &b);
            let v_at = v.as_deref().expect("invariant: AdamW has a second moment");
            let v0 = load(e, v_at);
            let (a, rest) = (f(e, "mulf", beta2, &v0), f(e, "subf", &one, beta2));
            let b = f(e, "mulf", &rest, &g);
            let b = f(e, "mulf", &b, &g);
            let v1 = f(e, "addf", &a, &b);
            store(e, &v1, v_at, &i, n);
            // w = w − lr·((m / (1 − β1^t)) / (√(v / (1 − β2^t)) + ε) + λ·w)
            let m_hat = f(e, "divf", &m1, &h[hyper::BIAS1]);
            let v_hat = f(e, "divf", &v1, &h[hyper::BIAS2]);
            // On the GPU NVVM's correctly rounded root: `math.sqrt` would become libdevice's
            // `__nv_sqrtf`, which is `sqrt.approx` unless told otherwise.
            let root = match on_cpu {
                true => e.let_(&format!("math.sqrt {v_hat} : f32")),
                false => e.let_(&format!(
                    "llvm.call_intrinsic \"llvm.nvvm.sqrt.rn.f\"({v_hat}) : (f32) -> f32"
                )),
            };
            let den = f(e, "addf", &root, &h[hyper::EPS]);
            let step = f(e, "divf", &m_hat, &den);
            let decay = f(e, "mulf", &wd, &w);
            let step = f(e, "addf", &step, &decay);
            let by = f(e, "mulf", lr, &step);
            (m1, f(e, "subf", &w, &by))
        }
        Kind::Sgd => {
            // g = g + λ·w; m = μ·m + g; w = w − lr·m
            let decay = f(e, "mulf", &wd, &w);
            let g = f(e, "addf", &g, &decay);
            let a = f(e, "mulf", beta1, &m0);
            let m1 = f(e, "addf", &a, &g);
            let by = f(e, "mulf", lr, &m1);
            (m1, f(e, "subf", &w, &by))
        }
    };
    store(e, &m1, &m, &i, n);
    store(e, &w1, &w_at, &i, n);
    if master.is_some() {
        let d = p.weight.ty.dtype;
        let stored = e.let_(&format!(
            "arith.truncf {w1} : f32 to {}",
            super::buf::elt(d)
        ));
        e.op(&format!(
            "memref.store {stored}, {weight}[{i}] : memref<{n}x{}>",
            super::buf::elt(d)
        ));
    }
    close_elementwise(e);
}

/// Opens a kernel of one thread per index `0..n` (blocks of [`THREADS`]); returns the
/// thread's index. Where kernels run as CPU loops, a loop over the indices.
pub(super) fn open_elementwise(e: &mut Emitter, n: u64) -> String {
    if e.gpu.as_ref().is_some_and(|g| g.kernels_on_cpu) {
        return e.begin_for(n);
    }
    let (block, thread) = e.open_launch(n.div_ceil(THREADS), THREADS);
    let threads = e.index(THREADS);
    let first = e.let_(&format!("arith.muli {block}, {threads} : index"));
    let i = e.let_(&format!("arith.addi {first}, {thread} : index"));
    let end = e.index(n);
    let inside = e.let_(&format!("arith.cmpi ult, {i}, {end} : index"));
    e.open(&format!("scf.if {inside} {{"));
    i
}

/// Ends the kernel [`open_elementwise`] began.
pub(super) fn close_elementwise(e: &mut Emitter) {
    if e.gpu.as_ref().is_some_and(|g| g.kernels_on_cpu) {
        return e.end_for();
    }
    e.close();
    e.close_launch();
}

/// `memref.store value, b[i]` of an f32 buffer of `n` elements.
fn store(e: &mut Emitter, value: &str, b: &str, i: &str, n: u64) {
    e.op(&format!("memref.store {value}, {b}[{i}] : memref<{n}xf32>"));
}

/// `b` as a one-dimensional buffer of its `n` elements (rows are contiguous: entry arguments
/// have the identity layout).
pub(super) fn flatten(e: &mut Emitter, b: &Buf, n: u64) -> String {
    let (rank, elt) = (b.ty.rank(), super::buf::elt(b.ty.dtype));
    match rank {
        1 => b.name.clone(),
        0 => e.let_(&format!(
            "memref.expand_shape {} [] output_shape [1] : {} into memref<1x{elt}>",
            b.name,
            b.mty()
        )),
        _ => {
            let all: Vec<String> = (0..rank).map(|d| d.to_string()).collect();
            e.let_(&format!(
                "memref.collapse_shape {} [[{}]] : {} into memref<{n}x{elt}>",
                b.name,
                all.join(", "),
                b.mty()
            ))
        }
    }
}
