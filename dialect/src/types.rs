//! Tensor types: a dtype and a static shape whose dimensions remember the name they were written
//! with, so that `f32[b, d]` prints back as written while every check works on sizes.

pub use ppc_runtime::DType;
use std::fmt;

/// One dimension: its size, and the named dimension it came from, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dim {
    pub size: u64,
    pub name: Option<String>,
}

impl Dim {
    pub fn lit(size: u64) -> Dim {
        Dim { size, name: None }
    }

    pub fn named(name: &str, size: u64) -> Dim {
        Dim {
            size,
            name: Some(name.to_string()),
        }
    }
}

/// The type of every IR value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Type {
    pub dtype: DType,
    pub dims: Vec<Dim>,
}

impl Type {
    pub fn new(dtype: DType, dims: Vec<Dim>) -> Type {
        Type { dtype, dims }
    }

    /// A type with unnamed dimensions.
    pub fn of(dtype: DType, shape: &[u64]) -> Type {
        Type::new(dtype, shape.iter().map(|&s| Dim::lit(s)).collect())
    }

    pub fn scalar(dtype: DType) -> Type {
        Type::new(dtype, vec![])
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().map(|d| d.size).collect()
    }

    pub fn shape_usize(&self) -> Vec<usize> {
        self.dims.iter().map(|d| d.size as usize).collect()
    }

    pub fn elements(&self) -> u64 {
        self.dims.iter().map(|d| d.size).product()
    }

    pub fn bytes(&self) -> u64 {
        self.elements() * self.dtype.size_bytes()
    }

    /// Same dtype and sizes, whatever the dimension names.
    pub fn same_as(&self, other: &Type) -> bool {
        self.dtype == other.dtype && self.shape() == other.shape()
    }

    pub fn with_dtype(&self, dtype: DType) -> Type {
        Type::new(dtype, self.dims.clone())
    }

    /// This type with `dim` inserted at `axis`.
    pub fn insert(&self, axis: usize, dim: Dim) -> Type {
        let mut dims = self.dims.clone();
        dims.insert(axis, dim);
        Type::new(self.dtype, dims)
    }

    /// This type with the dimension at `axis` removed.
    pub fn remove(&self, axis: usize) -> Type {
        let mut dims = self.dims.clone();
        dims.remove(axis);
        Type::new(self.dtype, dims)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.size),
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A type written with sizes only, for messages that compare shapes: `f32[16, 256]`.
pub fn sizes(t: &Type) -> String {
    Type::of(t.dtype, &t.shape()).to_string()
}
