//! Single-thread GEMM rates on pipeline-stage shapes: the packing-free few-row kernels
//! (`small_m`, AVX-512 only) against OpenBLAS, with the weight as it is (`A · B`, the forward)
//! and used transposed (`A · Bᵀ`, the input gradient). `gemm.rs` picks between them from these
//! numbers (BENCHMARKS.md): `cargo run --release -p ppc-runtime --example gemm`.

use ppc_runtime::blas::{self, Operand};
use ppc_runtime::small_m;
use std::time::Instant;

fn main() {
    println!(
        "{:>16} {:>12} {:>12} {:>12} {:>12}",
        "m x k x n", "small_m", "OpenBLAS", "small_m ·Bᵀ", "OpenBLAS ·Bᵀ"
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
        for transposed in [false, true] {
            // B is k rows of n, or (transposed) n rows of k.
            let (b_rows, b_cols) = if transposed { (1, k) } else { (n, 1) };
            for small in [true, false] {
                if small && !small_m::available() {
                    rates.push("-".to_string());
                    continue;
                }
                let t = Instant::now();
                for r in 0..reps {
                    let b = bs[r % 4].as_ptr();
                    let (a, c) = (a.as_ptr(), c.as_mut_ptr());
                    // SAFETY: the buffers have exactly the sizes passed; AVX-512 was checked.
                    unsafe {
                        match (small, transposed) {
                            (true, false) => small_m::sgemm(m, k, n, a, k, b, n, c, n),
                            (true, true) => small_m::sgemm_nt(m, k, n, a, k, b, k, c, n),
                            (false, _) => blas::sgemm(
                                m,
                                k,
                                n,
                                Operand {
                                    ptr: a,
                                    row_stride: k as isize,
                                    col_stride: 1,
                                },
                                Operand {
                                    ptr: b,
                                    row_stride: b_rows as isize,
                                    col_stride: b_cols as isize,
                                },
                                Operand {
                                    ptr: c.cast_const(),
                                    row_stride: n as isize,
                                    col_stride: 1,
                                },
                                false,
                            ),
                        }
                    }
                }
                rates.push(format!(
                    "{:.1}",
                    flops * reps as f64 / t.elapsed().as_secs_f64() / 1e9
                ));
            }
        }
        println!(
            "{:>16} {:>12} {:>12} {:>12} {:>12}",
            format!("{m}x{k}x{n}"),
            rates[0],
            rates[1],
            rates[2],
            rates[3]
        );
    }
}
