//! The model language as a user writes it: sizes and numbers computed from dimensions, values
//! that keep f32 in a bf16 model.

use crate::common::{json_last_line, path, ppc};
use ppc_dialect::op::OpKind;

const DIM_EXPRESSIONS: &str = "tests/models/dim_expressions.ppc";

#[test]
fn sizes_slices_and_constants_follow_the_dimensions_they_are_written_with() {
    let model = path(DIM_EXPRESSIONS);
    for d in ["8", "16"] {
        let dim = format!("d={d}");
        let n: u64 = d.parse().expect("number");
        // The loaded module holds the evaluated values: the slice takes the middle third of
        // `3 * d` and the scale is 1/sqrt(d / heads), whatever `d` is.
        let overrides = ppc_dialect::Overrides {
            dims: vec![("d".to_string(), n)],
            ..Default::default()
        };
        let text = std::fs::read_to_string(&model).expect("model");
        let m = crate::common::load(&text, &overrides);
        let layer = m.func("layer").expect("@layer");
        let kinds: Vec<&OpKind> = layer.ops.values().map(|op| &op.kind).collect();
        let slice = kinds.iter().find_map(|k| match k {
            OpKind::Slice { start, end, .. } => Some((start.clone(), end.clone())),
            _ => None,
        });
        assert_eq!(slice, Some((vec![0, n], vec![2, 2 * n])), "d = {n}");
        let want = 1.0 / ((n / 2) as f64).sqrt();
        assert!(
            kinds
                .iter()
                .any(|k| matches!(k, OpKind::Constant { value } if value.0 == want)),
            "no constant {want} at d = {n}"
        );
        for backend in ["interp", "cpu"] {
            let args = ["verify", &model, "--dim", &dim, "--backend", backend];
            let (code, out, err) = ppc(&args);
            assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
            assert_eq!(json_last_line(&out)["ok"], true, "{args:?}: {out}");
        }
    }
}

/// `ppc run MODEL --dtype bf16 --backend BACKEND` on `input`: the output tensor.
fn run_bf16(model: &str, backend: &str, input: &std::path::Path) -> ppc_runtime::tensor::Tensor {
    let out = input.with_file_name(format!("out-{backend}.safetensors"));
    let (i, o) = (input.display().to_string(), out.display().to_string());
    let args = [
        "run",
        model,
        "--dtype",
        "bf16",
        "--backend",
        backend,
        "--input",
        &i,
        "--output",
        &o,
        "--steps",
        "1",
    ];
    let (code, stdout, err) = ppc(&args);
    assert_eq!(code, 0, "{args:?}\n{stdout}\n{err}");
    ppc_runtime::safetensors::read_tensor(&out, "output")
        .expect("output")
        .to_tensor()
}

#[test]
fn a_pinned_f32_value_stays_exact_in_a_bf16_model_on_every_backend() {
    use ppc_runtime::{memref::HostBuffer, safetensors, tensor::Tensor, DType};
    let dir = std::env::temp_dir().join(format!("ppc-pinned-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    // Small integers, exact in bf16: the identity model must give them back exactly.
    let shape = vec![2, 2, 512];
    let data: Vec<f32> = (0..2 * 2 * 512).map(|i| (i % 13) as f32 - 6.0).collect();
    let x = Tensor::new(DType::BF16, shape, data);
    let input = dir.join("in.safetensors");
    safetensors::write(&input, &[("input", &HostBuffer::from_tensor(&x))]).expect("input");
    let pinned = path("tests/models/pinned_f32.ppc");
    for backend in ["interp", "cpu"] {
        let got = run_bf16(&pinned, backend, &input);
        assert_eq!(got.data, x.data, "{backend}: positions lost precision");
    }
    // The same model without `!`: its positions round to bf16 and the gaps are 0 or 2.
    let text = std::fs::read_to_string(&pinned).expect("model");
    let unpinned = dir.join("unpinned.ppc");
    std::fs::write(&unpinned, text.replace("f32!", "f32")).expect("write");
    let got = run_bf16(&unpinned.display().to_string(), "interp", &input);
    assert_ne!(
        got.data, x.data,
        "bf16 positions should have lost precision above 256"
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
