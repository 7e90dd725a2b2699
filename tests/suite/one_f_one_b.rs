//! `--schedule 1f1b` (`compiler/src/passes/one_f_one_b.rs`): the training step as one loop over
//! ticks gives GPipe's loss and every gradient bit for bit (interpreted: random S, M, k, with
//! and without poisoned bubbles, on every rank count that divides the stages; the language
//! models on 1, 2 and 4 ranks), and keeps a ring of `S` stage inputs, not GPipe's tape of
//! `M + S - 1`.

use crate::common::{json_losses, load, ppc, root};
use crate::grad::train_opts;
use crate::mpirun::{bench_json, build, launch, scratch};
use crate::passes::assert_bits_eq;
use crate::properties::{model, pick};
use ppc::passes::{Options, Remat};
use ppc::pipeline::compile;
use ppc::timetable::Kind;
use ppc_dialect::grad::{train_step_on_ranks, Step};
use ppc_dialect::interp::{synthetic_targets, Interp};
use ppc_dialect::ir::{names, Block, Func};
use ppc_dialect::op::OpKind;
use ppc_dialect::{Module, Overrides};
use ppc_runtime::init::Source;
use ppc_runtime::Rng;

fn compiled(text: &str, over: &Overrides, opts: &Options) -> Module {
    let mut m = load(text, over);
    compile(&mut m, opts, None, None).unwrap_or_else(|e| panic!("{e:?}"));
    m
}

/// One interpreted training step of `text` under `schedule`.
fn step(
    text: &str,
    over: &Overrides,
    poison: bool,
    (schedule, remat): (Kind, Remat),
    seed: u64,
) -> Step {
    let opts = Options {
        schedule,
        ..train_opts(poison, remat)
    };
    let m = compiled(text, over, &opts);
    let inputs = Interp::new(&m, seed).synthetic_inputs();
    let targets = synthetic_targets(&m, seed);
    train_step_on_ranks(&m, seed, &Source::Seeded(seed), &inputs, &targets).expect("runs")
}

fn assert_same_step(want: &Step, got: &Step, what: &str) {
    assert_eq!(want.loss.to_bits(), got.loss.to_bits(), "{what}: loss");
    assert_eq!(want.grads.params.len(), got.grads.params.len(), "{what}");
    for ((name, w), (_, g)) in want.grads.params.iter().zip(&got.grads.params) {
        for (l, (w, g)) in w.iter().zip(g).enumerate() {
            assert_bits_eq(w, g, &format!("{what}: gradient of {name} in layer {l}"));
        }
    }
    assert_eq!(
        want.grads.held_once.len(),
        got.grads.held_once.len(),
        "{what}"
    );
    for ((name, w), (_, g)) in want.grads.held_once.iter().zip(&got.grads.held_once) {
        assert_bits_eq(w, g, &format!("{what}: gradient of {name}"));
    }
}

/// The `--remat` of GPipe's step that 1F1B's under `remat` must equal: `tick` is `stage`
/// recomputing a tick earlier, which GPipe has no tick for.
fn gpipes(remat: Remat) -> Remat {
    match remat {
        Remat::Tick => Remat::Stage,
        remat => remat,
    }
}

fn over_ranks(ranks: u64) -> Overrides {
    Overrides {
        ranks: Some(ranks),
        ..Overrides::default()
    }
}

#[test]
fn one_f_one_b_gives_gpipes_loss_and_gradients_bit_for_bit() {
    same_step_as_gpipes(Kind::OneFOneB, &[Remat::Stage, Remat::Tick, Remat::None]);
}

/// Interleaved 1F1B (circular pipelines, `R > 1`): a stage runs a forward and a backward in
/// the same tick, the repeats of a group of `S` microbatches in turn, yet the step is GPipe's
/// circular one, bit for bit, on random S, M (a multiple of S or not), R and k.
#[test]
fn interleaved_one_f_one_b_gives_gpipes_loss_and_gradients_bit_for_bit() {
    let mut rng = Rng::stream(2026, "interleaved-property", 0);
    let mut sharded = 0;
    for case in 0..16u64 {
        let s = pick(&mut rng, 2, 4);
        let (m, r, k) = (
            pick(&mut rng, s, 2 * s + 1),
            pick(&mut rng, 2, 3),
            pick(&mut rng, 1, 2),
        );
        let (b, d, h) = (
            pick(&mut rng, 1, 3),
            pick(&mut rng, 1, 4),
            pick(&mut rng, 1, 5),
        );
        let text = model(s, m, r, k, b, d, h);
        let poison = case % 2 == 1;
        let remat = [Remat::Stage, Remat::None][case as usize % 2];
        for ranks in (1..=s).filter(|r| s.is_multiple_of(*r)) {
            let what = format!(
                "case {case}: S={s} M={m} R={r} k={k} b={b} d={d} h={h} poison={poison} ranks={ranks} remat={}",
                remat.name()
            );
            let over = over_ranks(ranks);
            let want = step(&text, &over, poison, (Kind::Gpipe, remat), case);
            let got = step(&text, &over, poison, (Kind::OneFOneB, remat), case);
            assert_same_step(&want, &got, &what);
            sharded += usize::from(ranks > 1);
        }
    }
    assert!(sharded >= 6, "only {sharded} cases split over ranks");
}

/// ZB-H1 runs each weight gradient a tick after its input gradient, from what the input
/// gradient stashed; the gradients still add up in GPipe's order.
#[test]
fn zb_h1_gives_gpipes_loss_and_gradients_bit_for_bit() {
    same_step_as_gpipes(Kind::ZbH1, &[Remat::Stage, Remat::None]);
}

/// `schedule` under each of `remats` in turn gives GPipe's step bit for bit, interpreted, on
/// random S, M, k, with and without poisoned bubbles, on every rank count that divides S.
fn same_step_as_gpipes(schedule: Kind, remats: &[Remat]) {
    let mut rng = Rng::stream(2026, "1f1b-property", 0);
    let mut sharded = 0;
    for case in 0..24u64 {
        let (s, m, k) = (
            pick(&mut rng, 1, 5),
            pick(&mut rng, 1, 7),
            pick(&mut rng, 1, 2),
        );
        let (b, d, h) = (
            pick(&mut rng, 1, 3),
            pick(&mut rng, 1, 4),
            pick(&mut rng, 1, 5),
        );
        let text = model(s, m, 1, k, b, d, h);
        let poison = case % 2 == 1;
        let remat = remats[case as usize % remats.len()];
        let ranks = (1..=s.min(4)).filter(|r| s.is_multiple_of(*r));
        for ranks in ranks {
            let what = format!(
                "{}, case {case}: S={s} M={m} k={k} b={b} d={d} h={h} poison={poison} ranks={ranks} remat={}",
                schedule.name(),
                remat.name()
            );
            let over = over_ranks(ranks);
            let want = step(&text, &over, poison, (Kind::Gpipe, gpipes(remat)), case);
            let got = step(&text, &over, poison, (schedule, remat), case);
            assert!(
                want.grads
                    .params
                    .iter()
                    .flat_map(|(_, ls)| ls)
                    .any(|t| t.data.iter().any(|&v| v != 0.0)),
                "{what}: every gradient is zero"
            );
            assert_same_step(&want, &got, &what);
            sharded += usize::from(ranks > 1);
        }
    }
    assert!(sharded >= 8, "only {sharded} cases split over ranks");
}

/// bf16 and f16 storage: every ticked schedule (the parity order under each `--remat`, ZB-H1,
/// the interleaved order) gives GPipe's step bit for bit, its masked cotangents in the
/// storage dtype.
#[test]
fn ticked_schedules_train_half_precision_models_with_gpipes_bytes() {
    let runs = [
        (1, Kind::OneFOneB, Remat::Stage),
        (1, Kind::OneFOneB, Remat::Tick),
        (1, Kind::ZbH1, Remat::None),
        (2, Kind::OneFOneB, Remat::Stage),
        (2, Kind::OneFOneB, Remat::None),
    ];
    for dtype in [ppc_dialect::DType::BF16, ppc_dialect::DType::F16] {
        for (r, schedule, remat) in runs {
            let text = model(2, 4, r, 1, 2, 3, 4);
            for ranks in [1, 2] {
                let over = Overrides {
                    ranks: Some(ranks),
                    float_dtype: Some(dtype),
                    ..Overrides::default()
                };
                let what = format!(
                    "{dtype:?} R={r} {} {} on {ranks} ranks",
                    schedule.name(),
                    remat.name()
                );
                let want = step(&text, &over, true, (Kind::Gpipe, gpipes(remat)), 3);
                let got = step(&text, &over, true, (schedule, remat), 3);
                assert_same_step(&want, &got, &what);
            }
        }
    }
}

/// GPT-2 (a tied embedding, cross entropy) and Llama: the head and the loss run per microbatch
/// inside the tick loop, yet the step is GPipe's, bit for bit, under 1F1B and ZB-H1, on 1, 2
/// and 4 ranks, with each `--remat`.
#[test]
fn the_language_models_train_with_gpipes_bytes_on_1_2_and_4_ranks() {
    for file in ["examples/gpt2.ppc", "examples/llama.ppc"] {
        let text = std::fs::read_to_string(root().join(file)).expect("model");
        let runs = [
            (Kind::OneFOneB, 1, Remat::Stage),
            (Kind::OneFOneB, 2, Remat::Stage),
            (Kind::OneFOneB, 4, Remat::Stage),
            (Kind::OneFOneB, 2, Remat::Tick),
            (Kind::OneFOneB, 4, Remat::Tick),
            (Kind::OneFOneB, 4, Remat::None),
            (Kind::ZbH1, 1, Remat::Stage),
            (Kind::ZbH1, 4, Remat::Stage),
            (Kind::ZbH1, 2, Remat::None),
        ];
        let circular = Overrides {
            repeats: Some(2),
            ..Overrides::default()
        };
        for ranks in [1, 2, 4] {
            let over = Overrides {
                ranks: Some(ranks),
                ..circular.clone()
            };
            let remat = [Remat::Stage, Remat::None][ranks as usize % 2];
            let what = format!("{file}, interleaved 1f1b on {ranks} ranks");
            let want = step(&text, &over, true, (Kind::Gpipe, remat), 6);
            let got = step(&text, &over, true, (Kind::OneFOneB, remat), 6);
            assert_same_step(&want, &got, &what);
        }
        for (schedule, ranks, remat) in runs {
            let what = format!(
                "{file}, {} on {ranks} ranks, --remat {}",
                schedule.name(),
                remat.name()
            );
            let over = over_ranks(ranks);
            let want = step(&text, &over, true, (Kind::Gpipe, gpipes(remat)), 5);
            let got = step(&text, &over, true, (schedule, remat), 5);
            assert!(
                !want.grads.held_once.is_empty(),
                "{what}: no @embed or @head gradients"
            );
            assert_same_step(&want, &got, &what);
        }
    }
}

/// The shapes of the values `@train_vjp`'s loops carry that hold stage inputs of several ticks:
/// a stage axis and one more axis than `@stage`'s state (GPipe's tape, 1F1B's ring).
fn kept_inputs(m: &Module) -> Vec<Vec<u64>> {
    fn walk(f: &Func, block: &Block, rank: usize, out: &mut Vec<Vec<u64>>) {
        for &id in &block.ops {
            if let OpKind::Loop { body, .. } = &f.ops[id].kind {
                for &a in &body.args[1..] {
                    let ty = f.ty(a);
                    if ty.rank() == rank + 1 && ty.stage_axis().is_some() {
                        out.push(ty.shape());
                    }
                }
                walk(f, body, rank, out);
            }
        }
    }
    let rank = m.func(names::STAGE).expect("@stage").arg_types()[0].rank();
    let f = m.func(&names::vjp(names::TRAIN)).expect("@train_vjp");
    let mut out = Vec::new();
    walk(f, &f.body, rank, &mut out);
    out
}

/// `--remat stage` keeps one tape (the stage inputs), `none` one per activation the backward
/// reads: 1F1B keeps a ring of `S` slots in place of each.
#[test]
fn one_f_one_b_keeps_a_ring_of_s_stage_inputs() {
    let (s, m) = (3u64, 8u64);
    let text = model(s, m, 1, 1, 2, 4, 3);
    for remat in [Remat::Stage, Remat::None] {
        let kept = |schedule| {
            let opts = Options {
                schedule,
                ..train_opts(false, remat)
            };
            kept_inputs(&compiled(&text, &Overrides::default(), &opts))
        };
        let gpipe = kept(Kind::Gpipe);
        let tapes = gpipe.iter().filter(|s| s[..2] == [8 + 3 - 1, 3]).count();
        let want = match remat {
            Remat::None => tapes > 1,
            _ => tapes == 1,
        };
        assert!(want, "GPipe's tapes, --remat {}: {gpipe:?}", remat.name());
        let rings = kept(Kind::OneFOneB);
        assert!(
            rings.len() == tapes && rings.iter().all(|s| s[..2] == [3, 3]),
            "1F1B's rings, --remat {}: {rings:?}",
            remat.name()
        );
    }
}

/// A tick's stage calls all run between its two exchanges (the cotangents' first, the
/// activations' last), so that ranks running a forward and a backward side by side wait for
/// each other once per tick; under `--remat tick` the backward's recomputation runs in the
/// forward tick (`@stage_recompute`, then `@stage_bwd`), under `stage` inside the backward
/// (`@stage_vjp`).
#[test]
fn every_stage_call_of_a_tick_runs_between_its_two_exchanges() {
    let text = model(4, 5, 1, 2, 2, 4, 3);
    let stage = names::STAGE.to_string();
    for (ranks, remat) in [(2, Remat::Tick), (4, Remat::Tick), (4, Remat::Stage)] {
        let opts = Options {
            schedule: Kind::OneFOneB,
            ..train_opts(false, remat)
        };
        let m = compiled(&text, &over_ranks(ranks), &opts);
        let f = m.func(&names::vjp(names::TRAIN)).expect("@train_vjp");
        let body = (f.body.ops.iter())
            .find_map(|&id| match &f.ops[id].kind {
                OpKind::Loop { body, .. }
                    if body
                        .args
                        .iter()
                        .any(|&a| names::is_tick_ring(&f.values[a].name)) =>
                {
                    Some(body)
                }
                _ => None,
            })
            .expect("the loop over ticks");
        let at = |pick: &dyn Fn(&OpKind) -> bool| -> Vec<usize> {
            (body.ops.iter().enumerate())
                .filter(|(_, &id)| pick(&f.ops[id].kind))
                .map(|(i, _)| i)
                .collect()
        };
        let callee = |k: &OpKind| match k {
            OpKind::Call { callee, .. } => Some(m.funcs[*callee].name.clone()),
            _ => None,
        };
        let calls_of = |names: &[String]| at(&|k| callee(k).is_some_and(|c| names.contains(&c)));
        let backward = match remat {
            Remat::Tick => vec![names::recompute(&stage), names::bwd(&stage)],
            _ => vec![names::vjp(&stage)],
        };
        let exchanges = at(&|k| matches!(k, OpKind::Exchange { .. }));
        let calls = calls_of(&[names::stage_forwards().as_slice(), &backward].concat());
        let what = format!(
            "{ranks} ranks, --remat {}: exchanges at {exchanges:?}, stage calls at {calls:?}",
            remat.name()
        );
        assert_eq!(exchanges.len(), 2, "{what}");
        assert_eq!(calls.len(), 1 + backward.len(), "{what}");
        assert!(
            calls.iter().all(|&c| exchanges[0] < c && c < exchanges[1]),
            "{what}"
        );
    }
}

/// Compiled: a few training steps of `--schedule 1f1b` and `zb-h1` on 1, 2 and 4 ranks give the
/// losses and the checkpoint of GPipe on one rank, byte for byte (MLP with mse, GPT-2 with a
/// tied embedding and cross entropy), and every rank's `--bench` measures the slots GPipe's
/// bubble leaves (ZB-H1's weight gradients are counted with their backwards).
#[test]
fn compiled_1f1b_and_zb_h1_train_with_gpipes_bytes_on_1_2_and_4_ranks() {
    let dir = scratch("1f1b");
    for (file, remat) in [
        ("examples/mlp.ppc", "stage"),
        ("examples/gpt2.ppc", "stage"),
        ("examples/gpt2.ppc", "tick"),
        ("examples/mlp.ppc", "none"),
    ] {
        let run = |schedule: &str, ranks: u64| {
            let remat = match (schedule, remat) {
                ("gpipe", "tick") => "stage",
                _ => remat,
            };
            let what = format!("{file} --schedule {schedule} --remat {remat} on {ranks} ranks");
            let exe = dir.join(format!("model_{schedule}_{ranks}"));
            let flags = ["--train", "--schedule", schedule, "--remat", remat];
            build(file, &exe, ranks, &flags);
            let ckpt = dir.join(format!("model_{schedule}_{ranks}.safetensors"));
            let ckpt_s = ckpt.display().to_string();
            let args = ["--steps", "4", "--json", "--save", &ckpt_s];
            let l = launch(&exe, Some(ranks), &args, &[]);
            assert_eq!(l.code, 0, "{what}\n{}", l.stderr);
            let losses = json_losses(&l.stdout);
            assert_eq!(losses.len(), 4, "{what}: one line per step\n{}", l.stdout);
            (what, losses, std::fs::read(&ckpt).expect("checkpoint"))
        };
        let (_, want_losses, want) = run("gpipe", 1);
        let schedules = match remat {
            "tick" => &["1f1b"][..],
            _ => &["1f1b", "zb-h1"][..],
        };
        for (&schedule, ranks) in schedules.iter().flat_map(|s| [(s, 1), (s, 2), (s, 4)]) {
            let (what, losses, got) = run(schedule, ranks);
            assert_eq!(want_losses, losses, "{what}: losses");
            assert!(want == got, "{what}: the checkpoint differs from GPipe's");
            let exe = dir.join(format!("model_{schedule}_{ranks}"));
            let l = launch(&exe, Some(ranks), &["--bench", "1"], &[]);
            assert_eq!(l.code, 0, "{what}\n{}", l.stderr);
            let j = bench_json(&l.stdout);
            let formula = j["bubble_fraction"].as_f64().expect("formula");
            for r in j["per_rank"].as_array().expect("per_rank") {
                let measured = r["measured_bubble"].as_f64().expect("measured");
                assert!((measured - formula).abs() < 1e-12, "{what}: {j}");
            }
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// Compiled, interleaved 1F1B (`--repeats 2`): a few training steps on 1, 2 and 4 ranks give
/// GPipe's circular losses and checkpoint on one rank, byte for byte, and every rank's
/// `--bench` counts the idle slots the report reads off the program (a tick offers each stage
/// a forward's and a backward's), which the report's time bubble, `(S-1)/(R·M+S-1)`, is below.
#[test]
fn compiled_interleaved_1f1b_trains_with_gpipes_bytes_on_1_2_and_4_ranks() {
    let dir = scratch("interleaved");
    for (file, remat) in [("examples/mlp.ppc", "stage"), ("examples/gpt2.ppc", "none")] {
        let path = root().join(file).display().to_string();
        let flags = |schedule: &'static str| {
            [
                "--train",
                "--schedule",
                schedule,
                "--remat",
                remat,
                "--repeats",
                "2",
            ]
        };
        let run = |schedule: &'static str, ranks: u64| {
            let what = format!(
                "{file} --schedule {schedule} --remat {remat} --repeats 2 on {ranks} ranks"
            );
            let exe = dir.join(format!("model_{schedule}_{ranks}"));
            build(file, &exe, ranks, &flags(schedule));
            let ckpt = dir.join(format!("model_{schedule}_{ranks}.safetensors"));
            let ckpt_s = ckpt.display().to_string();
            let l = launch(
                &exe,
                Some(ranks),
                &["--steps", "3", "--json", "--save", &ckpt_s],
                &[],
            );
            assert_eq!(l.code, 0, "{what}\n{}", l.stderr);
            let losses = json_losses(&l.stdout);
            assert_eq!(losses.len(), 3, "{what}: one line per step\n{}", l.stdout);
            (what, exe, losses, std::fs::read(&ckpt).expect("checkpoint"))
        };
        let (_, _, want_losses, want) = run("gpipe", 1);
        let mut args = vec!["compile", &path, "--report=json"];
        args.extend(flags("1f1b"));
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let slots = report["training"]["tick_loop"]["bubble_fraction"]
            .as_f64()
            .expect("slots");
        let time = report["schedule_check"]["bubble_fraction"]
            .as_f64()
            .expect("time");
        let (s, m) = (4.0, report["microbatches"].as_f64().expect("M"));
        assert!(
            (time - (s - 1.0) / (2.0 * m + s - 1.0)).abs() < 1e-12,
            "{report}"
        );
        assert!(slots > time, "{report}");
        for ranks in [1, 2, 4] {
            let (what, exe, losses, got) = run("1f1b", ranks);
            assert_eq!(want_losses, losses, "{what}: losses");
            assert!(want == got, "{what}: the checkpoint differs from GPipe's");
            let l = launch(&exe, Some(ranks), &["--bench", "1"], &[]);
            assert_eq!(l.code, 0, "{what}\n{}", l.stderr);
            let j = bench_json(&l.stdout);
            for r in j["per_rank"].as_array().expect("per_rank") {
                let measured = r["measured_bubble"].as_f64().expect("measured");
                assert!(
                    (measured - slots).abs() < 1e-12,
                    "{what}: {j} against {slots}"
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// `--report=json` reads the tick loop off the program: `2(M+S-1)` ticks, GPipe's bubble
/// `(S-1)/(M+S-1)`, and a ring of `S` stage inputs per stage in place of GPipe's `M + S - 1`. `ppc schedule` says how the 1F1B order is compiled.
#[test]
fn the_report_reads_the_tick_loop_off_the_program() {
    let mlp = root().join("examples/mlp.ppc").display().to_string();
    let report = |flags: &[&str]| {
        let mut args = vec!["compile", &mlp, "--train", "--report=json"];
        args.extend(flags);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("JSON")
    };
    let (gpipe, one) = (
        report(&["--schedule", "gpipe"]),
        report(&["--schedule", "1f1b"]),
    );
    let (s, m) = (
        one["stages"].as_u64().unwrap(),
        one["microbatches"].as_u64().unwrap(),
    );
    let t = &one["training"];
    assert_eq!(t["schedule"], "1f1b");
    assert_eq!(gpipe["training"]["schedule"], "gpipe");
    assert_eq!(t["tick_loop"]["ticks"], 2 * (m + s - 1), "{t}");
    assert_eq!(t["tick_loop"]["ring_slots_per_stage"], s, "{t}");
    let bubble = t["tick_loop"]["bubble_fraction"].as_f64().unwrap();
    assert!(
        (bubble - (s - 1) as f64 / (m + s - 1) as f64).abs() < 1e-12,
        "{t}"
    );
    let x = one["microbatch_bytes"].as_u64().unwrap();
    assert_eq!(t["kept_activation_bytes_per_rank"], s * s * x, "{t}");
    assert_eq!(
        gpipe["training"]["kept_activation_bytes_per_rank"],
        (m + s - 1) * s * x
    );
    // `--remat none`: GPipe's tapes hold M+S-1 slots of every activation the backward reads
    // and of the stage mask (a byte per stage), 1F1B's rings S slots of the activations.
    let kept = |flags: &[&str]| {
        let r = report(&[flags, &["--remat", "none"]].concat());
        r["training"]["kept_activation_bytes_per_rank"]
            .as_u64()
            .expect("bytes")
    };
    let (gpipe, one) = (
        kept(&["--schedule", "gpipe"]),
        kept(&["--schedule", "1f1b"]),
    );
    assert!(gpipe > (m + s - 1) * s * x, "{gpipe}");
    assert_eq!(one * (m + s - 1), (gpipe - (m + s - 1) * s) * s);
    // `--remat tick`: the ring of S stage inputs, and the residuals a stage recomputes in its
    // forward tick for the next tick's backward: one slot of `none`'s rings, and the stage
    // mask (a byte per stage).
    let tick = report(&["--schedule", "1f1b", "--remat", "tick"]);
    let t = &tick["training"];
    assert_eq!(t["remat"], "tick", "{t}");
    assert_eq!(
        t["kept_activation_bytes_per_rank"],
        s * s * x + one / s + s,
        "{t}"
    );
    let by = &t["kept_activation_bytes_per_rank_by_remat"];
    assert_eq!(by["tick"], t["kept_activation_bytes_per_rank"], "{t}");
    assert_eq!(by["stage"], s * s * x, "{t}");
    let (code, _, err) = ppc(&["compile", &mlp, "--train", "--remat", "tick"]);
    assert!(code != 0 && err.contains("only `--schedule 1f1b`"), "{err}");

    let (code, out, err) = ppc(&["schedule", &mlp, "--schedule", "1f1b"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("compiles this order as a lockstep loop over ticks"),
        "{out}"
    );
}

/// What `--schedule` does not build yet is refused with a precise message, not miscompiled.
#[test]
fn schedules_not_built_yet_are_refused_clearly() {
    let mlp = root().join("examples/mlp.ppc").display().to_string();
    for (extra, says) in [
        (
            &["--schedule", "zb-h1", "--remat", "tick"][..],
            "train zb-h1 with `--remat stage` or `none`",
        ),
        (
            &["--schedule", "1f1b", "--repeats", "2", "--remat", "tick"][..],
            "train it with `--remat stage` or `none`",
        ),
        (
            &["--schedule", "zb-h1", "--repeats", "2"][..],
            "`--schedule zb-h1` with `repeats` > 1 is not built",
        ),
    ] {
        let mut args = vec!["compile", &mlp, "--train"];
        args.extend(extra);
        let (code, _, err) = ppc(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `--trace` numbers the loop over ticks: `2(M+S-1)` spans "iteration τ" per run of
/// the program, in order, on every rank, and no "backward iteration" (GPipe's second loop).
#[test]
fn traces_number_the_ticks() {
    let dir = scratch("1f1b-trace");
    let exe = dir.join("model");
    build(
        "examples/mlp.ppc",
        &exe,
        2,
        &["--train", "--schedule", "1f1b"],
    );
    let trace = dir.join("trace.json");
    let trace_s = trace.display().to_string();
    let l = launch(&exe, Some(2), &["--steps", "2", "--trace", &trace_s], &[]);
    assert_eq!(l.code, 0, "{}", l.stderr);
    let text = std::fs::read_to_string(&trace).expect("trace");
    assert!(
        !text.contains("backward iteration"),
        "a tick labelled as GPipe's backward"
    );
    let j: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let ticks = 2 * (8 + 4 - 1);
    for rank in 0..2u64 {
        let named = |prefix: &'static str| {
            (j["traceEvents"].as_array().expect("events"))
                .iter()
                .filter(move |e| e["ph"] == "X" && e["pid"] == rank)
                .filter(move |e| e["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        };
        let interval = |e: &serde_json::Value| {
            let ts = e["ts"].as_f64().expect("ts");
            (ts, ts + e["dur"].as_f64().expect("dur"))
        };
        // Each step runs the tick loop once; each labelling of a synthetic batch before it
        // runs the forward pass (GPipe's iterations), outside the steps.
        let steps: Vec<(f64, f64)> = named("step ").map(interval).collect();
        assert_eq!(steps.len(), 2, "rank {rank}");
        let labellings: Vec<&str> = named("labelling synthetic batch ")
            .map(|e| e["name"].as_str().expect("a name"))
            .collect();
        assert_eq!(
            labellings,
            ["labelling synthetic batch 1", "labelling synthetic batch 2"],
            "rank {rank}"
        );
        let in_a_step = |e: &&serde_json::Value| {
            let (a, b) = interval(e);
            steps.iter().any(|&(s, t)| s <= a && b <= t)
        };
        let spans: Vec<&serde_json::Value> = named("iteration ").filter(in_a_step).collect();
        assert_eq!(spans.len(), 2 * ticks, "rank {rank}");
        for (i, e) in spans.iter().enumerate() {
            assert_eq!(e["args"]["iteration"], i % ticks, "rank {rank}: {e}");
        }
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// `schedule = 1f1b` in the model file's `pipeline` block trains in 1F1B order, `--schedule`
/// overrides it, `ppc fmt` keeps it and `ppc schedule` draws its timetable.
#[test]
fn the_model_file_can_name_the_schedule() {
    let dir = scratch("1f1b-file");
    let text = std::fs::read_to_string(root().join("examples/mlp.ppc")).expect("model");
    let named = text.replace("microbatches = 8 }", "microbatches = 8, schedule = 1f1b }");
    assert_ne!(named, text, "the pipeline block moved");
    let file = dir.join("named.ppc");
    std::fs::write(&file, &named).expect("write");
    let file = file.display().to_string();
    let schedule_of = |extra: &[&str]| {
        let mut args = vec!["compile", file.as_str(), "--train", "--report=json"];
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        let report: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        report["training"]["schedule"]
            .as_str()
            .expect("schedule")
            .to_string()
    };
    assert_eq!(schedule_of(&[]), "1f1b");
    assert_eq!(schedule_of(&["--schedule", "gpipe"]), "gpipe");
    let (code, printed, err) = ppc(&["fmt", file.as_str()]);
    assert_eq!(code, 0, "{err}");
    assert!(printed.contains("schedule = 1f1b }"), "{printed}");
    let (code, drawn, err) = ppc(&["schedule", file.as_str()]);
    assert_eq!(code, 0, "{err}");
    assert!(drawn.contains("1f1b` compiles this order"), "{drawn}");
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// `--schedule zb-h1`: the report names the compiled schedule, reads 1F1B's tick loop off it and
/// counts the stash a tick holds; `ppc schedule --train` draws each stage's weight gradient (W)
/// in the tick after its input gradient (B), the last one after the loop.
#[test]
fn zb_h1_is_reported_and_drawn_as_compiled() {
    let mlp = root().join("examples/mlp.ppc").display().to_string();
    let report = |schedule: &str| {
        let args = [
            "compile",
            &mlp,
            "--train",
            "--report=json",
            "--schedule",
            schedule,
        ];
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("JSON")
    };
    let (one, zb) = (report("1f1b"), report("zb-h1"));
    let (t1, tz) = (&one["training"], &zb["training"]);
    assert_eq!(tz["schedule"], "zb-h1", "{tz}");
    assert_eq!(tz["tick_loop"], t1["tick_loop"], "{tz}");
    let kept = |t: &serde_json::Value| t["kept_activation_bytes_per_rank"].as_u64().unwrap();
    assert!(kept(tz) > kept(t1), "the stash is counted: {tz}");
    // Weighed by their matrix products, GPipe's ticks are even, so its bubble is the formula's;
    // 1F1B's backward ticks outweigh its forward ticks, and ZB-H1 moving W into the forward
    // tick at least halves the idle time (idle over work: b / (1 - b)).
    let work_bubble = |r: &serde_json::Value| {
        r["schedule_check"]["work_bubble_fraction"]
            .as_f64()
            .unwrap()
    };
    let gpipe = report("gpipe");
    let (s, m) = (
        gpipe["stages"].as_f64().unwrap(),
        gpipe["microbatches"].as_f64().unwrap(),
    );
    assert!((work_bubble(&gpipe) - (s - 1.0) / (m + s - 1.0)).abs() < 1e-12);
    let idle = |b: f64| b / (1.0 - b);
    let (b1, bz) = (work_bubble(&one), work_bubble(&zb));
    assert!(b1 > work_bubble(&gpipe), "1F1B {b1}");
    assert!(
        idle(bz) <= 0.5 * idle(b1) + 1e-12,
        "ZB-H1 {bz} against 1F1B {b1}"
    );

    let (s, m) = (3usize, 4usize);
    let (ss, ms) = (s.to_string(), m.to_string());
    let args = [
        "schedule",
        &mlp,
        "--train",
        "--schedule",
        "zb-h1",
        "--stages",
        &ss,
        "--microbatches",
        &ms,
    ];
    let (code, out, err) = ppc(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("weight gradient (W) runs once (proved)"),
        "{out}"
    );
    let rows: Vec<Vec<&str>> = (out.lines())
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() > 1 && w[0] == "stage" && w[1].parse::<usize>().is_ok())
        .map(|w| w[2..].to_vec())
        .collect();
    assert_eq!(rows.len(), s, "{out}");
    let tick_of = |row: &[&str], unit: &str| {
        let ends = |c: &str, at: usize| !c[at..].starts_with(|d: char| d.is_ascii_digit());
        (row.iter()).position(|c| c.match_indices(unit).any(|(i, _)| ends(c, i + unit.len())))
    };
    let mut drawn = 0;
    for (g, row) in rows.iter().enumerate() {
        for n in 0..m {
            let b =
                tick_of(row, &format!("B{n}")).unwrap_or_else(|| panic!("stage {g}: B{n}\n{out}"));
            match tick_of(row, &format!("W{n}")) {
                Some(w) => {
                    assert_eq!(w, b + 1, "stage {g}: W{n} a tick after B{n}\n{out}");
                    assert!(
                        !row[w].contains('B'),
                        "stage {g}: W{n} in a forward tick\n{out}"
                    );
                    drawn += 1;
                }
                None => assert_eq!(
                    b,
                    row.len() - 1,
                    "only the last tick's W runs after the loop\n{out}"
                ),
            }
        }
    }
    assert_eq!(drawn, s * m - 1, "{out}");
}
