//! Tests of `sgemm.rs`: every kernel against the scalar chain of fused multiply-adds, bit for bit.

use super::*;
use crate::rng::{Init, Rng};

/// A row-major matrix, or its transpose stored column-major, with padding between rows.
struct Stored {
    values: Vec<f32>,
    operand: Operand,
}

fn stored(rows: usize, cols: usize, transposed: bool, seed: u64) -> Stored {
    let pad = 3;
    let (outer, inner) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let values =
        Rng::stream(seed, "sgemm", 0).fill(Init::Uniform(-1.0, 1.0), outer * (inner + pad));
    let lead = (inner + pad) as isize;
    let (row_stride, col_stride) = if transposed { (1, lead) } else { (lead, 1) };
    let operand = Operand {
        ptr: values.as_ptr(),
        row_stride,
        col_stride,
    };
    Stored { values, operand }
}

/// The register blocks this CPU runs: AVX2's, and AVX-512's where it has it.
fn isas() -> Vec<Isa> {
    match Isa::here() {
        Some(Isa::Avx512) => vec![Isa::Avx2, Isa::Avx512],
        Some(Isa::Avx2) => {
            eprintln!("sgemm: this CPU has no AVX-512 (or PPC_CPU_DISABLE hides it): AVX2 only");
            vec![Isa::Avx2]
        }
        None => {
            eprintln!("SKIPPED sgemm: this CPU has no AVX2/FMA (or PPC_CPU_DISABLE hides it)");
            vec![]
        }
    }
}

/// Both register blocks give the portable chains' bits on ragged shapes (every edge of
/// `MR`, `NR`, `KC`, `MC`, `NC` and of the AVX-512 block's 12 rows and 32 columns), with
/// either operand transposed, with and without accumulation, and on a strided `c`.
#[test]
fn every_shape_and_layout_gives_the_portable_bits() {
    let shapes = [
        (1, 1, 1),
        (6, 256, 16),
        (7, 257, 17),
        (12, 64, 32),
        (25, 40, 49),
        (150, 70, 100),
        (16, 300, 1030),
        (73, 513, 40),
        (5, 3, 2),
        (13, 0, 9),
    ];
    for isa in isas() {
        for (m, k, n) in shapes {
            same_bits_as_portable(isa, m, k, n);
        }
    }
}

/// `isa`'s blocked product of `m × k × n` against the portable chains, bit for bit, in four
/// layouts and modes.
fn same_bits_as_portable(isa: Isa, m: usize, k: usize, n: usize) {
    for (ta, tb, accumulate) in [
        (false, false, false),
        (false, true, false),
        (true, false, true),
        (true, true, true),
    ] {
        let (a, b) = (stored(m, k, ta, 1), stored(k, n, tb, 2));
        let ldc = n + 5;
        let start = Rng::stream(3, "sgemm", 0).fill(Init::Uniform(-1.0, 1.0), m * ldc);
        let (mut want, mut got) = (start.clone(), start);
        let at = |v: &mut Vec<f32>| Operand {
            ptr: v.as_mut_ptr(),
            row_stride: ldc as isize,
            col_stride: 1,
        };
        // SAFETY: the buffers hold the shapes at the strides given; the CPU has `isa`.
        unsafe {
            portable(m, k, n, a.operand, b.operand, at(&mut want), accumulate);
            if k == 0 {
                sgemm(m, k, n, a.operand, b.operand, at(&mut got), accumulate);
            } else {
                blocked(isa, m, k, n, a.operand, b.operand, at(&mut got), accumulate);
            }
        }
        let same = want
            .iter()
            .zip(&got)
            .all(|(w, g)| w.to_bits() == g.to_bits());
        assert!(
            same,
            "{isa:?}: {m}×{k}×{n} (A transposed {ta}, B transposed {tb}, accumulate {accumulate})"
        );
        drop((a.values, b.values));
    }
}

/// Cutting a product into column blocks or row blocks, as the runtime's tasks do, gives the
/// same bits as one call.
#[test]
fn blocks_of_any_size_give_the_same_bits() {
    let (m, k, n) = (40, 300, 200);
    let (a, b) = (stored(m, k, false, 4), stored(k, n, false, 5));
    let whole = |rows: usize, cols: usize| {
        let mut c = vec![0.0f32; m * n];
        for i0 in (0..m).step_by(rows) {
            for j0 in (0..n).step_by(cols) {
                let (mm, nn) = (rows.min(m - i0), cols.min(n - j0));
                let sub = |o: Operand, i: usize, j: usize| Operand {
                    ptr: o.at(i, j),
                    ..o
                };
                let co = Operand {
                    ptr: c.as_mut_ptr(),
                    row_stride: n as isize,
                    col_stride: 1,
                };
                // SAFETY: each block is inside its operand.
                unsafe {
                    sgemm(
                        mm,
                        k,
                        nn,
                        sub(a.operand, i0, 0),
                        sub(b.operand, 0, j0),
                        sub(co, i0, j0),
                        false,
                    )
                };
            }
        }
        c
    };
    let reference = whole(m, n);
    for (rows, cols) in [(1, n), (7, 33), (16, 64), (m, 48), (13, 1)] {
        let got = whole(rows, cols);
        assert!(
            reference
                .iter()
                .zip(&got)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "blocks of {rows}×{cols}"
        );
    }
}
