//! The ppc runtime: what a program produced by ppc needs at run time, and nothing more.
//!
//! Today that is host tensors ([`Tensor`], f32/bf16/f16/i32/i1 storage) and the seeded
//! generator ([`rng`]) that draws parameters and synthetic inputs. The reference interpreter in
//! `ppc-dialect` uses the same generator, so every backend sees identical numbers for one seed.
//! It also holds what generated code calls and needs: memref buffers and descriptors, the GEMM
//! behind `matmul`, the manifest, safetensors I/O and the run driver. It never depends on the
//! compiler.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod comm;
pub mod cpu;
pub mod cuda;
pub mod exec;
pub mod files;
pub mod gemm;
pub mod heap;
pub mod init;
pub mod manifest;
pub mod memref;
pub mod optim;
pub mod params;
pub mod pool;
pub mod rng;
pub mod run_options;
pub mod safetensors;
pub mod sgemm;
pub mod small_m;
pub mod tensor;
pub mod trace;
pub mod train;

pub use rng::{Init, Rng};
pub use tensor::{DType, Tensor};
