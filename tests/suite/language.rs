//! The model language as a user writes it: sizes and numbers computed from dimensions, values
//! that keep f32 in a bf16 model.

use crate::common::{json_last_line, path, ppc};

const DIM_EXPRESSIONS: &str = "tests/models/dim_expressions.ppc";

#[test]
fn sizes_slices_and_constants_follow_the_dimensions_they_are_written_with() {
    let model = path(DIM_EXPRESSIONS);
    for d in ["8", "16"] {
        let dim = format!("d={d}");
        let n: u64 = d.parse().expect("number");
        // The parsed module holds the evaluated values: the slice takes the middle third of
        // `3 * d` and the scale is 1/sqrt(d / heads), whatever `d` is.
        let (code, out, err) = ppc(&["compile", &model, "--dim", &dim, "--emit=vmap-stages"]);
        assert_eq!(code, 0, "{err}");
        let slice = format!("start = [0, {n}], end = [2, {}]", 2 * n);
        assert!(out.contains(&slice), "no `{slice}` in:\n{out}");
        let scale = format!("constant {} : f32[]", 1.0 / ((n / 2) as f64).sqrt());
        assert!(out.contains(&scale), "no `{scale}` in:\n{out}");
        for backend in ["interp", "cpu"] {
            let args = ["verify", &model, "--dim", &dim, "--backend", backend];
            let (code, out, err) = ppc(&args);
            assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
            assert_eq!(json_last_line(&out)["ok"], true, "{args:?}: {out}");
        }
    }
}
