//! Robustness: thousands of random mutations of the examples (byte flips, truncations, token
//! swaps, deleted and repeated lines, huge numbers) go through the parser, the verifier and the
//! passes. Every one must end in `Ok` or diagnostics: no panic, and no case may take long.

use crate::common::examples;
use ppc::passes::Options;
use ppc::pipeline::{compile, frontend, PipelineError};
use ppc_dialect::diag::render;
use ppc_dialect::Overrides;
use ppc_runtime::Rng;
use std::time::Duration;

const HUGE: &[&str] = &[
    "0",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "4294967296",
    "65537",
    "-1",
    "1e308",
    "nan",
];

fn tokens(s: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in s.char_indices() {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(st)) => {
                out.push((st, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(st) = start {
        out.push((st, s.len()));
    }
    out
}

fn mutate(src: &str, rng: &mut Rng) -> String {
    let mut bytes = src.as_bytes().to_vec();
    let pick = |rng: &mut Rng, n: usize| (rng.next_u64() % n.max(1) as u64) as usize;
    match rng.next_u64() % 7 {
        0 => {
            // Flip a few bytes to random printable (or any) bytes.
            for _ in 0..1 + pick(rng, 3) {
                let i = pick(rng, bytes.len());
                bytes[i] = if rng.next_u64().is_multiple_of(4) {
                    rng.next_u64() as u8
                } else {
                    b' ' + pick(rng, 95) as u8
                };
            }
        }
        1 => bytes.truncate(pick(rng, bytes.len())),
        2 => {
            let t = tokens(src);
            let (a, b) = (t[pick(rng, t.len())], t[pick(rng, t.len())]);
            let (a, b) = if a.0 <= b.0 { (a, b) } else { (b, a) };
            if a.1 <= b.0 {
                let mut s = String::new();
                s.push_str(&src[..a.0]);
                s.push_str(&src[b.0..b.1]);
                s.push_str(&src[a.1..b.0]);
                s.push_str(&src[a.0..a.1]);
                s.push_str(&src[b.1..]);
                return s;
            }
        }
        3 => {
            // Replace a number with a huge or degenerate one.
            let nums: Vec<(usize, usize)> = tokens(src)
                .into_iter()
                .filter(|&(a, _)| src.as_bytes()[a].is_ascii_digit())
                .collect();
            if !nums.is_empty() {
                let (a, b) = nums[pick(rng, nums.len())];
                let digits_end = a + src[a..b].bytes().take_while(|c| c.is_ascii_digit()).count();
                return format!(
                    "{}{}{}",
                    &src[..a],
                    HUGE[pick(rng, HUGE.len())],
                    &src[digits_end..]
                );
            }
        }
        4 => {
            let mut lines: Vec<&str> = src.lines().collect();
            let i = pick(rng, lines.len());
            lines.remove(i);
            return lines.join("\n");
        }
        5 => {
            let mut lines: Vec<&str> = src.lines().collect();
            let i = pick(rng, lines.len());
            let j = pick(rng, lines.len());
            let l = lines[i];
            lines.insert(j, l);
            return lines.join("\n");
        }
        _ => {
            // Delete a random token.
            let t = tokens(src);
            let (a, b) = t[pick(rng, t.len())];
            return format!("{}{}", &src[..a], &src[b..]);
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What became of one mutant: accepted (all passes ran) or rejected with diagnostics.
fn outcome(text: &str) -> Result<bool, String> {
    let check = |d: &ppc_dialect::Diagnostics, what: &str| -> Result<(), String> {
        if d.is_empty() {
            return Err(format!("{what}: an error without diagnostics"));
        }
        for l in d.iter().flat_map(|d| &d.labels) {
            if l.span.end as usize > text.len() || l.span.start > l.span.end {
                return Err(format!("{what}: span {:?} outside the file", l.span));
            }
        }
        // Rendering must not panic either, whatever the spans.
        if !render("mutant.ppc", text, d).contains("error") {
            return Err(format!("{what}: rendered without `error`"));
        }
        Ok(())
    };
    match frontend(text, &Overrides::default()) {
        Err(d) => check(&d, "front end").map(|_| false),
        Ok(mut m) => match compile(&mut m, &Options::default(), None, None) {
            Ok(()) => Ok(true),
            Err(PipelineError::Pass(pass, d)) => check(&d, pass).map(|_| false),
            Err(e) => Err(format!("not a user error: {e:?}")),
        },
    }
}

/// Each mutant runs on its own thread under a time limit, so that a hang fails the test
/// instead of stalling the suite.
const LIMIT: Duration = Duration::from_secs(5);

#[test]
fn mutated_examples_never_panic_or_hang() {
    let mut rng = Rng::stream(99, "mutations", 0);
    let (mut accepted, mut rejected) = (0, 0);
    for path in examples() {
        let src = std::fs::read_to_string(&path).expect("example");
        for i in 0..800 {
            let text = mutate(&src, &mut rng);
            let (tx, rx) = std::sync::mpsc::channel();
            let job = text.clone();
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(|| outcome(&job));
                let _ = tx.send(r);
            });
            let what = format!("mutation {i} of {}", path.display());
            match rx.recv_timeout(LIMIT) {
                Ok(Ok(Ok(true))) => accepted += 1,
                Ok(Ok(Ok(false))) => rejected += 1,
                Ok(Ok(Err(e))) => panic!("{what}: {e}\n{text}"),
                Ok(Err(_)) => panic!("panic on {what}:\n{text}"),
                Err(_) => panic!("{what} did not finish in {LIMIT:?}:\n{text}"),
            }
        }
    }
    assert!(
        accepted > 50 && rejected > 1000,
        "accepted {accepted}, rejected {rejected}"
    );
}
