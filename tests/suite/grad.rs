//! The `autodiff` pass, checked by the interpreter: the pipelined program's gradients equal the
//! sequential model's bit for bit (random S, M, R, k, with and without poisoned bubbles, and
//! on the examples), and the sequential gradients agree with central finite differences on a
//! model that uses every differentiable op.

use crate::common::{load, root};
use crate::passes::assert_bits_eq;
use crate::properties::{model, pick};
use ppc::passes::{Options, Remat};
use ppc::pipeline::compile;
use ppc_dialect::grad::{pipeline_vjp_on_ranks, synthetic_cotangent, Grads};
use ppc_dialect::interp::{synthetic_targets, Interp};
use ppc_dialect::{Module, Overrides};
use ppc_runtime::init::Source;
use ppc_runtime::{Init, Rng, Tensor};

pub(crate) fn train_opts(poison: bool, remat: Remat) -> Options {
    Options {
        poison_bubbles: poison,
        train: true,
        remat,
        ..Options::default()
    }
}

/// Runs both gradients of `text` under `over` and checks them equal, bit for bit.
fn pipelined_equals_sequential(
    text: &str,
    over: &Overrides,
    opts: &Options,
    seed: u64,
    what: &str,
) -> Grads {
    let mut m = load(text, over);
    compile(&mut m, opts, None, None).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    assert_grads_equal(&m, seed, what)
}

/// The stage counts that divide `s` (ranks a pipeline of `s` stages can be split over), up to 4.
fn rank_counts(s: u64) -> Vec<u64> {
    (2..=s.min(4)).filter(|r| s.is_multiple_of(*r)).collect()
}

/// The gradients of the pipelined program `m` and of its sequential model, checked equal bit
/// for bit, for seeded inputs and a seeded cotangent; returns the sequential ones.
pub fn assert_grads_equal(m: &Module, seed: u64, what: &str) -> Grads {
    let mut interp = Interp::new(m, seed);
    let inputs = interp.synthetic_inputs();
    let d = synthetic_cotangent(m, seed);
    let want = interp
        .sequential_vjp(&inputs, &d)
        .expect("sequential gradients");
    let got = pipeline_vjp_on_ranks(m, seed, &Source::Seeded(seed), &inputs, &d)
        .expect("pipelined gradients");
    assert_bits_eq(&want.outputs, &got.outputs, &format!("{what}: outputs"));
    assert_bits_eq(
        want.inputs.as_ref().expect("float inputs"),
        got.inputs.as_ref().expect("float inputs"),
        &format!("{what}: input gradient"),
    );
    assert_eq!(want.params.len(), got.params.len());
    for ((name, w), (_, g)) in want.params.iter().zip(&got.params) {
        assert_eq!(w.len(), g.len(), "{what}: layers of {name}");
        for (l, (w, g)) in w.iter().zip(g).enumerate() {
            assert!(
                w.data.iter().all(|v| v.is_finite()),
                "{what}: the reference gradient of {name} in layer {l} is not finite"
            );
            assert_bits_eq(w, g, &format!("{what}: gradient of {name} in layer {l}"));
        }
    }
    want
}

#[test]
fn pipelined_gradients_equal_sequential_bit_for_bit() {
    let mut rng = Rng::stream(2026, "grad-property", 0);
    let (mut ran, mut sharded) = (0, 0);
    for case in 0..40u64 {
        let (s, m, r, k) = (
            pick(&mut rng, 1, 5),
            pick(&mut rng, 1, 7),
            pick(&mut rng, 1, 3),
            pick(&mut rng, 1, 3),
        );
        if r > 1 && m < s {
            continue;
        }
        let (b, d, h) = (
            pick(&mut rng, 1, 3),
            pick(&mut rng, 1, 4),
            pick(&mut rng, 1, 5),
        );
        let text = model(s, m, r, k, b, d, h);
        // Both rematerializations, on alternate cases.
        let remat = [Remat::Stage, Remat::None][case as usize % 2];
        for poison in [false, true] {
            let what = format!(
                "case {case}: S={s} M={m} R={r} k={k} b={b} d={d} h={h} poison={poison} remat={}",
                remat.name()
            );
            let opts = train_opts(poison, remat);
            let g = pipelined_equals_sequential(&text, &Overrides::default(), &opts, case, &what);
            for ranks in rank_counts(s) {
                let over = Overrides {
                    ranks: Some(ranks),
                    ..Overrides::default()
                };
                let what = format!("{what} ranks={ranks}");
                pipelined_equals_sequential(&text, &over, &opts, case, &what);
                sharded += 1;
            }
            let nonzero = g
                .params
                .iter()
                .flat_map(|(_, ls)| ls)
                .any(|t| t.data.iter().any(|&v| v != 0.0));
            assert!(nonzero, "{what}: every parameter gradient is zero");
            ran += 1;
        }
    }
    assert!(
        ran >= 40 && sharded >= 20,
        "only {ran} cases ran, {sharded} split over ranks"
    );
}

#[test]
fn example_gradients_equal_sequential_bit_for_bit() {
    for (file, over) in [
        (
            "mlp.ppc",
            Overrides {
                microbatches: Some(4),
                dims: vec![("d".into(), 16), ("h".into(), 32)],
                ..Overrides::default()
            },
        ),
        (
            "transformer.ppc",
            Overrides {
                repeats: Some(2),
                ..Overrides::default()
            },
        ),
        ("tiny.ppc", Overrides::default()),
    ] {
        let text = std::fs::read_to_string(root().join("examples").join(file)).expect("example");
        for (poison, remat) in [
            (false, Remat::Stage),
            (true, Remat::Stage),
            (true, Remat::None),
        ] {
            let what = format!("{file} poison={poison} remat={}", remat.name());
            pipelined_equals_sequential(&text, &over, &train_opts(poison, remat), 7, &what);
        }
    }
}

/// `sum(d * y)` over all outputs of the sequential model, in f64.
fn loss(interp: &mut Interp, inputs: &Tensor, d: &Tensor) -> f64 {
    let y = interp.sequential(inputs).expect("forward");
    y.data
        .iter()
        .zip(&d.data)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// `t + sign·eps·u`, rounded to `t`'s dtype.
fn moved(t: &Tensor, u: &[f32], sign: f64, eps: f64) -> Tensor {
    let data = t
        .data
        .iter()
        .zip(u)
        .map(|(&x, &v)| (f64::from(x) + sign * eps * f64::from(v)) as f32)
        .collect();
    Tensor::new(t.dtype, t.shape.clone(), data)
}

/// Checks `<grad, u>` against the central difference of the loss along `u`.
fn check_direction(what: &str, grad: &[f32], u: &[f32], plus: f64, minus: f64, eps: f64) {
    let analytic = dot(grad, u);
    let numeric = (plus - minus) / (2.0 * eps);
    let scale = dot(grad, grad).sqrt() * dot(u, u).sqrt();
    let err = (analytic - numeric).abs();
    assert!(
        err <= 1e-2 * (analytic.abs() + numeric.abs()) + 1e-3 * scale,
        "{what}: gradient · u = {analytic}, finite difference {numeric} (|grad|·|u| = {scale})"
    );
}

#[test]
fn gradients_match_finite_differences_on_every_op() {
    let text =
        std::fs::read_to_string(root().join("tests/models/every_grad_op.ppc")).expect("model");
    let mut m = load(&text, &Overrides::default());
    compile(&mut m, &train_opts(false, Remat::Stage), None, None).expect("compile");
    let layer = m.func("layer").expect("@layer").clone();
    let eps = 1e-3;
    for seed in 0..3u64 {
        let mut interp = Interp::new(&m, seed);
        let inputs = interp.synthetic_inputs();
        let d = synthetic_cotangent(&m, seed);
        let grads = interp.sequential_vjp(&inputs, &d).expect("gradients");
        // Along a random direction of the inputs.
        let u = Rng::stream(seed, "direction", 0).fill(Init::Normal(1.0), inputs.len());
        let shifted = |sign: f64| moved(&inputs, &u, sign, eps);
        let (plus, minus) = (
            loss(&mut Interp::new(&m, seed), &shifted(1.0), &d),
            loss(&mut Interp::new(&m, seed), &shifted(-1.0), &d),
        );
        check_direction(
            &format!("seed {seed}: inputs"),
            &grads.inputs.as_ref().expect("float inputs").data,
            &u,
            plus,
            minus,
            eps,
        );
        // Along a random direction of each parameter of each layer.
        for (i, (name, per_layer)) in grads.params.iter().enumerate() {
            for (l, g) in per_layer.iter().enumerate() {
                let mut base = Interp::new(&m, seed);
                let ty = layer.ty(layer.params[i].value);
                let w = ppc_dialect::interp::materialize(
                    &ppc_runtime::init::Source::Seeded(seed),
                    name,
                    ty,
                    &layer.params[i],
                    l as u64,
                    None,
                    m.pipeline.layers,
                )
                .expect("weights");
                let u = Rng::stream(seed, name, 1 + l as u64).fill(Init::Normal(1.0), w.len());
                let mut at = |sign: f64| {
                    base.set_param("layer", i, l as u64, moved(&w, &u, sign, eps));
                    loss(&mut base, &inputs, &d)
                };
                let (plus, minus) = (at(1.0), at(-1.0));
                check_direction(
                    &format!("seed {seed}: {name} of layer {l}"),
                    &g.data,
                    &u,
                    plus,
                    minus,
                    eps,
                );
            }
        }
    }
}

/// A small residual model with a loss, for the training-step checks.
fn trained_model(loss: &str) -> String {
    let target = match loss {
        "mse" => "f32[b, d]",
        _ => "i32[b]",
    };
    format!(
        "dims {{ b = 3, d = 5, h = 7 }}
pipeline {{ stages = 2, layers_per_stage = 2, microbatches = 3, repeats = 2 }}
input f32[b, d]
target {target}
loss {loss}

func @layer(%x: f32[b, d]) -> f32[b, d] {{
  param %w1: f32[d, h] = normal(0.5)
  param %b1: f32[h] = uniform(-0.2, 0.2)
  param %w2: f32[h, d] = normal(0.5)
  %n = layernorm %x, axis = 1, eps = 0.001
  %u = matmul %n, %w1
  %v = add %u, %b1
  %a = gelu %v
  %o = matmul %a, %w2
  %y = add %x, %o
  return %y
}}
"
    )
}

#[test]
fn loss_gradients_match_finite_differences() {
    for loss_name in ["mse", "softmax_cross_entropy"] {
        let mut m = load(&trained_model(loss_name), &Overrides::default());
        compile(&mut m, &train_opts(true, Remat::Stage), None, None).expect("compile for training");
        let seed = 3;
        let mut interp = Interp::new(&m, seed);
        let inputs = interp.synthetic_inputs();
        let t = synthetic_targets(&m, seed);
        let step = interp.train_step(&inputs, &t).expect("train step");
        assert!(
            step.loss.is_finite() && step.loss > 0.0,
            "{loss_name}: loss {}",
            step.loss
        );
        let train = m.func("train").expect("@train");
        let stage = m.func("stage").expect("@stage");
        let eps = 1e-3;
        for (i, (name, per_layer)) in step.grads.params.iter().enumerate() {
            let p = &stage.params[i];
            let w = ppc_dialect::interp::materialize(
                &ppc_runtime::init::Source::Seeded(seed),
                name,
                stage.ty(p.value),
                p,
                0,
                None,
                m.pipeline.layers,
            )
            .expect("weights");
            let g: Vec<f32> = per_layer.iter().flat_map(|t| t.data.clone()).collect();
            let u = Rng::stream(seed, name, 99).fill(Init::Normal(1.0), w.len());
            let at = |sign: f64| {
                let mut interp = Interp::new(&m, seed);
                interp.set_param("stage", i, 0, moved(&w, &u, sign, eps));
                let r = interp
                    .call(train, vec![inputs.clone(), t.clone()], 0)
                    .expect("loss");
                f64::from(r[0].data[0])
            };
            let (plus, minus) = (at(1.0), at(-1.0));
            check_direction(&format!("{loss_name}: {name}"), &g, &u, plus, minus, eps);
        }
    }
}
