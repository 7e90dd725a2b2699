//! Helpers shared by the suite: paths, examples, running `ppc` in-process.

use ppc_dialect::{Module, Overrides};
use std::path::{Path, PathBuf};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The model files (`.ppc`) in `dir` under the repository root, sorted.
pub fn ppc_files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ppc"))
        .collect();
    v.sort();
    v
}

/// Every example model file, sorted.
pub fn examples() -> Vec<PathBuf> {
    let v = ppc_files("examples");
    assert!(v.len() >= 3, "expected the three examples, found {v:?}");
    v
}

/// The JSON object on the last line of a command's output.
pub fn json_last_line(out: &str) -> serde_json::Value {
    serde_json::from_str(out.lines().last().expect("some output")).expect("the last line is JSON")
}

/// Parses and checks a model's text, panicking with rendered diagnostics on failure.
pub fn load(text: &str, overrides: &Overrides) -> Module {
    ppc::pipeline::frontend(text, overrides).unwrap_or_else(|d| {
        panic!(
            "model does not load:\n{}",
            ppc_dialect::diag::render("<test>", text, &d)
        )
    })
}

/// The `loss` of every JSON line of a training executable's `--json` output, in order.
pub fn json_losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64())
        .collect()
}

/// Runs `ppc ARGS...` in-process: (exit status, stdout, stderr).
pub fn ppc(args: &[&str]) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut argv = vec!["ppc"];
    argv.extend(args);
    let code = ppc::cli::run(argv, &mut out, &mut err);
    (
        code,
        String::from_utf8(out).expect("utf-8 stdout"),
        String::from_utf8(err).expect("utf-8 stderr"),
    )
}

/// A path under the repository root, as a string.
pub fn path(rel: &str) -> String {
    root().join(rel).display().to_string()
}
