//! The passes over ppc's IR, in the order the pipeline runs them. A pass is a plain function
//! `fn(&mut Module, &Options) -> Result<(), Diagnostics>`; [`PASSES`] is the one table that the
//! command line, `--print-after-all` and the test `// RUN:` lines read.

mod autodiff;
mod autodiff_kept;
mod autodiff_loop;
mod batching;
mod bw_split;
mod differ;
mod embed_head;
mod gpipe_loop;
mod gpipe_step;
mod loss;
mod one_f_one_b;
mod options;
mod remat;
mod scatter_add;
mod shard_stages;
mod stage_mask;
mod tick;
mod tick_backward;
mod tick_interleaved;
mod tick_ring;
mod vjp;
mod vmap_stages;

pub use autodiff::{autodiff, trainables};
pub use embed_head::embed_head;
pub use gpipe_loop::gpipe_loop;
pub use loss::loss;
pub use one_f_one_b::one_f_one_b;
pub use options::Options;
pub use remat::Remat;
pub use shard_stages::shard_stages;
pub use vmap_stages::vmap_stages;

use ppc_dialect::{Diagnostics, Module};

/// One entry of the pass table.
pub struct PassInfo {
    /// Kebab-case name used by `--emit` and `// RUN:` lines.
    pub name: &'static str,
    pub summary: &'static str,
    /// Only for training: runs with [`Options::train`], or when asked for by name.
    pub training: bool,
    pub run: fn(&mut Module, &Options) -> Result<(), Diagnostics>,
}

/// Every pass, in pipeline order.
pub const PASSES: &[PassInfo] = &[
    PassInfo {
        name: "vmap-stages",
        summary: "vectorize the one-stage compute @layer over a leading stage axis into @stage",
        training: false,
        run: vmap_stages,
    },
    PassInfo {
        name: "shard-stages",
        summary: "split @stage's stage axis over `ranks` processes (S/R consecutive stages each)",
        training: false,
        run: shard_stages,
    },
    PassInfo {
        name: "gpipe-loop",
        summary:
            "wrap @stage in the GPipe loop @pipeline: shifting state, zero padding, stage-0 select",
        training: false,
        run: gpipe_loop,
    },
    PassInfo {
        name: "embed-head",
        summary:
            "add @model: @embed, the GPipe loop, then @head, on all microbatches (models with them)",
        training: false,
        run: embed_head,
    },
    PassInfo {
        name: "loss",
        summary:
            "add @train: the pipeline on all microbatches, then the model's loss (training only)",
        training: true,
        run: loss,
    },
    PassInfo {
        name: "autodiff",
        summary: "add @f_vjp, the reverse-mode gradient, for every function (training only)",
        training: true,
        run: autodiff,
    },
    PassInfo {
        name: "1f1b",
        summary: "with --schedule 1f1b or zb-h1: fuse @train_vjp's forward and backward loops into one loop over ticks (zb-h1: each stage backward cut into B and W, W a tick later; training only)",
        training: true,
        run: one_f_one_b,
    },
];

pub fn find(name: &str) -> Option<&'static PassInfo> {
    PASSES.iter().find(|p| p.name == name)
}
