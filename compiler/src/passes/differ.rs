//! The differentiation of one function: what `autodiff` knows while it writes `@f_vjp` (and,
//! with `--remat=none`, `@f_fwd` and `@f_bwd`). Its methods are in `autodiff.rs`,
//! `autodiff_kept.rs` and `autodiff_loop.rs`.

use super::remat::Remat;
use ppc_dialect::ir::{Func, FuncId, Module, ValueId};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A trainable parameter: the function that declares it and its index among its parameters.
pub type Slot = (FuncId, usize);

/// Cotangents built so far: of source values, and of callees' parameters.
#[derive(Default)]
pub(super) struct Cots {
    pub(super) values: HashMap<ValueId, ValueId>,
    pub(super) slots: BTreeMap<Slot, ValueId>,
    /// Accumulators (cotangent values) whose slice at the reverse loop's own index still holds
    /// the `-0.0` they start from: the first add into it is a write.
    pub(super) fresh: HashSet<ValueId>,
}

/// The functions `@g_fwd` and `@g_bwd` of a function `@g` (`--remat=none`, and in every
/// mode where `once`), or `@g_recompute` and `@g_bwd` (`recomputed`).
pub(super) struct Split {
    pub(super) fwd: FuncId,
    pub(super) bwd: FuncId,
    /// `@g` is called outside every loop (a model's ends, the loss): its callers keep its
    /// residuals whatever `--remat` says, as they would had it been inlined.
    pub(super) once: bool,
    /// `@g` is the stage under `--remat=tick`: the backward calls `@g_fwd`
    /// (named `@g_recompute`) for the residuals, then `@g_bwd`, where `@g_vjp` would do both,
    /// so that `1f1b` can run the recomputation a tick before the backward.
    pub(super) recomputed: bool,
}

/// One function being differentiated, with what the module already has: the VJPs of its
/// callees and their forward/backward splits.
pub(super) struct Diff<'a> {
    pub(super) m: &'a Module,
    pub(super) id: FuncId,
    pub(super) f: &'a Func,
    /// `f`'s values whose cotangent is zero by construction ([`super::vjp::fixed_values`]).
    pub(super) fixed: HashSet<ValueId>,
    pub(super) remat: Remat,
    pub(super) vjps: &'a HashMap<FuncId, FuncId>,
    pub(super) splits: &'a HashMap<FuncId, Split>,
}
