//! Tensor types: a dtype and a static shape whose dimensions remember the name they were written
//! with, so that `f32[b, d]` prints back as written while every check works on sizes.
//!
//! The pipeline's own axes are a [`Label::Axis`], not a name: `f32[#stages, d, stages]` has the
//! stage axis that `vmap-stages` added first and an ordinary dimension that happens to be as
//! long as the pipeline has stages last, and passes tell them apart by type.

pub use ppc_tensor::DType;
use std::fmt;

/// An axis that passes create and find by what it is, never by what it is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// One entry per pipeline stage (`vmap-stages`); prints as `#stages`.
    Stages,
    /// This rank's consecutive stages of a program split over ranks (`shard-stages`); prints as
    /// `#stages_per_rank`.
    RankStages,
}

impl Axis {
    pub const ALL: [Axis; 2] = [Axis::Stages, Axis::RankStages];

    /// The name after `#` in the text format.
    pub fn name(self) -> &'static str {
        match self {
            Axis::Stages => "stages",
            Axis::RankStages => "stages_per_rank",
        }
    }

    pub fn from_name(s: &str) -> Option<Axis> {
        Axis::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// How a dimension is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Label {
    /// As its size: `4`.
    Size,
    /// As a named dimension or pipeline setting: `d`, `stages`.
    Named(String),
    /// As a pipeline axis: `#stages`.
    Axis(Axis),
}

/// One dimension: its size, and how it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dim {
    pub size: u64,
    pub label: Label,
}

impl Dim {
    pub fn lit(size: u64) -> Dim {
        Dim {
            size,
            label: Label::Size,
        }
    }

    pub fn named(name: &str, size: u64) -> Dim {
        Dim {
            size,
            label: Label::Named(name.to_string()),
        }
    }

    pub fn axis(axis: Axis, size: u64) -> Dim {
        Dim {
            size,
            label: Label::Axis(axis),
        }
    }

    /// The pipeline axis this dimension is, if any.
    pub fn as_axis(&self) -> Option<Axis> {
        match self.label {
            Label::Axis(a) => Some(a),
            Label::Size | Label::Named(_) => None,
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

    /// The position of the pipeline axis `a`, if the type has it.
    pub fn axis(&self, a: Axis) -> Option<usize> {
        self.dims.iter().position(|d| d.as_axis() == Some(a))
    }

    /// The position and kind of the stage axis (all stages or this rank's), if any.
    pub fn stage_axis(&self) -> Option<(usize, Axis)> {
        self.dims
            .iter()
            .enumerate()
            .find_map(|(i, d)| d.as_axis().map(|a| (i, a)))
    }

    /// Whether this is a stage mask, `i1[#stages]`: which stages a stage function runs.
    pub fn is_stage_mask(&self) -> bool {
        self.dtype == DType::I1 && self.rank() == 1 && self.stage_axis().is_some()
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
        match &self.label {
            Label::Size => write!(f, "{}", self.size),
            Label::Named(n) => f.write_str(n),
            Label::Axis(a) => write!(f, "#{}", a.name()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_print_with_a_hash_and_are_found_by_kind_not_name() {
        for a in Axis::ALL {
            assert_eq!(Axis::from_name(a.name()), Some(a));
        }
        let t = Type::new(
            DType::F32,
            vec![
                Dim::named("stages", 4),
                Dim::axis(Axis::Stages, 4),
                Dim::lit(3),
            ],
        );
        assert_eq!(t.to_string(), "f32[stages, #stages, 3]");
        assert_eq!(t.stage_axis(), Some((1, Axis::Stages)));
        assert_eq!(t.axis(Axis::RankStages), None);
        // Equal sizes with other labels: the same type for every check, not the same type.
        let plain = Type::of(DType::F32, &[4, 4, 3]);
        assert!(t.same_as(&plain) && t != plain);
    }
}
