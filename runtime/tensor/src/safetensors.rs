//! Reading and writing safetensors files, the tensor format ML users already use: an 8-byte
//! little-endian header length, a JSON header mapping names to dtype, shape and byte range,
//! then the raw little-endian data.
//!
//! Errors are typed: [`FormatError`] says what is wrong with the bytes, [`FileError`] which file
//! could not be read or written, or which tensor it lacks (with the bytes' error as its source).

use crate::files::{write_file, WriteError};
use crate::memref::HostBuffer;
use crate::tensor::DType;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
        DType::I32 => "I32",
        DType::I1 => "BOOL",
    }
}

fn dtype_of(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dtype_name(d) == name)
}

/// The bytes of a safetensors file holding `tensors` in the given order.
pub fn encode(tensors: &[(&str, &HostBuffer)]) -> Vec<u8> {
    encode_with(tensors, &[])
}

/// As [`encode`], with string `metadata` in the header's `__metadata__` (what ppc records of
/// the model a file belongs to: [`MODEL_METADATA`]).
pub fn encode_with(tensors: &[(&str, &HostBuffer)], metadata: &[(String, String)]) -> Vec<u8> {
    let mut header = Map::new();
    if !metadata.is_empty() {
        let m: Map<String, Value> = (metadata.iter())
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let mut offset = 0usize;
    for (name, b) in tensors {
        let n = b.bytes().len();
        header.insert(name.to_string(), json!({"dtype": dtype_name(b.dtype), "shape": b.shape, "data_offsets": [offset, offset + n]}));
        offset += n;
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    for (_, b) in tensors {
        out.extend_from_slice(b.bytes());
    }
    out
}

/// A tensor as the header describes it: its bytes are `begin..end` of the data section.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub begin: usize,
    pub end: usize,
    /// Stored as 64-bit integers (`I64`, NumPy's default), read as `I32` where they fit.
    pub wide: bool,
}

/// What is wrong with the bytes of a safetensors file.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("the file is shorter than a safetensors header")]
    TooShort,
    #[error("the header length points past the end of the file")]
    HeaderPastEnd,
    #[error("the header is not JSON")]
    HeaderNotJson(#[source] serde_json::Error),
    /// `dtype` is the header's JSON value.
    #[error("tensor `{name}`: unsupported dtype {dtype}")]
    UnsupportedDType { name: String, dtype: String },
    #[error("tensor `{name}`: no shape")]
    NoShape { name: String },
    #[error("tensor `{name}`: bad shape")]
    BadShape { name: String },
    #[error("tensor `{name}`: no data_offsets")]
    NoDataOffsets { name: String },
    #[error("tensor `{name}`: shape overflows")]
    ShapeOverflows { name: String },
    #[error("tensor `{name}`: size overflows")]
    SizeOverflows { name: String },
    #[error(
        "tensor `{name}`: data_offsets {begin}..{end} do not fit a {} tensor of shape {shape:?} in {data_len} data bytes",
        dtype_name(*.dtype)
    )]
    OffsetsOutOfRange {
        name: String,
        begin: usize,
        end: usize,
        dtype: DType,
        shape: Vec<usize>,
        data_len: usize,
    },
    /// Reading the header from an open file failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Wide(#[from] WideValue),
}

/// A safetensors file that could not be read or written, or lacks a tensor.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a valid safetensors file", .path.display())]
    Invalid { path: PathBuf, source: FormatError },
    #[error("{} has no tensor `{name}` (it has: {})", .path.display(), .names.join(", "))]
    NoTensor {
        path: PathBuf,
        name: String,
        /// The tensors the file has, in header order.
        names: Vec<String>,
    },
    /// An `I64` tensor holds a value `I32` cannot.
    #[error("{}: tensor `{name}` holds {value} at element {index}, which int32 cannot hold: store it as int32", .path.display())]
    WideInt {
        path: PathBuf,
        name: String,
        index: usize,
        value: i64,
    },
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// The entries of a JSON header, checked against a data section of `data_len` bytes.
fn entries(header: &[u8], data_len: usize) -> Result<Vec<Entry>, FormatError> {
    let header: Map<String, Value> =
        serde_json::from_slice(header).map_err(FormatError::HeaderNotJson)?;
    let mut out = Vec::new();
    for (name, v) in header {
        if name == "__metadata__" {
            continue;
        }
        let wide = v["dtype"].as_str() == Some("I64");
        let Some(dtype) = (v["dtype"].as_str())
            .and_then(dtype_of)
            .or(wide.then_some(DType::I32))
        else {
            let dtype = v["dtype"].to_string();
            return Err(FormatError::UnsupportedDType { name, dtype });
        };
        let Some(dims) = v["shape"].as_array() else {
            return Err(FormatError::NoShape { name });
        };
        let Some(shape) = dims
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<Vec<usize>>>()
        else {
            return Err(FormatError::BadShape { name });
        };
        let Some(offs) = v["data_offsets"].as_array().filter(|o| o.len() == 2) else {
            return Err(FormatError::NoDataOffsets { name });
        };
        let (a, b) = (
            offs[0].as_u64().unwrap_or(u64::MAX) as usize,
            offs[1].as_u64().unwrap_or(u64::MAX) as usize,
        );
        let Some(elements) = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) else {
            return Err(FormatError::ShapeOverflows { name });
        };
        let size = if wide { 8 } else { dtype.size_bytes() as usize };
        let Some(want) = elements.checked_mul(size) else {
            return Err(FormatError::SizeOverflows { name });
        };
        if b < a || b - a != want || b > data_len {
            return Err(FormatError::OffsetsOutOfRange {
                name,
                begin: a,
                end: b,
                dtype,
                shape,
                data_len,
            });
        }
        out.push(Entry {
            name,
            dtype,
            shape,
            begin: a,
            end: b,
            wide,
        });
    }
    Ok(out)
}

/// The header length the bytes `head` start with.
fn header_len(head: &[u8]) -> Result<usize, FormatError> {
    let len = head.first_chunk::<8>().ok_or(FormatError::TooShort)?;
    Ok(u64::from_le_bytes(*len) as usize)
}

/// The tensors of a safetensors file, in header order, or what is wrong with it.
pub fn decode(bytes: &[u8]) -> Result<Vec<(String, HostBuffer)>, FormatError> {
    let len = header_len(bytes)?;
    let header = bytes
        .get(8..8usize.saturating_add(len))
        .ok_or(FormatError::HeaderPastEnd)?;
    let data = &bytes[8 + len..];
    entries(header, data.len())?
        .into_iter()
        .map(|e| {
            let buf = buffer(&e, &data[e.begin..e.end])?;
            Ok((e.name, buf))
        })
        .collect()
}

/// The buffer of entry `e` from its stored `bytes`; `I64` values narrowed to `I32`, or the
/// index and value of the first that does not fit.
fn buffer(e: &Entry, bytes: &[u8]) -> Result<HostBuffer, WideValue> {
    let mut buf = HostBuffer::zeros(e.dtype, &e.shape);
    if !e.wide {
        buf.bytes_mut().copy_from_slice(bytes);
        return Ok(buf);
    }
    for (index, (w, n)) in bytes
        .chunks_exact(8)
        .zip(buf.bytes_mut().chunks_exact_mut(4))
        .enumerate()
    {
        let value = i64::from_le_bytes(w.try_into().expect("invariant: 8 bytes"));
        let narrow = i32::try_from(value).map_err(|_| WideValue { index, value })?;
        n.copy_from_slice(&narrow.to_le_bytes());
    }
    Ok(buf)
}

/// An `I64` value that `I32` cannot hold, at flat `index`.
#[derive(Debug, thiserror::Error)]
#[error("tensor holds {value} at element {index}, which int32 cannot hold: store it as int32")]
pub struct WideValue {
    pub index: usize,
    pub value: i64,
}

/// The entries of an open file and where its data section starts, reading only the header.
pub fn read_header(f: &mut std::fs::File) -> Result<(Vec<Entry>, u64), FormatError> {
    use std::io::Read;
    let file_len = f.metadata()?.len();
    let mut head = [0u8; 8];
    f.read_exact(&mut head).map_err(|_| FormatError::TooShort)?;
    let len = header_len(&head)?;
    if 8 + len as u64 > file_len {
        return Err(FormatError::HeaderPastEnd);
    }
    let mut header = vec![0u8; len];
    f.read_exact(&mut header)?;
    let data_len = (file_len - 8 - len as u64) as usize;
    Ok((entries(&header, data_len)?, 8 + len as u64))
}

/// Reads one tensor by name from a file.
/// Tensor `name` of the file at `path` as its header describes it, with the open file and
/// where its data section starts: the header alone is read, checked against the file's length.
fn entry(path: &Path, name: &str) -> Result<(std::fs::File, Entry, u64), FileError> {
    let mut f = std::fs::File::open(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let (entries, data_start) = read_header(&mut f).map_err(|source| FileError::Invalid {
        path: path.to_path_buf(),
        source,
    })?;
    match entries.iter().position(|e| e.name == name) {
        Some(i) => Ok((f, entries[i].clone(), data_start)),
        None => Err(FileError::NoTensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            names: entries.into_iter().map(|e| e.name).collect(),
        }),
    }
}

/// The dtype and shape of tensor `name`, reading the file's header alone.
pub fn tensor_type(path: &Path, name: &str) -> Result<(DType, Vec<usize>), FileError> {
    let (_, e, _) = entry(path, name)?;
    Ok((e.dtype, e.shape))
}

/// Reads one tensor by name from a file: the header first, checked against the file's length,
/// then that tensor's bytes alone (a file that is not safetensors, `/dev/zero` included, is
/// refused before its body is read).
pub fn read_tensor(path: &Path, name: &str) -> Result<HostBuffer, FileError> {
    use std::io::{Read, Seek, SeekFrom};
    let (mut f, e, data_start) = entry(path, name)?;
    let mut bytes = vec![0u8; e.end - e.begin];
    f.seek(SeekFrom::Start(data_start + e.begin as u64))
        .and_then(|_| f.read_exact(&mut bytes))
        .map_err(|source| FileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    buffer(&e, &bytes).map_err(|w| FileError::WideInt {
        path: path.to_path_buf(),
        name: name.to_string(),
        index: w.index,
        value: w.value,
    })
}

/// Writes a file atomically (see [`crate::files::write_atomic`]).
pub fn write(path: &Path, tensors: &[(&str, &HostBuffer)]) -> Result<(), FileError> {
    Ok(write_file(path, &encode(tensors))?)
}

/// As [`write`], with `metadata` ([`encode_with`]).
pub fn write_with(
    path: &Path,
    tensors: &[(&str, &HostBuffer)],
    metadata: &[(String, String)],
) -> Result<(), FileError> {
    Ok(write_file(path, &encode_with(tensors, metadata))?)
}

/// The keys of `__metadata__` under which ppc records the model a parameter file or a
/// checkpoint belongs to: its dimensions (`b=2 t=32 ...`), its pipeline settings, and for a
/// checkpoint the training run's optimizer settings (`lr=0.001 ...`).
pub const MODEL_METADATA: [&str; 3] = ["ppc.dims", "ppc.pipeline", "ppc.optimizer"];

/// The `__metadata__` of a safetensors file (empty where it has none), reading its header
/// alone.
pub fn read_metadata(path: &Path) -> Result<Vec<(String, String)>, FileError> {
    use std::io::Read;
    let invalid = |source| FileError::Invalid {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file_len = f.metadata().map_err(|e| invalid(e.into()))?.len();
    let mut head = [0u8; 8];
    f.read_exact(&mut head)
        .map_err(|_| invalid(FormatError::TooShort))?;
    let len = header_len(&head).map_err(invalid)?;
    if 8 + len as u64 > file_len {
        return Err(invalid(FormatError::HeaderPastEnd));
    }
    let mut header = vec![0u8; len];
    f.read_exact(&mut header).map_err(|e| invalid(e.into()))?;
    let header: Map<String, Value> =
        serde_json::from_slice(&header).map_err(|e| invalid(FormatError::HeaderNotJson(e)))?;
    Ok(match header.get("__metadata__") {
        Some(Value::Object(m)) => (m.iter())
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        _ => Vec::new(),
    })
}

/// `key=value` pairs separated by spaces, as [`MODEL_METADATA`] values hold them.
pub fn pairs(text: &str) -> Vec<(String, String)> {
    (text.split_whitespace())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    /// NumPy's default integers: `I64` read as `I32` where every value fits, else refused
    /// naming the first that does not.
    #[test]
    fn int64_tensors_read_as_int32_where_they_fit() {
        let file = |values: &[i64]| {
            let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let header = format!(
                r#"{{"target":{{"dtype":"I64","shape":[{}],"data_offsets":[0,{}]}}}}"#,
                values.len(),
                raw.len()
            );
            let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
            bytes.extend(header.as_bytes());
            bytes.extend(raw);
            let path = std::env::temp_dir().join(format!(
                "ppc-i64-{}-{}.safetensors",
                std::process::id(),
                values.len()
            ));
            std::fs::write(&path, bytes).expect("write");
            path
        };
        let fits = file(&[3, -1, 9]);
        let t = read_tensor(&fits, "target").expect("fits").to_tensor();
        assert_eq!(
            (t.dtype, t.int(0), t.int(1), t.int(2)),
            (DType::I32, 3, -1, 9)
        );
        let wide = file(&[1, 2, 1 << 40, 4]);
        let Err(e) = read_tensor(&wide, "target") else {
            panic!("2^40 read as int32");
        };
        assert!(
            e.to_string().contains("holds 1099511627776 at element 2"),
            "{e}"
        );
        assert!(e.to_string().contains("store it as int32"), "{e}");
        for p in [fits, wide] {
            std::fs::remove_file(p).expect("cleanup");
        }
    }

    #[test]
    fn round_trips_and_rejects_garbage() {
        let a = HostBuffer::from_tensor(&Tensor::new(
            DType::F32,
            vec![2, 2],
            vec![1.0, -2.0, 3.0, 4.5],
        ));
        let b = HostBuffer::from_tensor(&Tensor::new(DType::BF16, vec![3], vec![1.0, 0.5, -8.0]));
        let bytes = encode(&[("a", &a), ("b", &b)]);
        let back = decode(&bytes).expect("decodes");
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].1.to_tensor(), a.to_tensor());
        assert_eq!(back[1].1.to_tensor(), b.to_tensor());
        assert!(decode(&bytes[..5]).is_err());
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        let mut bad = bytes.clone();
        bad[0] = 0xff;
        assert!(decode(&bad).is_err());
    }
}
