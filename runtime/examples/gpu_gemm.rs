//! The GPU check's direct GEMM test (`scripts/gpu-check.sh`): the runtime's GEMM entry points,
//! as generated code calls them, on f32, bf16 and f16 operands — transposed, strided-batched,
//! broadcast, with masked-out stages and accumulating, into f32 and (16-bit operands, not
//! accumulating) into their own type — against an f64 product of the same (rounded) operands. Runs the CPU path always and the GPU path (cuBLAS) where a GPU is found,
//! so a dry run without one checks the checker. Exit status 0 only when every case passed.
//!
//! `cargo run --release -p ppc-runtime --example gpu_gemm`

use ppc_runtime::cuda;
use ppc_runtime::gemm::*;
use ppc_runtime::memref::{encode, Unranked};
use ppc_runtime::tensor::DType;
use std::process::ExitCode;

/// One product: `c[batch.., m, n] = a · b` (or `+=`), operand layouts as generated code passes them.
struct Case {
    name: &'static str,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    /// `a` stored as `[.., k, m]` and read transposed.
    a_transposed: bool,
    /// `b` stored as `[.., n, k]` and read transposed (the input gradient's `dy · Wᵀ`).
    b_transposed: bool,
    /// `b` is one `[k, n]` matrix for every batch entry (a stage's weight against rows).
    b_shared: bool,
    /// Batch entries (stages) that compute; the others are `-0.0`, or untouched with `accumulate`.
    mask: Option<Vec<bool>>,
    accumulate: bool,
}

/// name, batch, m, k, n, then: a transposed, b transposed, b shared, masked, accumulate.
type Row = (&'static str, [usize; 4], [bool; 5]);

#[rustfmt::skip]
const CASES: &[Row] = &[
    ("plain",                [1, 37, 64, 48],    [false, false, false, false, false]),
    ("b_transposed",         [1, 33, 72, 40],    [false, true, false, false, false]),
    ("a_transposed",         [1, 40, 56, 24],    [true, false, false, false, false]),
    ("batched",              [4, 16, 64, 32],    [false, false, false, false, false]),
    ("batched_b_transposed", [3, 17, 48, 40],    [false, true, false, false, false]),
    ("shared_weight",        [4, 24, 64, 48],    [false, false, true, false, false]),
    ("masked",               [4, 16, 32, 24],    [false, false, false, true, false]),
    ("accumulate",           [2, 32, 64, 32],    [true, false, false, false, true]),
    ("masked_accumulate",    [4, 16, 48, 16],    [false, true, false, true, true]),
    ("stage_sized",          [4, 256, 1024, 512], [false, false, false, true, false]),
];

/// A buffer of `len` elements: managed memory when the GPU is open (its kernels read it).
struct Buffer {
    ptr: *mut u8,
    bytes: usize,
    _host: Vec<u64>,
}

impl Buffer {
    fn new(bytes: usize, gpu: bool) -> Buffer {
        if gpu {
            Buffer {
                ptr: cuda::alloc(bytes).cast(),
                bytes,
                _host: Vec::new(),
            }
        } else {
            let mut host = vec![0u64; bytes.div_ceil(8)];
            Buffer {
                ptr: host.as_mut_ptr().cast(),
                bytes,
                _host: host,
            }
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` covers `bytes` bytes, host-accessible (managed memory is).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }

    /// The values of a buffer of `dtype` elements, as f32.
    fn values(&self, dtype: DType) -> Vec<f32> {
        // SAFETY: as above; the buffer holds `dtype` elements, aligned (it is 8-byte aligned).
        unsafe {
            match dtype {
                DType::BF16 => {
                    std::slice::from_raw_parts(self.ptr.cast::<half::bf16>(), self.bytes / 2)
                        .iter()
                        .map(|x| x.to_f32())
                        .collect()
                }
                DType::F16 => {
                    std::slice::from_raw_parts(self.ptr.cast::<half::f16>(), self.bytes / 2)
                        .iter()
                        .map(|x| x.to_f32())
                        .collect()
                }
                _ => std::slice::from_raw_parts(self.ptr.cast::<f32>(), self.bytes / 4).to_vec(),
            }
        }
    }
}

/// A ranked descriptor `{allocated, aligned, offset, sizes, strides}` and its unranked handle.
struct Described {
    words: Vec<i64>,
}

impl Described {
    fn new(ptr: *mut u8, sizes: &[usize], strides: &[usize]) -> Described {
        let p = ptr as i64;
        let mut words = vec![p, p, 0];
        words.extend(sizes.iter().map(|&s| s as i64));
        words.extend(strides.iter().map(|&s| s as i64));
        Described { words }
    }

    fn unranked(&self) -> Unranked {
        Unranked {
            rank: ((self.words.len() - 3) / 2) as i64,
            descriptor: self.words.as_ptr().cast(),
        }
    }
}

/// Deterministic values in [-1, 1), rounded to `dtype` (so the f64 reference sees what the
/// GEMM sees).
fn values(len: usize, seed: u64, dtype: DType) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            match dtype {
                DType::BF16 => half::bf16::from_f32(x).to_f32(),
                DType::F16 => half::f16::from_f32(x).to_f32(),
                _ => x,
            }
        })
        .collect()
}

/// The runtime's entry point for `dtype` operands with a stage mask (`c += a · b` with
/// `accumulate`), as generated code calls it.
fn masked(
    dtype: DType,
    accumulate: bool,
) -> unsafe extern "C" fn(*const Unranked, *const Unranked, *const Unranked, *const Unranked) {
    match (dtype, accumulate) {
        (DType::F32, false) => _mlir_ciface_ppc_matmul_f32_masked,
        (DType::BF16, false) => _mlir_ciface_ppc_matmul_bf16_masked,
        (DType::F16, false) => _mlir_ciface_ppc_matmul_f16_masked,
        (DType::F32, true) => _mlir_ciface_ppc_matmul_acc_f32_masked,
        (DType::BF16, true) => _mlir_ciface_ppc_matmul_acc_bf16_masked,
        (DType::F16, true) => _mlir_ciface_ppc_matmul_acc_f16_masked,
        _ => unreachable!("GEMM operands are floats"),
    }
}

/// The same without a mask.
fn plain(
    dtype: DType,
    accumulate: bool,
) -> unsafe extern "C" fn(*const Unranked, *const Unranked, *const Unranked) {
    match (dtype, accumulate) {
        (DType::F32, false) => _mlir_ciface_ppc_matmul_f32,
        (DType::BF16, false) => _mlir_ciface_ppc_matmul_bf16,
        (DType::F16, false) => _mlir_ciface_ppc_matmul_f16,
        (DType::F32, true) => _mlir_ciface_ppc_matmul_acc_f32,
        (DType::BF16, true) => _mlir_ciface_ppc_matmul_acc_bf16,
        (DType::F16, true) => _mlir_ciface_ppc_matmul_acc_f16,
        _ => unreachable!("GEMM operands are floats"),
    }
}

/// The rounded entry point for 16-bit `dtype` (the result of that type), masked or not, as
/// generated code calls it.
fn rounded(
    dtype: DType,
) -> (
    unsafe extern "C" fn(*const Unranked, *const Unranked, *const Unranked),
    unsafe extern "C" fn(*const Unranked, *const Unranked, *const Unranked, *const Unranked),
) {
    match dtype {
        DType::BF16 => (
            _mlir_ciface_ppc_matmul_bf16_rounded,
            _mlir_ciface_ppc_matmul_bf16_rounded_masked,
        ),
        DType::F16 => (
            _mlir_ciface_ppc_matmul_f16_rounded,
            _mlir_ciface_ppc_matmul_f16_rounded_masked,
        ),
        _ => unreachable!("rounded GEMMs are for 16-bit operands"),
    }
}

/// Runs `case` on the open backend, into an f32 result or (`out` 16-bit) one of that type;
/// returns the largest difference to the f64 reference relative to its largest value, or why
/// it failed.
fn check(case: &Case, dtype: DType, out: DType, gpu: bool, seed: u64) -> Result<f64, String> {
    let (bt, m, k, n) = (case.batch, case.m, case.k, case.n);
    let width = dtype.size_bytes() as usize;
    let a_vals = values(bt * m * k, seed, dtype);
    let b_count = if case.b_shared { k * n } else { bt * k * n };
    let b_vals = values(b_count, seed + 1, dtype);
    let c_init = values(bt * m * n, seed + 2, DType::F32);
    // a[i, r, j] for r < m, j < k at its stored place.
    let a_at = |i: usize, r: usize, j: usize| {
        if case.a_transposed {
            i * m * k + j * m + r
        } else {
            i * m * k + r * k + j
        }
    };
    let b_at = |i: usize, r: usize, j: usize| {
        let i = if case.b_shared { 0 } else { i };
        if case.b_transposed {
            i * k * n + j * k + r
        } else {
            i * k * n + r * n + j
        }
    };
    // Stored in the layout, as `dtype`.
    let mut a_stored = vec![0f32; a_vals.len()];
    let mut b_stored = vec![0f32; b_vals.len()];
    for i in 0..bt {
        for r in 0..m {
            for j in 0..k {
                a_stored[a_at(i, r, j)] = a_vals[(i * m + r) * k + j];
            }
        }
    }
    for i in 0..if case.b_shared { 1 } else { bt } {
        for r in 0..k {
            for j in 0..n {
                b_stored[b_at(i, r, j)] = b_vals[(i * k + r) * n + j];
            }
        }
    }
    let (mut a, mut b, mut c) = (
        Buffer::new(a_vals.len() * width, gpu),
        Buffer::new(b_vals.len() * width, gpu),
        Buffer::new(c_init.len() * out.size_bytes() as usize, gpu),
    );
    encode(dtype, &a_stored, a.bytes_mut());
    encode(dtype, &b_stored, b.bytes_mut());
    // Poisoned where the product is written, the prior sum where it accumulates.
    let poison: Vec<f32> = if case.accumulate {
        c_init.clone()
    } else {
        vec![f32::NAN; c_init.len()]
    };
    encode(out, &poison, c.bytes_mut());

    let batched = |sizes: [usize; 2], strides: [usize; 2], step: usize| {
        if bt == 1 {
            (sizes.to_vec(), strides.to_vec())
        } else {
            (
                vec![bt, sizes[0], sizes[1]],
                vec![step, strides[0], strides[1]],
            )
        }
    };
    let (a_sizes, a_strides) = batched(
        [m, k],
        if case.a_transposed { [1, m] } else { [k, 1] },
        m * k,
    );
    let (b_sizes, b_strides) = if case.b_shared {
        (
            vec![k, n],
            if case.b_transposed {
                vec![1, k]
            } else {
                vec![n, 1]
            },
        )
    } else {
        batched(
            [k, n],
            if case.b_transposed { [1, k] } else { [n, 1] },
            k * n,
        )
    };
    let (c_sizes, c_strides) = batched([m, n], [n, 1], m * n);
    let (da, db, dc) = (
        Described::new(a.ptr, &a_sizes, &a_strides),
        Described::new(b.ptr, &b_sizes, &b_strides),
        Described::new(c.ptr, &c_sizes, &c_strides),
    );
    let (ua, ub, uc) = (da.unranked(), db.unranked(), dc.unranked());
    let mask_bytes: Vec<u8> = case.mask.iter().flatten().map(|&on| u8::from(on)).collect();
    let dm = Described::new(mask_bytes.as_ptr().cast_mut(), &[bt], &[1]);
    let um = dm.unranked();
    // SAFETY: each descriptor covers its buffer, which outlives the call; `c` overlaps neither.
    unsafe {
        match (case.mask.is_some(), out == DType::F32) {
            (true, true) => masked(dtype, case.accumulate)(&ua, &ub, &uc, &um),
            (false, true) => plain(dtype, case.accumulate)(&ua, &ub, &uc),
            (true, false) => rounded(dtype).1(&ua, &ub, &uc, &um),
            (false, false) => rounded(dtype).0(&ua, &ub, &uc),
        }
    }
    cuda::sync();

    let got = c.values(out);
    let (mut worst, mut largest) = (0f64, 0f64);
    for i in 0..bt {
        let active = case.mask.as_ref().is_none_or(|mask| mask[i]);
        for r in 0..m {
            for j in 0..n {
                let at = (i * m + r) * n + j;
                let g = got[at];
                if !active {
                    let want = if case.accumulate { c_init[at] } else { -0.0 };
                    if g.to_bits() != want.to_bits() {
                        return Err(format!(
                            "masked-out entry [{i}, {r}, {j}] is {g}, not {want}"
                        ));
                    }
                    continue;
                }
                let mut sum = if case.accumulate {
                    c_init[at] as f64
                } else {
                    0.0
                };
                for l in 0..k {
                    let bi = if case.b_shared { 0 } else { i };
                    sum += a_vals[(i * m + r) * k + l] as f64 * b_vals[(bi * k + l) * n + j] as f64;
                }
                if !g.is_finite() {
                    return Err(format!("entry [{i}, {r}, {j}] is {g}"));
                }
                worst = worst.max((g as f64 - sum).abs());
                largest = largest.max(sum.abs());
            }
        }
    }
    Ok(worst / largest.max(1e-30))
}

fn main() -> ExitCode {
    let gpu = match cuda::init(0, None) {
        Ok(name) => {
            println!("gpu_gemm: {name}");
            true
        }
        Err(e) => {
            println!("gpu_gemm: no GPU ({e}); checking the CPU path only");
            false
        }
    };
    let mut failed = 0;
    for (seed, &(name, [batch, m, k, n], [a_t, b_t, shared, masked, accumulate])) in
        CASES.iter().enumerate()
    {
        let case = Case {
            name,
            batch,
            m,
            k,
            n,
            a_transposed: a_t,
            b_transposed: b_t,
            b_shared: shared,
            mask: masked.then(|| (0..batch).map(|i| i % 3 != 1).collect()),
            accumulate,
        };
        // Into f32, and 16-bit operands also into their own type where nothing accumulates.
        let outs = [
            (DType::F32, DType::F32),
            (DType::BF16, DType::F32),
            (DType::F16, DType::F32),
            (DType::BF16, DType::BF16),
            (DType::F16, DType::F16),
        ];
        for (dtype, out) in outs {
            if out != DType::F32 && case.accumulate {
                continue;
            }
            // f32 accumulation of exactly representable products: only the order of the sum
            // differs from the f64 reference (TF32, where asked, rounds the f32 operands); a
            // 16-bit result adds its rounding: at most 2^-8 (bf16) or 2^-11 (f16) of its
            // largest value.
            let tol = match out {
                DType::BF16 => 4e-3,
                DType::F16 => 5e-4,
                _ if dtype == DType::F32 && std::env::var("PPC_TF32").is_ok_and(|v| v == "1") => {
                    2e-3
                }
                _ => 1e-5,
            };
            let label = match out != DType::F32 {
                true => format!("{}_{}_rounded", case.name, dtype.name()),
                false => format!("{}_{}", case.name, dtype.name()),
            };
            match check(&case, dtype, out, gpu, seed as u64 * 7 + 1) {
                Ok(err) if err <= tol => {
                    println!("ok    gemm {label}: {err:.1e} (tolerance {tol:.0e})")
                }
                Ok(err) => {
                    println!("FAIL  gemm {label}: {err:.1e} (tolerance {tol:.0e})");
                    failed += 1;
                }
                Err(why) => {
                    println!("FAIL  gemm {label}: {why}");
                    failed += 1;
                }
            }
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
