//! Single-thread GEMM rates on pipeline-stage shapes: ppc's own GEMM (`sgemm.rs`, whose
//! results do not depend on how a product is cut) against OpenBLAS, with the weight as it is
//! (`A · B`, the forward), used transposed (`A · Bᵀ`, the input gradient), and with the
//! activations read transposed (`Aᵀ · B`, the weight gradient), and the AVX-512 few-row kernels
//! where the CPU has it, then two threads of ppc's GEMM on the d = 1024 products (the rate a
//! two-core training step is held against). ppc runs its widest register block;
//! `PPC_CPU_DISABLE=avx512f` shows the AVX2 block's. BENCHMARKS.md has the figures:
//! `cargo run --release -p ppc-runtime --example gemm`; with `-- --two-threads`, only the
//! two-thread rates (`make bench` sets its d = 1024 training rows against them).

use ppc_runtime::sgemm::{self, Operand};
use ppc_runtime::{small_m, small_m_bt};
use std::time::Instant;

/// OpenBLAS, the maintained GEMM that ppc's runtime used before its own (for the comparison
/// only: its result for an element depends on the shape of the call, `sgemm.rs` says why).
mod openblas {
    use super::Operand;

    #[link(name = "openblas")]
    extern "C" {
        fn cblas_sgemm(
            order: i32,
            trans_a: i32,
            trans_b: i32,
            m: i32,
            n: i32,
            k: i32,
            alpha: f32,
            a: *const f32,
            lda: i32,
            b: *const f32,
            ldb: i32,
            beta: f32,
            c: *mut f32,
            ldc: i32,
        );
        fn openblas_set_num_threads(n: i32);
    }

    /// `c = a · b` on one thread, for row-major `a` and `c` and a `b` with one unit stride.
    ///
    /// # Safety
    /// The operands cover their elements.
    pub unsafe fn sgemm(m: usize, k: usize, n: usize, a: Operand, b: Operand, c: Operand) {
        const ROW_MAJOR: i32 = 101;
        let (trans_a, lda) = if a.col_stride == 1 {
            (111, a.row_stride)
        } else {
            (112, a.col_stride)
        };
        let (trans_b, ldb) = if b.col_stride == 1 {
            (111, b.row_stride)
        } else {
            (112, b.col_stride)
        };
        // SAFETY: the caller's contract.
        unsafe {
            openblas_set_num_threads(1);
            cblas_sgemm(
                ROW_MAJOR,
                trans_a,
                trans_b,
                m as i32,
                n as i32,
                k as i32,
                1.0,
                a.ptr,
                lda as i32,
                b.ptr,
                ldb as i32,
                0.0,
                c.ptr.cast_mut(),
                c.row_stride as i32,
            )
        }
    }
}

/// The kernels timed: ppc's GEMM, OpenBLAS, the AVX-512 few-row kernel.
#[derive(Clone, Copy, PartialEq)]
enum Kernel {
    Ppc,
    OpenBlas,
    SmallM,
}

/// How the operands are stored: as the forward's `X · W`, the input gradient's `dY · Wᵀ` (the
/// weight read transposed), or the weight gradient's `Xᵀ · dY` (the activations read
/// transposed).
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Forward,
    WeightTransposed,
    InputTransposed,
}

/// The columns printed: a kernel on a layout each.
const COLUMNS: [(&str, Kernel, Layout); 8] = [
    ("ppc", Kernel::Ppc, Layout::Forward),
    ("OpenBLAS", Kernel::OpenBlas, Layout::Forward),
    ("small_m", Kernel::SmallM, Layout::Forward),
    ("ppc ·Bᵀ", Kernel::Ppc, Layout::WeightTransposed),
    ("OpenBLAS ·Bᵀ", Kernel::OpenBlas, Layout::WeightTransposed),
    ("small_m ·Bᵀ", Kernel::SmallM, Layout::WeightTransposed),
    ("ppc Aᵀ·", Kernel::Ppc, Layout::InputTransposed),
    ("OpenBLAS Aᵀ·", Kernel::OpenBlas, Layout::InputTransposed),
];

fn main() {
    if std::env::args().any(|a| a == "--two-threads") {
        return two_threads();
    }
    println!(
        "ppc's register block: {:?} (PPC_CPU_DISABLE=avx512f for AVX2's)",
        sgemm::Isa::here()
    );
    print!("{:>16}", "m x k x n");
    for (name, _, _) in COLUMNS {
        print!(" {name:>13}");
    }
    println!();
    for (m, k, n) in [
        (16usize, 256usize, 1024usize),
        (16, 1024, 256),
        (16, 256, 256),
        (16, 64, 1024),
        (16, 512, 1024),
        (16, 2048, 256),
        (16, 512, 2048),
        (32, 64, 256),
        (32, 256, 64),
        (16, 16, 16),
        (128, 256, 128),
        (128, 32, 128),
        (128, 128, 32),
        (32, 64, 64),
        (128, 256, 1024),
        (128, 1024, 256),
        (256, 256, 1024),
        (1024, 256, 1024),
        (1024, 1024, 256),
        (256, 1024, 256),
        // The transformer at d = 1024 (#34): a microbatch's 1024 rows, its projections and MLP.
        (1024, 1024, 1024),
        (1024, 1024, 4096),
        (1024, 4096, 1024),
        // Its attention, one (microbatch row, head) a product: scores q·kᵀ (and their
        // gradients), then p·v; the keys' gradient qᵀ·ds (Aᵀ·).
        (256, 64, 256),
        (256, 256, 64),
        (64, 256, 256),
    ] {
        // A is m×k (or, transposed, stored k×m); B k×n (or stored n×k).
        let a = vec![1.0f32; m * k];
        // Four weight matrices in turn, as four stages would use them, so B is not cache-hot.
        let bs: Vec<Vec<f32>> = (0..4).map(|_| vec![0.5f32; k * n]).collect();
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((1e9 / flops) as usize).max(10);
        // Five rounds, each timing every kernel once: the best of each (a shared machine's
        // noise only ever slows a round down).
        let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); 5];
        for round in rounds.iter_mut() {
            for (_, kernel, layout) in COLUMNS {
                if kernel == Kernel::SmallM && !small_m::available() {
                    round.push(f64::NAN);
                    continue;
                }
                let (a_rows, a_cols) = if layout == Layout::InputTransposed {
                    (1, m)
                } else {
                    (k, 1)
                };
                let (b_rows, b_cols) = if layout == Layout::WeightTransposed {
                    (1, k)
                } else {
                    (n, 1)
                };
                let t = Instant::now();
                for r in 0..reps {
                    let b = bs[r % 4].as_ptr();
                    let (ap, cp) = (a.as_ptr(), c.as_mut_ptr());
                    let operands = (
                        Operand {
                            ptr: ap,
                            row_stride: a_rows as isize,
                            col_stride: a_cols as isize,
                        },
                        Operand {
                            ptr: b,
                            row_stride: b_rows as isize,
                            col_stride: b_cols as isize,
                        },
                        Operand {
                            ptr: cp.cast_const(),
                            row_stride: n as isize,
                            col_stride: 1,
                        },
                    );
                    // SAFETY: the buffers have exactly the sizes passed; AVX-512 was checked.
                    unsafe {
                        match kernel {
                            Kernel::Ppc => {
                                sgemm::sgemm(m, k, n, operands.0, operands.1, operands.2, false)
                            }
                            Kernel::OpenBlas => {
                                openblas::sgemm(m, k, n, operands.0, operands.1, operands.2)
                            }
                            Kernel::SmallM if layout == Layout::WeightTransposed => {
                                small_m_bt::sgemm(m, k, n, ap, k, b, k, cp, n)
                            }
                            Kernel::SmallM => small_m::sgemm(m, k, n, ap, k, b, n, cp, n),
                        }
                    }
                }
                round.push(flops * reps as f64 / t.elapsed().as_secs_f64() / 1e9);
            }
        }
        print!("{:>16}", format!("{m}x{k}x{n}"));
        for i in 0..COLUMNS.len() {
            let mut v: Vec<f64> = rounds.iter().map(|r| r[i]).collect();
            v.sort_by(f64::total_cmp);
            let best = if v[4].is_nan() {
                "-".to_string()
            } else {
                format!("{:.1}", v[4])
            };
            print!(" {best:>13}");
        }
        println!();
    }
    two_threads();
}

/// The rate of two threads on the d = 1024 products (#34's "the machine's GEMM rate"), each
/// computing half of `C`'s columns with ppc's GEMM, as the runtime cuts a product for two
/// threads: best of five rounds.
fn two_threads() {
    println!("two threads, ppc, A·B (GFLOP/s):");
    for (m, k, n) in [
        (1024usize, 1024usize, 1024usize),
        (1024, 1024, 4096),
        (1024, 4096, 1024),
    ] {
        let a = vec![1.0f32; m * k];
        let b = vec![0.5f32; k * n];
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((4e9 / flops) as usize).max(4);
        let half = n / 2;
        let mut best = 0.0f64;
        for _ in 0..5 {
            let t = Instant::now();
            let (a, b, c) = (
                a.as_ptr() as usize,
                b.as_ptr() as usize,
                c.as_mut_ptr() as usize,
            );
            std::thread::scope(|scope| {
                for j0 in [0, half] {
                    scope.spawn(move || {
                        let at =
                            |base: usize, offset: usize| (base as *const f32).wrapping_add(offset);
                        for _ in 0..reps {
                            let operand = |ptr: *const f32, row_stride: usize| Operand {
                                ptr,
                                row_stride: row_stride as isize,
                                col_stride: 1,
                            };
                            // SAFETY: each thread writes its own half of C's columns; the
                            // operands cover the elements passed.
                            unsafe {
                                sgemm::sgemm(
                                    m,
                                    k,
                                    half,
                                    operand(at(a, 0), k),
                                    operand(at(b, j0), n),
                                    operand(at(c, j0), n),
                                    false,
                                )
                            }
                        }
                    });
                }
            });
            best = best.max(flops * reps as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        println!("{:>16} {best:>13.1}", format!("{m}x{k}x{n}"));
    }
}
