//! Token streams, the training data of language models as users have it: a flat file of token
//! ids with no header (nanoGPT's `train.bin` and `val.bin`), little-endian `uint16` or
//! `uint32`. Each batch samples seeded windows of `t + 1` consecutive tokens, one per sequence:
//! the first `t` are the sequence's input, the last `t` its targets (each token's next one).
//! Window starts come from the stream `(name, batch)` of the run's seed, so every rank, every
//! replica count and every rerun draws the same ones.
//!
//! [`write_bytes`] makes such a file from any text with a byte-level vocabulary (256 ids).

use crate::manifest::Arg;
use crate::memref::HostBuffer;
use crate::rng::Rng;
use crate::tensor::{DType, Tensor};
use std::path::{Path, PathBuf};

/// How a token stream stores an id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TokenDType {
    /// 2 bytes, little-endian: vocabularies up to 65536 (nanoGPT's format).
    #[default]
    U16,
    /// 4 bytes, little-endian.
    U32,
}

impl TokenDType {
    fn size(self) -> usize {
        match self {
            TokenDType::U16 => 2,
            TokenDType::U32 => 4,
        }
    }
}

/// A token stream that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {bytes} bytes is not a whole number of {size}-byte token ids (--token-dtype)", .path.display())]
    Partial {
        path: PathBuf,
        bytes: usize,
        size: usize,
    },
    #[error("{}: {tokens} tokens, but a sequence needs {need} (t + 1)", .path.display())]
    TooShort {
        path: PathBuf,
        tokens: usize,
        need: usize,
    },
    #[error("{}: token {id} at position {at} is outside the model's vocabulary of {vocab}", .path.display())]
    OutOfVocabulary {
        path: PathBuf,
        id: u32,
        at: usize,
        vocab: usize,
    },
    #[error("a token stream trains a model whose input is i32 token ids [..., t] and whose targets are the same shape; this one takes {input} and {target}")]
    NotALanguageModel { input: String, target: String },
}

/// A token stream, read a window at a time: only its length is known when it opens, and a
/// batch reads its windows alone (positioned reads, no mapping), so that a run's memory does
/// not grow with the file (nanoGPT's OpenWebText `train.bin` is 18 GB) and a rank reads only
/// the windows it draws. Ids are checked against the vocabulary as their windows are read.
#[derive(Debug)]
pub struct TokenStream {
    path: PathBuf,
    file: std::fs::File,
    dtype: TokenDType,
    tokens: usize,
}

impl TokenStream {
    /// Opens `path`, stored as `dtype`, reading nothing but its length.
    pub fn open(path: &Path, dtype: TokenDType) -> Result<TokenStream, TokenError> {
        let read_error = |source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let bytes = file.metadata().map_err(read_error)?.len() as usize;
        let size = dtype.size();
        if !bytes.is_multiple_of(size) {
            return Err(TokenError::Partial {
                path: path.to_path_buf(),
                bytes,
                size,
            });
        }
        Ok(TokenStream {
            path: path.to_path_buf(),
            file,
            dtype,
            tokens: bytes / size,
        })
    }

    /// Checks the stream against the model: inputs and targets i32 `[M, ..., t]` alike, at
    /// least `t + 1` tokens.
    pub fn check(&self, input: &Arg, target: &Arg) -> Result<(), TokenError> {
        let fits = input.dtype == DType::I32
            && target.dtype == DType::I32
            && input.shape == target.shape
            && input.shape.len() >= 2;
        if !fits {
            let show = |a: &Arg| format!("{}{:?}", a.dtype, a.shape);
            return Err(TokenError::NotALanguageModel {
                input: show(input),
                target: show(target),
            });
        }
        let need = input.shape[input.shape.len() - 1] + 1;
        if self.tokens < need {
            return Err(TokenError::TooShort {
                path: self.path.clone(),
                tokens: self.tokens,
                need,
            });
        }
        Ok(())
    }

    /// Tokens `at..at + n`, each checked to be below `vocab`.
    fn window(&self, at: usize, n: usize, vocab: usize) -> Result<Vec<u32>, TokenError> {
        use std::os::unix::fs::FileExt;
        let size = self.dtype.size();
        let mut bytes = vec![0u8; n * size];
        (self.file.read_exact_at(&mut bytes, (at * size) as u64)).map_err(|source| {
            TokenError::Read {
                path: self.path.clone(),
                source,
            }
        })?;
        let ids = bytes.chunks(size).map(|c| match self.dtype {
            TokenDType::U16 => u32::from(u16::from_le_bytes([c[0], c[1]])),
            TokenDType::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        });
        (ids.enumerate())
            .map(|(i, id)| match id as usize >= vocab {
                true => Err(TokenError::OutOfVocabulary {
                    path: self.path.clone(),
                    id,
                    at: at + i,
                    vocab,
                }),
                false => Ok(id),
            })
            .collect()
    }

    /// Batch `batch` of stream `name` (`train`, `val`): inputs and targets shaped as `input`
    /// (`[M, ..., t]`), one seeded window per sequence, every id below `vocab`.
    pub fn batch(
        &self,
        input: &Arg,
        vocab: usize,
        seed: u64,
        name: &str,
        batch: u64,
    ) -> Result<(HostBuffer, HostBuffer), TokenError> {
        let t = input.shape[input.shape.len() - 1];
        let sequences: usize = input.shape[..input.shape.len() - 1].iter().product();
        let starts = self.tokens - t;
        let mut rng = Rng::stream(seed, name, batch);
        let (mut x, mut y) = (
            Vec::with_capacity(sequences * t),
            Vec::with_capacity(sequences * t),
        );
        for _ in 0..sequences {
            let at = (rng.next_u64() % starts as u64) as usize;
            let window = self.window(at, t + 1, vocab)?;
            x.extend(window[..t].iter().map(|&v| v as i32));
            y.extend(window[1..].iter().map(|&v| v as i32));
        }
        let buf = |ids| HostBuffer::from_tensor(&Tensor::from_ints(input.shape.clone(), ids));
        Ok((buf(x), buf(y)))
    }
}

/// Writes `text` as a token stream of `dtype` with a byte-level vocabulary: each byte is one
/// id, `0..256` (atomically).
pub fn write_bytes(text: &[u8], dtype: TokenDType, path: &Path) -> std::io::Result<()> {
    let bytes: Vec<u8> = match dtype {
        TokenDType::U16 => text
            .iter()
            .flat_map(|&b| u16::from(b).to_le_bytes())
            .collect(),
        TokenDType::U32 => text
            .iter()
            .flat_map(|&b| u32::from(b).to_le_bytes())
            .collect(),
    };
    crate::files::write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Init;

    fn arg(shape: Vec<usize>) -> Arg {
        Arg {
            role: crate::manifest::Role::Input,
            name: "input".into(),
            dtype: DType::I32,
            shape,
            init: Init::Zeros,
            layer_axes: 0,
            shard_axis: None,
        }
    }

    #[test]
    fn windows_are_seeded_and_targets_are_the_next_tokens() {
        let dir = std::env::temp_dir().join(format!("ppc-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("t.bin");
        let text: Vec<u8> = (0..200u32).map(|i| (i * 7 % 251) as u8).collect();
        write_bytes(&text, TokenDType::U16, &path).expect("write");
        let s = TokenStream::open(&path, TokenDType::U16).expect("open");
        assert_eq!(s.tokens, 200);
        let a = arg(vec![2, 3, 5]);
        s.check(&a, &a).expect("fits");
        let ids = |b: HostBuffer| b.to_tensor().values().collect::<Vec<f64>>();
        let batch = |n| s.batch(&a, 256, 1, "train", n).expect("ids in range");
        let (x, y) = batch(4);
        let (x, y) = (ids(x), ids(y));
        for (xs, ys) in x.chunks(5).zip(y.chunks(5)) {
            // Each row is a window of the text; its targets are the same window one later.
            let at = text
                .windows(5)
                .position(|w| w.iter().zip(xs).all(|(&b, &v)| f64::from(b) == v));
            let at = at.expect("the inputs are a window of the text");
            let next: Vec<f64> = text[at + 1..at + 6].iter().map(|&b| f64::from(b)).collect();
            assert_eq!(ys, next.as_slice());
        }
        assert_eq!(ids(batch(4).0), x);
        assert_ne!(ids(batch(5).0), x);
        assert!(matches!(
            s.batch(&a, 100, 1, "train", 4),
            Err(TokenError::OutOfVocabulary { .. })
        ));
        std::fs::write(&path, [1u8, 2, 3]).expect("write");
        assert!(matches!(
            TokenStream::open(&path, TokenDType::U16),
            Err(TokenError::Partial { .. })
        ));
        std::fs::remove_dir_all(dir).expect("cleanup");
    }
}
