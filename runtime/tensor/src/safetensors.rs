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
    let mut header = Map::new();
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
        let Some(dtype) = v["dtype"].as_str().and_then(dtype_of) else {
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
        let Some(want) = elements.checked_mul(dtype.size_bytes() as usize) else {
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
    Ok(entries(header, data.len())?
        .into_iter()
        .map(|e| {
            let mut buf = HostBuffer::zeros(e.dtype, &e.shape);
            buf.bytes_mut().copy_from_slice(&data[e.begin..e.end]);
            (e.name, buf)
        })
        .collect())
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
pub fn read_tensor(path: &Path, name: &str) -> Result<HostBuffer, FileError> {
    let bytes = std::fs::read(path).map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let tensors = decode(&bytes).map_err(|source| FileError::Invalid {
        path: path.to_path_buf(),
        source,
    })?;
    let names: Vec<String> = tensors.iter().map(|(n, _)| n.clone()).collect();
    tensors
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b)
        .ok_or_else(|| FileError::NoTensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            names,
        })
}

/// Writes a file atomically (see [`crate::files::write_atomic`]).
pub fn write(path: &Path, tensors: &[(&str, &HostBuffer)]) -> Result<(), FileError> {
    Ok(write_file(path, &encode(tensors))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

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
