//! The model language as a user writes it: sizes and numbers computed from dimensions, values
//! that keep f32 in a bf16 model.

use crate::common::{json_last_line, path, ppc};
use ppc_dialect::op::OpKind;
use ppc_dialect::DType;

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
    // Its f32 parameter trains in a bf16 model: the gradients match the sequential model's.
    let (code, out, err) = ppc(&["verify", &pinned, "--dtype", "bf16", "--grad"]);
    assert_eq!(code, 0, "{out}\n{err}");
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

const REFERENCE: &str = "docs/language.md";

/// The reference page, its generated op tables brought up to date first when `UPDATE_DOCS=1`.
fn reference_page() -> String {
    use ppc::reference::{ops_markdown, BEGIN, END};
    let file = crate::common::root().join(REFERENCE);
    let page = std::fs::read_to_string(&file).expect("docs/language.md");
    let (head, rest) = page
        .split_once(BEGIN)
        .expect("the page marks its generated op tables");
    let (_, tail) = rest.split_once(END).expect("the generated op tables end");
    let fresh = format!("{head}{BEGIN}\n{}{END}{tail}", ops_markdown());
    if std::env::var_os("UPDATE_DOCS").is_some() {
        if page != fresh {
            std::fs::write(&file, &fresh).expect("rewrite docs/language.md");
        }
        return fresh;
    }
    assert!(
        page == fresh,
        "docs/language.md's op tables are stale: run `UPDATE_DOCS=1 cargo test -p ppc-tests --test suite -- language` and review the diff"
    );
    page
}

#[test]
fn the_reference_names_every_op_attribute_setting_init_loss_and_dtype() {
    use ppc_dialect::parse::signature::signatures;
    let page = reference_page();
    let mut names: Vec<String> = Vec::new();
    for s in signatures() {
        names.push(format!("`{}`", s.name));
        names.extend(s.attributes.iter().map(|a| format!("`{a}`")));
    }
    names.extend(ppc_dialect::ir::Setting::ALL.map(|s| format!("`{}`", s.name())));
    names.extend(ppc_runtime::optim::SETTINGS.map(|s| format!("`{s}`")));
    names.extend(["mse", "softmax_cross_entropy"].map(|l| format!("`{l}`")));
    names.extend(["zeros", "ones", "normal(std)", "uniform(low, high)"].map(|i| format!("`{i}`")));
    names.extend(ppc_dialect::expr::Function::ALL.map(|f| format!("`{}`", f.name())));
    for d in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::I1] {
        names.push(format!("`{}`", d.name()));
    }
    names.push("`f32!`".into());
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !page.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/language.md does not mention {missing:?}"
    );
}

/// A model holding the reference's example values and then `stmt`.
fn with_example_values(stmt: &str) -> String {
    format!(
        "dims {{ b = 2, t = 4, d = 8 }}\npipeline {{ stages = 1, microbatches = 1 }}\ninput f32[b, d]\n\n\
         func @block(%x: f32[b, d]) -> f32[b, d] {{\n  %y = tanh %x\n  return %y\n}}\n\n\
         func @layer(%x: f32[b, d]) -> f32[b, d] {{\n  param %w: f32[d, d] = normal(0.1)\n\
         \x20 %y = tanh %x\n  %c = gt %x, %y\n  %k = iota axis = 0 : i32[b]\n\
         \x20 %x3 = reshape %x : f32[b, 1, d]\n  %s = broadcast %x3 : f32[b, t, d]\n\
         \x20 %ids = iota axis = 1 : i32[b, t]\n  %one = constant 1 : i32[]\n  %on = eq %one, %one\n\
         \x20 %unused = call @block, %x\n  {stmt}\n  return %x\n}}\n"
    )
}

#[test]
fn every_example_in_the_reference_checks_and_the_compilers_ops_are_rejected() {
    use ppc_dialect::parse::signature::{signatures, Writer};
    let page = reference_page();
    let dir = std::env::temp_dir().join(format!("ppc-reference-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let check = |name: &str, text: &str| {
        let file = dir.join(format!("{name}.ppc"));
        std::fs::write(&file, text).expect("write");
        ppc(&["check", &file.display().to_string()])
    };
    // Whole models in ```ppc blocks.
    let blocks: Vec<&str> = page
        .split("```ppc\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap_or_default())
        .collect();
    assert!(!blocks.is_empty(), "the page shows a whole model");
    for (i, block) in blocks.iter().enumerate() {
        let (code, _, err) = check(&format!("block{i}"), block);
        assert_eq!(code, 0, "model {i} of docs/language.md:\n{block}\n{err}");
    }
    // Every op's example line, among the example values.
    for s in signatures() {
        let (code, _, err) = check(s.name, &with_example_values(s.example));
        match s.writer {
            Writer::User => assert_eq!(code, 0, "`{}`: {}\n{err}", s.name, s.example),
            Writer::Compiler => assert!(
                code == 1 && err.contains("an op the compiler writes"),
                "`{}` must be rejected in a model: {err}",
                s.name
            ),
        }
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_setting_from_the_command_line_is_labelled_as_such() {
    let file = std::env::temp_dir().join(format!("ppc-stages-{}.ppc", std::process::id()));
    let text = "dims { b = 2, d = 4 }\npipeline { stages = 4, layers = 8, microbatches = 4, ranks = 2 }\ninput f32[b, d]\n\nfunc @layer(%x: f32[b, d]) -> f32[b, d] {\n  %y = tanh %x\n  return %y\n}\n";
    std::fs::write(&file, text).expect("write");
    let (code, _, err) = ppc(&["check", &file.display().to_string(), "--stages", "3"]);
    std::fs::remove_file(&file).expect("cleanup");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("`--stages 3` from the command line"), "{err}");
    assert!(!err.contains("stages set here"), "{err}");
}

#[test]
fn check_help_points_to_the_reference_and_lists_only_the_ops_a_model_may_use() {
    use ppc_dialect::parse::signature::{signatures, Writer};
    let (code, out, _) = ppc(&["check", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains(REFERENCE), "{out}");
    let listed = out.lines().last().unwrap_or_default();
    for s in signatures() {
        let shown = listed.split_whitespace().any(|w| w == s.name);
        assert_eq!(shown, s.writer == Writer::User, "`{}` in: {listed}", s.name);
    }
}

#[test]
fn a_function_called_from_layer_runs_everywhere_and_its_parameters_go_in_and_out() {
    use ppc_runtime::safetensors;
    let model = path("tests/models/called_block.ppc");
    for args in [
        vec!["verify"],
        vec!["verify", "--backend", "cpu"],
        vec!["verify", "--grad"],
        vec!["verify", "--ranks", "2"],
    ] {
        let mut argv = vec![args[0], model.as_str()];
        argv.extend(&args[1..]);
        let (code, out, err) = ppc(&argv);
        assert_eq!(code, 0, "{argv:?}\n{out}\n{err}");
    }
    // Its parameters are @layer's `mlp.w1`, one per layer, shared by both calls.
    let dir = std::env::temp_dir().join(format!("ppc-called-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let file = |n: &str| dir.join(n).display().to_string();
    let run = |extra: &[&str]| {
        let mut argv = vec!["run", model.as_str(), "--steps", "1"];
        argv.extend(extra);
        let (code, out, err) = ppc(&argv);
        assert_eq!(code, 0, "{argv:?}\n{out}\n{err}");
    };
    run(&[
        "--dump-params",
        &file("p.safetensors"),
        "--output",
        &file("want.safetensors"),
    ]);
    let bytes = std::fs::read(file("p.safetensors")).expect("dumped");
    let mut tensors = safetensors::decode(&bytes).expect("safetensors");
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    for layer in 0..2 {
        assert!(
            names.contains(&format!("layers.{layer}.mlp.w1").as_str()),
            "{names:?}"
        );
    }
    // Read back, they give the same result; changed, another.
    let read = |n: &str| {
        let p = std::path::PathBuf::from(file(n));
        safetensors::read_tensor(&p, "output")
            .expect("output")
            .to_tensor()
    };
    run(&[
        "--params",
        &file("p.safetensors"),
        "--output",
        &file("same.safetensors"),
    ]);
    assert_eq!(read("same.safetensors").data, read("want.safetensors").data);
    for (name, t) in tensors.iter_mut().filter(|(n, _)| n.ends_with("mlp.w1")) {
        let zeros = ppc_runtime::Tensor::splat(t.dtype, t.to_tensor().shape, 0.0);
        *t = ppc_runtime::memref::HostBuffer::from_tensor(&zeros);
        assert!(name.starts_with("layers."));
    }
    let refs: Vec<(&str, &ppc_runtime::memref::HostBuffer)> =
        tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    safetensors::write(std::path::Path::new(&file("zeroed.safetensors")), &refs).expect("write");
    run(&[
        "--params",
        &file("zeroed.safetensors"),
        "--output",
        &file("other.safetensors"),
    ]);
    assert_ne!(
        read("other.safetensors").data,
        read("want.safetensors").data
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
