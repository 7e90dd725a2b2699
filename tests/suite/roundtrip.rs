//! The round-trip law: `parse(print(m)) == m` and `print(parse(print(m))) == print(m)`, over
//! every example and over every pass snapshot the suite has recorded.

use crate::common::{examples, load, root};
use ppc_dialect::{parse, print, verify, Overrides};

/// Checks the law for one module's text; returns the canonical text.
pub fn assert_roundtrip(m: &ppc_dialect::Module) -> String {
    let text = print(m);
    let again = parse(&text, &Overrides::default()).unwrap_or_else(|d| {
        panic!(
            "printed IR does not parse:\n{}\n{text}",
            ppc_dialect::diag::render("<printed>", &text, &d)
        )
    });
    assert_eq!(&again, m, "parse(print(m)) != m for\n{text}");
    assert_eq!(print(&again), text, "printing is not a fixed point");
    text
}

#[test]
fn examples_round_trip() {
    for path in examples() {
        let text = std::fs::read_to_string(&path).expect("readable example");
        assert_roundtrip(&load(&text, &Overrides::default()));
    }
}

#[test]
fn pass_snapshots_round_trip() {
    let dir = root().join("tests/suite/snapshots");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("snapshots exist") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if !name.starts_with("suite__passes__") || !name.ends_with(".snap") {
            continue;
        }
        let snap = std::fs::read_to_string(&path).expect("readable snapshot");
        // The body follows insta's `---` header.
        let body = snap.splitn(3, "---\n").nth(2).expect("insta header");
        if body.starts_with("error") {
            continue;
        }
        let m = parse(body, &Overrides::default())
            .unwrap_or_else(|d| panic!("{name}: {}", ppc_dialect::diag::render(&name, body, &d)));
        verify(&m).unwrap_or_else(|d| panic!("{name}: {d:?}"));
        assert_eq!(
            assert_roundtrip(&m).trim_end(),
            body.trim_end(),
            "{name}: the snapshot is not canonical text"
        );
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} pass snapshots");
}
