//! Running a compiled pipeline: buffers from the manifest, a call into generated code, and the
//! driver that `ppc run` and generated executables share (seeded or file inputs, steps, timing,
//! the printed summary, the benchmark line, safetensors output).

use crate::init;
use crate::manifest::{Manifest, Role};
use crate::memref::HostBuffer;
use crate::safetensors;
use crate::tensor::Tensor;
use std::ffi::c_void;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// MLIR's packed calling convention: one array of pointers to the arguments.
pub type PackedFn = unsafe extern "C" fn(*mut *mut c_void);

/// Generated code for one manifest.
pub struct Program {
    pub manifest: Manifest,
    entry: PackedFn,
}

impl Program {
    /// # Safety
    /// `entry` must be the packed C-interface wrapper (`_mlir__mlir_ciface_...`) of an entry
    /// function whose memref arguments are exactly the manifest's arguments, in order.
    pub unsafe fn new(manifest: Manifest, entry: PackedFn) -> Program {
        Program { manifest, entry }
    }

    /// Parameters drawn from the seeded generator, in manifest order.
    pub fn params(&self, seed: u64) -> Vec<HostBuffer> {
        self.manifest
            .args
            .iter()
            .filter(|a| a.role == Role::Param)
            .map(|a| {
                HostBuffer::from_tensor(&init::param(
                    seed,
                    &a.name,
                    a.dtype,
                    &a.shape,
                    a.layer_axes,
                    a.init,
                    0,
                    None,
                ))
            })
            .collect()
    }

    /// Seeded synthetic input microbatches.
    pub fn synthetic_input(&self, seed: u64) -> HostBuffer {
        let a = self.manifest.input();
        HostBuffer::from_tensor(&init::synthetic_inputs(
            seed,
            a.dtype,
            &a.shape[1..],
            a.shape[0],
        ))
    }

    /// A zeroed output buffer.
    pub fn output_buffer(&self) -> HostBuffer {
        let a = self.manifest.output();
        HostBuffer::zeros(a.dtype, &a.shape)
    }

    /// Runs the pipeline once: `output = f(input, params)`.
    pub fn run(
        &self,
        input: &mut HostBuffer,
        params: &mut [HostBuffer],
        output: &mut HostBuffer,
    ) -> Result<(), String> {
        let mut bufs: Vec<&mut HostBuffer> = Vec::with_capacity(self.manifest.args.len());
        let mut params = params.iter_mut();
        let (mut input, mut output) = (Some(input), Some(output));
        for a in &self.manifest.args {
            let b = match a.role {
                Role::Input => input.take(),
                Role::Param => params.next(),
                Role::Output => output.take(),
            }
            .ok_or_else(|| format!("missing buffer for argument `{}`", a.name))?;
            if b.dtype != a.dtype || b.shape != a.shape {
                return Err(format!(
                    "argument `{}` must be {}{:?}, got {}{:?}",
                    a.name, a.dtype, a.shape, b.dtype, b.shape
                ));
            }
            bufs.push(b);
        }
        let mut descriptors: Vec<Vec<i64>> = bufs.iter_mut().map(|b| b.descriptor()).collect();
        let mut desc_ptrs: Vec<*mut i64> = descriptors.iter_mut().map(|d| d.as_mut_ptr()).collect();
        let mut packed: Vec<*mut c_void> = desc_ptrs
            .iter_mut()
            .map(|p| (p as *mut *mut i64).cast::<c_void>())
            .collect();
        // SAFETY: `Program::new`'s contract says `entry` takes exactly these memrefs; each packed
        // slot points to a pointer to a descriptor of a live buffer with the checked dtype and
        // shape, and all of them outlive the call.
        unsafe { (self.entry)(packed.as_mut_ptr()) };
        Ok(())
    }
}

/// What `ppc run` and an executable are asked to do.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub seed: u64,
    pub steps: u32,
    /// Timed repetitions after warm-up; prints one JSON line.
    pub bench: Option<u32>,
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    /// What ran, for the summary: `cpu (JIT)`, `cpu (executable)`.
    pub backend: String,
}

/// The name of the input and output tensors in safetensors files.
pub const INPUT_TENSOR: &str = "input";
pub const OUTPUT_TENSOR: &str = "output";

/// The summary `ppc run` and executables print: what ran, on what shapes, the result's checksum
/// and the step time. `pipeline` is stages, microbatches, repeats, layers.
pub fn write_summary(
    out: &mut dyn Write,
    model: &str,
    pipeline: [u64; 4],
    input: &str,
    y: &Tensor,
    step: &str,
) -> std::io::Result<()> {
    let [s, mb, r, l] = pipeline;
    writeln!(out, "model       {model}")?;
    writeln!(
        out,
        "pipeline    {s} stages, {mb} microbatches, {r} repeats, {l} layers"
    )?;
    writeln!(out, "input       {input}")?;
    writeln!(out, "output      {}{:?}", y.dtype, y.shape)?;
    writeln!(out, "checksum    {:.6e}", y.checksum())?;
    writeln!(out, "step time   {step}")
}

/// Runs `program` as `opts` says, printing the summary to `out` and progress to `err`.
pub fn drive(
    program: &Program,
    opts: &RunOptions,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<HostBuffer, String> {
    let m = &program.manifest;
    let io = |e: std::io::Error| e.to_string();
    let mut input = match &opts.input {
        None => program.synthetic_input(opts.seed),
        Some(path) => {
            let b = safetensors::read_tensor(path, INPUT_TENSOR)?;
            let want = m.input();
            if b.dtype != want.dtype || b.shape != want.shape {
                return Err(format!(
                    "{}: tensor `{INPUT_TENSOR}` is {}{:?}, but this model takes {}{:?} ([microbatches, ...input])",
                    path.display(),
                    b.dtype,
                    b.shape,
                    want.dtype,
                    want.shape
                ));
            }
            b
        }
    };
    let mut params = program.params(opts.seed);
    let mut output = program.output_buffer();
    let steps = opts.steps.max(1);
    let mut times = Vec::new();
    for step in 0..steps {
        let t = Instant::now();
        program.run(&mut input, &mut params, &mut output)?;
        times.push(t.elapsed().as_secs_f64());
        if steps > 1 {
            writeln!(
                err,
                "step {}/{steps}: {:.4} s",
                step + 1,
                times[times.len() - 1]
            )
            .map_err(io)?;
        }
    }
    let step_s = times.iter().sum::<f64>() / times.len() as f64;
    let y = output.to_tensor();
    let bubble = (m.stages - 1) as f64 / (m.repeats * m.microbatches + m.stages - 1) as f64;
    let step = format!(
        "{step_s:.6} s ({}, seed {}, {steps} step{})",
        opts.backend,
        opts.seed,
        if steps == 1 { "" } else { "s" }
    );
    let shape = |dtype, shape: &[usize]| format!("{dtype}{shape:?}");
    let input_shape = shape(m.input().dtype, &m.input().shape);
    write_summary(
        out,
        &m.model,
        [m.stages, m.microbatches, m.repeats, m.layers],
        &input_shape,
        &y,
        &step,
    )
    .map_err(io)?;
    writeln!(
        out,
        "throughput  {:.1} microbatches/s, {:.2} GFLOP/s useful",
        m.microbatches as f64 / step_s,
        m.flops as f64 / step_s / 1e9
    )
    .map_err(io)?;
    writeln!(
        out,
        "bubble      {:.1}% of stage-iterations idle",
        100.0 * bubble
    )
    .map_err(io)?;
    if let Some(n) = opts.bench {
        // Warm up (page in weights, fill caches), then time n steps and report the median.
        for _ in 0..2 {
            program.run(&mut input, &mut params, &mut output)?;
        }
        let mut t: Vec<f64> = (0..n.max(1))
            .map(|_| {
                let s = Instant::now();
                program
                    .run(&mut input, &mut params, &mut output)
                    .map(|_| s.elapsed().as_secs_f64())
            })
            .collect::<Result<_, _>>()?;
        t.sort_by(f64::total_cmp);
        let median = t[t.len() / 2];
        writeln!(
            out,
            "{{\"median_step_s\":{median:e},\"min_step_s\":{:e},\"useful_gflops\":{:.3},\"microbatches_per_s\":{:.3},\"steps\":{},\"bubble_fraction\":{bubble}}}",
            t[0],
            m.flops as f64 / median / 1e9,
            m.microbatches as f64 / median,
            t.len()
        )
        .map_err(io)?;
    }
    if let Some(path) = &opts.output {
        safetensors::write(path, &[(OUTPUT_TENSOR, &output)])?;
        writeln!(err, "wrote {}", path.display()).map_err(io)?;
    }
    Ok(output)
}
