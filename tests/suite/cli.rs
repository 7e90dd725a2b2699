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
fn run_reads_inputs_steps_and_benches_at_every_opt_level() {
    use ppc_runtime::{memref::HostBuffer, safetensors};
    let tiny = path("examples/tiny.ppc");
    let dir = std::env::temp_dir().join(format!("ppc-run-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    // --input: other numbers than the seeded ones, and the interpreter's answer for them.
    let text = std::fs::read_to_string(&tiny).expect("model");
    let mut m = crate::common::load(&text, &ppc_dialect::Overrides::default());
    ppc::pipeline::compile(&mut m, &ppc::passes::Options::default(), None, None).expect("compiles");
    let mut interp = ppc_dialect::interp::Interp::new(&m, 0);
    let x = ppc_dialect::interp::Interp::new(&m, 42).synthetic_inputs();
    let want = interp.forward(&x).expect("interp");
    let input = dir.join("in.safetensors");
    safetensors::write(&input, &[("input", &HostBuffer::from_tensor(&x))]).expect("input");
    let (input_s, mut outputs) = (input.display().to_string(), Vec::new());
    for opt in ["0", "1", "2", "3"] {
        let out = dir.join(format!("out{opt}.safetensors"));
        let out_s = out.display().to_string();
        let args = [
            "run",
            &tiny,
            "--exact",
            "--opt-level",
            opt,
            "--input",
            &input_s,
        ];
        let mut args = args.to_vec();
        args.extend(["--output", &out_s, "--steps", "3"]);
        let (code, stdout, err) = ppc(&args);
        assert_eq!(code, 0, "-O{opt}: {err}");
        assert!(
            stdout.contains("median of 2 warm steps") && err.contains("step 3/3"),
            "{stdout}{err}"
        );
        let got = safetensors::read_tensor(&out, "output")
            .expect("output")
            .to_tensor();
        crate::passes::assert_bits_eq(&want, &got, &format!("ppc run -O{opt} --input"));
        outputs.push(std::fs::read(&out).expect("bytes"));
    }
    assert!(
        outputs.windows(2).all(|w| w[0] == w[1]),
        "opt levels disagree"
    );
    let (code, _, err) = ppc(&["run", &tiny, "--opt-level", "4"]);
    assert_eq!(code, 2, "{err}");
    for bad in ["i32", "f64"] {
        let (code, _, err) = ppc(&["run", &tiny, "--dtype", bad]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("not a floating-point dtype"), "{err}");
    }
    // --bench: the bubble the loop has, from the report, and compute + waiting = the step.
    let (_, report, _) = ppc(&["compile", &tiny, "--report=json", "--repeats", "2"]);
    let report: serde_json::Value = serde_json::from_str(&report).expect("report");
    let (code, out, err) = ppc(&["run", &tiny, "--bench", "2", "--repeats", "2"]);
    assert_eq!(code, 0, "{err}");
    let j = json_last_line(&out);
    assert_eq!(
        j["bubble_fraction"], report["bubble_fraction_formula"],
        "{j}"
    );
    let r = &j["per_rank"][0];
    assert_eq!(r["measured_bubble"], report["bubble_fraction"], "{j}");
    let f = |v: &serde_json::Value| v.as_f64().expect("number");
    let (step, compute, wait) = (
        f(&r["median_step_s"]),
        f(&r["compute_s"]),
        f(&r["exchange_wait_s"]),
    );
    assert!(
        (compute + wait - step).abs() <= 1e-12 * step.max(1.0),
        "{j}"
    );
    assert_eq!(j["median_step_s"], r["median_step_s"], "{j}");
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn layers_per_stage_is_a_setting_the_command_line_overrides() {
    let tiny = path("examples/tiny.ppc");
    let (code, out, err) = ppc(&["check", &tiny, "--layers-per-stage", "3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("(2 stages, 6 layers"), "{out}");
    // It replaces a file's `layers = L` too, and the pipelined program still equals the model.
    let text = std::fs::read_to_string(&tiny)
        .expect("tiny")
        .replace("layers_per_stage = 1", "layers = 8");
    let file = std::env::temp_dir().join(format!("ppc-layers-{}.ppc", std::process::id()));
    std::fs::write(&file, text).expect("write");
    let f = file.display().to_string();
    let (code, out, err) = ppc(&["check", &f, "--layers-per-stage", "3"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("(2 stages, 6 layers"), "{out}");
    std::fs::remove_file(file).expect("cleanup");
    let (code, out, _) = ppc(&["verify", &tiny, "--layers-per-stage", "4", "--repeats", "2"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(json_last_line(&out)["layers"], 16, "{out}");
    let (code, _, err) = ppc(&["check", &tiny, "--layers-per-stage", "0"]);
    assert_eq!(code, 1);
    assert!(err.contains("`layers_per_stage` is zero"), "{err}");
}

#[test]
fn time_passes_says_where_compile_time_goes() {
    let tiny = path("examples/tiny.ppc");
    let exe = std::env::temp_dir().join(format!("ppc-timed-{}", std::process::id()));
    let exe_s = exe.display().to_string();
    let (code, _, err) = ppc(&["compile", &tiny, "-o", &exe_s, "--time-passes"]);
    assert_eq!(code, 0, "{err}");
    let mut phases = Vec::new();
    for line in err
        .lines()
        .skip_while(|l| !l.contains("share  phase"))
        .skip(1)
    {
        let mut w = line.split_whitespace();
        let secs: f64 = w.next().and_then(|s| s.parse().ok()).expect("seconds");
        let name = w.skip(1).collect::<Vec<_>>().join(" ");
        phases.push((name, secs));
    }
    let names: Vec<&str> = phases.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "parse and check",
        "vmap-stages",
        "gpipe-loop",
        "MLIR CPU pipeline",
        "LLVM opt",
        "LLVM codegen",
        "link",
        "total",
    ] {
        assert!(names.contains(&want), "no `{want}` in {names:?}");
    }
    let (total, parts) = phases.split_last().expect("rows");
    let sum: f64 = parts.iter().map(|(_, s)| s).sum();
    assert!(
        (sum - total.1).abs() < 1e-3,
        "the rows add up to {sum}, the total says {}",
        total.1
    );
    // Without the flag, nothing of it.
    let (_, _, err) = ppc(&["compile", &tiny, "-o", &exe_s]);
    assert!(!err.contains("share  phase"), "{err}");
    std::fs::remove_file(exe).expect("cleanup");
}

/// Checks a `--trace` file's structure: valid trace-event JSON, per rank `steps` steps, each
/// holding the loop's `iterations` iterations (numbered from 0, as `ppc schedule` does).
pub(crate) fn assert_trace(path: &std::path::Path, ranks: u64, steps: u64, iterations: u64) {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("trace")).expect("JSON");
    let events = j["traceEvents"].as_array().expect("traceEvents");
    for rank in 0..ranks {
        let spans: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == rank)
            .collect();
        for e in &spans {
            assert!(
                e["ts"].as_f64().is_some() && e["dur"].as_f64().is_some_and(|d| d >= 0.0),
                "{e}"
            );
            assert!(e["tid"].as_u64().is_some() && e["name"].is_string(), "{e}");
        }
        let named = |prefix: &str| -> Vec<&serde_json::Value> {
            spans
                .iter()
                .copied()
                .filter(|e| e["name"].as_str().unwrap().starts_with(prefix))
                .collect()
        };
        let (step_spans, iters) = (named("step "), named("iteration "));
        assert_eq!(step_spans.len() as u64, steps, "rank {rank}");
        assert_eq!(iters.len() as u64, steps * iterations, "rank {rank}");
        for (i, it) in iters.iter().enumerate() {
            assert_eq!(
                it["args"]["iteration"],
                (i as u64 % iterations),
                "rank {rank}: {it}"
            );
            let (ts, end) = (
                it["ts"].as_f64().unwrap(),
                it["ts"].as_f64().unwrap() + it["dur"].as_f64().unwrap(),
            );
            let step = &step_spans[i / iterations as usize];
            let (s0, s1) = (
                step["ts"].as_f64().unwrap(),
                step["ts"].as_f64().unwrap() + step["dur"].as_f64().unwrap(),
            );
            assert!(
                s0 <= ts + 1.0 && end <= s1 + 1.0,
                "rank {rank}: iteration {i} outside its step"
            );
        }
        assert!(!named("GEMM").is_empty(), "rank {rank}: no GEMM spans");
        // Loop nests of generated code: named by their ops and model line, inside a step.
        let nests: Vec<&&serde_json::Value> =
            spans.iter().filter(|e| e["cat"] == "loop nest").collect();
        assert!(!nests.is_empty(), "rank {rank}: no loop nest spans");
        for n in nests {
            let name = n["name"].as_str().unwrap();
            let line = name.rsplit_once(", line ").map(|(_, l)| l.parse::<u32>());
            assert!(
                matches!(line, Some(Ok(_))),
                "rank {rank}: loop nest named {name:?}"
            );
            let ts = n["ts"].as_f64().unwrap();
            assert!(
                step_spans.iter().any(|s| {
                    let s0 = s["ts"].as_f64().unwrap();
                    s0 <= ts + 1.0 && ts <= s0 + s["dur"].as_f64().unwrap() + 1.0
                }),
                "rank {rank}: {name} outside every step"
            );
        }
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == rank),
            "rank {rank} has no name"
        );
    }
}

#[test]
fn executables_write_a_trace_of_steps_iterations_loop_nests_and_gemms() {
    // An executable, so that no other test's run shares the process it traces.
    let tiny = path("examples/tiny.ppc");
    let dir = std::env::temp_dir().join(format!("ppc-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let (exe, trace) = (dir.join("tiny"), dir.join("trace.json"));
    let exe_s = exe.display().to_string();
    let (code, _, err) = ppc(&["compile", &tiny, "--repeats", "2", "-o", &exe_s]);
    assert_eq!(code, 0, "{err}");
    let o = std::process::Command::new(&exe)
        .args(["--steps", "3", "--trace", &trace.display().to_string()])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, report, _) = ppc(&["compile", &tiny, "--report=json", "--repeats", "2"]);
    let report: serde_json::Value = serde_json::from_str(&report).expect("report");
    assert_trace(
        &trace,
        1,
        3,
        report["iterations"].as_u64().expect("iterations"),
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn verify_grad_checks_gradients_and_can_fail() {
    let transformer = path("examples/transformer.ppc");
    for args in [
        &["--ranks", "2", "--poison-bubbles"][..],
        &["--repeats", "2", "--ranks", "4"],
        &["--backend", "cpu"],
        &["--backend", "cpu", "--dtype", "bf16", "--exact"],
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
