//! `ppc sample`: text from a trained byte-level language model (256 token ids, as `ppc
//! tokenize` writes them). The forward pass is compiled once for one sequence (one
//! microbatch, the input's other leading axes at 1) and run on the prompt's bytes, then on each
//! byte it chose: the largest logit, or with `--temperature T` a draw from softmax(logits / T)
//! by the seeded generator. The model sees a window of its `t` tokens: a longer text keeps its
//! last `t`; a shorter one is padded after its end, which causal attention never reads.

use super::loaded::*;
use crate::cli::SampleArgs;
use crate::passes::Options;
use anyhow::{anyhow, bail};
use ppc_dialect::Label;
use ppc_runtime::init::Source;
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::params::ParamFile;
use ppc_runtime::{Init, Rng, Tensor};
use std::io::Write;
use std::sync::Arc;

/// Byte-level vocabularies only.
const VOCAB: usize = 256;

pub fn sample_command(
    mut a: SampleArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<i32> {
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
    if vocab != VOCAB {
        bail!("`ppc sample` speaks byte-level vocabularies of {VOCAB} ids (`ppc tokenize`); this model's logits have {vocab}");
    }
    let t = input.dims[input.rank() - 1].size as usize;
    let rows = input.elements() as usize / t;
    l.compile(&Options::default(), None, None)?;
    let jit = l.jit(&a.codegen)?;
    let program = &jit.program;
    let file = ParamFile::open(&a.params, &program.specs())?;
    let mut params = program.params(&Source::File(Arc::new(file)))?;
    let mut text: Vec<u8> = a.prompt.clone().into_bytes();
    if text.is_empty() {
        bail!("--prompt is empty: give at least one character");
    }
    write!(out, "{}", a.prompt)?;
    let mut output_buf = program.output_buffer();
    for i in 0..a.tokens {
        let window = &text[text.len().saturating_sub(t)..];
        let mut ids = vec![0; rows * t];
        for (slot, &b) in ids.iter_mut().zip(window) {
            *slot = i32::from(b);
        }
        let shape = program.manifest.input().shape.clone();
        let mut x = HostBuffer::from_tensor(&Tensor::from_ints(shape, ids));
        program.run(&mut x, &mut params, &mut output_buf)?;
        let logits = output_buf.to_tensor();
        let at = (window.len() - 1) * VOCAB;
        let row = &logits.data[at..at + VOCAB];
        let next = choose(row, a.temperature, a.seed, u64::from(i));
        text.push(next);
        out.write_all(&[next])?;
        out.flush()?;
    }
    writeln!(out)?;
    writeln!(err, "sampled {} bytes from {}", a.tokens, l.path).map_err(|e| anyhow!(e))?;
    Ok(0)
}

/// The byte to emit after logits `row`: the largest (the first of equals) at temperature 0,
/// else a draw from softmax(row / temperature), uniform number `(seed, "sample", i)`.
fn choose(row: &[f32], temperature: f64, seed: u64, i: u64) -> u8 {
    let best = (0..row.len()).fold(0, |b, k| if row[k] > row[b] { k } else { b });
    if temperature <= 0.0 {
        return best as u8;
    }
    let top = f64::from(row[best]);
    let weights: Vec<f64> = row
        .iter()
        .map(|&v| ((f64::from(v) - top) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let u = f64::from(Rng::stream(seed, "sample", i).fill(Init::Uniform(0.0, 1.0), 1)[0]) * total;
    let mut acc = 0.0;
    for (k, w) in weights.iter().enumerate() {
        acc += w;
        if u < acc {
            return k as u8;
        }
    }
    best as u8
}
