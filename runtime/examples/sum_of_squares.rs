//! The host's cost of `grad_clip`'s sums of squares (`clip.rs`) on 100 M gradient elements
//! (the d = 1024 training step's count): `clip::sum_of_squares`, whose lane order the GPU's
//! kernels share (`compiler/src/lower/grad_squares.rs`), against a sum in element order (the
//! order before them). BENCHMARKS.md has the figures:
//! `cargo run --release -p ppc-runtime --example sum_of_squares`.

use std::time::Instant;

fn main() {
    let n = 100_000_000usize;
    let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    for _ in 0..3 {
        let t = Instant::now();
        let plain = g
            .iter()
            .fold(0.0f64, |s, &v| s + f64::from(v) * f64::from(v));
        let plain_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let lanes = ppc_runtime::clip::sum_of_squares(&g);
        let lanes_s = t.elapsed().as_secs_f64();
        println!(
            "element order {plain_s:.3} s, lanes {lanes_s:.3} s ({:.2}x); sums {plain} and {lanes}",
            plain_s / lanes_s
        );
    }
}
