//! File-driven lowering tests: `tests/lower/<strategy>/<case>.ppc`, one folder per strategy of
//! `compiler/src/lower/` (fusion, in-place, destinations, chains, accumulation, residency,
//! gpu-reduce, slabs, ...).
//!
//! A case's first line is `// LOWER: [FLAGS]` (`--train`, `--exact`, `--target cuda`,
//! `--stages N`, `--microbatches N`, `--ranks N`, `--remat none`), its second a comment saying what
//! it checks; then any of
//! - `// NEST: NAME`: the loop nests written for the case's functions (the `--trace` groups of
//!   the manifest on lines from the first `func` on, `mul+tanh, line 9`), all of them, in order;
//! - `// NEST-COUNT: N NAME`: exactly N loop nests of that name are written, on any line;
//! - `// CHECK: TEXT`: TEXT is in the MLIR; `// CHECK-NOT: TEXT`: it is not;
//!   `// CHECK-COUNT: N TEXT`: it is there exactly N times.
//!
//! The harness snapshots the MLIR (reviewed like the pass tests'), checks the lines above, and,
//! for the CPU on one rank, runs `ppc verify --backend cpu --exact` (with `--grad` for
//! training): the strategy keeps the meaning, bit for bit. A program over several ranks runs
//! only under MPI: the compiled schedules' tests (`one_f_one_b.rs`, `mpirun.rs`) check its bytes.

use crate::common::{ppc, root};
use ppc::lower::{self, Numerics};
use ppc::passes::{Options, Remat};
use ppc::pipeline::{compile, frontend};
use ppc_dialect::diag::render;
use ppc_dialect::Overrides;

/// A case's `// LOWER:` line.
struct Lower {
    train: bool,
    exact: bool,
    cuda: bool,
    remat: Remat,
    overrides: Overrides,
    /// The flags as `ppc verify` takes them (the model's settings).
    verify_flags: Vec<String>,
}

fn parse_lower(line: &str) -> Lower {
    let rest = line
        .strip_prefix("// LOWER:")
        .unwrap_or_else(|| panic!("first line must be `// LOWER: [FLAGS]`, got {line:?}"));
    let mut l = Lower {
        train: false,
        exact: false,
        cuda: false,
        remat: Remat::Stage,
        overrides: Overrides::default(),
        verify_flags: Vec::new(),
    };
    let mut words = rest.split_whitespace();
    while let Some(w) = words.next() {
        let mut value = || words.next().unwrap_or_else(|| panic!("{w} needs a value"));
        match w {
            "--train" => l.train = true,
            "--exact" => l.exact = true,
            "--target" => {
                assert_eq!(value(), "cuda", "--target cuda");
                l.cuda = true;
            }
            "--remat" => {
                assert_eq!(value(), "none", "--remat none");
                l.remat = Remat::None;
                l.verify_flags.extend(["--remat".into(), "none".into()]);
            }
            "--stages" | "--microbatches" | "--ranks" | "--repeats" => {
                let v = value();
                let n = Some(v.parse::<u64>().expect("a number"));
                match w {
                    "--stages" => l.overrides.stages = n,
                    "--microbatches" => l.overrides.microbatches = n,
                    "--ranks" => l.overrides.ranks = n,
                    _ => l.overrides.repeats = n,
                }
                l.verify_flags.extend([w.to_string(), v.to_string()]);
            }
            other => panic!("unknown LOWER flag {other}"),
        }
    }
    l
}

#[test]
fn lowering_cases() {
    insta::glob!("..", "lower/*/*.ppc", |path| {
        let text = std::fs::read_to_string(path).expect("readable case");
        let mut lines = text.lines();
        let l = parse_lower(lines.next().unwrap_or_default());
        let intent = lines.next().unwrap_or_default();
        assert!(
            intent.starts_with("//") && intent.len() > 10,
            "second line must say what the case checks"
        );
        let name = path
            .strip_prefix(root())
            .expect("under the root")
            .display()
            .to_string();
        let mut m = frontend(&text, &l.overrides)
            .unwrap_or_else(|d| panic!("{}", render(&name, &text, &d)));
        let opts = Options {
            train: l.train,
            remat: l.remat,
            schedule: ppc::timetable::Kind::of(&m),
            ..Options::default()
        };
        compile(&mut m, &opts, None, None).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let how = lower::Options {
            numerics: if l.exact {
                Numerics::Exact
            } else {
                Numerics::Fast
            },
            executable: false,
            replicas: 1,
            target: None,
            gpu: l.cuda.then(|| "sm_90".to_string()),
            gpu_kernels_on_cpu: false,
        };
        let lowered = lower::lower(&m, &how, &name, &text)
            .unwrap_or_else(|d| panic!("{}", render(&name, &text, &[d])));
        let mlir = &lowered.mlir;
        if let Some(generic) = reads_its_output(mlir) {
            panic!("{name}: a loop nest reads its output buffer as an input:\n{generic}");
        }
        let mut nests = Vec::new();
        for line in text.lines() {
            if let Some(want) = line.strip_prefix("// CHECK: ") {
                assert!(mlir.contains(want), "{name}: no `{want}` in\n{mlir}");
            } else if let Some(unwanted) = line.strip_prefix("// CHECK-NOT: ") {
                assert!(!mlir.contains(unwanted), "{name}: `{unwanted}` in\n{mlir}");
            } else if let Some(rest) = line.strip_prefix("// CHECK-COUNT: ") {
                let (n, want) = rest.split_once(' ').expect("`N TEXT`");
                let n: usize = n.parse().expect("a count");
                assert_eq!(mlir.matches(want).count(), n, "{name}: `{want}` in\n{mlir}");
            } else if let Some(nest) = line.strip_prefix("// NEST: ") {
                nests.push(nest.to_string());
            } else if let Some(rest) = line.strip_prefix("// NEST-COUNT: ") {
                let (n, nest) = rest.split_once(' ').expect("`N NAME`");
                let n: usize = n.parse().expect("a count");
                let groups = &lowered.manifest.groups;
                let written = groups.iter().filter(|g| *g == nest).count();
                assert_eq!(written, n, "{name}: `{nest}` nests in {groups:?}");
            }
        }
        if !nests.is_empty() {
            let first_func = 1 + text
                .lines()
                .position(|l| l.starts_with("func "))
                .expect("a func");
            let line_of = |g: &String| -> usize {
                let (_, line) = g.rsplit_once(", line ").expect("`NAME, line N`");
                line.parse().expect("a line number")
            };
            let written: Vec<&String> = lowered
                .manifest
                .groups
                .iter()
                .filter(|g| line_of(g) >= first_func)
                .collect();
            assert_eq!(
                written,
                nests.iter().collect::<Vec<_>>(),
                "{name}: the loop nests"
            );
        }
        if !l.cuda && l.overrides.ranks.is_none_or(|n| n == 1) {
            let file = root().join(&name).display().to_string();
            let mut args = vec!["verify", file.as_str(), "--backend", "cpu"];
            if l.exact {
                args.push("--exact");
            }
            if l.train {
                args.push("--grad");
            }
            args.extend(l.verify_flags.iter().map(String::as_str));
            let (code, out, err) = ppc(&args);
            assert_eq!(code, 0, "{name}: ppc {args:?}\n{out}\n{err}");
        }
        insta::assert_snapshot!(mlir.as_str());
    });
}

/// The first `linalg.generic` of `mlir` that names its output buffer among its inputs. A loop
/// nest written in place reads the output through its own block argument: as an input besides
/// the output it would alias it, and LLVM would not vectorize the loop.
fn reads_its_output(mlir: &str) -> Option<&str> {
    let names = |clause: &str| -> Vec<String> {
        clause
            .split(" : ")
            .next()
            .unwrap_or_default()
            .split(", ")
            .map(str::to_string)
            .collect()
    };
    mlir.lines()
        .filter(|l| l.contains("linalg.generic"))
        .find(|l| {
            let (Some((_, ins)), Some((_, outs))) = (l.split_once(" ins("), l.split_once(" outs("))
            else {
                return false;
            };
            let out = names(outs);
            names(ins).iter().any(|i| out.contains(i))
        })
}
