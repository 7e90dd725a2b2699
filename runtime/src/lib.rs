//! The ppc runtime: what a program produced by ppc needs at run time, and nothing more.
//!
//! What generated code calls and needs: the entry points of [`abi`] (the GEMM behind
//! `matmul`, exchanges, trace spans), the manifest, the run driver, training and the optimizer,
//! the thread pool, MPI transport and the CUDA runtime. Tensors, the seeded generator and files
//! it shares with the interpreter come from `ppc-tensor` (re-exported here). It never depends
//! on the compiler.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod accuracy;
pub mod bubble;
pub mod checkpoint;
pub mod clip;
pub mod comm;
pub mod cpu;
pub mod cuda;
pub mod data;
pub mod error;
pub mod exec;
pub mod gemm;
pub mod gpu_update;
pub mod heap;
pub mod lr_schedule;
pub mod manifest;
pub mod optim;
pub mod pool;
pub mod run_options;
pub mod samples;
pub mod sgemm;
pub mod small_m;
pub mod small_m_bt;
pub mod subnormals;
pub mod tokens;
pub mod trace;
pub mod train;

// Shared with the interpreter; re-exported so that `ppc_runtime::tensor` and the like name them.
pub use ppc_tensor::{files, init, memref, params, rng, safetensors, tensor};
pub use ppc_tensor::{DType, Init, Rng, Tensor};
