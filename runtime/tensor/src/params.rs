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
//! A file is opened by its header; each rank then reads only the bytes of the layers it holds.

use crate::init::Source;
use crate::memref::HostBuffer;
use crate::rng::Init;
use crate::safetensors::{self, Entry};
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The tensor name of parameter `name` of layer `layer`.
pub fn tensor_name(layer: u64, name: &str) -> String {
    format!("layers.{layer}.{name}")
}

/// One parameter of the model as files hold it: per layer, of `shape`, for `layers` layers;
/// stored as `dtype` and drawn with `init` by the seeded generator.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub name: String,
    pub shape: Vec<usize>,
    pub layers: u64,
    pub dtype: DType,
    pub init: Init,
}

/// Writes every layer's parameters from `source` to `path` (atomically), named as
/// [`ParamFile`] reads them, in the model's storage dtype.
pub fn dump(source: &Source, specs: &[Spec], path: &Path) -> Result<(), String> {
    let mut tensors = Vec::new();
    for spec in specs {
        let n: usize = spec.shape.iter().product();
        for l in 0..spec.layers {
            let v = source.layer(&spec.name, l, spec.init, n)?;
            let t = Tensor::new(spec.dtype, spec.shape.clone(), v);
            tensors.push((tensor_name(l, &spec.name), HostBuffer::from_tensor(&t)));
        }
    }
    let refs: Vec<(&str, &HostBuffer)> = tensors.iter().map(|(n, b)| (n.as_str(), b)).collect();
    safetensors::write(path, &refs)
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
    pub fn open(path: &Path, specs: &[Spec]) -> Result<ParamFile, String> {
        let shown = path.display();
        let mut f = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        let (entries, data_start) = safetensors::read_header(&mut f)
            .map_err(|e| format!("{shown} is not a valid safetensors file: {e}"))?;
        let mut index = BTreeMap::new();
        let mut problems = Vec::new();
        let mut used = vec![false; entries.len()];
        for spec in specs {
            let inner: usize = spec.shape.iter().product();
            let stacked = entries.iter().position(|e| e.name == spec.name);
            for l in 0..spec.layers {
                let per_layer = tensor_name(l, &spec.name);
                let found = entries.iter().position(|e| e.name == per_layer);
                let (i, offset, want) = match (found, stacked) {
                    (Some(i), _) => (i, 0, spec.shape.clone()),
                    (None, Some(i)) => {
                        let mut want = vec![spec.layers as usize];
                        want.extend(&spec.shape);
                        (i, l as usize * inner, want)
                    }
                    (None, None) => {
                        problems.push(format!("missing `{per_layer}` ({:?})", spec.shape));
                        continue;
                    }
                };
                used[i] = true;
                let e = &entries[i];
                if !e.dtype.is_float() {
                    problems.push(format!(
                        "`{}` is {}, not a floating-point dtype",
                        e.name, e.dtype
                    ));
                } else if e.shape != want {
                    problems.push(format!(
                        "`{}` has shape {:?}, the model needs {want:?}",
                        e.name, e.shape
                    ));
                } else {
                    index.insert((spec.name.clone(), l), (e.clone(), offset..offset + inner));
                }
            }
        }
        for (e, _) in entries.iter().zip(&used).filter(|(_, u)| !**u) {
            problems.push(format!("`{}` is not a parameter of this model", e.name));
        }
        if !problems.is_empty() {
            problems.sort();
            problems.dedup();
            let names: Vec<String> = specs
                .iter()
                .map(|s| format!("{} {:?}", s.name, s.shape))
                .collect();
            return Err(format!(
                "{shown} does not fit this model:\n  {}\n(expected `layers.L.NAME` for L in 0..{} or a stacked `NAME` [layers, ...] for each of: {})",
                problems.join("\n  "),
                specs.first().map_or(0, |s| s.layers),
                names.join(", ")
            ));
        }
        Ok(ParamFile {
            path: path.to_path_buf(),
            data_start,
            index,
        })
    }

    /// The values of parameter `name` of layer `layer`, as f32 (rounding to the model's dtype
    /// is the caller's, as for drawn values).
    pub fn layer(&self, name: &str, layer: u64) -> Result<Vec<f32>, String> {
        let (e, elements) = self
            .index
            .get(&(name.to_string(), layer))
            .ok_or_else(|| format!("no parameter `{name}` for layer {layer}"))?;
        let size = e.dtype.size_bytes() as usize;
        let mut b = HostBuffer::zeros(e.dtype, &[elements.len()]);
        let mut f = std::fs::File::open(&self.path)
            .map_err(|err| format!("cannot read {}: {err}", self.path.display()))?;
        f.seek(SeekFrom::Start(
            self.data_start + (e.begin + elements.start * size) as u64,
        ))
        .and_then(|_| f.read_exact(b.bytes_mut()))
        .map_err(|err| {
            format!(
                "cannot read `{}` from {}: {err}",
                e.name,
                self.path.display()
            )
        })?;
        Ok(b.to_tensor().data)
    }
}
