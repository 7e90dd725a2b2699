//! The README and the guides in `docs/` as a user reads them: every command they show runs, in
//! order, and must succeed.
//!
//! Commands are the lines of fenced `console` blocks that start with `$ ` (a line ending in `\`
//! goes on in the next); lines starting with `#` are comments, and the other lines are output
//! shown to the reader, which is not compared (it holds timings). `python` blocks are programs
//! the page asks the reader to run: they run under `python3`. Each page's blocks run in a
//! scratch directory of its own, in the page's order (a later command may use what an earlier
//! one wrote), with the repository's `examples/` and `scripts/` linked in and the `ppc` built
//! beside this test (`target/debug/ppc`: `make test` builds it; after changing the compiler,
//! `cargo build -p ppc -p ppc-exe` before running this alone) first on the `PATH`.
//!
//! A block marked ```` ```console no-run ```` is shown, not run. Each of its commands must be
//! one of these kinds, each for the reason given:
//! - `make ...`: `make run` and `make test` build everything and run every test (this one
//!   included), and `make bench*` take minutes to a quarter of an hour;
//! - `apt-get ...`: installs system packages (which `scripts/setup.sh`, run by `make test`, has
//!   installed already);
//! - a command that needs an NVIDIA GPU: it names `cuda` (an executable compiled with
//!   `--target cuda` run at once, `--backend cuda`, `PPC_CUDA_*`) or runs
//!   `scripts/gpu-check.sh` (whose `prepare` half builds every case, for a GPU host);
//! - `mpirun.mpich ... -hosts ...`: a launch over several machines.
//!
//! Shell blocks are `console` blocks only (no `sh`, `bash` or `shell`): one convention, in which
//! a command is told from its output by its `$ `.

use crate::common::root;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// No command may take longer; `timeout` kills it, and the test fails.
const LIMIT_S: u64 = 300;

/// A fenced block: its info string, the line of its opening fence (from 1), and its lines.
struct Block {
    info: String,
    line: usize,
    lines: Vec<String>,
}

impl Block {
    fn language(&self) -> &str {
        self.info.split_whitespace().next().unwrap_or("")
    }

    fn no_run(&self) -> bool {
        self.info.split_whitespace().skip(1).any(|w| w == "no-run")
    }

    /// The commands of a `console` block: (line in the page, command text).
    fn commands(&self) -> Vec<(usize, String)> {
        let mut out: Vec<(usize, String)> = Vec::new();
        let mut continued = false;
        for (i, l) in self.lines.iter().enumerate() {
            if continued {
                let last = out.last_mut().expect("invariant: a command continues");
                last.1.push('\n');
                last.1.push_str(l);
            } else if let Some(c) = l.strip_prefix("$ ") {
                out.push((self.line + 1 + i, c.to_string()));
            } else {
                continue;
            }
            continued = l.ends_with('\\');
        }
        out
    }
}

/// The fenced blocks of a page.
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, l) in text.lines().enumerate() {
        let Some(info) = l.strip_prefix("```") else {
            if let Some(b) = open.as_mut() {
                b.lines.push(l.to_string());
            }
            continue;
        };
        match open.take() {
            Some(b) => out.push(b),
            None => {
                open = Some(Block {
                    info: info.trim().to_string(),
                    line: i + 1,
                    lines: Vec::new(),
                })
            }
        }
    }
    assert!(open.is_none(), "a fenced block is not closed");
    out
}

/// The README and every page of `docs/`, relative to the repository's root, sorted.
fn pages() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| format!("docs/{}", p.file_name().expect("a name").to_string_lossy()))
        .collect();
    v.sort();
    v.insert(0, "README.md".to_string());
    v
}

fn read(page: &str) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"))
}

/// Why a command of a `no-run` block is not run, or `None` if it is none of the listed kinds.
fn not_run_because(command: &str) -> Option<&'static str> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let first = words
        .iter()
        .find(|w| !w.contains('='))
        .copied()
        .unwrap_or("");
    if first == "make" {
        Some("make")
    } else if words.contains(&"apt-get") {
        Some("installs system packages")
    } else if command.to_lowercase().contains("cuda") || command.contains("scripts/gpu-check.sh") {
        Some("needs a GPU")
    } else if first == "mpirun.mpich" && words.contains(&"-hosts") {
        Some("several machines")
    } else {
        None
    }
}

#[test]
fn shell_blocks_are_console_blocks_and_not_run_only_for_the_listed_reasons() {
    let mut problems = Vec::new();
    for page in pages() {
        for b in blocks(&read(&page)) {
            let at = format!("{page}:{}", b.line);
            match b.language() {
                "console" | "python" | "text" | "ppc" => {}
                "sh" | "bash" | "shell" | "" => problems.push(format!(
                    "{at}: a ```{} block: write shell commands in a ```console block, each after `$ `",
                    b.info
                )),
                other => problems.push(format!("{at}: a block of `{other}`, which this test does not know")),
            }
            if b.language() != "console" {
                continue;
            }
            let commands = b.commands();
            if commands.is_empty() {
                problems.push(format!("{at}: a console block without a `$ ` command"));
            }
            // A command written without its `$ ` would pass silently as output.
            for (i, l) in b.lines.iter().enumerate() {
                let command_like = ["ppc ", "./", "mpirun", "make ", "python3 "]
                    .iter()
                    .any(|p| l.starts_with(p));
                let in_command = commands
                    .iter()
                    .any(|(line, c)| (*line..line + c.lines().count()).contains(&(b.line + 1 + i)));
                if command_like && !in_command {
                    problems.push(format!(
                        "{page}:{}: `{l}` looks like a command: start it with `$ `",
                        b.line + 1 + i
                    ));
                }
            }
            if b.no_run() {
                for (line, c) in &commands {
                    if not_run_because(c).is_none() {
                        problems.push(format!(
                            "{page}:{line}: `{c}` is in a no-run block but is none of the kinds \
                             tests/suite/guides.rs lists: move it to a block that runs"
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The `ppc` built beside this test binary (`target/<profile>/ppc`).
fn ppc_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    exe.ancestors()
        .skip(1)
        .take(3)
        .find(|d| d.join("ppc").is_file() && d.join("libppc_exe.a").is_file())
        .unwrap_or_else(|| {
            panic!(
                "no ppc and libppc_exe.a beside {}: build them with `cargo build -p ppc -p ppc-exe` (`make test` does)",
                exe.display()
            )
        })
        .to_path_buf()
}

/// The last `n` bytes of `s` (from a character boundary).
fn tail(s: &[u8], n: usize) -> String {
    let s = String::from_utf8_lossy(s);
    let start = s.len().saturating_sub(n);
    let start = (start..=s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    s[start..].to_string()
}

/// Runs `cmd` (with `stdin` fed to it) in `dir`; panics with what it printed unless it succeeds.
fn run(mut cmd: Command, stdin: Option<&str>, what: &str, dir: &Path) {
    use std::io::Write;
    let started = Instant::now();
    let mut child = cmd
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let mut input = child.stdin.take().expect("piped stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    let o = child.wait_with_output().expect("wait");
    let took = started.elapsed().as_secs_f64();
    assert!(
        o.status.success(),
        "{what}\nfailed ({}, after {took:.1} s; in {}):\n--- stdout (end)\n{}\n--- stderr (end)\n{}",
        match o.status.code() {
            Some(124) => format!("killed after {LIMIT_S} s"),
            Some(c) => format!("exit status {c}"),
            None => "killed by a signal".to_string(),
        },
        dir.display(),
        tail(&o.stdout, 3000),
        tail(&o.stderr, 3000)
    );
    eprintln!("{what}: {took:.1} s");
}

/// Runs every command and program of `page` in a scratch directory of its own.
fn run_page(page: &str) {
    let stem = page.trim_end_matches(".md").replace('/', "-");
    let dir = std::env::temp_dir().join(format!("ppc-guide-{stem}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("clear the scratch directory");
    }
    std::fs::create_dir_all(&dir).expect("scratch directory");
    for linked in ["examples", "scripts"] {
        std::os::unix::fs::symlink(root().join(linked), dir.join(linked)).expect("link");
    }
    let path = format!(
        "{}:{}",
        ppc_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for b in blocks(&read(page)) {
        match b.language() {
            "console" if !b.no_run() => {
                for (line, c) in b.commands() {
                    let mut cmd = Command::new("timeout");
                    cmd.arg(LIMIT_S.to_string())
                        .args(["bash", "-o", "pipefail", "-c", &c])
                        .env("PATH", &path);
                    run(cmd, None, &format!("{page}:{line}: $ {c}"), &dir);
                    ran += 1;
                }
            }
            "python" => {
                let mut cmd = Command::new("timeout");
                cmd.arg(LIMIT_S.to_string()).args(["python3", "-"]);
                let program = b.lines.join("\n");
                run(
                    cmd,
                    Some(&program),
                    &format!("{page}:{}: python", b.line),
                    &dir,
                );
                ran += 1;
            }
            _ => {}
        }
    }
    eprintln!("{page}: {ran} commands and programs ran");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn the_readme_runs() {
    // Its language model trains on Debian's fortunes, which scripts/setup.sh installs.
    assert!(
        Path::new("/usr/share/games/fortunes").is_dir(),
        "the README trains on the `fortunes` package's texts: install it (scripts/setup.sh does)"
    );
    run_page("README.md");
}

#[test]
fn the_data_guide_runs() {
    run_page("docs/data.md");
}

#[test]
fn the_tokenizers_guide_runs() {
    run_page("docs/tokenizers.md");
}

#[test]
fn the_training_guide_runs() {
    run_page("docs/training.md");
}

#[test]
fn the_schedules_guide_runs() {
    run_page("docs/schedules.md");
}

#[test]
fn the_clusters_guide_runs() {
    run_page("docs/clusters.md");
}

#[test]
fn the_gpu_guide_runs() {
    run_page("docs/gpu.md");
}

#[test]
fn the_internals_guide_runs() {
    run_page("docs/internals.md");
}

#[test]
fn every_page_with_commands_has_a_test_that_runs_it() {
    let tested = [
        "README.md",
        "docs/data.md",
        "docs/tokenizers.md",
        "docs/training.md",
        "docs/schedules.md",
        "docs/clusters.md",
        "docs/gpu.md",
        "docs/internals.md",
    ];
    for page in pages() {
        let runs = blocks(&read(&page))
            .iter()
            .any(|b| (b.language() == "console" && !b.no_run()) || b.language() == "python");
        assert!(
            !runs || tested.contains(&page.as_str()),
            "{page} has commands: add a test that runs it to tests/suite/guides.rs"
        );
    }
}
