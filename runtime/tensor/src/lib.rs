//! What the reference interpreter (`ppc-dialect`) and the runtime share, and nothing else: host
//! tensors ([`Tensor`], f32/bf16/f16/i32/i1 storage) and buffers ([`memref::HostBuffer`]), the
//! seeded generator ([`rng`]) and the initializers that draw parameters and synthetic inputs
//! from it, and safetensors and parameter files. Because both sides draw from this one
//! generator, every backend sees identical numbers for one seed. The IR may depend on this
//! crate; it knows nothing of running programs (the runtime) or of compiling them.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod files;
pub mod init;
pub mod memref;
pub mod params;
pub mod rng;
pub mod safetensors;
pub mod tensor;

pub use rng::{Init, Rng};
pub use tensor::{DType, Tensor};
