//! Tokenizers that people use (`ppc tokenize --tokenizer` / `--train-bpe`, `ppc sample
//! --tokenizer`): a trained byte-level BPE loads back, encodes the same bytes every time and
//! decodes its token streams to the text; hand-written `tokenizer.json` files as
//! `transformers` writes them (a WordLevel one, Llama 3's pre-tokenizer and begin-of-text id)
//! encode as expected; the vocabulary reported is the one to compile with, the id width follows
//! it; bad files and sizes are refused in one line; a model trained on the BPE's tokens samples
//! through it, top-k 1 and a tiny top-p as greedy, padding ids never chosen.

use crate::common::{examples, path, ppc};
use crate::mpirun::{build, launch, scratch};
use ::tokenizers::Tokenizer;
use std::path::{Path, PathBuf};

/// A tiny WordLevel tokenizer.json as `transformers` writes one (7 ids; `extra` adds vocabulary
/// entries, e.g. `, "big": 70000`).
fn word_level(extra: &str) -> String {
    format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{{"id": 0, "content": "[UNK]", "single_word": false, "lstrip": false,
    "rstrip": false, "normalized": false, "special": true}}],
  "normalizer": {{"type": "Lowercase"}},
  "pre_tokenizer": {{"type": "Whitespace"}},
  "post_processor": null,
  "decoder": null,
  "model": {{"type": "WordLevel", "unk_token": "[UNK]",
    "vocab": {{"[UNK]": 0, "the": 1, "cat": 2, "sat": 3, "on": 4, "mat": 5, ".": 6{extra}}}}}}}"#
    )
}

/// The example model files, the texts the tests tokenize (about 40 KB).
fn texts() -> Vec<String> {
    examples().iter().map(|p| p.display().to_string()).collect()
}

/// `ppc tokenize TEXTS -o DIR EXTRA...`, which must succeed: its stdout.
fn tokenize(texts: &[String], dir: &Path, extra: &[&str]) -> String {
    let d = dir.display().to_string();
    let mut args = vec!["tokenize"];
    args.extend(texts.iter().map(String::as_str));
    args.extend(["-o", &d]);
    args.extend(extra);
    let (code, out, err) = ppc(&args);
    assert_eq!(code, 0, "{args:?}\n{out}{err}");
    out
}

/// The ids of a token stream of `width` bytes an id.
fn ids(file: &Path, width: usize) -> Vec<u32> {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(bytes.len() % width, 0, "{}", file.display());
    bytes
        .chunks(width)
        .map(|c| match c {
            [a, b] => u32::from(u16::from_le_bytes([*a, *b])),
            [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
            _ => unreachable!("2 or 4 bytes"),
        })
        .collect()
}

/// The ids of DIR/train.bin then DIR/val.bin.
fn stream(dir: &Path, width: usize) -> Vec<u32> {
    let mut v = ids(&dir.join("train.bin"), width);
    v.extend(ids(&dir.join("val.bin"), width));
    v
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn a_trained_bpe_loads_back_encodes_the_same_bytes_and_decodes_to_the_text() {
    let dir = scratch("bpe");
    let texts = texts();
    let out = tokenize(&texts, &dir.join("a"), &["--train-bpe", "300"]);
    assert!(
        out.contains("a byte-level BPE of 300 ids")
            && out.contains("--dim vocab=300, or 320 padded to a multiple of 64"),
        "{out}"
    );
    let json = dir.join("a/tokenizer.json");
    let tok = Tokenizer::from_file(&json).expect("the written tokenizer.json loads back");
    assert_eq!(tok.get_vocab_size(true), 300);
    let j: serde_json::Value = serde_json::from_slice(&read(&json)).expect("JSON");
    assert_eq!(j["model"]["type"], "BPE", "{j}");
    for part in ["pre_tokenizer", "decoder"] {
        assert_eq!(j[part]["type"], "ByteLevel", "{part}");
    }
    assert_eq!(
        j["model"]["merges"].as_array().map(Vec::len),
        Some(300 - 256)
    );

    // Deterministic: the same tokenizer and streams, byte for byte.
    tokenize(&texts, &dir.join("b"), &["--train-bpe", "300"]);
    for f in ["tokenizer.json", "train.bin", "val.bin"] {
        assert!(
            read(&dir.join("a").join(f)) == read(&dir.join("b").join(f)),
            "{f} differs"
        );
    }

    // The streams decode to the texts, concatenated: a round trip.
    let a = stream(&dir.join("a"), 2);
    assert!(a.iter().all(|&id| id < 300), "an id outside the vocabulary");
    let whole: String = texts
        .iter()
        .map(|t| std::fs::read_to_string(t).expect("text"))
        .collect();
    assert!(
        5 * a.len() < 4 * whole.len(),
        "{} tokens for {} bytes: merges make fewer",
        a.len(),
        whole.len()
    );
    assert_eq!(tok.decode(&a, false).expect("decodes"), whole);

    // Read back with --tokenizer it gives the same ids; --token-dtype u32 stores them wider.
    let json_s = json.display().to_string();
    let out = tokenize(&texts, &dir.join("c"), &["--tokenizer", &json_s]);
    assert!(
        out.contains("--dim vocab=300,") && !out.contains("u32"),
        "{out}"
    );
    assert_eq!(stream(&dir.join("c"), 2), a);
    let out = tokenize(
        &texts,
        &dir.join("d"),
        &["--tokenizer", &json_s, "--token-dtype", "u32"],
    );
    assert!(out.contains("train with --token-dtype u32"), "{out}");
    assert_eq!(stream(&dir.join("d"), 4), a);
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// Without a tokenizer nothing changed: each byte one u16 id, the same report.
#[test]
fn without_a_tokenizer_each_byte_is_a_token() {
    let dir = scratch("bytes");
    let texts = texts();
    let out = tokenize(&texts, &dir, &["--val-fraction", "0.25"]);
    assert!(
        out.ends_with(
            "vocabulary: 256 byte ids (a model's logits need 256 classes: --dim vocab=256)\n"
        ),
        "{out}"
    );
    let bytes: Vec<u32> = texts
        .iter()
        .flat_map(|t| std::fs::read(t).expect("text"))
        .map(u32::from)
        .collect();
    assert_eq!(stream(&dir, 2), bytes);
    assert_eq!(
        ids(&dir.join("val.bin"), 2).len(),
        (bytes.len() as f64 * 0.25).round() as usize
    );
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn hand_written_tokenizer_files_encode_as_transformers_has_them() {
    let dir = scratch("hand");
    let text = dir.join("t.txt");
    std::fs::write(&text, "The cat sat on the mat. The dog sat.").expect("write");
    let texts = [text.display().to_string()];
    let json = dir.join("word_level.json");
    std::fs::write(&json, word_level("")).expect("write");
    let json_s = json.display().to_string();
    let out = tokenize(
        &texts,
        &dir.join("w"),
        &["--tokenizer", &json_s, "--val-fraction", "0.2"],
    );
    assert!(
        out.contains("vocabulary: 7 ids") && out.contains("--dim vocab=7, or 64"),
        "{out}"
    );
    // Lower-cased, split at spaces and punctuation; "dog" is unknown.
    assert_eq!(stream(&dir.join("w"), 2), [1, 2, 3, 4, 1, 5, 6, 1, 0, 3, 6]);
    assert_eq!(ids(&dir.join("w/val.bin"), 2), [3, 6]);

    let unused = dir.join("unused").display().to_string();
    // An id above 65,535: stored as u32 unless u16 is asked for, which is refused.
    std::fs::write(&json, word_level(r#", "big": 70000"#)).expect("write");
    let out = tokenize(&texts, &dir.join("big"), &["--tokenizer", &json_s]);
    assert!(
        out.contains("--dim vocab=70001") && out.contains("--token-dtype u32"),
        "{out}"
    );
    assert_eq!(
        stream(&dir.join("big"), 4),
        [1, 2, 3, 4, 1, 5, 6, 1, 0, 3, 6]
    );
    let u16 = [
        "tokenize",
        &texts[0],
        "-o",
        &unused,
        "--tokenizer",
        &json_s,
        "--token-dtype",
        "u16",
    ];
    let (code, _, err) = ppc(&u16);
    assert_eq!(code, 1);
    assert!(
        err.contains("65,536") && err.contains("70001") && err.contains("u32"),
        "{err}"
    );

    // Llama 3's pre-tokenizer (a Split regex with a lookahead, run by the pure-Rust regex
    // engine) and its post-processor, which starts every file with <|begin_of_text|>.
    let out = tokenize(&self::texts(), &dir.join("bpe"), &["--train-bpe", "270"]);
    assert!(out.contains("vocabulary: 270 ids"), "{out}");
    let mut j: serde_json::Value =
        serde_json::from_slice(&read(&dir.join("bpe/tokenizer.json"))).expect("JSON");
    let bos = r#"{"id": 270, "content": "<|begin_of_text|>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true}"#;
    j["added_tokens"] = serde_json::from_str(&format!("[{bos}]")).expect("JSON");
    j["pre_tokenizer"] = serde_json::from_str(
        r#"{"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
           "behavior": "Isolated", "invert": false},
          {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}"#,
    )
    .expect("JSON");
    j["post_processor"] = serde_json::from_str(
        r#"{"type": "TemplateProcessing",
          "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
          "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
          "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [270], "tokens": ["<|begin_of_text|>"]}}}"#,
    )
    .expect("JSON");
    let llama = dir.join("llama3.json");
    std::fs::write(&llama, j.to_string()).expect("write");
    let llama_s = llama.display().to_string();
    let two = [texts[0].clone(), texts[0].clone()];
    let out = tokenize(
        &two,
        &dir.join("l3"),
        &["--tokenizer", &llama_s, "--val-fraction", "0.5"],
    );
    assert!(out.contains("vocabulary: 271 ids"), "{out}");
    let l3 = stream(&dir.join("l3"), 2);
    let half = l3.len() / 2;
    assert_eq!(l3[..half], l3[half..], "two files, the same ids");
    assert_eq!(
        (l3[0], l3.iter().filter(|&&id| id == 270).count()),
        (270, 2),
        "{l3:?}"
    );
    let tok = Tokenizer::from_file(&llama).expect("loads");
    let text = std::fs::read_to_string(&texts[0]).expect("text");
    assert_eq!(tok.decode(&l3[..half], true).expect("decodes"), text);

    // A post-processor whose special id is outside the vocabulary is refused, not written.
    let broken = j.to_string().replace(r#""ids":[270]"#, r#""ids":[999]"#);
    assert_ne!(broken, j.to_string());
    std::fs::write(&llama, broken).expect("write");
    let unused = dir.join("unused").display().to_string();
    let args = [
        "tokenize",
        &texts[0],
        "-o",
        &unused,
        "--tokenizer",
        &llama_s,
    ];
    refused(&args, 1, &[&llama_s, "id 999", "271 ids"]);
    std::fs::remove_dir_all(dir).expect("cleanup");
}

/// One line on stderr, no panic, exit status `code`, containing every one of `words`.
fn refused(args: &[&str], code: i32, words: &[&str]) {
    let (got, out, err) = ppc(args);
    assert_eq!(got, code, "{args:?}\n{out}{err}");
    let first = err.lines().next().unwrap_or_default();
    assert!(first.starts_with("error: "), "{args:?}: {err}");
    for w in words {
        assert!(first.contains(w), "{args:?}: `{w}` not in `{first}`");
    }
    if code == 1 {
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn bad_tokenizers_and_sizes_are_refused_in_one_line() {
    let dir = scratch("bad-tokenizers");
    let (text, gpt2) = (path("examples/mlp.ppc"), path("examples/gpt2.ppc"));
    let out = dir.join("out").display().to_string();
    let file = |name: &str, body: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, body).expect("write");
        p.display().to_string()
    };
    let missing = dir.join("missing.json").display().to_string();
    let not_json = file("not_json.json", b"{\"model\": ");
    let not_tokenizer = file("wrong.json", b"{\"hello\": 1}");
    let dir_s = dir.display().to_string();
    for (bad, why) in [
        (&missing, "No such file"),
        (&dir_s, "Is a directory"),
        (&not_json, "is not a tokenizer.json"),
        (&not_tokenizer, "is not a tokenizer.json"),
    ] {
        refused(
            &["tokenize", &text, "-o", &out, "--tokenizer", bad],
            1,
            &[bad, why],
        );
        let sample = [
            "sample",
            &gpt2,
            "--params",
            "p.safetensors",
            "--prompt",
            "a",
            "--tokenizer",
            bad,
        ];
        refused(&sample, 1, &[bad, why]);
    }
    let binary = file("binary.dat", &[0x66, 0xff, 0x00]);
    let words = file("words.json", word_level("").as_bytes());
    refused(
        &["tokenize", &binary, "-o", &out, "--tokenizer", &words],
        1,
        &[&binary, "not UTF-8"],
    );
    refused(
        &["tokenize", &binary, "-o", &out, "--train-bpe", "300"],
        1,
        &[&binary, "not UTF-8"],
    );
    refused(
        &[
            "tokenize",
            &text,
            "-o",
            &out,
            "--tokenizer",
            &words,
            "--train-bpe",
            "300",
        ],
        2,
        &["--tokenizer", "cannot be used with", "--train-bpe"],
    );
    for (n, why) in [
        ("256", "at least 257"),
        ("12", "at least 257"),
        ("5000000", "more than 1,048,576"),
        ("many", "not a number"),
    ] {
        refused(
            &["tokenize", &text, "-o", &out, "--train-bpe", n],
            2,
            &[n, why],
        );
    }
    assert!(!dir.join("out").exists(), "a refused run writes nothing");
    std::fs::remove_dir_all(dir).expect("cleanup");
}

#[test]
fn help_explains_the_tokenizer_flags() {
    let tokenize = [
        "--tokenizer <FILE>",
        "--train-bpe <N>",
        "--token-dtype",
        "docs/tokenizers.md",
    ];
    let sample = [
        "--tokenizer <FILE>",
        "--top-k <K>",
        "--top-p <P>",
        "--temperature <T>",
        "--seed",
    ];
    for (command, flags) in [("tokenize", &tokenize[..]), ("sample", &sample)] {
        let (code, out, _) = ppc(&[command, "--help"]);
        assert_eq!(code, 0, "{command} --help");
        let missing: Vec<&&str> = flags.iter().filter(|f| !out.contains(**f)).collect();
        assert!(
            missing.is_empty(),
            "{command} --help lacks {missing:?}:\n{out}"
        );
    }
}

/// GPT-2 (examples/gpt2.ppc, `--dim vocab=320`: 300 ids padded) trained a few steps on the
/// BPE's token streams, then sampled through the BPE: greedy, top-k 1 and a top-p that keeps one
/// id agree; seeded draws repeat; through a WordLevel tokenizer of 7 ids (every generated id a
/// word, so the words count the tokens) no padding id is chosen; a model with fewer classes
/// than the tokenizer has ids is refused, naming both.
#[test]
fn a_model_trained_on_bpe_tokens_samples_through_the_tokenizer() {
    let dir = scratch("bpe-sample");
    let d = |name: &str| dir.join(name).display().to_string();
    tokenize(&texts(), &dir.join("data"), &["--train-bpe", "300"]);
    let exe: PathBuf = dir.join("gpt2");
    build(
        "examples/gpt2.ppc",
        &exe,
        1,
        &["--train", "--dim", "vocab=320"],
    );
    let ckpt = d("gpt2.safetensors");
    let data = |part: &str| d(&format!("data/{part}.bin"));
    let (train, val) = (data("train"), data("val"));
    let args = [
        "--data",
        &train,
        "--val-data",
        &val,
        "--steps",
        "4",
        "--save",
        &ckpt,
    ];
    let l = launch(&exe, None, &args, &[]);
    assert_eq!(l.code, 0, "{}", l.stderr);
    let json = d("data/tokenizer.json");
    let model = path("examples/gpt2.ppc");
    let sample = |tokenizer: &str, prompt: &str, extra: &[&str]| {
        let mut args = vec![
            "sample",
            &model,
            "--params",
            &ckpt,
            "--tokenizer",
            tokenizer,
        ];
        args.extend(["--prompt", prompt]);
        args.extend("--dim vocab=320 --tokens 12 --opt-level 0".split(' '));
        args.extend(extra);
        let (code, out, err) = ppc(&args);
        assert_eq!(code, 0, "{args:?}\n{err}");
        assert!(err.contains("sampled 12 tokens"), "{err}");
        let text = out
            .strip_prefix(prompt)
            .and_then(|s| s.strip_suffix('\n'))
            .unwrap_or_else(|| panic!("{args:?}: not the prompt and a line: {out:?}"));
        text.to_string()
    };
    let greedy = sample(&json, "func @", &[]);
    assert!(!greedy.is_empty(), "12 tokens decode to some text");
    assert_eq!(
        sample(&json, "func @", &[]),
        greedy,
        "greedy is deterministic"
    );
    assert_eq!(
        sample(&json, "func @", &["--top-k", "1"]),
        greedy,
        "top-k 1"
    );
    assert_eq!(
        sample(&json, "func @", &["--top-p", "1e-9"]),
        greedy,
        "a top-p of one id"
    );
    let drawn = |seed: &str| {
        sample(
            &json,
            "func @",
            &["--top-k", "40", "--top-p", "0.95", "--seed", seed],
        )
    };
    assert_eq!(drawn("3"), drawn("3"), "a seeded draw repeats");
    assert_ne!(drawn("3"), drawn("4"), "another seed, another draw");

    // 7 known ids of 320 logits: every generated token is one of the words, after a space.
    let words = dir.join("words.json");
    std::fs::write(&words, word_level("")).expect("write");
    let words = words.display().to_string();
    for extra in [&[][..], &["--temperature", "2", "--seed", "1"]] {
        let text = sample(&words, "the cat", extra);
        let known = ["[UNK]", "the", "cat", "sat", "on", "mat", "."];
        let got: Vec<&str> = text.split(' ').skip(1).collect();
        assert!(
            text.starts_with(' ') && got.len() == 12,
            "{extra:?}: {text:?}"
        );
        assert!(got.iter().all(|w| known.contains(w)), "{extra:?}: {text:?}");
    }

    // The byte-level model (the checkpoint's vocab=320 overridden on the command line) has
    // 256 classes, fewer than the BPE's 300 ids.
    let fewer = [
        "sample",
        &model,
        "--dim",
        "vocab=256",
        "--params",
        &ckpt,
        "--tokenizer",
        &json,
        "--prompt",
        "a",
    ];
    refused(&fewer, 1, &["256 classes", "300 ids", "--dim vocab=300"]);
    std::fs::remove_dir_all(dir).expect("cleanup");
}
