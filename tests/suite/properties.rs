//! The pipelining property: for random stages S, microbatches M, repeats R, layers per stage k
//! and small dimensions, the pipelined program equals the sequential model bit for bit, with
//! and without poisoned bubbles, in one process and sharded over ranks; the report's bubble fraction is (S-1)/(R·M+S-1); and the
//! configurations the loop cannot route (R > 1 with M < S) are rejected with a diagnostic.

use crate::common::load;
use crate::passes::{assert_bits_eq, check_stage_program};
use ppc::passes::Options;
use ppc::pipeline::compile;
use ppc_dialect::interp::{forward_on_ranks, Interp};
use ppc_dialect::Overrides;
use ppc_runtime::Rng;

/// A small residual model with a mix of ops: matmul, bias, layernorm, tanh, a mask.
pub(crate) fn model(s: u64, m: u64, r: u64, k: u64, b: u64, d: u64, h: u64) -> String {
    format!(
        "dims {{ b = {b}, d = {d}, h = {h} }}
pipeline {{ stages = {s}, layers_per_stage = {k}, microbatches = {m}, repeats = {r} }}
input f32[b, d]

func @layer(%x: f32[b, d]) -> f32[b, d] {{
  param %w1: f32[d, h] = normal(0.6)
  param %b1: f32[h] = uniform(-0.2, 0.2)
  param %w2: f32[h, d] = normal(0.6)
  %n = layernorm %x, axis = 1, eps = 0.001
  %u = matmul %n, %w1
  %v = add %u, %b1
  %a = tanh %v
  %o = matmul %a, %w2
  %col = iota axis = 1 : i32[b, d]
  %zero = constant 0 : i32[]
  %first = eq %col, %zero
  %half = constant 0.5 : f32[]
  %o2 = mul %o, %half
  %sel = select %first, %o2, %o
  %y = add %x, %sel
  return %y
}}
"
    )
}

pub(crate) fn pick(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + rng.next_u64() % (hi - lo + 1)
}

#[test]
fn pipelined_equals_sequential_bit_for_bit() {
    let mut rng = Rng::stream(2026, "property", 0);
    let (mut ran, mut rejected, mut sharded_cases) = (0, 0, 0);
    for case in 0..80usize {
        let (s, m, r, k) = (
            pick(&mut rng, 1, 6),
            pick(&mut rng, 1, 9),
            pick(&mut rng, 1, 3),
            pick(&mut rng, 1, 3),
        );
        let (b, d, h) = (
            pick(&mut rng, 1, 3),
            pick(&mut rng, 1, 5),
            pick(&mut rng, 1, 6),
        );
        let text = model(s, m, r, k, b, d, h);
        // `ppc check` refuses a circular pipeline with fewer microbatches than stages.
        let base = match ppc::pipeline::frontend(&text, &Overrides::default()) {
            Ok(base) => base,
            Err(d) if r > 1 && m < s => {
                assert!(
                    d[0].message
                        .contains("at least as many microbatches as stages"),
                    "S={s} M={m} R={r}: {}",
                    d[0].message
                );
                rejected += 1;
                continue;
            }
            Err(d) => panic!("S={s} M={m} R={r}: {}", d[0].message),
        };
        for poison in [false, true] {
            let what =
                format!("case {case}: S={s} M={m} R={r} k={k} b={b} d={d} h={h} poison={poison}");
            let mut piped = base.clone();
            match compile(
                &mut piped,
                &Options {
                    poison_bubbles: poison,
                    ..Options::default()
                },
                None,
                None,
            ) {
                Ok(()) => {}
                Err(e) => panic!("{what}: {e:?}"),
            }
            assert!(
                !(r > 1 && m < s),
                "{what}: an unroutable circular pipeline was accepted"
            );
            let seed = case as u64;
            let mut seq = Interp::new(&base, seed);
            let inputs = seq.synthetic_inputs();
            let want = seq.sequential(&inputs).expect("sequential");
            let got = Interp::new(&piped, seed)
                .forward(&inputs)
                .expect("pipelined");
            assert!(
                want.data.iter().all(|v| v.is_finite()),
                "{what}: the reference itself is not finite"
            );
            assert_bits_eq(&want, &got, &what);
            // The same program split over ranks (one thread each) gives the same bits.
            let divisors: Vec<u64> = (2..=s).filter(|q| s.is_multiple_of(*q)).collect();
            if let Some(&ranks) = divisors.get(case % divisors.len().max(1)) {
                let over = Overrides {
                    ranks: Some(ranks),
                    ..Overrides::default()
                };
                let mut sharded = load(&text, &over);
                let opts = Options {
                    poison_bubbles: poison,
                    ..Options::default()
                };
                compile(&mut sharded, &opts, None, None).expect("sharded compile");
                let got = forward_on_ranks(
                    &sharded,
                    seed,
                    &ppc_runtime::init::Source::Seeded(seed),
                    &inputs,
                )
                .expect("sharded");
                assert_bits_eq(&want, &got, &format!("{what} ranks={ranks}"));
                sharded_cases += 1;
            }
            check_stage_program(&piped, seed);
            let report = ppc::report::report(&piped).expect("report");
            let formula = (s - 1) as f64 / (r * m + s - 1) as f64;
            assert_eq!(report["bubble_fraction"].as_f64(), Some(formula), "{what}");
            assert_eq!(report["iterations"].as_u64(), Some(r * m + s - 1), "{what}");
            ran += 1;
        }
    }
    assert!(
        ran >= 100 && rejected >= 4 && sharded_cases >= 40,
        "ran {ran}, rejected {rejected}, sharded {sharded_cases}: the generator should hit all"
    );
}

/// The examples themselves, across configurations including circular ones and poisoned bubbles.
#[test]
fn examples_pipeline_bit_exact_across_configurations() {
    let configs: &[(&str, Overrides)] = &[
        (
            "examples/tiny.ppc",
            Overrides {
                stages: Some(3),
                microbatches: Some(5),
                repeats: Some(2),
                ..Default::default()
            },
        ),
        (
            "examples/tiny.ppc",
            Overrides {
                stages: Some(2),
                microbatches: Some(2),
                repeats: Some(3),
                ..Default::default()
            },
        ),
        (
            "examples/mlp.ppc",
            Overrides {
                dims: vec![("d".into(), 32), ("h".into(), 64)],
                repeats: Some(2),
                ..Default::default()
            },
        ),
        (
            "examples/mlp.ppc",
            Overrides {
                dims: vec![("d".into(), 16), ("h".into(), 16)],
                stages: Some(2),
                microbatches: Some(3),
                ..Default::default()
            },
        ),
        (
            "examples/transformer.ppc",
            Overrides {
                dims: vec![("t".into(), 4), ("dh".into(), 4)],
                repeats: Some(2),
                ..Default::default()
            },
        ),
        (
            "examples/transformer.ppc",
            Overrides {
                dims: vec![("t".into(), 4)],
                stages: Some(2),
                microbatches: Some(4),
                ..Default::default()
            },
        ),
    ];
    for (file, ov) in configs {
        let text = std::fs::read_to_string(crate::common::root().join(file)).expect("example");
        let base = load(&text, ov);
        for poison in [false, true] {
            let mut piped = base.clone();
            compile(
                &mut piped,
                &Options {
                    poison_bubbles: poison,
                    ..Options::default()
                },
                None,
                None,
            )
            .expect("compiles");
            let mut seq = Interp::new(&base, 11);
            let inputs = seq.synthetic_inputs();
            let want = seq.sequential(&inputs).expect("sequential");
            let got = Interp::new(&piped, 11).forward(&inputs).expect("pipelined");
            assert_bits_eq(&want, &got, &format!("{file} {ov:?} poison={poison}"));
        }
    }
}
