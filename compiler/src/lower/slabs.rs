//! `index` and `gather` on the CPU as a loop over the index's positions, each copying its slab
//! of the source (`x[p.., k, ..]`, with `k` read and clamped once) through views.
//!
//! As one `linalg.generic` over the result, the index was loaded and clamped again for every
//! element, and LLVM could neither hoist that load (the stores might alias it) nor vectorize the
//! copy: ZB-H1's reads of its stash, one slot per stage, ran as a scalar loop and took 8% of
//! the MLP's training step. As slabs, such reads take a quarter of that loop's time: 11.6
//! against 42.4 ms of `index` loop nests in `PPC_NUM_THREADS=1 ./z --steps 20 --trace z.json`
//! (`z` from `ppc compile examples/mlp.ppc --train --schedule zb-h1 --remat none --stages 4
//! --dim d=256 --dim h=1024 -o z`; measured before those reads became views, BENCHMARKS.md,
//! 2026-12-07, "the ticked schedules' stash and rings without copies").

use super::buf::Buf;
use super::emit::Emitter;

/// `out[p.., ..] = x[p[..axis].., clamp(idx[p..]), ..]` for every position `p` of `idx`, whose
/// first `axis` axes are `x`'s first. False, with nothing emitted, where a loop of copies does
/// not pay: on the GPU (one kernel does it) and where a slab is a single element.
pub fn copy_slabs(e: &mut Emitter, x: &Buf, idx: &Buf, axis: usize, out: &Buf) -> bool {
    let positions = idx.ty.rank();
    if e.gpu.is_some() || out.ty.rank() == positions {
        return false;
    }
    let ivs: Vec<String> = idx.ty.shape().iter().map(|&n| e.begin_for(n)).collect();
    let k = e.let_(&format!(
        "memref.load {}[{}] : {}",
        idx.name,
        ivs.join(", "),
        idx.mty()
    ));
    let k = e.clamped_index(&k, x.ty.dims[axis].size);
    let at_x: Vec<(usize, String)> = ivs[..axis]
        .iter()
        .cloned()
        .enumerate()
        .chain([(axis, k)])
        .collect();
    let at_out: Vec<(usize, String)> = ivs.iter().cloned().enumerate().collect();
    let from = e.slots(x, &at_x, false);
    let to = e.slots(out, &at_out, false);
    e.copy(&from, &to);
    for _ in &ivs {
        e.end_for();
    }
    true
}
