//! How each loop nest maps onto GPU blocks and threads (`--target cuda`).
//!
//! Every `linalg.generic` with a parallel loop becomes one kernel: its last parallel loop is cut
//! into tiles of up to 256 consecutive elements, one thread each (consecutive threads touch
//! consecutive addresses), and the tiles with up to two more parallel loops before it are the
//! grid; other parallel loops and every reduction loop run inside each thread. The generic is
//! tagged with its [`Tiling`]; the module's transform script ([`script`]) tiles each tag with
//! `scf.forall`s mapped to `#gpu.block`/`#gpu.thread` and turns them into `gpu.launch`es, which
//! MLIR then outlines into kernels. A nest with no parallel loop (a scalar, a full reduction)
//! stays on the host.

use std::fmt::Write;

/// Threads per block along the innermost parallel loop, at most.
const MAX_THREADS: u64 = 256;

/// The largest grid extent along y and z (x takes 2^31 - 1).
const MAX_GRID_YZ: u64 = 65_535;

/// Tile sizes of one loop nest, one per loop: 0 for loops each thread runs whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// The block tile: 1 on grid loops, `threads` on the thread loop, 0 elsewhere.
    pub block: Vec<u64>,
    /// The loop whose block tile is spread over the block's threads.
    pub thread_loop: usize,
    /// Threads per block: the largest divisor of that loop's trip count up to 256, so that
    /// every tile is full (the thread mapping needs static trip counts).
    pub threads: u64,
}

/// The tiling of a nest with these trip counts and iterator types, or `None` to leave it on the
/// host.
pub fn tiling(sizes: &[u64], iters: &[&str]) -> Option<Tiling> {
    let parallel: Vec<usize> = (0..sizes.len())
        .filter(|&i| iters[i] == "parallel")
        .collect();
    let &thread_loop = parallel.last()?;
    let n = sizes[thread_loop];
    let threads = (1..=MAX_THREADS.min(n))
        .rev()
        .find(|&t| n.is_multiple_of(t))?;
    let mut block = vec![0; sizes.len()];
    block[thread_loop] = threads;
    for &i in parallel.iter().rev().skip(1).take(2) {
        if sizes[i] <= MAX_GRID_YZ {
            block[i] = 1;
        }
    }
    Some(Tiling {
        block,
        thread_loop,
        threads,
    })
}

/// The discardable attribute that tags a generic with tiling number `k` of the module.
pub fn tag(k: usize) -> String {
    format!("ppc.gpu_{k}")
}

/// The transform script that maps every tagged generic to a `gpu.launch`: tile into a grid of
/// blocks (x the innermost grid loop), tile each block's tile over its threads, then map both
/// `scf.forall`s. Private, so that `symbol-dce` drops it afterwards.
pub fn script(tilings: &[Tiling]) -> String {
    let mut s = String::from(
        "  transform.named_sequence private @__transform_main(%m: !transform.any_op {transform.readonly}) {\n",
    );
    for (k, t) in tilings.iter().enumerate() {
        let grid = t.block.iter().filter(|&&b| b != 0).count();
        let mapping: Vec<String> = ["x", "y", "z"][..grid]
            .iter()
            .rev()
            .map(|d| format!("#gpu.block<{d}>"))
            .collect();
        let mut inner = vec![0; t.block.len()];
        inner[t.thread_loop] = 1;
        let any = "(!transform.any_op) -> !transform.any_op";
        let two = "(!transform.any_op) -> (!transform.any_op, !transform.any_op)";
        let _ = writeln!(
            s,
            "    %g{k} = transform.structured.match attributes {{{}}} in %m : {any}",
            tag(k)
        );
        let _ = writeln!(
            s,
            "    %t{k}, %b{k} = transform.structured.tile_using_forall %g{k} tile_sizes [{}] (mapping = [{}]) : {two}",
            super::buf::list(&t.block),
            mapping.join(", ")
        );
        if t.threads > 1 {
            let _ = writeln!(
                s,
                "    %u{k}, %w{k} = transform.structured.tile_using_forall %t{k} tile_sizes [{}] (mapping = [#gpu.thread<x>]) : {two}",
                super::buf::list(&inner)
            );
        }
        let _ = writeln!(
            s,
            "    %l{k} = transform.gpu.map_forall_to_blocks %b{k} generate_gpu_launch : {any}"
        );
        let _ = writeln!(
            s,
            "    %n{k} = transform.gpu.map_nested_forall_to_threads %l{k} block_dims = [{}, 1, 1] sync_after_distribute = false : {any}",
            t.threads
        );
    }
    s.push_str("    transform.yield\n  }\n");
    s
}
