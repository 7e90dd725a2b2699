//! `ppc check` is complete: every model it accepts compiles, runs, verifies and trains on the
//! interpreter and the CPU backend, splits over two ranks, compiles for CUDA, and prints back
//! (`ppc fmt`) as a model it accepts again. Checked on every model file of the repository
//! (those `check` rejects are skipped: rejecting is its job) and on seeded generated models
//! whose ops are drawn from the op table, the compiler's own among them, under pipeline
//! settings that are sometimes invalid. A model that `check` accepts and a later step rejects
//! is a failure here.

use crate::common::{ppc, ppc_files, root};
use ppc_dialect::parse::signature::{signatures, Writer};
use ppc_runtime::Rng;

/// Runs every command on the model file `file`; `None` when `check` rejects it, else the
/// commands that failed after it, with their errors.
fn through_every_command(file: &str) -> Option<Vec<String>> {
    if ppc(&["check", file]).0 != 0 {
        return None;
    }
    let (_, checked, _) = ppc(&["check", file]);
    let stages: u64 = checked
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .expect("`check` prints the stage count");
    let mut commands: Vec<Vec<&str>> = vec![
        vec!["run", "--backend", "interp", "--steps", "1"],
        vec!["verify"],
        vec!["verify", "--backend", "cpu"],
        vec!["verify", "--grad"],
        vec!["compile", "--train", "--emit=mlir"],
        vec!["compile", "--target", "cuda", "--emit=mlir"],
        vec!["compile", "--target", "cuda", "--train", "--emit=mlir"],
    ];
    if stages.is_multiple_of(2) {
        commands.push(vec!["verify", "--ranks", "2"]);
    }
    let mut failures = Vec::new();
    for cmd in commands {
        let mut args = vec![cmd[0], file];
        args.extend(&cmd[1..]);
        let (code, out, err) = ppc(&args);
        if code != 0 {
            let last = out.lines().last().unwrap_or_default();
            failures.push(format!("ppc {}: {err}{last}", cmd.join(" ")));
        }
    }
    let (code, printed, err) = ppc(&["fmt", file]);
    let again = std::path::PathBuf::from(format!("{file}.fmt.ppc"));
    std::fs::write(&again, &printed).expect("scratch");
    let (code2, _, err2) = ppc(&["check", &again.display().to_string()]);
    std::fs::remove_file(&again).expect("cleanup");
    if code != 0 || code2 != 0 {
        failures.push(format!("ppc fmt, then check: {err}{err2}"));
    }
    Some(failures)
}

/// A conformance case's text with `$OP` replaced by the first op it lists.
fn instantiated(text: &str) -> String {
    let op = text
        .lines()
        .find_map(|l| l.strip_prefix("// OPS:"))
        .and_then(|ops| ops.split_whitespace().next())
        .unwrap_or_default();
    text.replace("$OP", op)
}

#[test]
fn every_model_file_that_check_accepts_runs_through_every_command() {
    let dirs = [
        "examples",
        "tests/models",
        "tests/conformance",
        "tests/errors",
    ];
    let mut files: Vec<std::path::PathBuf> = dirs.iter().flat_map(|d| ppc_files(d)).collect();
    for group in ["tests/passes", "tests/lower"] {
        for e in std::fs::read_dir(root().join(group)).expect("dir") {
            let sub = e.expect("entry").path();
            files.extend(ppc_files(
                &sub.strip_prefix(root())
                    .expect("under root")
                    .display()
                    .to_string(),
            ));
        }
    }
    let scratch = std::env::temp_dir().join(format!("ppc-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch");
    let (mut accepted, mut failures) = (0, Vec::new());
    for f in &files {
        let text = instantiated(&std::fs::read_to_string(f).expect("model"));
        let file = scratch.join(f.file_name().expect("name"));
        std::fs::write(&file, text).expect("copy");
        if let Some(fails) = through_every_command(&file.display().to_string()) {
            accepted += 1;
            failures.extend(fails.into_iter().map(|e| format!("{}: {e}", f.display())));
        }
    }
    std::fs::remove_dir_all(&scratch).expect("cleanup");
    assert!(
        accepted >= 30,
        "only {accepted} of {} models accepted",
        files.len()
    );
    assert!(
        failures.is_empty(),
        "accepted by `ppc check`, then rejected:\n{}",
        failures.join("\n")
    );
}

/// A small model whose `@layer` (and, drawn too, `@embed` and `@head` around it) has a few
/// statements drawn from the op table, with their axes drawn over both of `[b, d]`'s (seeded),
/// under pipeline settings drawn too.
fn generated(seed: u64) -> String {
    let mut rng = Rng::stream(seed, "generated-model", 0);
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    let (stages, micro, repeats) = ([2, 4][pick(2)], [2, 3, 4, 6][pick(4)], [1, 1, 2][pick(3)]);
    let mut helpers = String::new();
    let mut funcs = Vec::new();
    let with_ends = pick(2) == 1;
    for (name, prefix) in [("embed", "e"), ("layer", ""), ("head", "h")] {
        if name != "layer" && !with_ends {
            continue;
        }
        let (params, body) = drawn_body(&mut pick, prefix, &mut helpers);
        // The layer's residual keeps its depth trainable; the ends are plain chains.
        let ret = if name == "layer" {
            "  %r = add %x, %out\n  return %r"
        } else {
            "  return %out"
        };
        funcs.push(format!(
            "func @{name}(%x: f32[b, d]) -> f32[b, d] {{\n{}\n{}\n{ret}\n}}\n",
            params.join("\n"),
            body.join("\n")
        ));
    }
    format!(
        "// Generated (seed {seed}).\ndims {{ b = 4, d = 4 }}\npipeline {{ stages = {stages}, microbatches = {micro}, repeats = {repeats} }}\ninput f32[b, d]\n\n{helpers}{}",
        funcs.join("\n")
    )
}

/// A function body of a few statements drawn from the op table on `%x: f32[b, d]`, ending in
/// `%out`: its parameter lines and its statements. `prefix` keeps the names of values, helper
/// functions and parameters apart between the functions of one model.
fn drawn_body(
    pick: &mut dyn FnMut(usize) -> usize,
    prefix: &str,
    helpers: &mut String,
) -> (Vec<String>, Vec<String>) {
    let mut params = Vec::new();
    let mut body = vec![format!("  %{prefix}one = constant 1 : f32[]")];
    let one = format!("%{prefix}one");
    let mut last = "%x".to_string();
    let ops: Vec<&str> = signatures().iter().map(|s| s.name).collect();
    for i in 0..4 + pick(5) {
        let a = last.clone();
        let v = format!("%{prefix}v{i}");
        let op = ops[pick(ops.len())];
        let sig = signatures().iter().find(|s| s.name == op).expect("listed");
        let axis = pick(2);
        let lines: Vec<String> = match op {
            "exp" => vec![format!("{v}t = tanh {a}"), format!("{v} = exp {v}t")],
            "log" | "sqrt" | "rsqrt" => vec![
                format!("{v}a = abs {a}"),
                format!("{v}p = add {v}a, {one}"),
                format!("{v} = {op} {v}p"),
            ],
            "div" => vec![
                format!("{v}a = abs {a}"),
                format!("{v}p = add {v}a, {one}"),
                format!("{v} = div %x, {v}p"),
            ],
            "lt" | "le" | "eq" | "gt" | "ge" | "ne" => vec![
                format!("{v}c = {op} {a}, %x : i1[b, d]"),
                format!("{v} = select {v}c, {a}, %x"),
            ],
            "select" => vec![format!("{v}c = gt {a}, %x"), format!("{v} = select {v}c, %x, {a}")],
            "matmul" => {
                params.push(format!("  param %{prefix}w{i}: f32[d, d] = normal(1 / sqrt(d))"));
                vec![format!("{v} = matmul {a}, %{prefix}w{i}")]
            }
            "transpose" => vec![format!("{v} = transpose {a}, perm = [1, 0] : f32[d, b]")],
            "reshape" => vec![
                format!("{v}r = reshape {a} : f32[b, 2, d / 2]"),
                format!("{v} = reshape {v}r : f32[b, d]"),
            ],
            "broadcast" | "reduce_sum" | "reduce_mean" | "reduce_max" => {
                let r = if op == "broadcast" { "reduce_mean" } else { op };
                if axis == 0 {
                    vec![format!("{v}r = {r} {a}, axes = [0] : f32[d]"), format!("{v} = broadcast {v}r : f32[b, d]")]
                } else {
                    vec![
                        format!("{v}r = {r} {a}, axes = [1] : f32[b]"),
                        format!("{v}k = reshape {v}r : f32[b, 1]"),
                        format!("{v} = broadcast {v}k : f32[b, d]"),
                    ]
                }
            }
            "convert" => vec![format!("{v}h = convert {a} : bf16[b, d]"), format!("{v} = convert {v}h : f32[b, d]")],
            "slice" | "concat" => vec![
                format!("{v}l = slice {a}, start = [0, 0], end = [b, d / 2] : f32[b, d / 2]"),
                format!("{v}r = slice {a}, start = [0, d / 2], end = [b, d] : f32[b, d / 2]"),
                format!("{v} = concat {v}r, {v}l, axis = 1 : f32[b, d]"),
            ],
            "softmax" | "log_softmax" => vec![format!("{v} = {op} {a}, axis = {axis}")],
            "layernorm" => vec![format!("{v} = layernorm {a}, axis = {axis}, eps = 1e-5")],
            "iota" | "constant" => vec![
                format!("{v}i = iota axis = {axis} : f32[b, d]"),
                format!("{v}s = constant 1 / d : f32[]"),
                format!("{v}j = mul {v}i, {v}s"),
                format!("{v} = add {a}, {v}j"),
            ],
            "pad" if axis == 0 => vec![
                format!("{v}p = pad {a}, axis = 0, low = 1, high = 0, fill = 0 : f32[b + 1, d]"),
                format!("{v} = slice {v}p, start = [0, 0], end = [b, d] : f32[b, d]"),
            ],
            "pad" => vec![
                format!("{v}p = pad {a}, axis = 1, low = 1, high = 0, fill = 0 : f32[b, d + 1]"),
                format!("{v} = slice {v}p, start = [0, 0], end = [b, d] : f32[b, d]"),
            ],
            "shift" => vec![format!("{v} = shift {a}, axis = {axis}, fill = 0")],
            "index" | "update" if axis == 0 => vec![
                format!("{v}k = constant 1 : i32[]"),
                format!("{v}r = index {a}, {v}k, axis = 0 : f32[d]"),
                format!("{v}n = neg {v}r"),
                format!("{v} = update {a}, {v}n, {v}k, axis = 0"),
            ],
            "index" | "update" => vec![
                format!("{v}k = iota axis = 0 : i32[b]"),
                format!("{v}r = index {a}, {v}k, axis = 1 : f32[b]"),
                format!("{v}n = neg {v}r"),
                format!("{v} = update {a}, {v}n, {v}k, axis = 1"),
            ],
            "call" => {
                helpers.push_str(&format!(
                    "func @block{prefix}{i}(%u: f32[b, d]) -> f32[b, d] {{\n  param %{prefix}g{i}: f32[d] = ones\n  %m = mul %u, %{prefix}g{i}\n  %t = tanh %m\n  return %t\n}}\n\n"
                ));
                vec![format!("{v} = call @block{prefix}{i}, {a}")]
            }
            "loop" => vec![format!("{v} = loop {a}, trips = 2 {{\n  ^body(%{prefix}it{i}, %{prefix}c{i}):\n    %{prefix}n{i} = tanh %{prefix}c{i}\n    yield %{prefix}n{i}\n  }}")],
            "rank" => vec![format!("{v}r = rank : i32[]"), format!("{v} = tanh {a}")],
            "exchange" => vec![format!("{v} = exchange {a}")],
            _ if sig.operands == ppc_dialect::parse::signature::Arity::Exactly(1) => vec![format!("{v} = {op} {a}")],
            _ => vec![format!("{v} = {op} {a}, %x")],
        };
        body.extend(lines.into_iter().map(|l| format!("  {l}")));
        last = v;
    }
    body.push(format!("  %out = tanh {last}"));
    (params, body)
}

#[test]
fn generated_models_that_check_accepts_run_through_every_command() {
    assert!(
        signatures().iter().any(|s| s.writer == Writer::Compiler),
        "the generator draws the compiler's ops too, which `check` must reject"
    );
    let dir = std::env::temp_dir().join(format!("ppc-generated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let (mut accepted, mut with_ends, mut failures) = (0, 0, Vec::new());
    for seed in 0..96 {
        let file = dir.join(format!("gen{seed}.ppc"));
        let text = generated(seed);
        std::fs::write(&file, &text).expect("write");
        if let Some(fails) = through_every_command(&file.display().to_string()) {
            accepted += 1;
            with_ends += usize::from(text.contains("func @embed"));
            failures.extend(
                fails
                    .into_iter()
                    .map(|e| format!("seed {seed}:\n{text}\n{e}")),
            );
        }
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
    assert!(
        accepted >= 16 && with_ends >= 4,
        "only {accepted} of 96 generated models accepted, {with_ends} of them with `@embed` and `@head`"
    );
    assert!(
        failures.is_empty(),
        "accepted by `ppc check`, then rejected:\n{}",
        failures.join("\n")
    );
}
