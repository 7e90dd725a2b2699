//! The manifest: what a compiled pipeline takes and returns, embedded in every executable as
//! JSON (and handed to the JIT as a value), so the runtime can build its buffers without the
//! compiler.
//!
//! ```text
//! {"ppc_manifest": 1, "model": "examples/mlp.ppc", "stages": 4, "microbatches": 8, ...,
//!  "target": {"cpu": "x86-64-v3", "features": ["sse", "sse2", ..., "avx2", "fma"]},
//!  "args": [{"role": "input", "name": "x", "dtype": "f32", "shape": [8, 16, 256], ...},
//!           {"role": "param", "name": "w1", ..., "init": {"normal": 0.0625}, "layer_axes": 1,
//!            "shard_axis": 0}, ...],
//!  "groups": ["relu+add, line 14", ...], "train": [["optimizer", "sgd"], ["lr", "0.05"]]}
//! ```
//! `ranks` is the processes the stage axis is split over; `target` the CPU the code was compiled
//! for and the features it needs (null for the JIT, which compiles for the CPU it runs on). A
//! parameter's `shard_axis` holds this rank's slice of the stage axis. Arguments are listed in
//! the order the entry function takes them. `groups` name the loop nests that generated code
//! marks for `--trace`, numbered from 0 in order; `kernels` (`--target cuda`) say where each
//! kernel module comes from, for errors and profiles.

use crate::init::{global_layer, Shard};
use crate::rng::Init;
use crate::tensor::DType;
use serde::{Deserialize, Serialize};

/// The format's version, the first key of the text.
const VERSION: u32 = 1;

/// Why a manifest's text cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("not a ppc manifest (version {VERSION})")]
    NotJson(#[source] serde_json::Error),
    #[error("manifest version {found} (this runtime reads version {VERSION})")]
    Version { found: u32 },
    #[error("a program needs at least one rank and one replica")]
    NoRanks,
    #[error("a manifest needs exactly one input and one output")]
    InputOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Input,
    Param,
    Output,
    /// Training programs: the targets of the loss, `[microbatches, ...target]`.
    Target,
    /// Training programs: the loss (f32 scalar).
    Loss,
    /// Training programs: the f32 gradient of the parameter of the same name.
    Grad,
    /// The arguments of a CUDA training step's optimizer update (`gpu_update.rs`), never in
    /// a manifest's lists: the f32 first and second moments (SGD: momentum in the first) and
    /// the f32 master of the parameter of the same name, the step's hyper-parameters, and the
    /// gradients' sums of squares (for the global norm, `clip.rs`).
    Moment1,
    Moment2,
    Master,
    Hyper,
    Squares,
}

impl Role {
    /// What the program writes: the output, the loss, the gradients.
    pub fn is_result(self) -> bool {
        matches!(self, Role::Output | Role::Loss | Role::Grad)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Arg {
    pub role: Role,
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// How values are drawn when no file gives them: parameters, and the input (synthetic
    /// inputs; token ids are `uniform(0, vocab)`).
    pub init: Init,
    pub layer_axes: usize,
    /// Sharded parameters only: the axis that holds this rank's stages.
    pub shard_axis: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub model: String,
    pub stages: u64,
    pub microbatches: u64,
    pub repeats: u64,
    pub layers: u64,
    pub ranks: u64,
    /// Training programs: pipelines run side by side on `replicas × ranks` processes, each on its
    /// own microbatches, their gradients summed once per step (data × pipeline parallel).
    pub replicas: u64,
    /// Floating-point operations of one forward step of the sequential model (no bubbles).
    pub flops: u64,
    /// How many stage calls offer each (tick, stage) slot its work: 1, or 2 in the training
    /// step of `--schedule 1f1b`, whose every tick calls the stages' forward and their backward
    /// and each stage takes one of the two. The measured bubble counts busy slots over this.
    #[serde(default = "one")]
    pub calls_per_slot: u64,
    pub target: Option<Target>,
    /// `--target cuda`: the GPU architecture of the kernels (`sm_90`); `None` for the CPU.
    pub gpu: Option<String>,
    pub args: Vec<Arg>,
    /// Training programs for the CPU: the arguments of `ppc_evaluate`, the step without its
    /// gradients (`loss, output = f(input, target, params)`), which labels the synthetic task
    /// and validates; empty where it is not built (forward programs, `--target cuda`).
    #[serde(default)]
    pub evaluate: Vec<Arg>,
    /// Generated code runs with subnormals counted as zero (`subnormals.rs`): the fast numerics
    /// on the CPU. False: IEEE's gradual underflow (the exact numerics, GPU kernels).
    #[serde(default)]
    pub flush_to_zero: bool,
    /// Names of the traced loop nests (`ppc_trace_group_begin`'s numbers index them).
    pub groups: Vec<String>,
    /// `--target cuda`: where each kernel module comes from in the model file (`file:line:col`),
    /// in the order the modules register, which is the order `ppc compile --emit=ptx` prints.
    #[serde(default)]
    pub kernels: Vec<String>,
    /// Training programs: the model file's `train { ... }` settings (the optimizer's defaults).
    pub train: Vec<(String, String)>,
    /// Training programs whose loss is `softmax_cross_entropy`: the outputs' last axis holds
    /// classes and the targets are class ids, so a run reports accuracy beside the loss.
    #[serde(default)]
    pub cross_entropy: bool,
    /// The target id the loss leaves out (`ignore_index`), which accuracy leaves out too.
    #[serde(default)]
    pub ignore_index: Option<i32>,
    /// The model's dimensions, as compiled (`--dim` applied), in the file's order: recorded in
    /// the parameter files and checkpoints the program writes.
    #[serde(default)]
    pub dims: Vec<(String, u64)>,
}

/// The CPU generated code was compiled for (`ppc compile --target-cpu`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// The name given to `--target-cpu`, as the user wrote it (`x86-64-v3`, `native`).
    pub cpu: String,
    /// Instruction-set features the code may use ([`crate::cpu::KNOWN`] names).
    pub features: Vec<String>,
}

fn one() -> u64 {
    1
}

impl Manifest {
    /// The model layer of each of the `[layer axes...]` slices of parameter `a` on rank
    /// `rank`, in order (one slice, layer 0, for a parameter of `@embed` or `@head`).
    pub fn layer_ids(&self, a: &Arg, rank: usize) -> Vec<u64> {
        let lead = &a.shape[..a.layer_axes];
        let shard = a.shard_axis.map(|axis| Shard {
            axis,
            full: self.stages as usize,
            offset: rank * a.shape[axis],
        });
        let count: usize = lead.iter().product();
        (0..count)
            .map(|l| global_layer(l, lead, shard) as u64)
            .collect()
    }

    /// The share of the GPipe loop's layer slots that run no layer: of `(R·M+S-1)·S·k`, a
    /// microbatch runs each of the `L` layers once; (S-1)/(R·M+S-1) when the layers fill
    /// the `S·R·k` slots, more where the last are empty (uneven depth).
    pub fn bubble(&self) -> f64 {
        let k = self.layers.div_ceil(self.stages * self.repeats);
        let iterations = self.repeats * self.microbatches + self.stages - 1;
        1.0 - (self.microbatches * self.layers) as f64 / (iterations * self.stages * k) as f64
    }

    /// What the program's parameter files and checkpoints record of its model
    /// ([`crate::params::model_metadata`]).
    pub fn metadata(&self) -> Vec<(String, String)> {
        let pipeline = [self.stages, self.microbatches, self.repeats, self.layers];
        crate::params::model_metadata(&self.dims, pipeline)
    }

    pub fn input(&self) -> &Arg {
        self.args
            .iter()
            .find(|a| a.role == Role::Input)
            .expect("invariant: a manifest has an input")
    }

    pub fn output(&self) -> &Arg {
        self.args
            .iter()
            .find(|a| a.role == Role::Output)
            .expect("invariant: a manifest has an output")
    }

    /// The argument of role `role` (the first, if several).
    pub fn arg(&self, role: Role) -> Option<&Arg> {
        self.args.iter().find(|a| a.role == role)
    }

    /// True for a training step (`ppc compile --train`): it takes targets and returns the loss
    /// and the gradients.
    pub fn trains(&self) -> bool {
        self.arg(Role::Loss).is_some()
    }

    /// The manifest as embedded in executables: JSON, its first key the format's version.
    pub fn to_text(&self) -> String {
        let versioned = Versioned {
            ppc_manifest: VERSION,
            manifest: self.clone(),
        };
        serde_json::to_string(&versioned).expect("invariant: a manifest serializes")
    }

    /// Reads [`Manifest::to_text`]'s text back, checking what the runtime relies on.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let v: Versioned = serde_json::from_str(text).map_err(ManifestError::NotJson)?;
        if v.ppc_manifest != VERSION {
            return Err(ManifestError::Version {
                found: v.ppc_manifest,
            });
        }
        let m = v.manifest;
        if m.ranks == 0 || m.replicas == 0 {
            return Err(ManifestError::NoRanks);
        }
        let count = |role| m.args.iter().filter(|a| a.role == role).count();
        if count(Role::Input) != 1 || count(Role::Output) != 1 {
            return Err(ManifestError::InputOutput);
        }
        Ok(m)
    }
}

/// The manifest's text: the version first, then the fields.
#[derive(Serialize, Deserialize)]
struct Versioned {
    ppc_manifest: u32,
    #[serde(flatten)]
    manifest: Manifest,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let m = Manifest {
            model: "examples/my model.ppc".into(),
            stages: 4,
            microbatches: 8,
            repeats: 2,
            layers: 8,
            ranks: 2,
            replicas: 3,
            flops: 123,
            calls_per_slot: 2,
            target: Some(Target {
                cpu: "x86-64-v3".into(),
                features: vec!["avx2".into(), "fma".into()],
            }),
            gpu: Some("sm_90".into()),
            flush_to_zero: true,
            args: vec![
                Arg {
                    role: Role::Input,
                    name: "x".into(),
                    dtype: DType::F32,
                    shape: vec![8, 16],
                    init: Init::Zeros,
                    layer_axes: 0,
                    shard_axis: None,
                },
                Arg {
                    role: Role::Param,
                    name: "w".into(),
                    dtype: DType::BF16,
                    shape: vec![2, 4, 16, 16],
                    init: Init::Uniform(-0.5, 0.25),
                    layer_axes: 2,
                    shard_axis: Some(1),
                },
                Arg {
                    role: Role::Param,
                    name: "s".into(),
                    dtype: DType::F32,
                    shape: vec![],
                    init: Init::Normal(0.02),
                    layer_axes: 0,
                    shard_axis: None,
                },
                Arg {
                    role: Role::Grad,
                    name: "w".into(),
                    dtype: DType::F32,
                    shape: vec![2, 4, 16, 16],
                    init: Init::Zeros,
                    layer_axes: 0,
                    shard_axis: None,
                },
                Arg {
                    role: Role::Output,
                    name: "y".into(),
                    dtype: DType::F32,
                    shape: vec![8, 16],
                    init: Init::Zeros,
                    layer_axes: 0,
                    shard_axis: None,
                },
            ],
            evaluate: vec![Arg {
                role: Role::Loss,
                name: "loss".into(),
                dtype: DType::F32,
                shape: vec![],
                init: Init::Zeros,
                layer_axes: 0,
                shard_axis: None,
            }],
            groups: vec!["gelu+add, line 60".into(), "softmax, line 39".into()],
            kernels: vec!["examples/mlp.ppc:14:9".into()],
            cross_entropy: false,
            ignore_index: None,
            dims: Vec::new(),
            train: vec![
                ("optimizer".into(), "sgd".into()),
                ("lr".into(), "1e-3".into()),
            ],
        };
        assert_eq!(Manifest::parse(&m.to_text()).expect("parses"), m);
        assert!(matches!(
            Manifest::parse("nonsense"),
            Err(ManifestError::NotJson(_))
        ));
        let later = m
            .to_text()
            .replacen("\"ppc_manifest\":1", "\"ppc_manifest\":2", 1);
        assert!(matches!(
            Manifest::parse(&later),
            Err(ManifestError::Version { found: 2 })
        ));
        let no_output = Manifest {
            args: m.args[..1].to_vec(),
            ..m
        };
        assert!(matches!(
            Manifest::parse(&no_output.to_text()),
            Err(ManifestError::InputOutput)
        ));
    }
}
