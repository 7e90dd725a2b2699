//! Training timetables (`compiler/src/timetable.rs`): each is sound, and with unit costs each
//! reaches the published figures (GPipe and Megatron for GPipe and 1F1B, Qi et al. 2023 for
//! ZB-H1): GPipe's and 1F1B's bubble `(S-1)/(M+S-1)`, ZB-H1's `(S-1)/(3M+S-1)`, a third of
//! it; GPipe keeps `M` stage inputs, 1F1B and ZB-H1 at most `S - s` on stage `s`.

use ppc::timetable::{Kind, Phase, TableError, Timetable, Unit};

const SHAPES: [(u64, u64); 8] = [
    (2, 3),
    (3, 5),
    (4, 4),
    (4, 8),
    (4, 16),
    (3, 7),
    (8, 32),
    (4, 2),
];

#[test]
fn timetables_are_sound_and_reach_the_published_bubbles_and_memory() {
    for (s, m) in SHAPES {
        let what = |k: Kind| format!("{} with {s} stages, {m} microbatches", k.name());
        for kind in Kind::ALL {
            let t = Timetable::build(kind, s, m);
            assert_eq!(t.check(), Ok(()), "{}\n{}", what(kind), t.text());
        }
        let gpipe = Timetable::build(Kind::Gpipe, s, m);
        // Forward M + S - 1 ticks; backward (B and W, two ticks) 2M + 2(S - 1).
        assert_eq!(
            gpipe.ticks() as u64,
            3 * m + 3 * (s - 1),
            "{}",
            what(Kind::Gpipe)
        );
        let formula = (s - 1) as f64 / (m + s - 1) as f64;
        assert!((gpipe.bubble_fraction() - formula).abs() < 1e-12);
        assert_eq!(gpipe.kept_inputs(), vec![m; s as usize]);

        let one = Timetable::build(Kind::OneFOneB, s, m);
        assert_eq!(
            one.ticks(),
            gpipe.ticks(),
            "{}: GPipe's time",
            what(Kind::OneFOneB)
        );
        let s_minus: Vec<u64> = (0..s).map(|i| (s - i).min(m)).collect();
        assert_eq!(one.kept_inputs(), s_minus, "{}", what(Kind::OneFOneB));

        if m >= s {
            let zb = Timetable::build(Kind::ZbH1, s, m);
            assert_eq!(
                zb.ticks() as u64,
                3 * m + s - 1,
                "{}\n{}",
                what(Kind::ZbH1),
                zb.text()
            );
            let formula = (s - 1) as f64 / (3 * m + s - 1) as f64;
            assert!((zb.bubble_fraction() - formula).abs() < 1e-12);
            assert!(zb.bubble_fraction() < 0.5 * one.bubble_fraction());
            assert_eq!(
                zb.kept_inputs(),
                s_minus,
                "{}: 1F1B's memory",
                what(Kind::ZbH1)
            );
            assert!(zb.pending_weight_grads().iter().all(|&p| p <= s));
        }
    }
}

#[test]
fn a_broken_timetable_is_rejected_naming_the_tick_and_the_stages() {
    let mut t = Timetable::build(Kind::OneFOneB, 3, 4);
    // 1F1B takes the last microbatch first: GPipe's order of adding weight gradients.
    let f3 = Some(Unit {
        phase: Phase::F,
        microbatch: 3,
    });
    assert_eq!(t.slots[0][0], f3);
    let w_order: Vec<u64> = (t.slots.iter())
        .filter_map(|row| row[0].filter(|u| u.phase == Phase::W).map(|u| u.microbatch))
        .collect();
    assert_eq!(w_order, [3, 2, 1, 0]);
    // Stage 1 runs that forward in the tick stage 0 computes its input.
    let at = t
        .slots
        .iter()
        .position(|row| row[1] == f3)
        .expect("stage 1 runs F3");
    t.slots[at][1] = None;
    t.slots[0][1] = f3;
    let err = t.check().expect_err("a forward before its input");
    assert!(
        matches!(
            err,
            TableError::Early {
                tick: 0,
                stage: 1,
                phase: Phase::F,
                microbatch: 3,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("before stage 0 runs its F"),
        "{err}"
    );

    // A weight gradient that never runs.
    let mut t = Timetable::build(Kind::ZbH1, 3, 4);
    let w = Some(Unit {
        phase: Phase::W,
        microbatch: 2,
    });
    let at = t
        .slots
        .iter()
        .position(|row| row[2] == w)
        .expect("stage 2 runs W2");
    t.slots[at][2] = None;
    assert_eq!(
        t.check(),
        Err(TableError::Count {
            stage: 2,
            phase: Phase::W,
            microbatch: 2,
            times: 0
        })
    );
}

/// `ppc schedule --schedule` draws a timetable for the model's settings, with its bubble beside
/// the formula and what it keeps; the compile report lists every schedule's figures.
#[test]
fn schedule_draws_each_timetable_and_the_report_lists_them() {
    let mlp = crate::common::path("examples/mlp.ppc");
    let svg = std::env::temp_dir().join(format!("ppc-timetable-{}.svg", std::process::id()));
    let svg_s = svg.display().to_string();
    let (code, out, err) = crate::common::ppc(&[
        "schedule",
        &mlp,
        "--schedule",
        "zb-h1",
        "--ranks",
        "2",
        "--svg",
        &svg_s,
    ]);
    assert_eq!(code, 0, "{err}");
    // The MLP: 4 stages, 8 microbatches; ZB-H1 takes 3M + S - 1 ticks.
    assert!(
        out.starts_with("ZB-H1 training timetable: 4 stages, 8 microbatches: 27 ticks"),
        "{out}"
    );
    assert!(out.contains("bubble 11.1%, the formula's 11.1%"), "{out}");
    assert!(out.contains("per stage: 4 3 2 1;"), "{out}");
    assert!(out.contains("stage 3 (rank 1)"), "{out}");
    assert!(
        out.contains("compiles 1F1B's lockstep loop with each backward cut in two"),
        "{out}"
    );
    let picture = std::fs::read_to_string(&svg).expect("svg written");
    assert!(
        picture.starts_with("<svg") && picture.contains(">W0<"),
        "{picture}"
    );
    std::fs::remove_file(&svg).expect("cleanup");

    let (code, out, _) = crate::common::ppc(&["schedule", &mlp, "--schedule", "gpipe"]);
    assert_eq!(code, 0);
    assert!(!out.contains("not yet compiled"), "{out}");
    // A circular pipeline's 1F1B is the interleaved order, drawn as compiled: repeat 1 of
    // microbatch 7 on stage 0 a group of S forwards after its repeat 0.
    let (code, out, err) =
        crate::common::ppc(&["schedule", &mlp, "--schedule", "1f1b", "--repeats", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("formula (S-1)/(R·M+S-1)"), "{out}");
    let stage0 = out
        .lines()
        .find(|l| l.starts_with("stage 0"))
        .expect("stage 0");
    let cells: Vec<&str> = stage0.split_whitespace().skip(2).collect();
    assert_eq!(
        cells[..5],
        ["F7/0", "F6/0", "F5/0", "F4/0", "F7/1"],
        "{out}"
    );
    let (code, _, err) =
        crate::common::ppc(&["schedule", &mlp, "--schedule", "zb-h1", "--repeats", "2"]);
    assert_eq!(code, 1);
    assert!(err.contains("without repeats"), "{err}");

    let (code, out, err) = crate::common::ppc(&["compile", &mlp, "--train", "--report=json"]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let t = &r["training"]["timetables"];
    for kind in Kind::ALL {
        let e = &t[kind.name()];
        let (got, want) = (
            e["bubble_fraction"].as_f64(),
            e["bubble_fraction_formula"].as_f64(),
        );
        assert!(
            (got.unwrap() - want.unwrap()).abs() < 1e-9,
            "{}: {e}",
            kind.name()
        );
    }
    let input = r["microbatch_bytes"].as_u64().unwrap();
    assert_eq!(t["gpipe"]["stage_input_bytes_per_rank"][0], 32 * input);
    assert_eq!(t["1f1b"]["stage_input_bytes_per_rank"][0], 10 * input);
}
