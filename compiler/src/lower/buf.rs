//! Buffers: each value of the program lives in a memref, whole or a strided view of another.
//! What the lowering passes around and the emitter writes into; each allocation (or entry
//! argument) has its own [`BufId`], which its views share.

use ppc_dialect::{DType, Type};
use std::fmt::Write;

/// A buffer holding one value: the SSA name of its memref and its type. `layout` is set for
/// strided views (subviews), which have a non-identity memref type.
#[derive(Clone, Debug)]
pub struct Buf {
    pub name: String,
    pub ty: Type,
    pub layout: Option<Layout>,
    /// The allocation (or entry argument) this buffer or view lies in.
    pub base: BufId,
}

/// One allocation or entry argument of the function being written, numbered in the order the
/// emitter made them (`Emitter::buffer_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufId(pub u32);

/// Where a view's elements are in its buffer: strides, and an offset known when compiling or
/// only at run time (`None`).
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub strides: Vec<usize>,
    pub offset: Option<u64>,
}

impl Layout {
    fn text(&self) -> String {
        let offset = self.offset.map_or("?".to_string(), |o| o.to_string());
        format!("strided<[{}], offset: {offset}>", list(&self.strides))
    }
}

/// MLIR's element type for a dtype.
pub fn elt(d: DType) -> &'static str {
    d.name()
}

/// `memref<2x3xf32>` (or `memref<f32>` for a scalar), with an optional strided layout.
pub fn memref_type(ty: &Type, layout: Option<&Layout>) -> String {
    let mut s = String::from("memref<");
    for d in ty.shape() {
        let _ = write!(s, "{d}x");
    }
    s.push_str(elt(ty.dtype));
    if let Some(l) = layout {
        let _ = write!(s, ", {}", l.text());
    }
    s.push('>');
    s
}

impl Buf {
    pub fn mty(&self) -> String {
        memref_type(&self.ty, self.layout.as_ref())
    }

    /// Its strides: the layout's, or those of a contiguous row-major buffer.
    pub fn strides(&self) -> Vec<usize> {
        self.layout.as_ref().map_or_else(
            || ppc_runtime::tensor::strides(&self.ty.shape_usize()),
            |l| l.strides.clone(),
        )
    }
}

/// The type of a scalar SSA value: an element type, or the 16-bit integers that hold the bits
/// of 16-bit floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalar {
    Elem(DType),
    I16,
}

impl Scalar {
    pub fn name(self) -> &'static str {
        match self {
            Scalar::Elem(d) => elt(d),
            Scalar::I16 => "i16",
        }
    }
}

impl From<DType> for Scalar {
    fn from(d: DType) -> Scalar {
        Scalar::Elem(d)
    }
}

/// `a, b, c`: a list as MLIR writes it.
pub fn list<T: ToString>(xs: &[T]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
