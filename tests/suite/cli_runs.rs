//! `ppc run` and the executables it compiles, as users run them: inputs and outputs at every
//! opt level, settings from the command line, where compile time goes, traces.

use crate::common::{json_last_line, path, ppc};

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
        let gemms = named("GEMM");
        assert!(!gemms.is_empty(), "rank {rank}: no GEMM spans");
        for g in gemms.iter().filter(|g| g["cat"] == "GEMM") {
            let a = &g["args"];
            for size in ["batch", "m", "n", "k"] {
                assert!(a[size].as_u64().is_some_and(|x| x >= 1), "rank {rank}: {g}");
            }
            assert!(
                a["product"].is_string() && a["accumulate"].is_boolean(),
                "rank {rank}: {g}"
            );
        }
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
    // Every GEMM is the layer's `x · w` of one stage (small stages run in parallel, each on its
    // own slice, `stage_split.rs`): one product of [b, d] · [d, d].
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("JSON");
    let shapes: std::collections::BTreeSet<String> = j["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["cat"] == "GEMM")
        .map(|e| e["args"].to_string())
        .collect();
    let want = r#"{"accumulate":false,"batch":1,"k":4,"m":2,"n":4,"product":"A·B"}"#;
    assert_eq!(shapes, [want.to_string()].into(), "GEMM spans' shapes");
    // scripts/trace-gemms.py sums them by kind: one row, 2·2·4·4 FLOPs a call.
    let o = std::process::Command::new("python3")
        .arg(path("scripts/trace-gemms.py"))
        .arg(&trace)
        .output()
        .expect("python3 runs");
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<&str> = (table.lines())
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(
        rows[0].contains("1 × [2×4]·[4×4]") && rows[0].contains("A·B"),
        "{table}"
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// A test set of any length: `--input` of N samples (`[N, ...sample]`) or of K microbatches
/// runs batch by batch, the last padded and its padding dropped; each sample's output is the
/// interpreter's for that sample (tiny's rows are independent), and a `target` beside the
/// input gives the accuracy of the outputs' largest logits, counted here independently.
#[test]
fn a_data_file_of_any_length_is_evaluated_batch_by_batch() {
    use ppc_runtime::{memref::HostBuffer, safetensors, DType, Tensor};
    let tiny = path("examples/tiny.ppc");
    let dir = crate::mpirun::scratch("samples");
    // tiny: 3 microbatches of [2, 4] a call; 7 samples are a call and a padded one.
    let text = std::fs::read_to_string(&tiny).expect("model");
    let mut m = crate::common::load(&text, &ppc_dialect::Overrides::default());
    ppc::pipeline::compile(&mut m, &ppc::passes::Options::default(), None, None).expect("compiles");
    let mut interp = ppc_dialect::interp::Interp::new(&m, 0);
    let calls: Vec<Tensor> = [5, 6]
        .iter()
        .map(|&seed| ppc_dialect::interp::Interp::new(&m, seed).synthetic_inputs())
        .collect();
    let want: Vec<Tensor> = calls
        .iter()
        .map(|x| interp.forward(x).expect("interp"))
        .collect();
    let samples: Vec<f32> = calls
        .iter()
        .flat_map(|x| x.data.clone())
        .take(7 * 4)
        .collect();
    let targets = [3, 0, 1, 2, 2, 1, 0];
    let write = |name: &str, input: Tensor, target: Option<Tensor>| {
        let file = dir.join(name);
        let mut tensors = vec![("input", HostBuffer::from_tensor(&input))];
        tensors.extend(target.map(|t| ("target", HostBuffer::from_tensor(&t))));
        let named: Vec<(&str, &HostBuffer)> = tensors.iter().map(|(n, b)| (*n, b)).collect();
        safetensors::write(&file, &named).expect("write");
        file.display().to_string()
    };
    let by_sample = write(
        "samples.safetensors",
        Tensor::new(DType::F32, vec![7, 4], samples.clone()),
        Some(Tensor::from_ints(vec![7], targets)),
    );
    let out = dir.join("out.safetensors").display().to_string();
    let (code, stdout, err) = ppc(&[
        "run", &tiny, "--exact", "--input", &by_sample, "--output", &out,
    ]);
    assert_eq!(code, 0, "{err}");
    let got = safetensors::read_tensor(std::path::Path::new(&out), "output").expect("output");
    let got = got.to_tensor();
    assert_eq!(got.shape, vec![7, 4]);
    let expected: Vec<f32> = want
        .iter()
        .flat_map(|y| y.data.clone())
        .take(7 * 4)
        .collect();
    assert_eq!(
        got.data, expected,
        "each sample's output is the interpreter's"
    );
    let hits = got
        .data
        .chunks(4)
        .zip(targets)
        .filter(|(row, t)| {
            let best = row.iter().cloned().fold(f32::MIN, f32::max);
            row.iter().position(|&v| v == best) == Some(*t as usize)
        })
        .count();
    let line = format!("({hits} of 7 rows)");
    assert!(stdout.contains(&line), "{line} in\n{stdout}");
    // Five microbatches: the output keeps the layout, [5, 2, 4].
    let five = Tensor::new(
        DType::F32,
        vec![5, 2, 4],
        calls[0]
            .data
            .iter()
            .chain(&calls[1].data)
            .take(40)
            .cloned()
            .collect(),
    );
    let by_microbatch = write("microbatches.safetensors", five, None);
    let (code, _, err) = ppc(&[
        "run",
        &tiny,
        "--exact",
        "--input",
        &by_microbatch,
        "--output",
        &out,
    ]);
    assert_eq!(code, 0, "{err}");
    let got = safetensors::read_tensor(std::path::Path::new(&out), "output").expect("output");
    assert_eq!(got.shape, vec![5, 2, 4]);
    assert_eq!(
        got.to_tensor().data[..],
        want.iter()
            .flat_map(|y| y.data.clone())
            .take(40)
            .collect::<Vec<_>>()[..]
    );
    // A class id the outputs do not have is refused, naming the row.
    let bad = write(
        "bad.safetensors",
        Tensor::new(DType::F32, vec![7, 4], samples),
        Some(Tensor::from_ints(vec![7], [0, 1, 2, 3, 4, 0, 0])),
    );
    let (code, _, err) = ppc(&["run", &tiny, "--input", &bad]);
    assert_ne!(code, 0);
    assert!(
        err.contains("holds 4 at row 4, outside the model's 4 classes"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}
