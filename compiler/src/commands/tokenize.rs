//! `ppc tokenize`: text files into the token streams that training executables read
//! (`ppc_runtime::tokens`). Three vocabularies: one id per byte (256 ids, the default: anyone
//! can train on any text); the ids of a Hugging Face `tokenizer.json` (`--tokenizer`: GPT-2's,
//! Llama's, one's own), read and run by the `tokenizers` crate, the library behind
//! `transformers`' fast tokenizers; or those of a byte-level BPE trained here on the texts
//! (`--train-bpe N`: the crate's `BpeTrainer` with GPT-2's ByteLevel pre-tokenizer and decoder),
//! written as `DIR/tokenizer.json` and then read back as `--tokenizer` reads one.
//!
//! With a tokenizer each file is one document, encoded whole as `transformers`'
//! `tokenizer(text)` encodes it: with the tokenizer's own special tokens (Llama's begin-of-text
//! id before each file; GPT-2's adds none). The files' tokens are concatenated and the last
//! `--val-fraction` of them become the validation stream. Ids are stored as u16 when the
//! vocabulary fits 65,536 ids, else u32. [`load`], [`vocabulary`] and [`encode`] serve
//! `ppc sample` too.

use crate::cli::TokenizeArgs;
use anyhow::{anyhow, bail, Context};
use ppc_runtime::tokens::TokenDType;
use std::io::Write;
use std::path::Path;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{Tokenizer, TokenizerBuilder};

/// The ids a u16 token stream can hold.
const U16_IDS: usize = 1 << 16;

/// Writes `DIR/train.bin` and `DIR/val.bin` (and `DIR/tokenizer.json` with `--train-bpe`), and
/// says what it wrote and which `--dim vocab` a model needs.
pub fn tokenize_command(a: &TokenizeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for t in &a.texts {
        let bytes = std::fs::read(t).with_context(|| format!("cannot read {}", t.display()))?;
        files.push((t.as_path(), bytes));
    }
    let (ids, vocab, named) = match (&a.tokenizer, a.train_bpe) {
        (None, None) => {
            let ids: Vec<u32> = files
                .iter()
                .flat_map(|(_, b)| b)
                .map(|&b| b.into())
                .collect();
            (ids, 256, None)
        }
        (Some(path), _) => {
            let tok = load(path)?;
            (
                encode_files(&tok, path, &files)?,
                vocabulary(&tok),
                Some(path.clone()),
            )
        }
        (None, Some(n)) => {
            // Refused before training rather than after.
            token_dtype(a.token_dtype, n as usize)?;
            let texts = files
                .iter()
                .map(|(path, bytes)| text(path, bytes))
                .collect::<anyhow::Result<Vec<&str>>>()?;
            let path = a.out.join("tokenizer.json");
            make_dir(&a.out)?;
            let ids = train_bpe(n, &texts, &path)?;
            writeln!(
                out,
                "wrote {} (a byte-level BPE of {ids} ids)",
                path.display()
            )?;
            if ids < n as usize {
                writeln!(
                    out,
                    "note: the texts gave {ids} ids, not the {n} asked: no pair of tokens is left that occurs twice"
                )?;
            }
            let tok = load(&path)?;
            (
                encode_files(&tok, &path, &files)?,
                vocabulary(&tok),
                Some(path),
            )
        }
    };
    let dtype = token_dtype(a.token_dtype, vocab)?;
    let val = (ids.len() as f64 * a.val_fraction).round() as usize;
    if val == 0 || val == ids.len() {
        bail!(
            "{} tokens cannot be split into training and validation tokens at --val-fraction {}",
            ids.len(),
            a.val_fraction
        );
    }
    make_dir(&a.out)?;
    let split = ids.len() - val;
    for (name, part) in [("train.bin", &ids[..split]), ("val.bin", &ids[split..])] {
        let path = a.out.join(name);
        write_ids(part, dtype, &path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(out, "wrote {} ({} tokens)", path.display(), part.len())?;
    }
    match named {
        None => writeln!(
            out,
            "vocabulary: 256 byte ids (a model's logits need 256 classes: --dim vocab=256)"
        )?,
        Some(path) => {
            let padded = vocab.div_ceil(64) * 64;
            let or_padded = if padded == vocab {
                String::new()
            } else {
                format!(", or {padded} padded to a multiple of 64 for speed")
            };
            writeln!(
                out,
                "vocabulary: {vocab} ids of {} (a model's logits need at least {vocab} classes: --dim vocab={vocab}{or_padded})",
                path.display()
            )?;
        }
    }
    if dtype == TokenDType::U32 {
        writeln!(out, "the files store u32 ids: train with --token-dtype u32")?;
    }
    Ok(())
}

/// A `tokenizer.json`, or one line naming the file and what is wrong with it.
pub(super) fn load(path: &Path) -> anyhow::Result<Tokenizer> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read tokenizer {}", path.display()))?;
    Tokenizer::from_bytes(&bytes).map_err(|e| {
        anyhow!(
            "{} is not a tokenizer.json that the tokenizers library reads: {e}",
            path.display()
        )
    })
}

/// The ids a tokenizer gives: one more than its largest, special tokens included (GPT-2's
/// 50,257; Llama 3's 128,256).
pub(super) fn vocabulary(tok: &Tokenizer) -> usize {
    tok.get_vocab(true)
        .values()
        .max()
        .map_or(0, |&id| id as usize + 1)
}

/// The ids of `text` (from `what`), with the tokenizer's special tokens, as `transformers`'
/// `tokenizer(text)` gives them. Every id must be in the vocabulary: a post-processor's special
/// ids (TemplateProcessing lists its own) may not be.
pub(super) fn encode(
    tok: &Tokenizer,
    path: &Path,
    text: &str,
    what: &str,
) -> anyhow::Result<Vec<u32>> {
    let e = tok
        .encode_fast(text, true)
        .map_err(|e| anyhow!("cannot encode {what} with {}: {e}", path.display()))?;
    let vocab = vocabulary(tok);
    if let Some(id) = e.get_ids().iter().find(|&&id| id as usize >= vocab) {
        bail!(
            "{} gave id {id} for {what}, outside its vocabulary of {vocab} ids: its post-processor's special tokens do not match its added tokens",
            path.display()
        );
    }
    Ok(e.get_ids().to_vec())
}

/// The files' ids, one after the other, each file encoded whole.
fn encode_files(
    tok: &Tokenizer,
    path: &Path,
    files: &[(&Path, Vec<u8>)],
) -> anyhow::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for (file, bytes) in files {
        let what = file.display().to_string();
        ids.extend(encode(tok, path, text(file, bytes)?, &what)?);
    }
    Ok(ids)
}

/// A file's bytes as the UTF-8 text a tokenizer reads.
fn text<'a>(path: &Path, bytes: &'a [u8]) -> anyhow::Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|e| {
        anyhow!(
            "{} is not UTF-8 text (byte {} is not), which a tokenizer needs; without --tokenizer and --train-bpe it is read as bytes",
            path.display(),
            e.valid_up_to()
        )
    })
}

/// Trains a byte-level BPE of at most `n` ids on `texts` (each one document) and writes it to
/// `path`, as GPT-2's is made: ByteLevel pre-tokenizer (GPT-2's split of words, numbers,
/// punctuation and spaces; no space added before the text), post-processor and decoder, the
/// 256 byte symbols first, then merges of pairs that occur at least twice, most frequent
/// first. Returns the ids it made: fewer than `n` when the texts run out of pairs.
fn train_bpe(n: u32, texts: &[&str], path: &Path) -> anyhow::Result<usize> {
    let byte_level = ByteLevel::new(false, true, true);
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(n as usize)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tok =
        TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel>::new()
            .with_model(BPE::default())
            .with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(byte_level))
            .with_decoder(Some(byte_level))
            .build()
            .map_err(|e| anyhow!("cannot make a byte-level BPE: {e}"))?;
    tok.train(&mut trainer, texts.iter())
        .map_err(|e| anyhow!("cannot train a byte-level BPE: {e}"))?;
    let json = tok
        .to_string(true)
        .map_err(|e| anyhow!("cannot write the trained BPE as JSON: {e}"))?;
    ppc_runtime::files::write_atomic(path, json.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(tok.get_vocab_size(true))
}

/// `--token-dtype`, else the narrowest that holds `vocab` ids.
fn token_dtype(asked: Option<TokenDType>, vocab: usize) -> anyhow::Result<TokenDType> {
    match asked {
        Some(TokenDType::U16) if vocab > U16_IDS => bail!(
            "--token-dtype u16 holds ids below 65,536, and this vocabulary has {vocab}: use --token-dtype u32"
        ),
        Some(d) => Ok(d),
        None if vocab > U16_IDS => Ok(TokenDType::U32),
        None => Ok(TokenDType::U16),
    }
}

/// `ids` as a token stream of `dtype`, little-endian (atomically).
fn write_ids(ids: &[u32], dtype: TokenDType, path: &Path) -> std::io::Result<()> {
    let bytes: Vec<u8> = match dtype {
        // Every id fits: `token_dtype` chose u16 only for vocabularies of 65,536 ids or fewer.
        TokenDType::U16 => ids.iter().flat_map(|&i| (i as u16).to_le_bytes()).collect(),
        TokenDType::U32 => ids.iter().flat_map(|&i| i.to_le_bytes()).collect(),
    };
    ppc_runtime::files::write_atomic(path, &bytes)
}

fn make_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))
}
