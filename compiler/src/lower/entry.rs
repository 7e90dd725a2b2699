//! The entry functions (`@ppc_forward`, and a training executable's `@ppc_evaluate`): which
//! function each runs ([`Entry`]), its arguments in the order the manifest lists them (inputs,
//! then parameters in first-use order, then outputs), and the code around the walk of that
//! function that binds them.

use super::buf::Buf;
use super::emit::Emitter;
use super::ops;
use super::walk::Walker;
use ppc_dialect::ir::{names, FuncId, Init, Item, Module, Param};
use ppc_dialect::op::{Float, OpKind};
use ppc_dialect::{Axis, Diagnostic, Type};
use ppc_runtime::manifest::{Arg, Role};
use std::collections::HashMap;

/// What the entry function computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `@pipeline`: `output = f(input, params)`.
    Forward,
    /// `@train_vjp` (after `loss` and `autodiff`): `loss, output, grads = f(input, target,
    /// params)`, the gradients in f32, one per parameter.
    Train,
    /// `@train` (after `loss`): `loss, output = f(input, target, params)`, the training step
    /// without its gradients: a third of its work, which labels the synthetic task and
    /// validates.
    Evaluate,
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

    /// The name of the function the entry runs in `m`.
    pub fn func(self, m: &Module) -> String {
        match self {
            Entry::Forward if m.func(names::MODEL).is_some() => names::MODEL.to_string(),
            Entry::Forward => names::PIPELINE.to_string(),
            Entry::Train => names::vjp(names::TRAIN),
            Entry::Evaluate => names::TRAIN.to_string(),
        }
    }
}

/// One argument of the entry function.
pub struct Argument {
    pub role: Role,
    /// As the manifest names it (a parameter or gradient: its `@layer` name).
    pub name: String,
    pub buf: Buf,
    /// A parameter's declaration (initializer, layer axes).
    pub param: Option<Param>,
    /// How the runtime draws it when no file gives it: a parameter's initializer, the model's
    /// synthetic inputs.
    pub init: Init,
}

impl Argument {
    pub fn manifest(&self) -> Arg {
        let ty = &self.buf.ty;
        Arg {
            role: self.role,
            name: self.name.clone(),
            dtype: ty.dtype,
            shape: ty.shape_usize(),
            init: self.init,
            layer_axes: self.param.as_ref().map_or(0, |p| p.layer_axes),
            shard_axis: ty.axis(Axis::RankStages),
        }
    }
}

/// The arguments `args` of an entry the runtime defines (the optimizer's on the GPU), as
/// buffers `%{prefix}0`, `%{prefix}1`, ...
pub fn of_runtime(e: &mut Emitter, args: &[Arg], prefix: &str) -> Vec<Argument> {
    (args.iter().enumerate())
        .map(|(i, a)| {
            let shape: Vec<u64> = a.shape.iter().map(|&s| s as u64).collect();
            Argument {
                role: a.role,
                name: a.name.clone(),
                buf: argument_buf(e, &format!("{prefix}{i}"), &Type::of(a.dtype, &shape)),
                param: None,
                init: Init::Zeros,
            }
        })
        .collect()
}

/// A buffer the entry function takes as argument `%name`.
fn argument_buf(e: &mut Emitter, name: &str, ty: &Type) -> Buf {
    Buf {
        name: format!("%{name}"),
        base: e.buffer_id(),
        ty: ty.clone(),
        layout: None,
    }
}

/// Writes the entry's body, `f` (the pipeline or the training step) with the entry's
/// arguments bound; returns the arguments in order.
pub fn write(w: &mut Walker, id: FuncId, entry: Entry) -> Result<Vec<Argument>, Diagnostic> {
    let m: &Module = w.m;
    let f = &m.funcs[id];
    let argument = |role, name: &str, buf| Argument {
        role,
        name: name.to_string(),
        buf,
        param: None,
        init: match role {
            Role::Input => m.input_init(),
            _ => Init::Zeros,
        },
    };
    // The entry's own arguments; the rest of `f`'s are constants.
    let mut inputs = vec![argument(
        Role::Input,
        "input",
        argument_buf(&mut w.e, "input", f.ty(f.body.args[0])),
    )];
    let mut args: Vec<Buf> = vec![inputs[0].buf.clone()];
    if entry != Entry::Forward {
        let target = argument_buf(&mut w.e, "target", f.ty(f.body.args[1]));
        args.push(target.clone());
        inputs.push(argument(Role::Target, "target", target));
    }
    if entry == Entry::Train {
        // (x, target, d_loss, d_outputs): the loss's cotangent is 1, the outputs' zero.
        w.e.at(m.spans.get(&Item::Pipeline));
        for (&a, v) in f.body.args[2..].iter().zip([1.0, -0.0]) {
            let b = w.e.alloc(f.ty(a));
            let fill = OpKind::Constant { value: Float(v) };
            ops::lower(&mut w.e, w.numerics, &fill, &[], &b);
            args.push(b);
        }
    }
    // The results that leave the entry: (role, name, index in `f`'s results).
    let mut outputs: Vec<(Role, String, usize)> = Vec::new();
    match entry {
        Entry::Forward => outputs.push((Role::Output, "output".into(), 0)),
        Entry::Evaluate | Entry::Train => {
            outputs.push((Role::Loss, "loss".into(), 0));
            outputs.push((Role::Output, "output".into(), 1));
        }
    }
    if entry == Entry::Train {
        // Then the inputs' (and float targets') cotangents, then one per trainable parameter
        // (`@train`'s own, then `@stage`'s), named as the parameter.
        let train = m
            .func_id(names::TRAIN)
            .ok_or_else(|| Diagnostic::plain("no `@train`"))?;
        let slots = crate::passes::trainables(m, train);
        let first = f.body.results.len() - slots.len();
        for (i, (g, p)) in slots.into_iter().enumerate() {
            let f = &m.funcs[g];
            let name = f.values[f.params[p].value].name.clone();
            outputs.push((Role::Grad, name, first + i));
        }
    }
    let out_bufs: Vec<Buf> = (outputs.iter().enumerate())
        .map(|(i, (role, name, r))| {
            let id = match role {
                Role::Grad => format!("grad{i}"),
                _ => name.clone(),
            };
            argument_buf(&mut w.e, &id, f.ty(f.body.results[*r]))
        })
        .collect();
    // On the CPU each result is computed straight into its argument where the walk can (a
    // weight gradient's accumulator from its fill on), not into a buffer copied at the end;
    // a result the walk places elsewhere (a view, an argument) is copied.
    let mut into: HashMap<usize, Buf> = HashMap::new();
    if w.e.gpu.is_none() {
        for ((_, _, r), buf) in outputs.iter().zip(&out_bufs) {
            let value = f.body.results[*r];
            // A value returned twice goes into the first of its arguments.
            if (f.body.results.iter()).position(|&v| v == value) == Some(*r) {
                into.insert(*r, buf.clone());
            }
        }
    }
    // A training step's values outside its loops share buffers where their lives do not
    // overlap, as those inside do (`reuse.rs`): the head's and the loss's `[rows, vocab]`
    // values and their cotangents, each dead before the next is made.
    let pooled = w.e.share_buffers;
    if pooled {
        w.e.begin_loop_buffers();
    }
    let results = w.func(id, args, &into)?;
    w.e.at(m.spans.get(&Item::Pipeline));
    let mut outs = Vec::new();
    for ((role, name, r), buf) in outputs.into_iter().zip(out_bufs) {
        w.e.copy(&results[r], &buf);
        outs.push(argument(role, &name, buf));
    }
    if pooled {
        w.e.end_loop_buffers();
    }
    let params = w.bound.iter().map(|(id, buf)| {
        let weight = w.params.weight(*id);
        Argument {
            role: Role::Param,
            name: weight.name.clone(),
            buf: buf.clone(),
            param: Some(weight.param.clone()),
            init: weight.param.init,
        }
    });
    Ok(inputs
        .into_iter()
        .chain(params.collect::<Vec<_>>())
        .chain(outs)
        .collect())
}
