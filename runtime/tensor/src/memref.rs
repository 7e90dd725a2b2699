//! Host buffers in the memory layout MLIR code expects, and the memref descriptors that point
//! at them.
//!
//! A [`HostBuffer`] holds the bytes of one dense row-major tensor in its dtype's storage format
//! (f32, bf16 and f16 bits, i32, and i1 as one byte), 64-byte aligned. Its descriptor is MLIR's
//! ranked memref struct `{allocated, aligned, offset, sizes[rank], strides[rank]}`, all 8-byte
//! words, so one `Vec<i64>` represents any rank.

use crate::tensor::{strides, DType, Tensor};
use half::{bf16, f16};

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// MLIR's unranked memref, as the C interface passes `memref<*xT>`: the rank and a pointer to
/// the ranked descriptor.
#[repr(C)]
pub struct Unranked {
    pub rank: i64,
    pub descriptor: *const std::ffi::c_void,
}

/// A tensor's bytes, laid out for generated code.
#[derive(Clone)]
pub struct HostBuffer {
    pub dtype: DType,
    pub shape: Vec<usize>,
    lines: Vec<Line>,
    len: usize,
    /// Names the contents: new at creation and at every borrow that could change the bytes
    /// (`bytes_mut`, `descriptor`), unique in the process (clones share it, and their bytes);
    /// a copy elsewhere (on a GPU) is current while the stamp it was made from is.
    stamp: u64,
}

/// The next [`HostBuffer`] stamp.
static STAMPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn new_stamp() -> u64 {
    STAMPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl HostBuffer {
    pub fn zeros(dtype: DType, shape: &[usize]) -> HostBuffer {
        let len = shape.iter().product::<usize>() * dtype.size_bytes() as usize;
        HostBuffer {
            dtype,
            shape: shape.to_vec(),
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
            stamp: new_stamp(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        let all: &[u8] = bytemuck_lines(&self.lines);
        &all[..self.len]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.stamp = new_stamp();
        let len = self.len;
        let all = bytemuck_lines_mut(&mut self.lines);
        &mut all[..len]
    }

    /// Encodes a tensor (whose values are already rounded to its dtype).
    pub fn from_tensor(t: &Tensor) -> HostBuffer {
        let mut b = HostBuffer::zeros(t.dtype, &t.shape);
        encode(t.dtype, &t.data, b.bytes_mut());
        b
    }

    /// The values of an f32 buffer, in place (`None` for other dtypes).
    pub fn f32s(&self) -> Option<&[f32]> {
        let n = self.len / 4;
        // SAFETY: the lines are 64-byte aligned and hold `len` initialized bytes; f32 has no
        // invalid bit patterns, and the bytes are little-endian, the target's order (below).
        (self.dtype == DType::F32)
            .then(|| unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), n) })
    }

    /// As [`HostBuffer::f32s`], to write.
    pub fn f32s_mut(&mut self) -> Option<&mut [f32]> {
        if self.dtype != DType::F32 {
            return None;
        }
        self.stamp = new_stamp();
        let n = self.len / 4;
        // SAFETY: as in `f32s`, with the unique borrow passed on.
        Some(unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), n) })
    }

    /// Decodes the bytes into a tensor.
    pub fn to_tensor(&self) -> Tensor {
        let w = self.dtype.size_bytes() as usize;
        let data = self
            .bytes()
            .chunks_exact(w)
            .map(|c| match self.dtype {
                DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                DType::BF16 => bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
                DType::F16 => f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
                DType::I32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                DType::I1 => f32::from(c[0] & 1),
            })
            .collect();
        Tensor::new(self.dtype, self.shape.clone(), data)
    }

    /// MLIR's ranked memref descriptor for this buffer. It points into `self`: keep the buffer
    /// alive and unmoved while generated code uses the descriptor.
    pub fn descriptor(&mut self) -> Vec<i64> {
        self.stamp = new_stamp();
        descriptor(self.lines.as_mut_ptr().cast(), &self.shape)
    }

    /// The stamp of the current contents: equal stamps, equal bytes.
    pub fn stamp(&self) -> u64 {
        self.stamp
    }
}

// Buffers hold little-endian values, which `f32s` reads in place.
const _: () = assert!(cfg!(target_endian = "little"));

/// Writes `values`, elements of a tensor of `dtype` (floats rounded to `dtype` here), as that
/// dtype's bytes into `out`.
pub fn encode(dtype: DType, values: &[f32], out: &mut [u8]) {
    // One loop per dtype, so that each is a plain vectorizable copy or conversion (the
    // optimizer writes every weight through this each step).
    fn each<const W: usize>(out: &mut [u8], values: &[f32], bytes: impl Fn(f32) -> [u8; W]) {
        for (chunk, &x) in out.chunks_exact_mut(W).zip(values) {
            chunk.copy_from_slice(&bytes(x));
        }
    }
    match dtype {
        DType::F32 => each(out, values, f32::to_le_bytes),
        DType::BF16 => each(out, values, |x| bf16::from_f32(x).to_bits().to_le_bytes()),
        DType::F16 => each(out, values, |x| f16::from_f32(x).to_bits().to_le_bytes()),
        DType::I32 => each(out, values, f32::to_le_bytes),
        DType::I1 => each(out, values, |x| [u8::from(x != 0.0)]),
    }
}

/// MLIR's ranked memref descriptor of a dense row-major buffer at `ptr`.
pub fn descriptor(ptr: *mut u8, shape: &[usize]) -> Vec<i64> {
    let p = ptr as i64;
    let mut d = vec![p, p, 0];
    d.extend(shape.iter().map(|&s| s as i64));
    d.extend(strides(shape).iter().map(|&s| s as i64));
    d
}

fn bytemuck_lines(lines: &[Line]) -> &[u8] {
    // SAFETY: `Line` is `repr(C)` plain bytes with no padding; the slice covers exactly the
    // lines' memory, which stays borrowed for the returned lifetime.
    unsafe { std::slice::from_raw_parts(lines.as_ptr().cast::<u8>(), lines.len() * 64) }
}

fn bytemuck_lines_mut(lines: &mut [Line]) -> &mut [u8] {
    // SAFETY: as above, with the unique borrow passed on.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), lines.len() * 64) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_decodes_every_dtype() {
        for dtype in DType::ALL {
            let v = [0.0, 1.0, -2.0, 3.5, 1.0, -0.25];
            let t = Tensor::from_values(dtype, vec![2, 3], v);
            let b = HostBuffer::from_tensor(&t);
            assert_eq!(b.bytes().len(), 6 * dtype.size_bytes() as usize);
            assert_eq!(b.to_tensor(), t, "{dtype}");
        }
        // Integers beyond f32's 2^24 keep every bit, as compiled code stores them.
        let ints = [i32::MAX, -16_777_217];
        let b = HostBuffer::from_tensor(&Tensor::from_ints(vec![2], ints));
        let want: Vec<u8> = ints.iter().flat_map(|i| i.to_le_bytes()).collect();
        assert_eq!(b.bytes(), &want[..]);
        assert_eq!(b.to_tensor(), Tensor::from_ints(vec![2], ints));
        let mut b = HostBuffer::zeros(DType::F32, &[2, 3]);
        let d = b.descriptor();
        assert_eq!(d[0] % 64, 0, "aligned");
        assert_eq!(&d[2..], &[0, 2, 3, 3, 1]);
    }

    #[test]
    fn stamps_change_with_every_write_and_differ_between_buffers() {
        let mut a = HostBuffer::zeros(DType::F32, &[4]);
        let b = HostBuffer::zeros(DType::F32, &[4]);
        assert_ne!(a.stamp(), b.stamp());
        let (before, copy) = (a.stamp(), a.clone());
        assert_eq!(copy.stamp(), before, "a clone holds the same bytes");
        let _ = a.bytes();
        assert_eq!(a.stamp(), before, "reading changes nothing");
        a.bytes_mut()[0] = 1;
        assert_ne!(a.stamp(), before);
        let after = a.stamp();
        let _ = a.descriptor();
        assert_ne!(
            a.stamp(),
            after,
            "generated code may write through a descriptor"
        );
    }
}
