//! Single-thread GEMM rates for the products of `examples/mlp.ppc`'s stages: the packing-free
//! few-row kernel (`small_m`) against `matrixmultiply`. The numbers in BENCHMARKS.md come from
//! `cargo run --release -p ppc-runtime --example gemm`.

use std::time::Instant;

fn main() {
    for (m, k, n) in [
        (16usize, 256usize, 1024usize),
        (16, 1024, 256),
        (16, 512, 2048),
    ] {
        let a = vec![1.0f32; m * k];
        // Four weight matrices in turn, as four stages would use them, so B is not cache-hot.
        let bs: Vec<Vec<f32>> = (0..4).map(|_| vec![0.5f32; k * n]).collect();
        let mut c = vec![0.0f32; m * n];
        let reps = 400;
        for (name, small) in [("small_m", true), ("matrixmultiply", false)] {
            if small && !ppc_runtime::small_m::available() {
                continue;
            }
            let t = Instant::now();
            for r in 0..reps {
                let b = &bs[r % 4];
                // SAFETY: the buffers have exactly the sizes passed; AVX-512 was checked above.
                unsafe {
                    if small {
                        ppc_runtime::small_m::sgemm(
                            m,
                            k,
                            n,
                            a.as_ptr(),
                            k,
                            b.as_ptr(),
                            n,
                            c.as_mut_ptr(),
                            n,
                        )
                    } else {
                        matrixmultiply::sgemm(
                            m,
                            k,
                            n,
                            1.0,
                            a.as_ptr(),
                            k as isize,
                            1,
                            b.as_ptr(),
                            n as isize,
                            1,
                            0.0,
                            c.as_mut_ptr(),
                            n as isize,
                            1,
                        )
                    }
                }
            }
            let gflops = 2.0 * (m * k * n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("{m}x{k}x{n} {name:>15}: {gflops:.1} GFLOP/s");
        }
    }
}
