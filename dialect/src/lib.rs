//! ppc's model IR: the one text format for model files and pass dumps, the verifier with shape
//! inference, and the reference interpreter that defines what every op means.
//!
//! ```text
//! text ──parse──▶ Module ──verify──▶ (passes) ──print──▶ text
//!                    └──────interp──────▶ tensors
//! ```
#![forbid(unsafe_code)]

pub mod arena;
pub mod as_written;
pub mod build;
pub mod diag;
pub mod expr;
pub mod grad;
pub mod infer;
pub mod inline;
pub mod interp;
pub mod ir;
pub mod kernels;
pub mod model_rules;
pub mod op;
pub mod parse;
pub mod print;
pub mod provenance;
pub mod schedule_check;
pub mod schedule_memory;
pub mod setting;
pub mod span;
pub mod types;
pub mod verify;

pub use diag::{Diagnostic, Diagnostics};
pub use ir::{Func, Module};
pub use parse::{parse, Overrides};
pub use print::print;
pub use types::{Axis, DType, Dim, Label, Type};
pub use verify::{check_model, verify};
