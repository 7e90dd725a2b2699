//! Checkpoints of a training run (`--save`, written atomically; `--resume`): a safetensors file
//! holding the f32 master weights as `layers.L.NAME` (the naming of `--params` files), the
//! optimizer's moments as `optim.m.layers.L.NAME` (and `optim.v.` for AdamW), and
//! `optim.step`; the parameters of `@embed` and `@head`, which every rank holds, once as
//! `NAME`. Names do not depend on how the stages are laid out, so a checkpoint resumes on any
//! rank count. What goes wrong is a [`CheckpointError`].

use crate::error::Chain;
use crate::manifest::{Arg, Manifest};
use crate::memref::HostBuffer;
use crate::optim::{Config, Kind, Optimizer};
use crate::params::tensor_name;
use crate::safetensors::{self, FileError};
use crate::tensor::{DType, Tensor};
use std::path::{Path, PathBuf};

/// A checkpoint that cannot be written, read, or resumed from.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    File(#[from] FileError),
    /// The checkpoint records other dimensions than the model's.
    #[error(transparent)]
    OtherModel(#[from] crate::params::ParamError),
    #[error("{}: tensor `{tensor}` is {shape:?}, the model's is {want:?}", .path.display())]
    Shape {
        path: PathBuf,
        tensor: String,
        shape: Vec<usize>,
        want: Vec<usize>,
    },
    /// AdamW's second moments cannot be read: shown with the cause first, then the likely
    /// reason (the cause is part of this message, not its `source`).
    #[error("{} (a checkpoint of SGD cannot resume with AdamW)", Chain(.0.as_ref()))]
    NoSecondMoments(Box<CheckpointError>),
    /// The copies of a parameter every rank holds (`@embed`'s, `@head`'s) differ: a bug.
    #[error("the ranks' copies of `{tensor}` differ (rank {rank} from rank 0); not written")]
    CopiesDiffer { tensor: String, rank: usize },
}

/// The tensor names of the `[layer axes...]` slices of parameter `a` on rank `rank`: one per
/// model layer (`None` for an empty slot of uneven depth, which checkpoints leave out), or the
/// parameter's own name for one held once (by every rank).
fn tensor_names(m: &Manifest, a: &Arg, rank: usize) -> Vec<Option<String>> {
    if a.layer_axes == 0 {
        return vec![Some(a.name.clone())];
    }
    m.layer_ids(a, rank)
        .into_iter()
        .map(|l| (l < m.layers).then(|| tensor_name(l, &a.name)))
        .collect()
}

/// Writes the checkpoint (on rank 0, which gathers every rank's stages); true where written.
/// A parameter every rank holds is written once, after checking that every copy is the same.
pub fn save(
    path: &Path,
    m: &Manifest,
    params: &[&Arg],
    bufs: &[HostBuffer],
    opt: &Optimizer,
) -> Result<bool, CheckpointError> {
    // Every replica holds the same weights: the first one writes them.
    if crate::comm::replica() != 0 {
        return Ok(false);
    }
    let mut named: Vec<(String, HostBuffer)> = Vec::new();
    for (i, a) in params.iter().enumerate() {
        let inner: Vec<usize> = a.shape[a.layer_axes..].to_vec();
        let n: usize = inner.iter().product();
        let mut add = |prefix: &str, data: &[f32]| -> Result<(), CheckpointError> {
            let local: Vec<f64> = data.iter().map(|&v| f64::from(v)).collect();
            // Every rank holds slices of the same shape, so rank `r`'s are chunk `r`.
            let Some(all) = crate::comm::gather(&local) else {
                return Ok(());
            };
            let mut chunks = all.chunks(local.len().max(1)).enumerate();
            if a.layer_axes == 0 {
                let tensor = format!("{prefix}{}", a.name);
                let first = chunks.next().map_or(&[][..], |(_, c)| c);
                if let Some((rank, _)) = chunks.find(|(_, c)| *c != first) {
                    return Err(CheckpointError::CopiesDiffer { tensor, rank });
                }
                chunks = all[..first.len()].chunks(first.len().max(1)).enumerate();
            }
            for (r, chunk) in chunks {
                let names = tensor_names(m, a, r).into_iter();
                for (name, values) in names.zip(chunk.chunks(n)) {
                    let Some(name) = name else { continue };
                    let values = values.iter().map(|&v| v as f32).collect();
                    let t = Tensor::new(DType::F32, inner.clone(), values);
                    named.push((format!("{prefix}{name}"), HostBuffer::from_tensor(&t)));
                }
            }
            Ok(())
        };
        add("", opt.weights(i, bufs))?;
        add("optim.m.", &opt.m[i])?;
        if opt.config.kind == Kind::AdamW {
            add("optim.v.", &opt.v[i])?;
        }
    }
    if crate::comm::rank() != 0 {
        return Ok(false);
    }
    // In one order whatever the rank count, so that the bytes are too.
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let step = Tensor::from_ints(vec![], [opt.step as i32]);
    named.push(("optim.step".into(), HostBuffer::from_tensor(&step)));
    let refs: Vec<(&str, &HostBuffer)> = named.iter().map(|(n, b)| (n.as_str(), b)).collect();
    let mut metadata = m.metadata();
    let settings = opt.config.settings().into_iter();
    let settings: Vec<String> = settings.map(|(k, v)| format!("{k}={v}")).collect();
    metadata.push(("ppc.optimizer".into(), settings.join(" ")));
    safetensors::write_with(path, &refs, &metadata)?;
    Ok(true)
}

/// The optimizer settings a checkpoint of [`save`] records, as `(key, value)` pairs (none
/// where it records none, or cannot be read: [`resume`] then says why).
pub fn optimizer_settings(path: &Path) -> Vec<(String, String)> {
    let meta = safetensors::read_metadata(path).unwrap_or_default();
    (meta.iter())
        .find(|(k, _)| k == "ppc.optimizer")
        .map_or(Vec::new(), |(_, v)| safetensors::pairs(v))
}

/// This rank's parameters and optimizer state from a checkpoint of [`save`], of any rank count.
pub fn resume(
    path: &Path,
    m: &Manifest,
    params: &[&Arg],
    config: Config,
    bufs: &mut [HostBuffer],
) -> Result<Optimizer, CheckpointError> {
    if let Some(e) = crate::params::other_dims(path, &m.dims) {
        return Err(e.into());
    }
    let rank = crate::comm::rank();
    let read = |prefix: &str, a: &Arg| -> Result<Vec<f32>, CheckpointError> {
        let inner: Vec<usize> = a.shape[a.layer_axes..].to_vec();
        let mut data = Vec::new();
        for name in tensor_names(m, a, rank) {
            let Some(name) = name else {
                data.extend(std::iter::repeat_n(0.0, inner.iter().product()));
                continue;
            };
            let key = format!("{prefix}{name}");
            let t = safetensors::read_tensor(path, &key)?;
            if t.shape != inner {
                return Err(CheckpointError::Shape {
                    path: path.to_path_buf(),
                    tensor: key,
                    shape: t.shape,
                    want: inner,
                });
            }
            data.extend(t.to_tensor().data);
        }
        Ok(data)
    };
    let mut opt = Optimizer::new(config, bufs);
    for (i, a) in params.iter().enumerate() {
        let weights = read("", a)?;
        opt.m[i] = read("optim.m.", a)?;
        if config.kind == Kind::AdamW {
            opt.v[i] =
                read("optim.v.", a).map_err(|e| CheckpointError::NoSecondMoments(Box::new(e)))?;
        }
        let w = Tensor::new(a.dtype, a.shape.clone(), weights);
        bufs[i] = HostBuffer::from_tensor(&w);
        if a.dtype != DType::F32 {
            opt.master[i] = w.data;
        }
    }
    opt.step = safetensors::read_tensor(path, "optim.step")?
        .to_tensor()
        .int(0) as u64;
    Ok(opt)
}
