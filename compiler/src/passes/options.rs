//! What every pass is told: the command line's choices that change the IR.

use super::remat::Remat;

/// Options shared by all passes.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Fill bubble slots (padding, initial state, shift fill) with NaN instead of zeros.
    pub poison_bubbles: bool,
    /// Run the training passes ([`crate::passes::PassInfo::training`]) too.
    pub train: bool,
    /// What the backward pass recomputes (`autodiff`).
    pub remat: Remat,
    /// The training schedule: the order of each stage's forwards and backwards.
    pub schedule: crate::timetable::Kind,
}
