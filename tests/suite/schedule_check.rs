//! The compile-time proof of a pipeline schedule (`ppc_dialect::schedule_check`): it covers
//! every forward and backward of every schedule the passes build (random S, M, R, k, ranks;
//! the examples), and rejects a table broken on purpose with the tick, the rank and the stage.

use crate::common::{load, ppc, root};
use crate::grad::train_opts;
use crate::properties::{model, pick};
use ppc::passes::{Options, Remat};
use ppc::pipeline::compile;
use ppc::timetable::Kind;
use ppc_dialect::ir::names;
use ppc_dialect::op::{Float, OpKind};
use ppc_dialect::schedule_check::{check, Proof};
use ppc_dialect::{Module, Overrides};
use ppc_runtime::Rng;

fn compiled(text: &str, ranks: u64, opts: &Options) -> Module {
    compiled_with(text, ranks, None, opts)
}

/// With `layers`, the model's depth: layer slots past it are empty.
fn compiled_with(text: &str, ranks: u64, layers: Option<u64>, opts: &Options) -> Module {
    let over = Overrides {
        ranks: Some(ranks),
        layers,
        ..Overrides::default()
    };
    let mut m = load(text, &over);
    compile(&mut m, opts, None, None).unwrap_or_else(|e| panic!("{e:?}"));
    m
}

fn proof(m: &Module) -> Proof {
    check(m)
        .unwrap_or_else(|d| panic!("{}", d.message))
        .expect("a pipeline to prove")
}

fn training(schedule: Kind, remat: Remat) -> Options {
    Options {
        schedule,
        ..train_opts(false, remat)
    }
}

/// Every (microbatch, layer group) forward, and in training every backward, is counted once;
/// ranks exchange in every tick they share a boundary; the bubble read off the program's stage
/// calls is the formula's, `(S-1)/(R·M+S-1)`.
fn assert_covers(p: &Proof, m: &Module, train: bool, what: &str) {
    let pl = m.pipeline;
    let formula = (pl.stages - 1) as f64 / (pl.repeats * pl.microbatches + pl.stages - 1) as f64;
    let bubble = p.bubble_fraction(pl.stages);
    assert!(
        (bubble - formula).abs() < 1e-12,
        "{what}: bubble {bubble}, formula {formula}"
    );
    let items = (pl.microbatches * pl.stages * pl.repeats) as usize;
    assert_eq!(p.forwards, items, "{what}: forwards");
    assert_eq!(
        p.backwards,
        if train { items } else { 0 },
        "{what}: backwards"
    );
    assert!(
        p.ticks >= pl.microbatches + pl.stages - 1,
        "{what}: {} ticks",
        p.ticks
    );
    if pl.ranks > 1 {
        assert!(
            p.exchanges as u64 >= p.ticks,
            "{what}: {} exchanges",
            p.exchanges
        );
    }
}

/// The microbatches whose stage input stage `stage` holds in a tape or ring for a pending
/// backward at most, as each schedule promises: GPipe every microbatch of every repeat, 1F1B
/// `S - s`, at most `M`. Stage 0 holds none: its backward reads its inputs where
/// the step holds them anyway (the step's input, and between repeats the outputs buffer), unless
/// `--remat none` keeps what its forward computed from them.
fn inputs_held(kind: Kind, remat: Remat, s: u64, m: u64, r: u64, stage: u64) -> usize {
    let held = match kind {
        // Interleaved 1F1B: stage `s` runs a forward every tick from tick `s` and a backward
        // every tick from `R·S + S - 1 - s`, where its count of held inputs stays (`S` | `M`).
        Kind::OneFOneB if r > 1 => (r * s + s - 2 * stage).min(r * m),
        _ if stage == 0 && remat != Remat::None => 0,
        Kind::OneFOneB => (s - stage).min(m),
        _ => m * r,
    };
    held as usize
}

#[test]
fn every_schedule_the_passes_build_is_proved() {
    let mut rng = Rng::stream(2026, "schedule-check", 0);
    for case in 0..16u64 {
        let (s, m, k) = (
            pick(&mut rng, 1, 5),
            pick(&mut rng, 1, 6),
            pick(&mut rng, 1, 2),
        );
        // Circular repeats need at least as many microbatches as stages; interleaved 1F1B's
        // count of held inputs below is for a multiple of them.
        let (r, m) = match case % 3 {
            0 => (pick(&mut rng, 2, 3), m.max(s).div_ceil(s) * s),
            _ => (1, m),
        };
        let text = model(s, m, r, k, 2, 3, 4);
        // Every other case one layer short of the slots: the last stage runs fewer.
        let layers = (case % 2 == 1 && s * r * k > 1).then(|| s * r * k - 1);
        for ranks in (1..=s.min(4)).filter(|n| s.is_multiple_of(*n)) {
            let what = format!("case {case}: S={s} M={m} R={r} k={k} {layers:?} ranks={ranks}");
            let compiled = |opts: &Options| compiled_with(&text, ranks, layers, opts);
            let forward = compiled(&Options::default());
            assert_covers(&proof(&forward), &forward, false, &what);
            let mut kinds = vec![(Kind::Gpipe, Remat::Stage), (Kind::Gpipe, Remat::None)];
            kinds.push((Kind::OneFOneB, Remat::Stage));
            match r {
                1 => kinds.push((Kind::OneFOneB, Remat::Tick)),
                _ => kinds.push((Kind::OneFOneB, Remat::None)),
            }
            for (kind, remat) in kinds {
                let step = compiled(&training(kind, remat));
                let what = format!("{what} {kind:?} remat {remat:?}");
                let p = proof(&step);
                assert_covers(&p, &step, true, &what);
                let held: Vec<usize> = (0..s)
                    .map(|st| inputs_held(kind, remat, s, m, r, st))
                    .collect();
                assert_eq!(p.inputs_held, held, "{what}: stage inputs held per stage");
            }
        }
    }
}

#[test]
fn the_examples_schedules_are_proved() {
    for file in ["mlp", "gpt2", "llama"] {
        let text = std::fs::read_to_string(root().join(format!("examples/{file}.ppc"))).unwrap();
        for ranks in [1, 2, 4] {
            let runs = [
                (Kind::Gpipe, Remat::Stage),
                (Kind::OneFOneB, Remat::Stage),
                (Kind::OneFOneB, Remat::Tick),
            ];
            for (kind, remat) in runs {
                let m = compiled(&text, ranks, &training(kind, remat));
                let what = format!("{file} {kind:?} --remat {} on {ranks} ranks", remat.name());
                assert_covers(&proof(&m), &m, true, &what);
            }
        }
    }
}

/// Sets the constant that defines value `name` (the first so named) in function `func`.
fn set_constant(m: &mut Module, func: &str, name: &str, value: f64) {
    let id = m.func_id(func).expect("function");
    let f = &mut m.funcs[id];
    let op = f
        .ops
        .iter()
        .map(|(id, _)| id)
        .find(|&o| f.values[f.ops[o].results[0]].name == name)
        .unwrap_or_else(|| panic!("no value %{name} in @{func}"));
    match &mut f.ops[op].kind {
        OpKind::Constant { value: v } => *v = Float(value),
        other => panic!("%{name} is {other:?}, not a constant"),
    }
}

fn broken(m: &Module) -> String {
    check(m).expect_err("a broken schedule is proved").message
}

/// Breaking the tables on purpose: the error names the tick, the rank and the stage.
#[test]
fn a_schedule_broken_on_purpose_is_rejected_with_its_tick_rank_and_stage() {
    let text = model(4, 5, 1, 1, 2, 3, 4);
    let train = names::vjp(names::TRAIN);

    // 1F1B's ring read one slot late: stage 2 reads another microbatch's kept input.
    let mut m = compiled(&text, 2, &training(Kind::OneFOneB, Remat::Stage));
    set_constant(&mut m, &train, "one", 2.0);
    let e = broken(&m);
    assert!(
        e.contains("tick ") && e.contains("rank ") && e.contains("stage "),
        "{e}"
    );
    assert!(e.contains("backward"), "{e}");

    // The recomputation for the backward run for the tick after next: the backward reads
    // another microbatch's residuals.
    let mut m = compiled(&text, 4, &training(Kind::OneFOneB, Remat::Tick));
    set_constant(&mut m, &train, "tick_ahead", 3.0);
    let e = broken(&m);
    assert!(
        e.contains("tick ") && e.contains("rank ") && e.contains("backward"),
        "{e}"
    );

    // The microbatches numbered one off where they enter and leave: the first stage runs
    // microbatch 0 twice, and the last stage's backward finds no cotangent seeded.
    let mut m = compiled(&text, 2, &training(Kind::OneFOneB, Remat::Stage));
    set_constant(&mut m, &train, "last_microbatch", 3.0);
    let e = broken(&m);
    assert!(e.contains("tick ") && e.contains("rank "), "{e}");

    // GPipe's outputs written one slot off.
    let mut m = compiled(&text, 2, &Options::default());
    set_constant(&mut m, names::PIPELINE, "last_stage", 2.0);
    let e = broken(&m);
    assert!(e.contains("output slot"), "{e}");

    // GPipe's activity mask one tick late: stage 1 runs on a bubble slot.
    let mut m = compiled(&text, 4, &Options::default());
    set_constant(&mut m, names::PIPELINE, "zero", -1.0);
    let e = broken(&m);
    assert!(
        e.contains("tick ") && e.contains("rank ") && e.contains("forward"),
        "{e}"
    );
}

/// `--report=json` gives what the proof covered: for GPT-2 in 1F1B order on 2 ranks, every
/// (microbatch, stage) forward and backward once, in `2(M+S-1)` ticks, with one exchange per
/// tick and direction, and the stage inputs each stage holds: 1F1B's `S - s`.
#[test]
fn the_report_says_what_was_proved() {
    let file = root().join("examples/gpt2.ppc").display().to_string();
    let args = [
        "compile",
        &file,
        "--train",
        "--schedule",
        "1f1b",
        "--ranks",
        "2",
        "--report=json",
    ];
    let (code, out, err) = ppc(&args);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let (s, m) = (
        r["stages"].as_u64().unwrap(),
        r["microbatches"].as_u64().unwrap(),
    );
    let p = &r["schedule_check"];
    assert_eq!(p["function"], "train_vjp", "{p}");
    assert_eq!(p["forwards_once"], s * m, "{p}");
    assert_eq!(p["backwards_once"], s * m, "{p}");
    assert_eq!(p["ticks"], 2 * (m + s - 1), "{p}");
    assert_eq!(p["exchanges_per_rank"], 2 * 2 * (m + s - 1), "{p}");
    // What the ring holds, measured on the program, is 1F1B's promise (stage 0's inputs are
    // the step's own).
    let held = p["stage_inputs_held_per_stage"].as_array().expect("held");
    assert_eq!(held.len() as u64, s, "{p}");
    assert_eq!(held[0], 0, "{p}");
    for st in 1..s {
        assert_eq!(held[st as usize], (s - st).min(m), "stage {st}: {p}");
    }
}

/// `ppc schedule MODEL --train` draws the compiled step as the proof reads it: every stage runs
/// each microbatch's forward and backward once, in the order of its schedule (1F1B: the last
/// stage runs a microbatch's backward in the tick after its forward), with the formula's bubble.
#[test]
fn schedule_train_draws_the_compiled_step() {
    let file = root().join("examples/mlp.ppc").display().to_string();
    let svg = std::env::temp_dir().join(format!("ppc-program-{}.svg", std::process::id()));
    let svg_s = svg.display().to_string();
    for kind in ["gpipe", "1f1b"] {
        let args = [
            "schedule",
            &file,
            "--train",
            "--schedule",
            kind,
            "--svg",
            &svg_s,
        ];
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{kind}: {err}");
        assert!(out.contains("formula (S-1)/(R·M+S-1) = 0.2727"), "{out}");
        assert!(
            out.contains("bubble (a forward and a backward one unit each): 0.2727"),
            "{out}"
        );
        let rows: Vec<Vec<&str>> = (out.lines())
            .filter(|l| l.trim_start().starts_with("stage ") && !l.contains(':'))
            .map(|l| l.split_whitespace().skip(2).collect())
            .collect();
        assert_eq!(rows.len(), 4, "{out}");
        for (s, row) in rows.iter().enumerate() {
            let cells = row.join(" ");
            for m in 0..8 {
                for phase in ["F", "B"] {
                    let unit = format!("{phase}{m}");
                    let n = cells.matches(&unit).count();
                    assert_eq!(n, 1, "{kind}: stage {s} runs {unit} {n} times\n{out}");
                }
            }
        }
        let at = |unit: String| rows[3].iter().position(|c| *c == unit);
        let next = (0..8).filter(|m| at(format!("B{m}")) == at(format!("F{m}")).map(|t| t + 1));
        // GPipe: only the microbatch that leaves last goes straight back.
        let want = if kind == "1f1b" { 8 } else { 1 };
        assert_eq!(next.count(), want, "{kind}\n{out}");
        let picture = std::fs::read_to_string(&svg).expect("svg");
        assert!(
            picture.starts_with("<svg") && picture.contains("F7"),
            "{kind}"
        );
    }
    std::fs::remove_file(svg).expect("cleanup");
}
