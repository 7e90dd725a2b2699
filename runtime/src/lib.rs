//! The ppc runtime: what a program produced by ppc needs at run time, and nothing more.
//!
//! Today that is host tensors ([`Tensor`], f32/bf16/f16/i32/i1 storage) and the seeded
//! generator ([`rng`]) that draws parameters and synthetic inputs. The reference interpreter in
//! `ppc-dialect` uses the same generator, so every backend sees identical numbers for one seed.
//! This crate never depends on the compiler.

pub mod rng;
pub mod tensor;

pub use rng::{Init, Rng};
pub use tensor::{DType, Tensor};
