//! Parameters in and out of safetensors files, under one naming.
//!
//! Layer `l` of the model (0-based, in model order: stage `s` of repeat `r` runs layers
//! `(r·S + s)·k .. +k`) has its parameter `w` (as `@layer` names it) in the tensor
//! `layers.{l}.w`, of `w`'s shape in `@layer`. A file may instead hold one stacked tensor `w`
//! of shape `[layers, ...]` per parameter; both are read, one form per parameter. The dtype in the
//! file may be f32, bf16 or f16 whatever the model stores: values are converted and rounded to
//! the storage dtype as the interpreter rounds. Every problem with a file (missing, extra,
//! wrong-shape or wrong-dtype tensors) is reported at once, before anything runs.
//!
//! Parameters of `@embed` and `@head` are held once, as the tensor named as the parameter. A
//! training checkpoint is a parameter file too: its optimizer state is skipped.
//!
//! A file is opened by its header; each rank then reads only the bytes of the layers it holds.
//!
//! What goes wrong is a [`ParamError`]: the file unreadable or not safetensors, or a
//! [`Misfit`] list of everything in it that does not fit the model.

use crate::init::Source;
use crate::memref::HostBuffer;
use crate::rng::Init;
use crate::safetensors::{self, Entry, FileError, FormatError};
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The prefix of a checkpoint's optimizer state (`optim.m.layers.0.w`), which readers of
/// parameters skip: a checkpoint is a parameter file too.
pub const OPTIMIZER_STATE: &str = "optim.";

/// The tensor name of parameter `name` of layer `layer`.
pub fn tensor_name(layer: u64, name: &str) -> String {
    format!("layers.{layer}.{name}")
}

impl Spec {
    /// Each tensor of the parameter with the layer it is read as: `(layers.{l}.name, l)` per
    /// layer, or `(name, 0)` for a parameter held once.
    fn tensors(&self) -> Vec<(String, u64)> {
        match self.layers {
            Some(layers) => (0..layers)
                .map(|l| (tensor_name(l, &self.name), l))
                .collect(),
            None => vec![(self.name.clone(), 0)],
        }
    }
}

/// One parameter of the model as files hold it: per layer, of `shape`, for `layers` layers, or
/// (`layers: None`, a parameter of `@embed` or `@head`) once, as the tensor `name`; stored as
/// `dtype` and drawn with `init` by the seeded generator (stream `(name, 0)` when held once).
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub name: String,
    pub shape: Vec<usize>,
    pub layers: Option<u64>,
    pub dtype: DType,
    pub init: Init,
}

/// Parameters that could not be read from (or written to) a file.
#[derive(Debug, thiserror::Error)]
pub enum ParamError {
    /// The file cannot be read or written, or is not safetensors.
    #[error(transparent)]
    File(#[from] FileError),
    /// Everything in the file that does not fit the model, sorted as shown.
    #[error(
        "{} does not fit this model:\n  {}\n(expected `layers.L.NAME` for L in 0..{layers} or a stacked `NAME` [layers, ...] for each of: {})",
        .path.display(),
        lines(.problems),
        .params.iter().map(|(name, shape)| format!("{name} {shape:?}")).collect::<Vec<_>>().join(", ")
    )]
    Misfit {
        path: PathBuf,
        problems: Vec<Misfit>,
        layers: u64,
        /// The model's parameters, named, with their per-layer shapes.
        params: Vec<(String, Vec<usize>)>,
    },
    /// The file records the dimensions of another model (`ppc.dims`): said in one line,
    /// instead of every tensor that does not fit.
    #[error("{} was made with {made}; this model has {have}: give the file's with --dim (or compile with them)", .path.display())]
    OtherDims {
        path: PathBuf,
        made: String,
        have: String,
    },
    #[error("no parameter `{name}` for layer {layer}")]
    NoParameter { name: String, layer: u64 },
    #[error("cannot read `{tensor}` from {}", .path.display())]
    ReadTensor {
        tensor: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One thing in a parameter file that does not fit the model.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Misfit {
    #[error("missing `{tensor}` ({shape:?})")]
    Missing { tensor: String, shape: Vec<usize> },
    #[error("`{tensor}` is {dtype}, not a floating-point dtype")]
    NotFloat { tensor: String, dtype: DType },
    #[error("`{tensor}` has shape {shape:?}, the model needs {want:?}")]
    Shape {
        tensor: String,
        shape: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("`{tensor}` is not a parameter of this model")]
    Extra { tensor: String },
}

/// One problem a line, indented under the first.
fn lines(problems: &[Misfit]) -> String {
    let shown: Vec<String> = problems.iter().map(Misfit::to_string).collect();
    shown.join("\n  ")
}

/// Writes every layer's parameters from `source` to `path` (atomically), named as
/// [`ParamFile`] reads them, in the model's storage dtype.
/// The `__metadata__` a parameter file or checkpoint records of its model: its dimensions and
/// its pipeline (`stages`, `microbatches`, `repeats`, `layers`).
pub fn model_metadata(dims: &[(String, u64)], pipeline: [u64; 4]) -> Vec<(String, String)> {
    let dims = dims.iter().map(|(n, v)| format!("{n}={v}"));
    let [s, m, r, l] = pipeline;
    let names = ["stages", "microbatches", "repeats", "layers"];
    vec![
        ("ppc.dims".into(), dims.collect::<Vec<_>>().join(" ")),
        (
            "ppc.pipeline".into(),
            (names.iter().zip([s, m, r, l]))
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ]
}

/// Where the dimensions `path` records (`ppc.dims`) differ from `dims`: `--dim d=64` against
/// `d=128`, one pair for each that differs; `None` where they agree or the file records none.
pub fn other_dims(path: &Path, dims: &[(String, u64)]) -> Option<ParamError> {
    let meta = safetensors::read_metadata(path).ok()?;
    let (_, made) = meta.iter().find(|(k, _)| k == "ppc.dims")?;
    let (made, have): (Vec<String>, Vec<String>) = safetensors::pairs(made)
        .into_iter()
        .filter_map(|(n, v)| {
            let (_, ours) = dims.iter().find(|(d, _)| *d == n)?;
            (v != ours.to_string()).then(|| (format!("--dim {n}={v}"), format!("{n}={ours}")))
        })
        .unzip();
    (!made.is_empty()).then(|| ParamError::OtherDims {
        path: path.to_path_buf(),
        made: made.join(" "),
        have: have.join(", "),
    })
}

/// Writes the parameters `specs` describe, drawn from `source`, to `path`, recording
/// `metadata` ([`model_metadata`]).
pub fn dump(
    source: &Source,
    specs: &[Spec],
    path: &Path,
    metadata: &[(String, String)],
) -> Result<(), ParamError> {
    let mut tensors = Vec::new();
    for spec in specs {
        let n: usize = spec.shape.iter().product();
        for (tensor, l) in spec.tensors() {
            let v = source.layer(&spec.name, l, spec.init, n)?;
            let t = Tensor::new(spec.dtype, spec.shape.clone(), v);
            tensors.push((tensor, HostBuffer::from_tensor(&t)));
        }
    }
    let refs: Vec<(&str, &HostBuffer)> = tensors.iter().map(|(n, b)| (n.as_str(), b)).collect();
    Ok(safetensors::write_with(path, &refs, metadata)?)
}

/// A parameter file, checked against the model and ready to read layer by layer.
#[derive(Debug)]
pub struct ParamFile {
    path: PathBuf,
    /// Where the data section starts in the file.
    data_start: u64,
    /// For each (parameter, layer): the tensor, and where the layer's elements are in it.
    index: BTreeMap<(String, u64), (Entry, std::ops::Range<usize>)>,
}

impl ParamFile {
    /// Opens `path` and checks that it holds exactly the parameters `specs` describe.
    pub fn open(path: &Path, specs: &[Spec]) -> Result<ParamFile, ParamError> {
        let mut f = std::fs::File::open(path).map_err(|source| FileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let (entries, data_start) =
            safetensors::read_header(&mut f).map_err(|source: FormatError| FileError::Invalid {
                path: path.to_path_buf(),
                source,
            })?;
        let mut index = BTreeMap::new();
        let mut problems = Vec::new();
        let mut used = vec![false; entries.len()];
        for spec in specs {
            let inner: usize = spec.shape.iter().product();
            let stacked = spec.layers.and_then(|layers| {
                Some((layers, entries.iter().position(|e| e.name == spec.name)?))
            });
            for (per_layer, l) in spec.tensors() {
                let found = entries.iter().position(|e| e.name == per_layer);
                let (i, offset, want) = match (found, stacked) {
                    (Some(i), _) => (i, 0, spec.shape.clone()),
                    (None, Some((layers, i))) => {
                        let mut want = vec![layers as usize];
                        want.extend(&spec.shape);
                        (i, l as usize * inner, want)
                    }
                    (None, None) => {
                        problems.push(Misfit::Missing {
                            tensor: per_layer,
                            shape: spec.shape.clone(),
                        });
                        continue;
                    }
                };
                used[i] = true;
                let e = &entries[i];
                if !e.dtype.is_float() {
                    problems.push(Misfit::NotFloat {
                        tensor: e.name.clone(),
                        dtype: e.dtype,
                    });
                } else if e.shape != want {
                    problems.push(Misfit::Shape {
                        tensor: e.name.clone(),
                        shape: e.shape.clone(),
                        want,
                    });
                } else {
                    index.insert((spec.name.clone(), l), (e.clone(), offset..offset + inner));
                }
            }
        }
        let unused = entries.iter().zip(&used).filter(|(_, u)| !**u);
        for (e, _) in unused.filter(|(e, _)| !e.name.starts_with(OPTIMIZER_STATE)) {
            problems.push(Misfit::Extra {
                tensor: e.name.clone(),
            });
        }
        if !problems.is_empty() {
            // In the order of their text: what users have always been shown.
            problems.sort_by_cached_key(Misfit::to_string);
            problems.dedup();
            return Err(ParamError::Misfit {
                path: path.to_path_buf(),
                problems,
                layers: specs.iter().find_map(|s| s.layers).unwrap_or(0),
                params: specs
                    .iter()
                    .map(|s| (s.name.clone(), s.shape.clone()))
                    .collect(),
            });
        }
        Ok(ParamFile {
            path: path.to_path_buf(),
            data_start,
            index,
        })
    }

    /// The values of parameter `name` of layer `layer`, as f32 (rounding to the model's dtype
    /// is the caller's, as for drawn values).
    pub fn layer(&self, name: &str, layer: u64) -> Result<Vec<f32>, ParamError> {
        let (e, elements) =
            self.index
                .get(&(name.to_string(), layer))
                .ok_or_else(|| ParamError::NoParameter {
                    name: name.to_string(),
                    layer,
                })?;
        let size = e.dtype.size_bytes() as usize;
        let mut b = HostBuffer::zeros(e.dtype, &[elements.len()]);
        let mut f = std::fs::File::open(&self.path).map_err(|source| FileError::Read {
            path: self.path.clone(),
            source,
        })?;
        f.seek(SeekFrom::Start(
            self.data_start + (e.begin + elements.start * size) as u64,
        ))
        .and_then(|_| f.read_exact(b.bytes_mut()))
        .map_err(|source| ParamError::ReadTensor {
            tensor: e.name.clone(),
            path: self.path.clone(),
            source,
        })?;
        Ok(b.to_tensor().data)
    }
}
