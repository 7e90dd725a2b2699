//! `ppc verify` can fail, visibly: a result changed in one element gives `"ok": false`, exit
//! status 1 and the element's index; and the comparison rules it applies, one by one.

use crate::common::{json_last_line, path, ppc};
use ppc::compare::{compare, tolerance};
use ppc_dialect::DType;
use ppc_runtime::Tensor;

#[test]
fn a_result_changed_in_one_element_fails_and_is_located() {
    let tiny = path("examples/tiny.ppc");
    // tiny: 3 microbatches of [2, 4]; element 13 is microbatch 1, row 1, column 1.
    for backend in ["interp", "cpu"] {
        let args = ["verify", tiny.as_str(), "--backend", backend, "--exact"];
        let (code, out, _) = ppc(&args);
        assert_eq!(code, 0, "{backend}: unperturbed must pass\n{out}");
        let mut perturbed = args.to_vec();
        perturbed.extend(["--perturb", "13"]);
        let (code, out, err) = ppc(&perturbed);
        assert_eq!(code, 1, "{backend}: {out}{err}");
        let j = json_last_line(&out);
        assert_eq!(j["ok"], false, "{j}");
        assert_eq!(j["bit_exact"], false, "{j}");
        assert_eq!(j["worst"]["index"], serde_json::json!([1, 1, 1]), "{j}");
        let (w, g) = (
            j["worst"]["want"].as_f64().unwrap(),
            j["worst"]["got"].as_f64().unwrap(),
        );
        assert!((g - w - 1.0).abs() < 1e-6, "{j}");
        assert!(
            (j["max_abs_diff"].as_f64().unwrap() - 1.0).abs() < 1e-6,
            "{j}"
        );
    }
    let (code, _, err) = ppc(&["verify", &tiny, "--perturb", "24"]);
    assert_eq!(code, 1);
    assert!(err.contains("the result has 24 elements"), "{err}");
}

fn t(v: &[f32]) -> Tensor {
    Tensor::new(DType::F32, vec![v.len()], v.to_vec())
}

#[test]
fn equal_results_compare_exact_and_nan_matches_nan() {
    let c = compare(&t(&[1.0, f32::NAN, -0.0]), &t(&[1.0, f32::NAN, -0.0]));
    assert!(c.bit_exact && c.max_abs == 0.0 && c.max_rel == 0.0 && c.worst.is_none());
    // A NaN of another sign is no difference in value, but not the same bits.
    let c = compare(&t(&[f32::NAN]), &t(&[-f32::NAN]));
    assert!(!c.bit_exact && c.max_abs == 0.0 && c.worst.is_none());
    // -0 against +0: equal values, other bits, located.
    let c = compare(&t(&[1.0, -0.0]), &t(&[1.0, 0.0]));
    assert!(!c.bit_exact && c.max_abs == 0.0);
    assert_eq!(c.worst, Some(1));
}

#[test]
fn a_nan_on_one_side_is_infinitely_far() {
    for (want, got) in [
        (&[1.0, 2.0][..], &[1.0, f32::NAN][..]),
        (&[1.0, f32::NAN], &[1.0, 2.0]),
    ] {
        let c = compare(&t(want), &t(got));
        assert!(c.max_abs.is_infinite() && c.max_rel.is_infinite());
        assert_eq!(c.worst, Some(1));
    }
}

#[test]
fn the_relative_difference_is_normwise() {
    // 1e-3 off on an element near zero, against a largest magnitude of 100: 1e-5 normwise.
    let c = compare(&t(&[100.0, 0.001]), &t(&[100.0, 0.002]));
    assert!((c.max_rel - 1e-5).abs() < 1e-9, "{}", c.max_rel);
    assert_eq!(c.worst, Some(1));
    // The largest difference is the one located, not the first.
    let c = compare(&t(&[1.0, 2.0, 3.0]), &t(&[1.1, 2.5, 3.2]));
    assert_eq!(c.worst, Some(1));
    // Infinite reference values do not set the scale.
    let c = compare(&t(&[f32::INFINITY, 2.0]), &t(&[f32::INFINITY, 2.002]));
    assert!((c.max_rel - 1e-3).abs() < 1e-6, "{}", c.max_rel);
    // Different shapes never compare equal.
    let c = compare(
        &t(&[1.0, 2.0]),
        &Tensor::new(DType::F32, vec![2, 1], vec![1.0, 2.0]),
    );
    assert!(!c.bit_exact && c.max_abs.is_infinite());
}

#[test]
fn tolerances_follow_the_precision_of_the_storage_dtype() {
    // Four to eight units of the dtype's epsilon for the half types, whose rounding dominates;
    // f32 allows for a different summation order over long dot products.
    let eps_bf16 = f64::from(half::bf16::EPSILON.to_f32());
    let eps_f16 = f64::from(half::f16::EPSILON.to_f32());
    assert!((4.0 * eps_bf16..=8.0 * eps_bf16).contains(&tolerance(DType::BF16)));
    assert!((4.0 * eps_f16..=8.0 * eps_f16).contains(&tolerance(DType::F16)));
    let eps = f64::from(f32::EPSILON);
    assert!((10.0 * eps..1e-4).contains(&tolerance(DType::F32)));
}
