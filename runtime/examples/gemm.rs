//! Single-thread GEMM rates on pipeline-stage shapes: the packing-free few-row kernel
//! (`small_m`, AVX-512 only) against OpenBLAS. `gemm.rs` picks between them from these numbers
//! (BENCHMARKS.md): `cargo run --release -p ppc-runtime --example gemm`.

use ppc_runtime::blas::{self, Operand};
use std::time::Instant;

fn main() {
    println!(
        "{:>16} {:>14} {:>14}",
        "m x k x n", "small_m GF/s", "OpenBLAS GF/s"
    );
    for (m, k, n) in [
        (16usize, 256usize, 1024usize),
        (16, 1024, 256),
        (16, 256, 256),
        (16, 64, 1024),
        (32, 64, 256),
        (32, 256, 64),
        (16, 16, 16),
        (128, 256, 128),
        (128, 32, 128),
        (128, 128, 32),
        (32, 64, 64),
        (128, 256, 1024),
        (128, 1024, 256),
        (1024, 256, 1024),
        (1024, 256, 256),
    ] {
        let a = vec![1.0f32; m * k];
        // Four weight matrices in turn, as four stages would use them, so B is not cache-hot.
        let bs: Vec<Vec<f32>> = (0..4).map(|_| vec![0.5f32; k * n]).collect();
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((2e9 / flops) as usize).max(10);
        let mut rates = Vec::new();
        for small in [true, false] {
            if small && !ppc_runtime::small_m::available() {
                rates.push("-".to_string());
                continue;
            }
            let t = Instant::now();
            for r in 0..reps {
                let b = &bs[r % 4];
                let at = |ptr: *const f32, cols: usize| Operand {
                    ptr,
                    row_stride: cols as isize,
                    col_stride: 1,
                };
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
                        blas::sgemm(
                            m,
                            k,
                            n,
                            at(a.as_ptr(), k),
                            at(b.as_ptr(), n),
                            at(c.as_mut_ptr(), n),
                            false,
                        )
                    }
                }
            }
            rates.push(format!(
                "{:.1}",
                flops * reps as f64 / t.elapsed().as_secs_f64() / 1e9
            ));
        }
        println!(
            "{:>16} {:>14} {:>14}",
            format!("{m}x{k}x{n}"),
            rates[0],
            rates[1]
        );
    }
}
