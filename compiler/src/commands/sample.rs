//! `ppc sample`: text from a trained language model. The prompt becomes token ids one per byte
//! (256 ids, as `ppc tokenize` writes them by default) or through the `--tokenizer` the training
//! data was made with (`tokenizer.json`, as `ppc tokenize --tokenizer` or `--train-bpe` used it),
//! and the chosen ids become text the same way (a tokenizer's through its decoder, a token at a
//! time, holding back bytes that do not yet make a character). The model's vocabulary (its
//! logits' last axis) must hold the tokenizer's ids; the ids above them, a padded vocabulary's
//! (GPT-2's 50,257 padded to 50,304), are never chosen.
//!
//! The forward pass is compiled once for one sequence (one microbatch, the input's other
//! leading axes at 1) and run on the prompt's ids, then on each id it chose: the largest logit
//! (the lower id of equals), or with `--temperature T` a draw from softmax(logits / T), after
//! `--top-k` (the K largest logits) and `--top-p` (the fewest likeliest ids whose probabilities
//! sum to P), by the seeded generator: the same seed gives the same text. The model sees a
//! window of its `t` tokens: a longer text keeps its last `t`; a shorter one is padded after
//! its end, which causal attention never reads.

use super::loaded::*;
use super::tokenize;
use crate::cli::SampleArgs;
use crate::passes::Options;
use anyhow::{anyhow, bail};
use ppc_dialect::Label;
use ppc_runtime::init::Source;
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::params::ParamFile;
use ppc_runtime::{Init, Rng, Tensor};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokenizers::Tokenizer;

/// The ids of the byte-level vocabulary.
const BYTES: usize = 256;

pub fn sample_command(
    mut a: SampleArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<i32> {
    a.model = with_model_of(a.model, Some(&a.params), err)?;
    let tokenizer = match &a.tokenizer {
        Some(path) => Some((tokenize::load(path)?, path.clone())),
        None => None,
    };
    // One sequence: the input's named leading axes (the batch) at 1, one microbatch.
    let l = load(&a.model)?;
    let input = l.module.input.clone();
    if input.dtype != ppc_dialect::DType::I32 || input.rank() < 1 {
        bail!("`ppc sample` runs language models, whose input is i32 token ids [..., t]; this one takes {input}");
    }
    for d in &input.dims[..input.rank() - 1] {
        if let Label::Named(name) = &d.label {
            a.model.dims.retain(|(n, _)| n != name);
            a.model.dims.push((name.clone(), 1));
        }
    }
    a.model.microbatches = Some(1);
    let mut l = load(&a.model)?;
    one_process(&l, "ppc sample")?;
    let (input, output) = (l.module.input.clone(), l.module.output_type());
    let vocab = output.dims.last().map_or(0, |d| d.size as usize);
    let known = tokenizer
        .as_ref()
        .map_or(BYTES, |(tok, _)| tokenize::vocabulary(tok));
    if vocab < known {
        let ids = match &tokenizer {
            Some((_, path)) => format!("the {known} ids of {}", path.display()),
            None => format!("the {BYTES} byte ids (without --tokenizer)"),
        };
        bail!(
            "this model's logits have {vocab} classes, fewer than {ids}: sample with the tokenizer its training data was made with, or compile the model with --dim vocab={known} or more"
        );
    }
    let mut ids: Vec<u32> = match &tokenizer {
        Some((tok, path)) => tokenize::encode(tok, path, &a.prompt, "the prompt")?,
        None => a.prompt.bytes().map(u32::from).collect(),
    };
    if ids.is_empty() {
        bail!("--prompt gives no tokens: give at least one character");
    }
    let sampling = Sampling {
        temperature: a
            .temperature
            .unwrap_or(if a.top_k.is_some() || a.top_p.is_some() {
                1.0
            } else {
                0.0
            }),
        top_k: a.top_k.map(|k| k as usize),
        top_p: a.top_p,
        seed: a.seed,
    };
    let t = input.dims[input.rank() - 1].size as usize;
    let rows = input.elements() as usize / t;
    l.compile(&Options::default(), None, None)?;
    let jit = l.jit(&a.codegen)?;
    let program = &jit.program;
    let file = ParamFile::open(&a.params, &program.specs())?;
    let mut params = program.params(&Source::File(Arc::new(file)))?;
    let mut text = Text::new(tokenizer.as_ref(), &ids)?;
    write!(out, "{}", a.prompt)?;
    let mut output_buf = program.output_buffer();
    for i in 0..a.tokens {
        let window = &ids[ids.len().saturating_sub(t)..];
        let mut x = vec![0; rows * t];
        for (slot, &id) in x.iter_mut().zip(window) {
            *slot = id as i32;
        }
        let shape = program.manifest.input().shape.clone();
        let mut x = HostBuffer::from_tensor(&Tensor::from_ints(shape, x));
        program.run(&mut x, &mut params, &mut output_buf)?;
        let logits = output_buf.to_tensor();
        let at = (window.len() - 1) * vocab;
        // Ids at and above `known` (a padded vocabulary's) are never chosen.
        let next = sampling.choose(&logits.data[at..at + known], u64::from(i));
        ids.push(next);
        out.write_all(&text.next(next)?)?;
        out.flush()?;
    }
    writeln!(out)?;
    writeln!(err, "sampled {} tokens from {}", a.tokens, l.path).map_err(|e| anyhow!(e))?;
    Ok(0)
}

/// Ids into text: bytes as they are, or a tokenizer's decoding, which emits a token's text
/// once it is whole (a character's bytes may span tokens) and reads it after the prompt's
/// (whether a word starts with a space depends on what precedes it).
enum Text<'a> {
    Bytes,
    Decoded {
        stream: tokenizers::tokenizer::DecodeStream<
            'a,
            tokenizers::ModelWrapper,
            tokenizers::NormalizerWrapper,
            tokenizers::PreTokenizerWrapper,
            tokenizers::PostProcessorWrapper,
            tokenizers::DecoderWrapper,
        >,
        path: &'a Path,
    },
}

impl<'a> Text<'a> {
    /// Text after `prompt`'s ids.
    fn new(tokenizer: Option<&'a (Tokenizer, PathBuf)>, prompt: &[u32]) -> anyhow::Result<Self> {
        let Some((tok, path)) = tokenizer else {
            return Ok(Text::Bytes);
        };
        let mut text = Text::Decoded {
            stream: tok.decode_stream(false),
            path,
        };
        for &id in prompt {
            text.next(id)?;
        }
        Ok(text)
    }

    /// The bytes that id `id` adds to the text.
    fn next(&mut self, id: u32) -> anyhow::Result<Vec<u8>> {
        match self {
            Text::Bytes => Ok(vec![id as u8]),
            Text::Decoded { stream, path } => {
                let piece = stream
                    .step(id)
                    .map_err(|e| anyhow!("cannot decode id {id} with {}: {e}", path.display()))?;
                Ok(piece.unwrap_or_default().into_bytes())
            }
        }
    }
}

/// How the next id is chosen.
struct Sampling {
    /// 0: the largest logit.
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    seed: u64,
}

impl Sampling {
    /// The id to emit after logits `row` (the ids that may be chosen), the `i`-th: the largest
    /// (the first of equals) at temperature 0, else a draw from softmax(row / temperature)
    /// over the ids that top-k and top-p keep, uniform number `(seed, "sample", i)`.
    fn choose(&self, row: &[f32], i: u64) -> u32 {
        let best = (0..row.len()).fold(0, |b, k| if row[k] > row[b] { k } else { b });
        if self.temperature <= 0.0 {
            return best as u32;
        }
        let top = f64::from(row[best]);
        let mut weights: Vec<f64> = row
            .iter()
            .map(|&v| ((f64::from(v) - top) / self.temperature).exp())
            .collect();
        self.keep_likeliest(&mut weights);
        let total: f64 = weights.iter().sum();
        let u = f64::from(Rng::stream(self.seed, "sample", i).fill(Init::Uniform(0.0, 1.0), 1)[0])
            * total;
        let mut acc = 0.0;
        for (k, w) in weights.iter().enumerate() {
            acc += w;
            if u < acc {
                return k as u32;
            }
        }
        best as u32
    }

    /// Zeroes the weights of the ids that top-k and top-p leave out: all but the `top_k`
    /// largest (ties to the lower id), then all but the fewest largest of those whose sum
    /// reaches `top_p` of theirs.
    fn keep_likeliest(&self, weights: &mut [f64]) {
        if self.top_k.is_none() && self.top_p.is_none() {
            return;
        }
        let mut order: Vec<usize> = (0..weights.len()).collect();
        order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        let mut keep = self.top_k.map_or(order.len(), |k| k.min(order.len()));
        if let Some(p) = self.top_p {
            let total: f64 = order[..keep].iter().map(|&k| weights[k]).sum();
            let mut acc = 0.0;
            if let Some(n) = order[..keep].iter().position(|&k| {
                acc += weights[k];
                acc >= p * total
            }) {
                keep = n + 1;
            }
        }
        for &k in &order[keep..] {
            weights[k] = 0.0;
        }
    }
}
