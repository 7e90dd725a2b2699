//! What the command line gives in place of what the model file writes (`--dim`, `--stages`,
//! `--dtype`, ...), applied while parsing, before any shape is computed.

use crate::ir::Setting;
use crate::types::DType;

/// Values given on the command line that replace those written in the file.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub dims: Vec<(String, u64)>,
    pub stages: Option<u64>,
    pub microbatches: Option<u64>,
    pub repeats: Option<u64>,
    pub ranks: Option<u64>,
    /// Layers per stage and repeat; replaces the file's `layers` or `layers_per_stage`.
    pub layers_per_stage: Option<u64>,
    /// The model's depth; replaces the file's `layers` or `layers_per_stage`.
    pub layers: Option<u64>,
    /// Every f32 type in the file becomes this dtype (bf16 or f16 storage).
    pub float_dtype: Option<DType>,
}

impl Overrides {
    /// The command line's value for a setting (`--layers` and `--layers-per-stage` each
    /// replace the depth either way the file gives it).
    pub fn setting(&self, s: Setting) -> Option<u64> {
        match s {
            Setting::Stages => self.stages,
            Setting::Layers => self.layers,
            Setting::LayersPerStage => self.layers_per_stage,
            Setting::Microbatches => self.microbatches,
            Setting::Repeats => self.repeats,
            Setting::Ranks => self.ranks,
        }
    }
}
