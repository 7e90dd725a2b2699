//! File-driven pass tests: `tests/passes/<pass>/<case>.ppc`.
//!
//! A case's first line is `// RUN: <pass> [--input FILE] [--stages S] [--microbatches M]
//! [--repeats R] [--ranks N] [--dim N=V] [--poison-bubbles] [--remat stage|none]`, its second a
//! comment saying what it checks; the
//! model is the case file itself or the `--input` file. The harness runs the pipeline up to that
//! pass, snapshots the printed IR (or the rendered diagnostic, if the pass rejects the model),
//! checks the round trip, and checks the meaning with the interpreter: after `gpipe-loop` the
//! pipelined program equals the sequential model bit for bit (a sharded one run with one thread
//! per rank); after `vmap-stages` (or `shard-stages`) every stage slice of `@stage` equals that
//! stage's layers run one by one.

use crate::common::root;
use crate::roundtrip::assert_roundtrip;
use ppc::passes::Options;
use ppc::pipeline::{compile, frontend, PipelineError};
use ppc_dialect::diag::render;
use ppc_dialect::interp::{forward_on_ranks, microbatch, stack, Interp};
use ppc_dialect::ir::names;
use ppc_dialect::{Module, Overrides};
use ppc_runtime::{DType, Init, Rng, Tensor};

struct Run {
    pass: String,
    input: Option<String>,
    overrides: Overrides,
    opts: Options,
}

fn parse_run(line: &str) -> Run {
    let rest = line
        .strip_prefix("// RUN:")
        .unwrap_or_else(|| panic!("first line must be `// RUN: <pass> ...`, got {line:?}"));
    let mut words = rest.split_whitespace();
    let pass = words.next().expect("a pass name").to_string();
    assert!(ppc::passes::find(&pass).is_some(), "unknown pass {pass}");
    let mut run = Run {
        pass,
        input: None,
        overrides: Overrides::default(),
        opts: Options::default(),
    };
    while let Some(w) = words.next() {
        let mut num = || {
            words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{w} needs a number"))
        };
        match w {
            "--stages" => run.overrides.stages = Some(num()),
            "--microbatches" => run.overrides.microbatches = Some(num()),
            "--repeats" => run.overrides.repeats = Some(num()),
            "--ranks" => run.overrides.ranks = Some(num()),
            "--poison-bubbles" => run.opts.poison_bubbles = true,
            "--remat" => {
                run.opts.remat = match words.next() {
                    Some("stage") => ppc::passes::Remat::Stage,
                    Some("none") => ppc::passes::Remat::None,
                    other => panic!("--remat stage|none, got {other:?}"),
                };
            }
            "--input" => run.input = Some(words.next().expect("--input FILE").to_string()),
            "--dim" => {
                let kv = words.next().expect("--dim N=V");
                let (k, v) = kv.split_once('=').expect("N=V");
                run.overrides
                    .dims
                    .push((k.to_string(), v.parse().expect("number")));
            }
            other => panic!("unknown RUN option {other}"),
        }
    }
    run
}

#[test]
fn pass_cases() {
    insta::glob!("..", "passes/*/*.ppc", |path| {
        let case = std::fs::read_to_string(path).expect("readable case");
        let mut lines = case.lines();
        let run = parse_run(lines.next().unwrap_or_default());
        let intent = lines.next().unwrap_or_default();
        assert!(
            intent.starts_with("//") && intent.len() > 10,
            "second line must say what the case checks"
        );
        let dir = path
            .parent()
            .and_then(|p| p.file_name())
            .expect("pass dir")
            .to_string_lossy();
        assert_eq!(dir, run.pass, "case {path:?} lives under the wrong pass");
        let (name, text) = match &run.input {
            Some(file) => (
                file.clone(),
                std::fs::read_to_string(root().join(file)).expect("readable --input"),
            ),
            None => (
                path.strip_prefix(root())
                    .expect("under the root")
                    .display()
                    .to_string(),
                case.clone(),
            ),
        };
        // A model the command line's settings make invalid: `ppc check`'s diagnostic.
        let mut m = match frontend(&text, &run.overrides) {
            Ok(m) => m,
            Err(d) => return insta::assert_snapshot!(render(&name, &text, &d)),
        };
        let before = m.clone();
        match compile(&mut m, &run.opts, Some(&run.pass), None) {
            Ok(()) => {
                let printed = assert_roundtrip(&m);
                check_meaning(&before, &m);
                insta::assert_snapshot!(printed);
            }
            Err(PipelineError::Pass(_, d)) => {
                insta::assert_snapshot!(render(&name, &text, &d));
            }
            Err(e) => panic!("{e:?}"),
        }
    });
}

/// The interpreter's verdict on a pass: same numbers before and after (and, after
/// `autodiff`, the pipelined program's gradients are the sequential model's).
fn check_meaning(before: &Module, after: &Module) {
    let seed = 7;
    if after.func(&names::vjp(names::PIPELINE)).is_some() {
        crate::grad::assert_grads_equal(after, seed, "pipelined vs sequential gradients");
    } else if after.func(names::PIPELINE).is_some() {
        let mut a = Interp::new(before, seed);
        let inputs = a.synthetic_inputs();
        let want = a.sequential(&inputs).expect("sequential runs");
        let got = forward_on_ranks(
            after,
            seed,
            &ppc_runtime::init::Source::Seeded(seed),
            &inputs,
        )
        .expect("pipeline runs");
        assert_bits_eq(&want, &got, "pipelined vs sequential");
    } else if after.func(names::STAGE).is_some() {
        check_stage_program(after, seed);
    }
}

/// Each stage slice of `@stage` equals the stage's `k` layers applied one by one with `@layer`.
pub fn check_stage_program(m: &Module, seed: u64) {
    let p = m.pipeline;
    let (stage, layer) = (
        m.func(names::STAGE).expect("@stage"),
        m.func(names::LAYER).expect("@layer"),
    );
    let x_ty = stage.arg_types()[0].clone();
    let n = x_ty.elements() as usize;
    let x = Tensor::new(
        x_ty.dtype,
        x_ty.shape_usize(),
        Rng::stream(seed, "stage-test", 0).fill(Init::Normal(1.0), n),
    );
    // A sharded `@stage` holds stages_per_rank stages: check every rank's slice.
    let local = p.stages_per_rank();
    let k = p.layers_per_stage();
    for rank in 0..p.ranks {
        let global = |i: u64| rank * local + i;
        let active = Tensor::splat(DType::I1, vec![local as usize], 1.0);
        let mut args = vec![x.clone(), active];
        let repeats: Vec<u64> = (0..local)
            .map(|i| (global(i) * 7 + 3) % p.repeats)
            .collect();
        if p.repeats > 1 {
            args.push(Tensor::from_ints(
                vec![local as usize],
                repeats.iter().map(|&r| r as i32),
            ));
        }
        let mut interp = Interp::on_rank(
            m,
            seed,
            ppc_runtime::init::Source::Seeded(seed),
            rank,
            Box::new(|x, _| Ok(x)),
        );
        let got = interp.call(stage, args, 0).expect("@stage runs").remove(0);
        let want: Vec<Tensor> = (0..local)
            .map(|i| {
                let mut y = microbatch(&x, i as usize);
                for j in 0..k {
                    let l = (repeats[i as usize] * p.stages + global(i)) * k + j;
                    y = interp
                        .call(layer, vec![y], l)
                        .expect("@layer runs")
                        .remove(0);
                }
                y
            })
            .collect();
        assert_bits_eq(
            &stack(&want),
            &got,
            &format!("@stage of rank {rank} vs per-stage layers"),
        );
    }
}

pub fn assert_bits_eq(want: &Tensor, got: &Tensor, what: &str) {
    assert_eq!(want.shape, got.shape, "{what}: shapes differ");
    let bad = want
        .data
        .iter()
        .zip(&got.data)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    if let Some(i) = bad {
        panic!(
            "{what}: element {i} differs: {} vs {}",
            want.data[i], got.data[i]
        );
    }
}

/// A function that exchanges with other ranks cannot run under `call_if`: the ranks that skip
/// it would leave their neighbours waiting. The verifier, which runs after every pass, says so.
#[test]
fn a_call_if_that_exchanges_is_rejected() {
    let text = "dims { b = 2, d = 4 }\npipeline { stages = 2, microbatches = 2, ranks = 2 }\ninput f32[b, d]\n\n\
        func @send(%x: f32[b, d]) -> f32[b, d] {\n  %y = exchange %x\n  return %y\n}\n\n\
        func @layer(%x: f32[b, d]) -> f32[b, d] {\n  %r = rank : i32[]\n  %zero = constant 0 : i32[]\n\
        \x20 %first = eq %r, %zero\n  %z = call_if @send, %first, %x\n  return %z\n}\n";
    let errors = match ppc_dialect::parse(text, &ppc_dialect::Overrides::default()) {
        Ok(m) => ppc_dialect::verify(&m).expect_err("a call_if that exchanges"),
        Err(d) => d,
    };
    let shown = ppc_dialect::diag::render("case.ppc", text, &errors);
    assert!(
        shown.contains("`@send` exchanges with the neighbouring ranks")
            && shown.contains("case.ppc:14:"),
        "{shown}"
    );
    // Without the exchange, the same call is fine.
    let fine = text.replace("%y = exchange %x", "%y = tanh %x");
    let m = ppc_dialect::parse(&fine, &ppc_dialect::Overrides::default()).expect("parses");
    ppc_dialect::verify(&m).expect("verifies");
}
