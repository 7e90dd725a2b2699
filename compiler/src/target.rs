//! The CPU an executable's generated code is compiled for (`ppc compile --target-cpu`).
//!
//! The default is `x86-64-v3` (AVX2, FMA, F16C: every x86-64 server CPU since 2015), so an
//! executable built on one node runs on the others whatever their generation; the runtime's own
//! kernels (the GEMMs) still use AVX-512 where the node has it, chosen at run time. `native`
//! compiles for the build machine and requires every feature it has. The manifest records the
//! name and the features, and the executable checks them at start (`ppc_runtime::cpu`).

use ppc_runtime::cpu;
use ppc_runtime::manifest::Target;

/// What `--target-cpu` defaults to.
pub const DEFAULT_CPU: &str = "x86-64-v3";

/// A `--target-cpu` that ppc does not know; `known` are the names it does.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown CPU `{name}`: ppc compiles for {} (the x86-64 levels, whose features executables check at start) or native (this machine)",
    .known.join(", ")
)]
pub struct UnknownCpu {
    pub name: String,
    pub known: Vec<&'static str>,
}

/// `name` as LLVM's `-mcpu` takes it, with the features the executable will require.
pub fn resolve(name: &str) -> Result<Target, UnknownCpu> {
    let features = if name == "native" {
        cpu::host_features()
    } else {
        cpu::features_of(name).ok_or_else(|| UnknownCpu {
            name: name.to_string(),
            known: cpu::levels().collect(),
        })?
    };
    Ok(Target {
        cpu: name.to_string(),
        features: features.into_iter().map(str::to_string).collect(),
    })
}
