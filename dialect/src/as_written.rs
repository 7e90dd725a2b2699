//! How the model file wrote what the IR holds evaluated, so that `ppc fmt` prints a model back
//! as its author meant it: `end = [b, 2 * d]` rather than the `[2, 16]` it evaluated to,
//! `normal(1 / sqrt(d))`, `f32!`. Only what names a dimension is kept (a number prints the
//! same either way). Metadata like spans: modules that differ only here are equal, and passes
//! do not carry it to the ops they write.

use crate::ir::{OpId, ValueId};
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, Default)]
pub struct AsWritten {
    /// Attributes written over dimensions, by op and key (`constant`'s number under `""`): their
    /// canonical text.
    pub exprs: BTreeMap<(OpId, String), String>,
    /// Initializers with arguments written over dimensions, by parameter: `normal(1 / sqrt(d))`.
    pub inits: BTreeMap<ValueId, String>,
    /// Values and parameters written `f32!`, which keep f32 under `--dtype`.
    pub pinned: BTreeSet<ValueId>,
}

impl PartialEq for AsWritten {
    fn eq(&self, _: &AsWritten) -> bool {
        true
    }
}
