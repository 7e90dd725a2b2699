//! Tests of `gemm.rs`: every kernel against the scalar chain of fused multiply-adds, bit for bit.

use super::*;
use crate::memref::descriptor;

/// Row-major `[batch.., m, k] · [batch'.., k, n]` with NumPy broadcasting of the batch axes,
/// entries whose first index is masked out `-0.0`, each element the chain of fused
/// multiply-adds in k order that every kernel computes.
fn reference(
    a: &[f32],
    sa: &[usize],
    b: &[f32],
    sb: &[usize],
    sc: &[usize],
    mask: &[bool],
) -> Vec<f32> {
    let r = sc.len();
    let (m, n, k) = (sc[r - 2], sc[r - 1], sa[sa.len() - 1]);
    let batch = &sc[..r - 2];
    let count: usize = batch.iter().product();
    let flat_of = |idx: &[usize], shape: &[usize]| {
        let nb = shape.len() - 2;
        let skip = idx.len() - nb;
        (0..nb).fold(0, |acc, i| {
            acc * shape[i] + if shape[i] == 1 { 0 } else { idx[skip + i] }
        })
    };
    let mut c = vec![0f32; count * m * n];
    for e in 0..count {
        let idx = unflatten(e, batch);
        let (ea, eb) = (flat_of(&idx, sa), flat_of(&idx, sb));
        for i in 0..m {
            for j in 0..n {
                c[(e * m + i) * n + j] = if mask[idx[0]] {
                    (0..k).fold(0.0, |s, l| {
                        a[(ea * m + i) * k + l].mul_add(b[(eb * k + l) * n + j], s)
                    })
                } else {
                    -0.0
                };
            }
        }
    }
    c
}

/// A test operand: its values, its shape, and its strides when not row-major.
struct Operand {
    values: Vec<f32>,
    shape: Vec<usize>,
    strides: Option<Vec<i64>>,
}

/// Values in [-1, 1) that differ between elements and seeds.
fn fill(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

/// `a · b` through the runtime's entry point (masked by `mask` when given), into a fresh
/// `[.., m, n]` result of shape `sc`.
fn product(a: &mut Operand, b: &mut Operand, sc: &[usize], mask: Option<&[bool]>) -> Vec<f32> {
    let mut c = vec![f32::NAN; sc.iter().product()];
    let describe = |v: &mut Operand| {
        let mut d = descriptor(v.values.as_mut_ptr().cast(), &v.shape);
        if let Some(strides) = &v.strides {
            let rank = v.shape.len();
            d[3 + rank..].copy_from_slice(strides);
        }
        d
    };
    let unranked = |d: &mut Vec<i64>, rank: usize| Unranked {
        rank: rank as i64,
        descriptor: d.as_mut_ptr().cast(),
    };
    let (mut da, mut db) = (describe(a), describe(b));
    let mut dc = descriptor(c.as_mut_ptr().cast(), sc);
    let mut bytes: Vec<u8> = mask.unwrap_or(&[]).iter().map(|&x| u8::from(x)).collect();
    let mut dm = descriptor(bytes.as_mut_ptr(), &[bytes.len()]);
    let (ua, ub, uc, um) = (
        unranked(&mut da, a.shape.len()),
        unranked(&mut db, b.shape.len()),
        unranked(&mut dc, sc.len()),
        unranked(&mut dm, 1),
    );
    // SAFETY: the descriptors point at live buffers of the shapes and strides they state.
    unsafe {
        if mask.is_some() {
            _mlir_ciface_ppc_matmul_f32_masked(&ua, &ub, &uc, &um);
        } else {
            _mlir_ciface_ppc_matmul_f32(&ua, &ub, &uc);
        }
    }
    c
}

/// `got` has `want`'s bits, masked-out entries included (-0.0).
fn assert_same(got: &[f32], want: &[f32], what: &str) {
    for (i, (got, want)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{what}: element {i}: {got} against {want}"
        );
    }
}

/// Per-stage weights broadcast along a batch axis (rows folded into one GEMM per stage),
/// with and without a stage mask, and a product whose weights differ per batch entry (no
/// folding): the bits of the k-ordered chains.
#[test]
fn batched_products_with_broadcast_weights_match_the_loops() {
    for (sa, sb, masked) in [
        (vec![3, 2, 4, 5], vec![3, 1, 5, 6], true),
        (vec![3, 2, 4, 5], vec![3, 1, 5, 6], false),
        (vec![2, 3, 4, 5], vec![5, 6], false),
        (vec![3, 2, 4, 5], vec![3, 2, 5, 6], true),
    ] {
        let r = sa.len();
        let mut sc = sa.clone();
        sc[r - 1] = sb[sb.len() - 1];
        let active = [true, false, true];
        let mask = if masked { &active } else { &[true; 3] };
        let mut a = Operand {
            values: fill(sa.iter().product(), 1),
            shape: sa.clone(),
            strides: None,
        };
        let mut b = Operand {
            values: fill(sb.iter().product(), 2),
            shape: sb.clone(),
            strides: None,
        };
        let want = reference(&a.values, &sa, &b.values, &sb, &sc, mask);
        let got = product(&mut a, &mut b, &sc, masked.then_some(&active[..]));
        assert_same(&got, &want, &format!("{sa:?}·{sb:?} masked {masked}"));
    }
}

/// Few-row products with per-stage weights used transposed (`dY · Wᵀ`, the weights stored
/// `[S, n, k]`), with a bubble stage: the bits of the k-ordered chains of `W` transposed.
/// The weights are large enough for the few-row kernel (`small_m_bt.rs`, where the CPU has
/// AVX-512), with columns past its blocks of 8.
#[test]
fn products_with_transposed_weights_match_the_loops() {
    let (s, m, k, n) = (3, 16, 700, 230);
    let stored = fill(s * n * k, 2);
    // The same weights, transposed into row-major [S, k, n], for the reference.
    let mut plain = vec![0.0; s * k * n];
    for e in 0..s {
        for j in 0..n {
            for l in 0..k {
                plain[(e * k + l) * n + j] = stored[(e * n + j) * k + l];
            }
        }
    }
    let (sa, sb, sc) = (vec![s, m, k], vec![s, k, n], vec![s, m, n]);
    let active = [true, false, true];
    let mut a = Operand {
        values: fill(s * m * k, 1),
        shape: sa.clone(),
        strides: None,
    };
    let want = reference(&a.values, &sa, &plain, &sb, &sc, &active);
    let strides = vec![(n * k) as i64, 1, k as i64];
    let mut b = Operand {
        values: stored,
        shape: sb,
        strides: Some(strides),
    };
    let got = product(&mut a, &mut b, &sc, Some(&active));
    assert_same(&got, &want, "[3, 16, 700] · [3, 230, 700]ᵀ");
}

/// A weight gradient summed over its batch axis, `C[S] = Σ_b A[S, b] · B[S, b]` (`A` a
/// transposed view, as `xᵀ`), with a bubble stage: when the strides fold the batch into k
/// (one GEMM) and when they do not (one accumulating GEMM per entry), the bits of the chain
/// over (b, k) in order, which is the reference's product of the operands with b and k
/// merged.
#[test]
fn products_summed_over_a_batch_axis_are_one_chain_over_it() {
    let (s, nb, m, k, n) = (3, 4, 20, 33, 40);
    let active = [true, false, true];
    // x: [S, b, k, m] row-major; A = xᵀ: [S, b, m, k] with strides (b·k·m, k·m, 1, m).
    let x = fill(s * nb * k * m, 1);
    let y = fill(s * nb * k * n, 2);
    // The merged operands, row-major: A' [S, m, b·k], B' [S, b·k, n].
    let mut merged_a = vec![0.0; s * m * nb * k];
    for (st, e, l, i) in (0..s).flat_map(|st| {
        (0..nb).flat_map(move |e| (0..k).flat_map(move |l| (0..m).map(move |i| (st, e, l, i))))
    }) {
        merged_a[(st * m + i) * nb * k + e * k + l] = x[((st * nb + e) * k + l) * m + i];
    }
    let (sa, sb, sc) = (vec![s, m, nb * k], vec![s, nb * k, n], vec![s, m, n]);
    let want = reference(&merged_a, &sa, &y, &sb, &sc, &active);
    let folded = {
        let mut a = Operand {
            values: x.clone(),
            shape: vec![s, nb, m, k],
            strides: Some(vec![(nb * k * m) as i64, (k * m) as i64, 1, m as i64]),
        };
        let mut b = Operand {
            values: y.clone(),
            shape: vec![s, nb, k, n],
            strides: None,
        };
        product(&mut a, &mut b, &sc, Some(&active))
    };
    assert_same(&folded, &want, "summed, folded into k");
    // The same A stored row-major [S, b, m, k]: its entries' k do not follow each other.
    let mut row_major = vec![0.0; s * nb * m * k];
    for (st, e, l, i) in (0..s).flat_map(|st| {
        (0..nb).flat_map(move |e| (0..k).flat_map(move |l| (0..m).map(move |i| (st, e, l, i))))
    }) {
        row_major[((st * nb + e) * m + i) * k + l] = x[((st * nb + e) * k + l) * m + i];
    }
    let mut a = Operand {
        values: row_major,
        shape: vec![s, nb, m, k],
        strides: None,
    };
    let mut b = Operand {
        values: y,
        shape: vec![s, nb, k, n],
        strides: None,
    };
    let by_entry = product(&mut a, &mut b, &sc, Some(&active));
    assert_same(&by_entry, &want, "summed, entry by entry");
}

/// A product of bf16 operands into a bf16 result (`--target cuda` code run on the CPU): the f32
/// sums of the product into an f32 result, each rounded once to nearest even, masked-out
/// entries `-0.0`, written through the result's strides (a slice of a wider buffer, whose
/// other columns stay as they were).
#[test]
fn a_16_bit_product_is_its_f32_sums_rounded_once_into_the_result() {
    use half::bf16;
    let (sa, sb, sc) = ([2, 3, 8], [2, 8, 5], [2usize, 3, 5]);
    let bits = |n: usize, seed| -> Vec<u16> {
        fill(n, seed)
            .iter()
            .map(|&x| bf16::from_f32(x * 3.3).to_bits())
            .collect()
    };
    let (mut a, mut b) = (bits(48, 1), bits(80, 2));
    let unranked = |d: &mut Vec<i64>, rank: usize| Unranked {
        rank: rank as i64,
        descriptor: d.as_mut_ptr().cast(),
    };
    let mut da = descriptor(a.as_mut_ptr().cast(), &sa);
    let mut db = descriptor(b.as_mut_ptr().cast(), &sb);
    let mut mask = vec![1u8, 0];
    let mut dm = descriptor(mask.as_mut_ptr(), &[2]);
    let (ua, ub, um) = (
        unranked(&mut da, 3),
        unranked(&mut db, 3),
        unranked(&mut dm, 1),
    );
    let mut sums = vec![f32::NAN; 30];
    let mut ds = descriptor(sums.as_mut_ptr().cast(), &sc);
    // The result: columns 0..5 of a [2, 3, 8] buffer.
    const UNTOUCHED: u16 = 0x1234;
    let mut c = vec![UNTOUCHED; 48];
    let mut dc = descriptor(c.as_mut_ptr().cast(), &sc);
    dc[3 + 3..].copy_from_slice(&[24, 8, 1]);
    let (us, uc) = (unranked(&mut ds, 3), unranked(&mut dc, 3));
    // SAFETY: the descriptors point at live buffers of the shapes and strides they state.
    unsafe {
        _mlir_ciface_ppc_matmul_bf16_masked(&ua, &ub, &us, &um);
        _mlir_ciface_ppc_matmul_bf16_rounded_masked(&ua, &ub, &uc, &um);
    }
    for (i, &got) in c.iter().enumerate() {
        let (e, row, col) = (i / 24, i % 24 / 8, i % 8);
        let want = match col < 5 {
            true => bf16::from_f32(sums[(e * 3 + row) * 5 + col]).to_bits(),
            false => UNTOUCHED,
        };
        assert_eq!(got, want, "element {i}");
    }
    // The masked-out stage is -0.0; the other's sums are not all zero.
    assert!(c[24..]
        .chunks(8)
        .all(|r| r[..5].iter().all(|&x| x == 0x8000)));
    assert!(sums[..15].iter().all(|x| x.is_finite()) && sums[..15].iter().any(|&x| x != 0.0));
}
