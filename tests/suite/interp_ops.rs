//! The interpreter's meaning of each op, against values worked out by hand, plus properties
//! (softmax rows sum to 1, layernorm gives mean 0 and variance 1, matmul matches an f64 loop).

use ppc_dialect::interp::Interp;
use ppc_dialect::{parse, verify, Overrides};
use ppc_runtime::{DType, Init, Rng, Tensor};

/// Evaluates `func @f(<sig>) -> <ret> { <body> }` on `args`.
fn eval(sig: &str, ret: &str, body: &str, args: Vec<Tensor>) -> Tensor {
    let text = format!("pipeline {{ stages = 1, microbatches = 1 }}\ninput f32[1]\nfunc @f({sig}) -> {ret} {{\n{body}\n}}\n");
    let m = parse(&text, &Overrides::default())
        .unwrap_or_else(|d| panic!("{}", ppc_dialect::diag::render("t", &text, &d)));
    verify(&m).expect("verifies");
    let f = m.func("f").expect("@f");
    let mut interp = Interp::new(&m, 0);
    interp.call(f, args, 0).expect("runs").remove(0)
}

fn t(shape: &[usize], data: &[f32]) -> Tensor {
    Tensor::new(DType::F32, shape.to_vec(), data.to_vec())
}

fn ti(shape: &[usize], data: &[i32]) -> Tensor {
    Tensor::from_ints(shape.to_vec(), data.iter().copied())
}

fn ints(t: &Tensor) -> Vec<i32> {
    assert_eq!(t.dtype, DType::I32);
    (0..t.len()).map(|i| t.int(i)).collect()
}

fn unary(op: &str, x: f32) -> f32 {
    eval(
        "%x: f32[1]",
        "f32[1]",
        &format!("%y = {op} %x\nreturn %y"),
        vec![t(&[1], &[x])],
    )
    .data[0]
}

fn binary(op: &str, a: Tensor, b: Tensor, ret: &str) -> Tensor {
    let sig = format!("%a: {}{:?}, %b: {}{:?}", a.dtype, a.shape, b.dtype, b.shape);
    eval(
        &sig,
        ret,
        &format!("%y = {op} %a, %b\nreturn %y"),
        vec![a, b],
    )
}

#[test]
fn elementwise_binary_with_broadcasting() {
    let a = || t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = || t(&[2], &[10.0, 20.0]);
    assert_eq!(
        binary("add", a(), b(), "f32[2, 2]").data,
        [11.0, 22.0, 13.0, 24.0]
    );
    assert_eq!(
        binary("sub", a(), b(), "f32[2, 2]").data,
        [-9.0, -18.0, -7.0, -16.0]
    );
    assert_eq!(
        binary("mul", a(), b(), "f32[2, 2]").data,
        [10.0, 40.0, 30.0, 80.0]
    );
    assert_eq!(
        binary("div", a(), b(), "f32[2, 2]").data,
        [0.1, 0.1, 0.3, 0.2]
    );
    assert_eq!(
        binary("max", a(), t(&[2, 1], &[2.5, 3.5]), "f32[2, 2]").data,
        [2.5, 2.5, 3.5, 4.0]
    );
    assert_eq!(
        binary("min", a(), t(&[], &[2.0]), "f32[2, 2]").data,
        [1.0, 2.0, 2.0, 2.0]
    );
    // Integer division rounds toward negative infinity.
    assert_eq!(
        ints(&binary(
            "div",
            ti(&[3], &[-7, 7, 6]),
            ti(&[], &[2]),
            "i32[3]"
        )),
        [-4, 3, 3]
    );
}

/// i32 values are integers, exact beyond f32's 2^24 and wrapping as two's complement (as the
/// compiled `arith` ops do; the conformance case `int_wide` checks the backends agree).
#[test]
fn integers_are_exact_and_wrap() {
    let big = || ti(&[4], &[16_777_217, i32::MAX, i32::MIN, -16_777_219]);
    let op = |name, b: Tensor, ret| ints(&binary(name, big(), b, ret));
    assert_eq!(
        op("add", ti(&[], &[2]), "i32[4]"),
        [16_777_219, i32::MIN + 1, i32::MIN + 2, -16_777_217]
    );
    assert_eq!(
        op("sub", ti(&[], &[1]), "i32[4]"),
        [16_777_216, i32::MAX - 1, i32::MAX, -16_777_220]
    );
    assert_eq!(
        op("mul", ti(&[], &[65_536]), "i32[4]"),
        [65_536, -65_536, 0, -196_608]
    );
    assert_eq!(
        op("div", ti(&[4], &[2, -1, -1, 0]), "i32[4]"),
        [8_388_608, -i32::MAX, i32::MIN, 0]
    );
    assert_eq!(
        op("max", ti(&[], &[16_777_218]), "i32[4]"),
        [16_777_218, i32::MAX, 16_777_218, 16_777_218]
    );
    // Neighbouring integers that one f32 would hold alike.
    let lt = binary("lt", big(), ti(&[], &[16_777_218]), "i1[4]");
    assert_eq!(lt.data, [1.0, 0.0, 1.0, 1.0]);
    let wide = ti(&[2], &[16_777_217, 16_777_219]);
    let y = eval(
        "%x: i32[2]",
        "i32[]",
        "%y = reduce_max %x, axes = [0]\nreturn %y",
        vec![wide],
    );
    assert_eq!(ints(&y), [16_777_219]);
}

#[test]
fn elementwise_unary() {
    assert_eq!(unary("neg", 2.0), -2.0);
    assert_eq!(unary("abs", -3.0), 3.0);
    assert_eq!(unary("exp", 0.0), 1.0);
    assert_eq!(unary("log", 1.0), 0.0);
    assert_eq!(unary("tanh", 0.0), 0.0);
    assert_eq!(unary("sigmoid", 0.0), 0.5);
    assert_eq!(unary("relu", -1.0), 0.0);
    assert_eq!(unary("relu", 1.5), 1.5);
    assert_eq!(unary("gelu", 0.0), 0.0);
    assert!(
        (unary("gelu", 10.0) - 10.0).abs() < 1e-5,
        "gelu(x) -> x for large x"
    );
    assert!(
        (unary("gelu", 1.0) - 0.841_192).abs() < 1e-5,
        "tanh-form gelu(1)"
    );
    assert_eq!(unary("sqrt", 4.0), 2.0);
    assert_eq!(unary("rsqrt", 4.0), 0.5);
    assert!((unary("exp", 1.0) - std::f32::consts::E).abs() < 1e-6);
}

#[test]
fn comparisons_and_select() {
    let a = || t(&[3], &[1.0, 2.0, 3.0]);
    let b = || t(&[3], &[2.0, 2.0, 2.0]);
    assert_eq!(binary("lt", a(), b(), "i1[3]").data, [1.0, 0.0, 0.0]);
    assert_eq!(binary("le", a(), b(), "i1[3]").data, [1.0, 1.0, 0.0]);
    assert_eq!(binary("eq", a(), b(), "i1[3]").data, [0.0, 1.0, 0.0]);
    assert_eq!(binary("gt", a(), b(), "i1[3]").data, [0.0, 0.0, 1.0]);
    assert_eq!(binary("ge", a(), b(), "i1[3]").data, [0.0, 1.0, 1.0]);
    assert_eq!(binary("ne", a(), b(), "i1[3]").data, [1.0, 0.0, 1.0]);
    let y = eval(
        "%a: f32[3], %b: f32[3]",
        "f32[3]",
        "%c = lt %a, %b\n%z = constant -1.0 : f32[]\n%y = select %c, %a, %z\nreturn %y",
        vec![a(), b()],
    );
    assert_eq!(y.data, [1.0, -1.0, -1.0]);
}

#[test]
fn matmul_by_hand_and_batched() {
    let y = binary(
        "matmul",
        t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]),
        t(&[2, 2], &[5.0, 6.0, 7.0, 8.0]),
        "f32[2, 2]",
    );
    assert_eq!(y.data, [19.0, 22.0, 43.0, 50.0]);
    // Batch [2] against an unbatched right operand: each batch is its own 1x2 · 2x1 product.
    let y = binary(
        "matmul",
        t(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]),
        t(&[2, 1], &[10.0, 1.0]),
        "f32[2, 1, 1]",
    );
    assert_eq!(y.data, [12.0, 34.0]);
}

#[test]
fn masked_matmul_zeroes_the_entries_it_skips() {
    // Two batch entries of [1, 2] · [2, 1]; the mask keeps only the second.
    let y = eval(
        "%a: f32[2, 1, 2], %b: f32[2, 2, 1], %m: i1[2]",
        "f32[2, 1, 1]",
        "%y = matmul %a, %b, %m\nreturn %y",
        vec![
            t(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]),
            t(&[2, 2, 1], &[5.0, 6.0, 7.0, 8.0]),
            Tensor::new(DType::I1, vec![2], vec![0.0, 1.0]),
        ],
    );
    assert_eq!(y.data, [0.0, 53.0]);
}

#[test]
fn matmul_matches_an_f64_loop() {
    let (m, k, n) = (5, 7, 3);
    let a: Vec<f32> = Rng::stream(1, "a", 0).fill(Init::Normal(1.0), m * k);
    let b: Vec<f32> = Rng::stream(1, "b", 0).fill(Init::Normal(1.0), k * n);
    let y = binary("matmul", t(&[m, k], &a), t(&[k, n], &b), "f32[5, 3]");
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            let got = f64::from(y.data[i * n + j]);
            assert!(
                (want - got).abs() <= 1e-5 * (1.0 + want.abs()),
                "({i},{j}): {got} vs {want}"
            );
        }
    }
}

#[test]
fn layout_ops() {
    let x = || t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = eval(
        "%x: f32[2, 3]",
        "f32[3, 2]",
        "%y = transpose %x, perm = [1, 0]\nreturn %y",
        vec![x()],
    );
    assert_eq!(y.data, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let y = eval(
        "%x: f32[2, 3]",
        "f32[3, 2]",
        "%y = reshape %x : f32[3, 2]\nreturn %y",
        vec![x()],
    );
    assert_eq!(y.data, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = eval(
        "%x: f32[3]",
        "f32[2, 3]",
        "%y = broadcast %x : f32[2, 3]\nreturn %y",
        vec![t(&[3], &[7.0, 8.0, 9.0])],
    );
    assert_eq!(y.data, [7.0, 8.0, 9.0, 7.0, 8.0, 9.0]);
    let y = eval(
        "%x: f32[2, 3]",
        "f32[1, 2]",
        "%y = slice %x, start = [1, 1], end = [2, 3]\nreturn %y",
        vec![x()],
    );
    assert_eq!(y.data, [5.0, 6.0]);
    let y = eval(
        "%x: f32[2, 3]",
        "f32[2, 6]",
        "%y = concat %x, %x, axis = 1\nreturn %y",
        vec![x()],
    );
    assert_eq!(
        y.data,
        [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 4.0, 5.0, 6.0]
    );
    let y = eval(
        "%x: f32[2, 3]",
        "f32[4, 3]",
        "%y = pad %x, axis = 0, low = 1, high = 1, fill = 9.0\nreturn %y",
        vec![x()],
    );
    assert_eq!(
        y.data,
        [9.0, 9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 9.0, 9.0, 9.0]
    );
    let y = eval(
        "%x: f32[2, 3]",
        "f32[2, 3]",
        "%y = shift %x, axis = 0, fill = 0.0\nreturn %y",
        vec![x()],
    );
    assert_eq!(y.data, [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
    let y = eval(
        "%x: f32[2, 3]",
        "f32[2, 3]",
        "%y = shift %x, axis = 1, fill = -1.0\nreturn %y",
        vec![x()],
    );
    assert_eq!(y.data, [-1.0, 1.0, 2.0, -1.0, 4.0, 5.0]);
}

#[test]
fn dynamic_index_and_update() {
    let x = || t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = eval(
        "%x: f32[2, 3], %i: i32[]",
        "f32[3]",
        "%y = index %x, %i, axis = 0\nreturn %y",
        vec![x(), ti(&[], &[1])],
    );
    assert_eq!(y.data, [4.0, 5.0, 6.0]);
    // Batched index: row r takes column i[r].
    let y = eval(
        "%x: f32[2, 3], %i: i32[2]",
        "f32[2]",
        "%y = index %x, %i, axis = 1\nreturn %y",
        vec![x(), ti(&[2], &[2, 0])],
    );
    assert_eq!(y.data, [3.0, 4.0]);
    let y = eval(
        "%x: f32[2, 3], %u: f32[3], %i: i32[]",
        "f32[2, 3]",
        "%y = update %x, %u, %i, axis = 0\nreturn %y",
        vec![x(), t(&[3], &[0.0, 0.5, 1.0]), ti(&[], &[0])],
    );
    assert_eq!(y.data, [0.0, 0.5, 1.0, 4.0, 5.0, 6.0]);
    // Out-of-range indices clamp, as XLA's dynamic slices do.
    let y = eval(
        "%x: f32[2, 3], %i: i32[]",
        "f32[3]",
        "%y = index %x, %i, axis = 0\nreturn %y",
        vec![x(), ti(&[], &[5])],
    );
    assert_eq!(y.data, [4.0, 5.0, 6.0]);
}

#[test]
fn reductions() {
    let x = || t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let sum = eval(
        "%x: f32[2, 3]",
        "f32[2]",
        "%y = reduce_sum %x, axes = [1]\nreturn %y",
        vec![x()],
    );
    assert_eq!(sum.data, [6.0, 15.0]);
    let mean = eval(
        "%x: f32[2, 3]",
        "f32[3]",
        "%y = reduce_mean %x, axes = [0]\nreturn %y",
        vec![x()],
    );
    assert_eq!(mean.data, [2.5, 3.5, 4.5]);
    let max = eval(
        "%x: f32[2, 3]",
        "f32[]",
        "%y = reduce_max %x, axes = [0, 1]\nreturn %y",
        vec![x()],
    );
    assert_eq!(max.data, [6.0]);
}

#[test]
fn iota_constant_convert() {
    let y = eval(
        "%x: f32[1]",
        "i32[2, 3]",
        "%y = iota axis = 1 : i32[2, 3]\nreturn %y",
        vec![t(&[1], &[0.0])],
    );
    assert_eq!(ints(&y), [0, 1, 2, 0, 1, 2]);
    let y = eval(
        "%x: f32[1]",
        "f32[2]",
        "%y = constant 2.5 : f32[2]\nreturn %y",
        vec![t(&[1], &[0.0])],
    );
    assert_eq!(y.data, [2.5, 2.5]);
    // bf16 keeps 8 significant bits: 1 + 2^-9 rounds to 1, 1 + 2^-7 is kept.
    let y = eval(
        "%x: f32[2]",
        "bf16[2]",
        "%y = convert %x : bf16[2]\nreturn %y",
        vec![t(&[2], &[1.0 + 1.0 / 512.0, 1.0 + 1.0 / 128.0])],
    );
    assert_eq!(y.data, [1.0, 1.0 + 1.0 / 128.0]);
    // f16 overflows to infinity above 65504.
    let y = eval(
        "%x: f32[1]",
        "f16[1]",
        "%y = convert %x : f16[1]\nreturn %y",
        vec![t(&[1], &[70000.0])],
    );
    assert_eq!(y.data, [f32::INFINITY]);
}

#[test]
fn bf16_arithmetic_rounds_on_store() {
    let a = Tensor::new(DType::BF16, vec![1], vec![1.0]);
    let b = Tensor::new(DType::BF16, vec![1], vec![1.0 / 512.0]);
    assert_eq!(
        binary("add", a, b, "bf16[1]").data,
        [1.0],
        "1 + 2^-9 is not representable in bf16"
    );
}

#[test]
fn softmax_rows_sum_to_one() {
    let data = Rng::stream(3, "s", 0).fill(Init::Normal(3.0), 4 * 7);
    let y = eval(
        "%x: f32[4, 7]",
        "f32[4, 7]",
        "%y = softmax %x, axis = 1\nreturn %y",
        vec![t(&[4, 7], &data)],
    );
    for r in 0..4 {
        let row = &y.data[r * 7..(r + 1) * 7];
        assert!(row.iter().all(|&v| v > 0.0 && v < 1.0));
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-6, "row {r} sums to {s}");
    }
    // Along axis 0 it is the columns that sum to one.
    let y = eval(
        "%x: f32[4, 7]",
        "f32[4, 7]",
        "%y = softmax %x, axis = 0\nreturn %y",
        vec![t(&[4, 7], &data)],
    );
    let s: f32 = (0..4).map(|r| y.data[r * 7]).sum();
    assert!((s - 1.0).abs() < 1e-6);
    // Large inputs do not overflow: the max is subtracted first.
    let y = eval(
        "%x: f32[2]",
        "f32[2]",
        "%y = softmax %x, axis = 0\nreturn %y",
        vec![t(&[2], &[1000.0, 1000.0])],
    );
    assert_eq!(y.data, [0.5, 0.5]);
}

#[test]
fn layernorm_has_mean_zero_variance_one() {
    let data = Rng::stream(4, "l", 0).fill(Init::Uniform(-5.0, 9.0), 3 * 64);
    let y = eval(
        "%x: f32[3, 64]",
        "f32[3, 64]",
        "%y = layernorm %x, axis = 1, eps = 0.0\nreturn %y",
        vec![t(&[3, 64], &data)],
    );
    for r in 0..3 {
        let row: Vec<f64> = y.data[r * 64..(r + 1) * 64]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let mean = row.iter().sum::<f64>() / 64.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 64.0;
        assert!(mean.abs() < 1e-5, "mean {mean}");
        assert!((var - 1.0).abs() < 1e-4, "variance {var}");
    }
    // By hand: [1, 3] has mean 2 and variance 1, so it normalizes to [-1, 1].
    let y = eval(
        "%x: f32[2]",
        "f32[2]",
        "%y = layernorm %x, axis = 0, eps = 0.0\nreturn %y",
        vec![t(&[2], &[1.0, 3.0])],
    );
    assert_eq!(y.data, [-1.0, 1.0]);
}
