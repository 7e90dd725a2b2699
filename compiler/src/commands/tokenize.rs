//! `ppc tokenize`: text files into the token streams that training executables read
//! (`ppc_runtime::tokens`), with a byte-level vocabulary: anyone can train on any text.

use anyhow::{bail, Context};
use ppc_runtime::tokens::{write_bytes, TokenDType};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `dir/train.bin` and `dir/val.bin`: the bytes of `texts` in order, the last
/// `val_fraction` of them the validation stream.
pub fn tokenize(
    texts: &[PathBuf],
    dir: &Path,
    val_fraction: f64,
    dtype: TokenDType,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for t in texts {
        all.extend(std::fs::read(t).with_context(|| format!("cannot read {}", t.display()))?);
    }
    let val = (all.len() as f64 * val_fraction).round() as usize;
    if val == 0 || val == all.len() {
        bail!(
            "{} bytes cannot be split into training and validation tokens at --val-fraction {val_fraction}",
            all.len()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let split = all.len() - val;
    for (name, part) in [("train.bin", &all[..split]), ("val.bin", &all[split..])] {
        let path = dir.join(name);
        write_bytes(part, dtype, &path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(out, "wrote {} ({} tokens)", path.display(), part.len())?;
    }
    writeln!(
        out,
        "vocabulary: 256 byte ids (a model's logits need 256 classes: --dim vocab=256)"
    )?;
    Ok(())
}
