//! The `ppc` command as users run it: exit codes, what it prints, files it writes.

use crate::common::{examples, json_last_line, path, ppc, root};

#[test]
fn check_accepts_examples_and_rejects_every_error_case() {
    for ex in examples() {
        let (code, out, err) = ppc(&["check", &ex.display().to_string()]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("ok: "), "{out}");
    }
    for entry in std::fs::read_dir(root().join("tests/errors")).expect("errors dir") {
        let p = entry.expect("entry").path();
        let (code, _, err) = ppc(&["compile", &p.display().to_string()]);
        assert_eq!(code, 1, "{} should fail", p.display());
        assert!(err.contains("error"), "{err}");
        assert!(
            err.contains(&format!("{}:", p.display())),
            "no file:line:col for {}:\n{err}",
            p.display()
        );
    }
}

#[test]
fn fmt_is_a_fixed_point() {
    for ex in examples() {
        let (code, once, _) = ppc(&["fmt", &ex.display().to_string()]);
        assert_eq!(code, 0);
        let tmp = std::env::temp_dir().join(format!(
            "ppc-fmt-{}-{}",
            std::process::id(),
            ex.file_name().expect("name").to_string_lossy()
        ));
        std::fs::write(&tmp, &once).expect("write temp");
        let (code, twice, _) = ppc(&["fmt", &tmp.display().to_string()]);
        assert_eq!(code, 0);
        assert_eq!(once, twice, "fmt is not idempotent on {}", ex.display());
        // --write rewrites a file that is not in canonical form (the example itself, with
        // comments and its own spacing, squeezed further) into the canonical text, leaving no
        // temporary file behind.
        let original = std::fs::read_to_string(&ex).expect("example");
        let messy = original.replace(", ", " ,  ").replace(" = ", "=");
        assert_ne!(messy, once, "the test needs a file that fmt changes");
        std::fs::write(&tmp, &messy).expect("write temp");
        let (code, _, _) = ppc(&["fmt", "--write", &tmp.display().to_string()]);
        assert_eq!(code, 0);
        assert_eq!(std::fs::read_to_string(&tmp).expect("read back"), once);
        let leftovers = std::fs::read_dir(std::env::temp_dir())
            .expect("tmp")
            .filter(|e| {
                e.as_ref().is_ok_and(|e| {
                    e.file_name().to_string_lossy().contains(&format!(
                        "{}.tmp",
                        tmp.file_name().expect("n").to_string_lossy()
                    ))
                })
            });
        assert_eq!(leftovers.count(), 0);
        std::fs::remove_file(&tmp).expect("cleanup");
    }
}

#[test]
fn run_prints_a_summary_that_depends_on_the_seed() {
    let tiny = path("examples/tiny.ppc");
    let (code, a, _) = ppc(&["run", &tiny, "--backend", "interp", "--seed", "3"]);
    assert_eq!(code, 0);
    for key in [
        "input       f32[3, 2, 4]",
        "output      f32[3, 2, 4]",
        "checksum",
        "step time",
    ] {
        assert!(a.contains(key), "missing {key:?} in\n{a}");
    }
    let (_, b, _) = ppc(&["run", &tiny, "--backend", "interp", "--seed", "3"]);
    let (_, c, _) = ppc(&["run", &tiny, "--backend", "interp", "--seed", "4"]);
    let checksum = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("checksum"))
            .expect("checksum line")
            .to_string()
    };
    assert_eq!(checksum(&a), checksum(&b));
    assert_ne!(checksum(&a), checksum(&c));
}

#[test]
fn verify_passes_on_every_example_linear_circular_and_poisoned() {
    for ex in examples() {
        let ex = ex.display().to_string();
        for extra in [
            &[][..],
            &["--repeats", "2", "--poison-bubbles"][..],
            &["--stages", "2", "--microbatches", "2", "--repeats", "2"][..],
            &["--ranks", "2", "--repeats", "2", "--poison-bubbles"][..],
        ] {
            let mut args = vec!["verify", ex.as_str(), "--dim", "b=1"];
            args.extend(extra);
            if ex.ends_with("transformer.ppc") {
                args.extend(["--dim", "t=4"]);
            }
            let (code, out, err) = ppc(&args);
            assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
            let j = json_last_line(&out);
            assert_eq!(j["ok"], true);
            assert_eq!(j["max_abs_diff"], 0.0);
            assert_eq!(j["max_rel_diff"], 0.0);
        }
    }
}

#[test]
fn programs_split_over_ranks_need_mpi_to_run() {
    let tiny = path("examples/tiny.ppc");
    for args in [
        vec!["run", tiny.as_str(), "--ranks", "2"],
        vec!["verify", tiny.as_str(), "--ranks", "2", "--backend", "cpu"],
    ] {
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 1, "{args:?}\n{out}");
        assert!(err.contains("split over 2 ranks"), "{err}");
        assert!(err.contains("mpirun.mpich -n 2"), "{err}");
    }
    let (code, text, _) = ppc(&["schedule", &tiny, "--ranks", "2"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("stage 0 (rank 0)") && text.contains("stage 1 (rank 1)"),
        "{text}"
    );
}

#[test]
fn report_counts_the_bubble_from_the_generated_loop() {
    let mlp = path("examples/mlp.ppc");
    for (extra, s, m, r, ranks) in [
        (&[][..], 4u64, 8u64, 1u64, 1u64),
        (&["--ranks", "2"][..], 4, 8, 1, 2),
        (
            &["--repeats", "3", "--stages", "2", "--microbatches", "5"][..],
            2,
            5,
            3,
            1,
        ),
    ] {
        let mut args = vec!["compile", mlp.as_str(), "--report=json"];
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        let j = json_last_line(&out);
        let t = r * m + s - 1;
        assert_eq!(j["stages"], s);
        assert_eq!(j["microbatches"], m);
        assert_eq!(j["repeats"], r);
        assert_eq!(j["iterations"], t);
        assert_eq!(
            j["bubble_fraction"].as_f64(),
            Some((s - 1) as f64 / t as f64)
        );
        // b = 16, d = 256, h = 1024 in f32: W1, b1 and W2 of one layer per stage and repeat.
        assert_eq!(
            j["param_bytes_per_stage"],
            r * 4 * (256 * 1024 + 1024 + 1024 * 256)
        );
        assert_eq!(j["ranks"], ranks);
        assert_eq!(j["state_buffer_bytes_per_rank"], s / ranks * 16 * 256 * 4);
    }
}

#[test]
fn schedule_draws_the_loop() {
    let mlp = path("examples/mlp.ppc");
    let (code, linear, _) = ppc(&["schedule", &mlp]);
    assert_eq!(code, 0);
    insta::assert_snapshot!("schedule_4_stages_8_microbatches", linear);
    let (code, circular, _) = ppc(&[
        "schedule",
        &mlp,
        "--stages",
        "3",
        "--microbatches",
        "4",
        "--repeats",
        "2",
    ]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(
        "schedule_circular_3_stages_4_microbatches_2_repeats",
        circular
    );
    let svg = std::env::temp_dir().join(format!("ppc-schedule-{}.svg", std::process::id()));
    let (code, _, err) = ppc(&["schedule", &mlp, "--svg", &svg.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    // One rectangle per (iteration, stage) slot, 3 of every 11 iterations bubbles per stage.
    assert_eq!(text.matches("<rect x=").count(), 11 * 4);
    assert_eq!(text.matches("url(#bubble)").count(), 3 * 4);
    std::fs::remove_file(svg).expect("cleanup");
}

#[test]
fn emit_and_print_after_all() {
    let tiny = path("examples/tiny.ppc");
    let (code, out, _) = ppc(&["compile", &tiny, "--emit=vmap-stages"]);
    assert_eq!(code, 0);
    assert!(out.contains("func @stage(") && !out.contains("func @pipeline("));
    let dir = std::env::temp_dir().join(format!("ppc-dumps-{}", std::process::id()));
    let (code, _, _) = ppc(&[
        "compile",
        &tiny,
        "--print-after-all",
        &dir.display().to_string(),
    ]);
    assert_eq!(code, 0);
    // Training passes run only with `--train` (or `--emit=<pass>`).
    let forward = ppc::passes::PASSES.iter().filter(|p| !p.training);
    for (i, pass) in forward.enumerate() {
        let dump = dir.join(format!("{:02}-{}.ppc", i + 1, pass.name));
        let text = std::fs::read_to_string(&dump).expect("dump written");
        // A dump parses back and verifies; as a model, `ppc check` would refuse the
        // compiler's own functions and ops in it.
        let m = ppc_dialect::parse(&text, &ppc_dialect::Overrides::default())
            .unwrap_or_else(|d| panic!("{}", ppc_dialect::diag::render(pass.name, &text, &d)));
        ppc_dialect::verify::verify(&m).expect("the dump verifies");
    }
    std::fs::remove_dir_all(dir).expect("cleanup");
    let (code, _, err) = ppc(&["compile", &tiny, "--emit=no-such-pass"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("vmap-stages"),
        "the error lists the passes: {err}"
    );
}

#[test]
fn user_errors_are_clear() {
    let tiny = path("examples/tiny.ppc");
    let (code, _, err) = ppc(&["check", &tiny, "--dim", "q=3"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no dimension `q`") && err.contains("declared dimensions: b, d"),
        "{err}"
    );
    let (code, _, err) = ppc(&["check", "/no/such/model.ppc"]);
    assert_eq!(code, 1);
    assert!(err.contains("cannot read /no/such/model.ppc"), "{err}");
    let (code, _, err) = ppc(&["check", &tiny, "--dim", "d"]);
    assert_eq!(code, 2);
    assert!(err.contains("NAME=VALUE"), "{err}");
    let (code, _, err) = ppc(&["verify", &tiny, "--stages", "0"]);
    assert_eq!(code, 1);
    assert!(err.contains("`stages` is zero"), "{err}");
    let (code, _, err) = ppc(&[
        "verify",
        &tiny,
        "--stages",
        "4",
        "--microbatches",
        "2",
        "--repeats",
        "2",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("at least as many microbatches as stages"),
        "{err}"
    );
}

#[test]
fn help_explains_the_commands() {
    let (code, out, _) = ppc(&["--help"]);
    assert_eq!(code, 0);
    for cmd in ["check", "fmt", "run", "compile", "verify", "schedule"] {
        assert!(out.contains(cmd), "--help does not mention {cmd}");
    }
    let (code, out, _) = ppc(&["verify", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--poison-bubbles") && out.contains("--repeats"));
}

#[test]
fn a_model_file_that_is_not_utf8_is_located_at_its_first_bad_byte() {
    let file = std::env::temp_dir().join(format!("ppc-latin1-{}.ppc", std::process::id()));
    // Line 2, column 9: the Latin-1 `é` of "caf\xe9"; everything before it is valid.
    std::fs::write(&file, b"dims { b = 2 }\n// a caf\xe9 model\n").expect("write");
    let f = file.display().to_string();
    for cmd in ["check", "fmt", "run", "compile"] {
        let (code, out, err) = ppc(&[cmd, &f]);
        assert_eq!(code, 1, "{cmd}: {out}{err}");
        assert!(err.contains("not UTF-8: byte 0xe9"), "{cmd}: {err}");
        assert!(err.contains(&format!("{f}:2:9")), "{cmd}: {err}");
    }
    std::fs::remove_file(file).expect("cleanup");
}

#[test]
fn pipeline_settings_as_layer_dimensions_verify_bit_exactly_on_every_rank_count() {
    let model = path("tests/models/settings_as_dims.ppc");
    for ranks in ["1", "2", "4"] {
        for repeats in ["1", "2"] {
            let args = [
                "verify",
                model.as_str(),
                "--ranks",
                ranks,
                "--repeats",
                repeats,
            ];
            let (code, out, err) = ppc(&args);
            assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
            let j = json_last_line(&out);
            assert_eq!(j["bit_exact"], true, "{args:?}: {j}");
            assert_eq!(j["max_abs_diff"], 0.0, "{args:?}: {j}");
        }
    }
    // Compiled for one process, loops in the interpreter's order: the same bits.
    let args = [
        "verify",
        model.as_str(),
        "--backend",
        "cpu",
        "--exact",
        "--repeats",
        "2",
    ];
    let (code, out, err) = ppc(&args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(json_last_line(&out)["bit_exact"], true, "{out}");
}

#[test]
fn verify_grad_checks_gradients_and_can_fail() {
    let transformer = path("examples/transformer.ppc");
    for args in [
        &["--ranks", "2", "--poison-bubbles"][..],
        &["--repeats", "2", "--ranks", "4"],
        &["--backend", "cpu"],
        &["--backend", "cpu", "--dtype", "bf16", "--exact"],
        // Uneven depth: the compiled gradients' empty stage slots are no model layer's.
        &["--backend", "cpu", "--layers", "3"],
        &[
            "--backend",
            "cpu",
            "--layers",
            "5",
            "--stages",
            "2",
            "--repeats",
            "2",
        ],
    ] {
        let mut all = vec!["verify", "--grad", &transformer];
        all.extend(["--dim", "t=4", "--dim", "dh=4"]);
        all.extend(args);
        let (code, out, err) = ppc(&all);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        let j = json_last_line(&out);
        assert_eq!(j["ok"], true, "{args:?}: {j}");
        assert!(
            j["compared"].as_u64().is_some_and(|n| n > 10),
            "{args:?}: {j}"
        );
    }
    for backend in ["interp", "cpu"] {
        let args = [
            "verify",
            "--grad",
            &transformer,
            "--dim",
            "t=4",
            "--dim",
            "dh=4",
            "--backend",
            backend,
            "--perturb",
            "0",
        ];
        let (code, out, err) = ppc(&args);
        assert_eq!(
            code, 1,
            "{backend}: a perturbed result must fail\n{out}{err}"
        );
        assert_eq!(json_last_line(&out)["ok"], false);
        assert!(err.contains("differs"), "{err}");
    }
}

#[test]
fn the_training_report_counts_what_the_backward_loop_keeps() {
    let mlp = path("examples/mlp.ppc");
    let report = |extra: &[&str]| {
        let mut args = vec!["compile", &mlp, "--train", "--report=json"];
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{err}");
        json_last_line(&out)
    };
    // The MLP's shapes (examples/mlp.ppc): 4 stages, b = 16, h = 1024, f32.
    let (stages, b, h) = (4, 16, 1024);
    for ranks in [1, 2, 4] {
        let r = report(&["--ranks", &ranks.to_string()]);
        let state = r["state_buffer_bytes_per_rank"].as_u64().expect("state");
        let iterations = r["iterations"].as_u64().expect("iterations");
        // GPipe's rematerialization keeps each iteration's stage input: the state buffer.
        let stage = iterations * state;
        // Keeping everything adds, per iteration and stage, the two [b, h] activations the
        // backward reads (relu's input and output) and the stage's active flag (1 byte).
        let none = iterations * (state + stages / ranks * (2 * b * h * 4 + 1));
        let t = &r["training"];
        assert_eq!(t["remat"], "stage");
        assert_eq!(
            t["kept_activation_bytes_per_rank"], stage,
            "{ranks} ranks: {r}"
        );
        let by = &t["kept_activation_bytes_per_rank_by_remat"];
        assert_eq!(
            (&by["stage"], &by["none"]),
            (&stage.into(), &none.into()),
            "{r}"
        );
        let r = report(&["--ranks", &ranks.to_string(), "--remat", "none"]);
        assert_eq!(r["training"]["remat"], "none");
        assert_eq!(r["training"]["kept_activation_bytes_per_rank"], none);
        assert_eq!(
            &r["training"]["kept_activation_bytes_per_rank_by_remat"],
            by
        );
    }
    let (_, forward, _) = ppc(&["compile", &mlp, "--report=json"]);
    assert!(json_last_line(&forward).get("training").is_none());
    // --remat only means something for a training step.
    for (cmd, needs) in [("compile", "--train"), ("verify", "--grad")] {
        let (code, _, err) = ppc(&[cmd, &mlp, "--remat", "none"]);
        assert_eq!(code, 1, "{cmd}: {err}");
        assert!(err.contains(needs), "{cmd}: {err}");
    }
}

/// Under `--remat none` the transformer's forward keeps, per iteration, stage and layer, the
/// values its layer's rules read (`examples/transformer.ppc`): not the attention scores `%s`,
/// which only a constant multiplies (`%ss = mul %s, %scale`: `%scale` has no cotangent, so
/// nothing needs `%s`), and which are the size of the largest value kept.
#[test]
fn remat_none_keeps_only_what_the_backward_reads() {
    let transformer = path("examples/transformer.ppc");
    let args = ["compile", &transformer, "--train", "--remat", "none"];
    let (code, out, err) = ppc(&[&args[..], &["--report=json"]].concat());
    assert_eq!(code, 0, "{err}");
    let r = json_last_line(&out);
    // The example's dims: b = 2, t = 16, heads = 4, dh = 16, d = 64, f = 256; f32.
    let (b, t, heads, d, f) = (2, 16, 4, 64, 256);
    // layernorm's input and result (x, n1; x1, n2), the matmuls' other operands (h1, qh, kt,
    // vh, om, h2, a), softmax's result (p) and GELU's input (ub).
    let per_layer = (10 * b * t * d + b * heads * t * t + 2 * b * t * f) * 4;
    let count = |key: &str| r[key].as_u64().expect(key);
    let (iterations, stages) = (count("iterations"), count("stages"));
    // And the stage's active flag, a byte per iteration and stage.
    let kept = iterations * stages * (count("layers_per_stage") * per_layer + 1);
    assert_eq!(r["training"]["kept_activation_bytes_per_rank"], kept, "{r}");
}
