//! A forward run over an input file of any length (`--input`): a test set as users have it.
//! Its samples are cut into the program's batches of `M × b`, the last batch padded with zeros
//! whose outputs are dropped, and the outputs are written in the file's layout. With a
//! `target` tensor beside `input` (one class id per row of the outputs), the run reports the
//! outputs' accuracy ([`crate::accuracy`]), so that evaluating a classifier needs no second
//! compile and no script.
//!
//! Layouts of `input`: `[N, ...sample]`, one sample a row (`sample` is the model's input
//! after its batch axis `b`), or `[K, b, ...sample]`, any number `K` of microbatches. A file
//! of exactly `[M, b, ...sample]` runs as one call, as [`crate::exec::drive`] always ran it.

use crate::accuracy::Accuracy;
use crate::exec::{write_summary, Program, RunError, INPUT_TENSOR, OUTPUT_TENSOR};
use crate::memref::HostBuffer;
use crate::run_options::RunOptions;
use crate::safetensors;
use crate::tensor::{DType, Tensor};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// The samples of an input file that is not exactly one call's input.
pub struct Samples {
    input: Tensor,
    /// `[K, b, ...]`: the file's microbatch count, which the output's layout keeps.
    microbatches: Option<usize>,
    target: Option<Tensor>,
}

impl Samples {
    /// The samples of `path`, or `None` for a file of exactly one call's input (`[M, ...input]`),
    /// whose header alone is read here. A file that fits neither layout is an error that names
    /// both.
    pub fn open(program: &Program, path: &Path) -> Result<Option<Samples>, RunError> {
        let a = program.manifest.input();
        let (dtype, shape) = safetensors::tensor_type(path, INPUT_TENSOR)?;
        let sample = &a.shape[2..];
        let shape_error = || RunError::InputShape {
            path: path.to_path_buf(),
            dtype,
            shape: shape.clone(),
            want_dtype: a.dtype,
            want_shape: a.shape.clone(),
        };
        if dtype != a.dtype || shape.first().is_none_or(|&n| n == 0) {
            return Err(shape_error());
        }
        let microbatches = if shape[1..] == a.shape[1..] {
            if shape[0] == a.shape[0] {
                return Ok(None);
            }
            Some(shape[0])
        } else if shape[1..] == *sample {
            None
        } else {
            return Err(shape_error());
        };
        let input = safetensors::read_tensor(path, INPUT_TENSOR)?.to_tensor();
        let rows = input.len() / sample.iter().product::<usize>().max(1);
        let target = match safetensors::read_tensor(path, "target") {
            Ok(y) => Some(check_target(program, path, y.to_tensor(), rows)?),
            Err(safetensors::FileError::NoTensor { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Some(Samples {
            input,
            microbatches,
            target,
        }))
    }

    /// Runs every batch, prints the summary (and the accuracy) on the rank that holds the
    /// outputs, writes `--output` there, and returns the outputs in the file's layout.
    pub fn run(
        &self,
        program: &Program,
        opts: &RunOptions,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> Result<Tensor, RunError> {
        let m = &program.manifest;
        let speaks = crate::comm::rank() == program.output_rank();
        let (a, o) = (m.input(), m.output());
        let per_call: usize = a.shape[..2].iter().product();
        let sample: usize = a.shape[2..].iter().product();
        let out_row: usize = o.shape[2..].iter().product();
        let n = self.input.len() / sample.max(1);
        let mut params = program.params(&program.param_source(opts)?)?;
        let mut output = program.output_buffer();
        let (mut y, mut calls) = (Vec::with_capacity(n * out_row), 0);
        let started = Instant::now();
        for first in (0..n).step_by(per_call) {
            let rows = per_call.min(n - first);
            let mut data = self.input.data[first * sample..(first + rows) * sample].to_vec();
            data.resize(per_call * sample, 0.0);
            let mut x = HostBuffer::from_tensor(&Tensor::new(a.dtype, a.shape.clone(), data));
            program.run(&mut x, &mut params, &mut output)?;
            y.extend_from_slice(&output.to_tensor().data[..rows * out_row]);
            calls += 1;
        }
        let secs = started.elapsed().as_secs_f64();
        let mut shape = match self.microbatches {
            Some(k) => vec![k, o.shape[1]],
            None => vec![n],
        };
        shape.extend(&o.shape[2..]);
        let y = Tensor::new(o.dtype, shape, y);
        if !speaks {
            return Ok(y);
        }
        let step = format!(
            "{secs:.6} s for {n} samples in {calls} calls of {per_call} ({}, {})",
            opts.backend,
            opts.origin()
        );
        let input_shape = format!("{}{:?}", self.input.dtype, self.input.shape);
        let pipeline = [m.stages, m.microbatches, m.repeats, m.layers];
        write_summary(out, &m.model, pipeline, &input_shape, &y, &step)?;
        if let Some(t) = &self.target {
            let classes = *o.shape.last().expect("invariant: checked by open");
            let targets: Vec<i32> = (0..t.len()).map(|i| t.int(i)).collect();
            let acc = Accuracy::of(&y.data, classes, &targets, None);
            writeln!(
                out,
                "accuracy    {:.2}% ({} of {} rows)",
                100.0 * acc.share(),
                acc.hits,
                acc.rows
            )?;
        }
        if let Some(path) = &opts.output {
            safetensors::write(path, &[(OUTPUT_TENSOR, &HostBuffer::from_tensor(&y))])?;
            writeln!(err, "wrote {}", path.display())?;
        }
        Ok(y)
    }
}

/// `target` of an input file of `rows` samples: i32 class ids, one per row of the outputs
/// (the output's per-sample shape without its class axis), each a class of the outputs.
fn check_target(
    program: &Program,
    path: &Path,
    t: Tensor,
    rows: usize,
) -> Result<Tensor, RunError> {
    let o = program.manifest.output();
    let per_sample: usize = o.shape[2..o.shape.len() - 1].iter().product();
    let classes = *o.shape.last().unwrap_or(&0);
    let bad = |why: String| RunError::Target {
        path: path.to_path_buf(),
        why,
    };
    if t.dtype != DType::I32 || o.shape.len() < 3 || t.len() != rows * per_sample {
        return Err(bad(format!(
            "tensor `target` is {}{:?}; accuracy needs i32 class ids, {per_sample} for each of the {rows} samples of `input`",
            t.dtype, t.shape
        )));
    }
    if let Some(i) = (0..t.len()).find(|&i| !(0..classes as i64).contains(&i64::from(t.int(i)))) {
        return Err(bad(format!(
            "tensor `target` holds {} at row {i}, outside the model's {classes} classes",
            t.int(i)
        )));
    }
    Ok(t)
}
