//! The backend conformance suite: every op, in every dtype its case lists, through every backend,
//! compared with the reference interpreter on edge values and seeded random ones.
//!
//! A case is a model file in `tests/conformance/` whose header says what it checks:
//!
//! ```text
//! // OPS: add sub mul          the ops under test; `$OP` in the text is replaced by each
//! // DTYPES: f32 bf16          storage dtypes to run it in (`--dtype`)
//! // RULE: exact               how the compiled result may differ from the interpreter's
//! // RULE fast: normwise 1e-5    (optional) the rule for the fast numerics (default: RULE)
//! // One line of intent.
//! ```
//!
//! Rules: `exact` (the same bits; any NaN equals any NaN), `ulps N` (at most N units in the last
//! place of the storage dtype; infinities exact; `ulps N ftz`: also 0 for an f32 subnormal, the
//! fast softmax's flush), `normwise X` (max |want - got| / max |want|
//! over finite values; NaN and infinities where the interpreter has them). The fast numerics
//! count subnormals as zero on the CPU (`ppc_runtime::subnormals`): they run on the inputs
//! with every subnormal made ±0, against the interpreter under the same setting. The input holds every
//! edge value of [`EDGES`] followed by seeded values of mixed magnitudes. The backends: the
//! interpreter's pipelined program (bit for bit with the sequential model), the CPU JIT with the
//! exact numerics (`--exact`), and the CPU JIT with the fast ones (the default: tuned GEMM,
//! vectorizable exp and tanh; run where its MLIR differs), at LLVM's -O2 as `ppc run` compiles.

use crate::common::load;
use ppc::backend::{self, Source};
use ppc::lower::Numerics;
use ppc_dialect::interp::Interp;
use ppc_dialect::parse::signature::signatures;
use ppc_dialect::{DType, Overrides};
use ppc_runtime::memref::HostBuffer;
use ppc_runtime::subnormals::FlushToZero;
use ppc_runtime::tensor::unflatten;
use ppc_runtime::{Init, Rng, Tensor};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Values every case's input starts with: the IEEE specials, the edges of f32, bf16, f16 and
/// i32, the points where exp overflows and underflows, and ties that test rounding to even.
const EDGES: &[f32] = &[
    f32::NAN,
    -f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -2.5,
    2.5,
    f32::MIN_POSITIVE, // smallest normal
    -1e-40,            // subnormal
    1e-45,             // smallest subnormal
    f32::MAX,
    f32::MIN,
    1e30,
    -1e-30,
    88.72284,        // exp overflows just above
    -87.33655,       // exp of this is the smallest normal
    -103.97208,      // exp underflows to 0 below
    65504.0,         // f16 max
    65520.0,         // rounds to inf in f16
    -6.0e-8,         // f16 subnormal
    1.003_906_3,     // bf16 tie, rounds to even (down)
    1.011_718_8,     // bf16 tie, rounds to even (up)
    2_147_483_648.0, // one past i32::MAX
    -2_147_483_904.0,
    16_777_217.0,
    -7.75,
    3.0e-39,
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    Exact,
    Ulps(u32),
    /// Within N ulps, or 0 where the reference is an f32 subnormal (flushed to zero, as the
    /// fast softmax does: `fast_math::exp_flushed`).
    UlpsFlushing(u32),
    Normwise(f64),
}

fn parse_rule(s: &str) -> Rule {
    let mut w = s.split_whitespace();
    match (w.next(), w.next()) {
        (Some("exact"), None) => Rule::Exact,
        (Some("ulps"), Some(n)) => match w.next() {
            None => Rule::Ulps(n.parse().expect("ulps N")),
            Some("ftz") => Rule::UlpsFlushing(n.parse().expect("ulps N ftz")),
            Some(other) => panic!("unknown rule `{s}`: `{other}` after ulps N"),
        },
        (Some("normwise"), Some(x)) => Rule::Normwise(x.parse().expect("normwise X")),
        _ => panic!("unknown rule `{s}`"),
    }
}

struct Case {
    path: PathBuf,
    text: String,
    ops: Vec<String>,
    dtypes: Vec<DType>,
    rule: Rule,
    fast_rule: Rule,
}

fn header<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .take_while(|l| l.starts_with("//"))
        .find_map(|l| l.strip_prefix(&format!("// {key}:")))
        .map(str::trim)
}

fn cases() -> Vec<Case> {
    crate::common::ppc_files("tests/conformance")
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("case");
            let name = path.display().to_string();
            let get = |k| header(&text, k).unwrap_or_else(|| panic!("{name}: no `// {k}:` line"));
            let rule = parse_rule(get("RULE"));
            let intent = text.lines().take_while(|l| l.starts_with("//")).count();
            assert!(
                intent >= 4,
                "{name}: the header needs a line of intent after the rule"
            );
            Case {
                ops: get("OPS").split_whitespace().map(str::to_string).collect(),
                dtypes: get("DTYPES")
                    .split_whitespace()
                    .map(|d| DType::from_name(d).expect("dtype"))
                    .collect(),
                rule,
                fast_rule: header(&text, "RULE fast").map_or(rule, parse_rule),
                path,
                text,
            }
        })
        .collect()
}

/// The input microbatches of `m`: the edge values, then seeded values from 1e-3 to 1e3.
fn edge_inputs(m: &ppc_dialect::Module) -> Tensor {
    let shape = Interp::new(m, 0).synthetic_inputs();
    let n = shape.data.len();
    let normal = Rng::stream(7, "conformance", 0).fill(Init::Normal(1.0), n);
    let scale = Rng::stream(7, "conformance-scale", 0).fill(Init::Uniform(-3.0, 3.0), n);
    let data = (0..n)
        .map(|i| {
            EDGES
                .get(i)
                .copied()
                .unwrap_or(normal[i] * 10f32.powf(scale[i]))
        })
        .collect();
    Tensor::new(shape.dtype, shape.shape, data)
}

/// Units in the last place between `a` and `b` stored in `d` (both finite).
fn ulps(a: f32, b: f32, d: DType) -> u64 {
    // Map the bits to a line on which consecutive values of the dtype are consecutive integers.
    let key = |x: f32| -> i64 {
        let bits = match d {
            DType::BF16 => i64::from(half::bf16::from_f32(x).to_bits()),
            DType::F16 => i64::from(half::f16::from_f32(x).to_bits()),
            _ => i64::from(x.to_bits()),
        };
        let sign = match d {
            DType::BF16 | DType::F16 => 0x8000,
            _ => 0x8000_0000,
        };
        if bits & sign != 0 {
            -(bits & (sign - 1))
        } else {
            bits
        }
    };
    key(a).abs_diff(key(b))
}

/// The first element where `got` breaks `rule` against `want`, described.
fn violation(want: &Tensor, got: &Tensor, rule: Rule) -> Option<String> {
    if want.shape != got.shape {
        return Some(format!("shape {:?} instead of {:?}", got.shape, want.shape));
    }
    let d = want.dtype;
    let scale = want
        .data
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f32, |m, x| m.max(x.abs()));
    for (i, (&a, &b)) in want.data.iter().zip(&got.data).enumerate() {
        if a.is_nan() && b.is_nan() {
            continue;
        }
        let ok = match rule {
            Rule::Exact => a.to_bits() == b.to_bits(),
            _ if !a.is_finite() || !b.is_finite() => a.to_bits() == b.to_bits(),
            Rule::Ulps(n) => ulps(a, b, d) <= u64::from(n),
            Rule::UlpsFlushing(n) => {
                ulps(a, b, d) <= u64::from(n) || (b == 0.0 && a.abs() < f32::MIN_POSITIVE)
            }
            Rule::Normwise(tol) => f64::from((a - b).abs()) <= tol * f64::from(scale),
        };
        if !ok {
            let at = unflatten(i, &want.shape);
            return Some(format!(
                "element {at:?}: interpreter {a:e} ({:#010x}), got {b:e} ({:#010x})",
                a.to_bits(),
                b.to_bits()
            ));
        }
    }
    None
}

/// Writes each subnormal of `t` as the zero of its sign: what the fast numerics' arithmetic
/// reads it as (an op that only looks at bits, a copy or a sign test, would see it).
fn flush_subnormals(t: &mut Tensor) {
    for x in &mut t.data {
        if x.is_subnormal() {
            *x = 0.0f32.copysign(*x);
        }
    }
}

/// Runs one case with `op` in `dtype` through every backend; the failures, described.
fn run(case: &Case, op: &str, dtype: DType) -> Vec<String> {
    let name = case.path.file_name().expect("name").to_string_lossy();
    let what = format!("{name} {op} {dtype}");
    let text = case.text.replace("$OP", op);
    let ov = Overrides {
        float_dtype: (dtype != DType::F32).then_some(dtype),
        ..Overrides::default()
    };
    let mut m = load(&text, &ov);
    ppc::pipeline::compile(&mut m, &ppc::passes::Options::default(), None, None)
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let inputs = edge_inputs(&m);
    let mut interp = Interp::new(&m, 3);
    let want = interp.sequential(&inputs).expect("interpreter");
    // The fast numerics count subnormals as zero: they run on the inputs with each subnormal
    // made the zero of its sign, against the interpreter under the same setting.
    let mut inputs_flushed = inputs.clone();
    flush_subnormals(&mut inputs_flushed);
    let want_flushed = {
        let _flush = FlushToZero::begin();
        Interp::new(&m, 3)
            .sequential(&inputs_flushed)
            .expect("interpreter")
    };
    let mut failures = Vec::new();
    let piped = interp.forward(&inputs).expect("interpreter");
    if let Some(v) = violation(&want, &piped, Rule::Exact) {
        failures.push(format!("{what}, interpreter pipeline: {v}"));
    }
    let file = case.path.display().to_string();
    let src = Source {
        file: &file,
        text: &text,
    };
    // Where the two MLIR modules are the same text, the fast numerics differ from the exact
    // ones only in counting subnormals as zero.
    for (numerics, rule, inputs, want) in [
        (Numerics::Exact, case.rule, &inputs, &want),
        (
            Numerics::Fast,
            case.fast_rule,
            &inputs_flushed,
            &want_flushed,
        ),
    ] {
        let jit = match backend::jit(&m, &src, numerics, 2) {
            Ok(j) => j,
            Err(d) => {
                let shown = ppc_dialect::diag::render(&file, &text, &d);
                failures.push(format!(
                    "{what}, cpu {numerics:?}: does not compile:\n{shown}"
                ));
                continue;
            }
        };
        let mut x = HostBuffer::from_tensor(inputs);
        let mut params = jit
            .program
            .params(&ppc_runtime::init::Source::Seeded(3))
            .expect("params");
        let mut y = jit.program.output_buffer();
        jit.program.run(&mut x, &mut params, &mut y).expect("runs");
        if let Some(v) = violation(want, &y.to_tensor(), rule) {
            failures.push(format!("{what}, cpu {numerics:?} ({rule:?}): {v}"));
        }
    }
    failures
}

/// Ops that no layer can hold, and the tests that compile and compare them instead.
const STRUCTURAL: &[(&str, &str)] = &[
    ("loop", "every compiled program is one: cpu::every_example_runs_on_the_cpu_and_matches_the_interpreter"),
    ("call", "every compiled program calls @stage: the same test"),
    ("rank", "only after shard-stages: mpirun::*_byte_identical_on_*_ranks"),
    ("exchange", "only after shard-stages: the same mpirun tests"),
    ("call_if", "only after embed-head or loss on several ranks: model_ends::*_on_1_2_and_4_ranks*"),
];

#[test]
fn every_op_in_every_dtype_matches_the_interpreter_on_every_backend() {
    let cases = cases();
    let mut failures = Vec::new();
    for case in &cases {
        for op in &case.ops {
            assert!(
                case.text.contains("$OP") || case.text.contains(&format!("= {op} ")),
                "{}: `{op}` is not used",
                case.path.display()
            );
            for &dtype in &case.dtypes {
                failures.extend(run(case, op, dtype));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_op_has_a_conformance_case() {
    let covered: BTreeSet<String> = cases().into_iter().flat_map(|c| c.ops).collect();
    let structural: BTreeSet<&str> = STRUCTURAL.iter().map(|(op, _)| *op).collect();
    let all: Vec<&str> = signatures().iter().map(|s| s.name).collect();
    let missing: Vec<&str> = all
        .iter()
        .copied()
        .filter(|op| !covered.contains(*op) && !structural.contains(op))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a case in tests/conformance: {missing:?}"
    );
    for op in &covered {
        assert!(all.contains(&op.as_str()), "`{op}` is not an op");
    }
}

#[test]
fn the_rules_catch_what_they_should() {
    let t = |d: DType, v: &[f32]| Tensor::new(d, vec![v.len()], v.to_vec());
    let want = t(DType::F32, &[1.0, f32::NAN, -0.0, 100.0]);
    assert_eq!(violation(&want, &want, Rule::Exact), None);
    // NaN equals NaN whatever its payload; -0 is not +0.
    let other_nan = t(DType::F32, &[1.0, -f32::NAN, -0.0, 100.0]);
    assert_eq!(violation(&want, &other_nan, Rule::Exact), None);
    let plus_zero = t(DType::F32, &[1.0, f32::NAN, 0.0, 100.0]);
    assert!(violation(&want, &plus_zero, Rule::Exact)
        .unwrap()
        .contains("element [2]"));
    // One ulp off: caught by exact, allowed by ulps 1; two are not.
    let next = f32::from_bits(100f32.to_bits() + 1);
    let next2 = f32::from_bits(100f32.to_bits() + 2);
    let one_off = t(DType::F32, &[1.0, f32::NAN, -0.0, next]);
    assert!(violation(&want, &one_off, Rule::Exact).is_some());
    assert_eq!(violation(&want, &one_off, Rule::Ulps(1)), None);
    assert!(violation(
        &want,
        &t(DType::F32, &[1.0, f32::NAN, -0.0, next2]),
        Rule::Ulps(1)
    )
    .is_some());
    // In bf16 one ulp of 100 is 0.5: 100.5 is one away.
    let bw = t(DType::BF16, &[100.0]);
    assert_eq!(
        violation(&bw, &t(DType::BF16, &[100.5]), Rule::Ulps(1)),
        None
    );
    assert!(violation(&bw, &t(DType::BF16, &[101.0]), Rule::Ulps(1)).is_some());
    // Flushing: an f32 subnormal may come back as 0, a normal number may not.
    let tiny = t(DType::F32, &[6e-39, 1.0]);
    let flushed = t(DType::F32, &[0.0, 1.0]);
    assert!(violation(&tiny, &flushed, Rule::Ulps(2)).is_some());
    assert_eq!(violation(&tiny, &flushed, Rule::UlpsFlushing(2)), None);
    let small = t(DType::F32, &[2e-38, 1.0]);
    assert!(violation(&small, &flushed, Rule::UlpsFlushing(2)).is_some());
    assert!(violation(&tiny, &t(DType::F32, &[0.0, 1.01]), Rule::UlpsFlushing(2)).is_some());
    // Across zero: the smallest subnormals of either sign are two ulps apart.
    assert_eq!(ulps(1e-45, -1e-45, DType::F32), 2);
    // Normwise: relative to the largest finite magnitude; a NaN where a number was never passes.
    assert_eq!(
        violation(
            &want,
            &t(DType::F32, &[1.0005, f32::NAN, -0.0, 100.0]),
            Rule::Normwise(1e-5)
        ),
        None
    );
    assert!(violation(
        &want,
        &t(DType::F32, &[1.01, f32::NAN, -0.0, 100.0]),
        Rule::Normwise(1e-5)
    )
    .is_some());
    assert!(violation(
        &want,
        &t(DType::F32, &[f32::NAN, f32::NAN, -0.0, 100.0]),
        Rule::Normwise(1.0)
    )
    .is_some());
    assert!(violation(
        &want,
        &t(DType::F32, &[1.0, 2.0, -0.0, 100.0]),
        Rule::Normwise(1.0)
    )
    .is_some());
    assert!(violation(
        &want,
        &t(DType::F32, &[1.0, f32::NAN, -0.0, f32::INFINITY]),
        Rule::Ulps(1000)
    )
    .is_some());
}

/// The edge values are where they should be: the first elements of every input.
#[test]
fn inputs_start_with_the_edge_values() {
    let case = &cases()[0];
    let m = load(
        &case.text.replace("$OP", &case.ops[0]),
        &Overrides::default(),
    );
    let x = edge_inputs(&m);
    assert!(
        x.data.len() > EDGES.len(),
        "{}: input too small for the edges",
        case.path.display()
    );
    for (a, b) in EDGES.iter().zip(&x.data) {
        assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
    }
}

/// The fast numerics count subnormals as zero in every thread of a parallel loop nest; the
/// exact ones keep them (`ppc_runtime::subnormals`).
#[test]
fn the_fast_numerics_flush_subnormals_on_every_thread() {
    // 2^-100 · 2^-30 = 2^-130, a subnormal, in 65536 elements a microbatch: a parallel nest.
    let text = "dims { b = 64, d = 1024 }
pipeline { stages = 1, layers_per_stage = 1, microbatches = 2 }
input f32[b, d]

func @layer(%x: f32[b, d]) -> f32[b, d] {
  %s = constant 9.313225746154785e-10 : f32[]
  %y = mul %x, %s
  return %y
}
";
    let mut m = load(text, &Overrides::default());
    ppc::pipeline::compile(&mut m, &ppc::passes::Options::default(), None, None).expect("compiles");
    let src = Source {
        file: "subnormals.ppc",
        text,
    };
    let shape = Interp::new(&m, 0).synthetic_inputs();
    let x = Tensor::new(
        shape.dtype,
        shape.shape.clone(),
        vec![f32::from_bits(27 << 23); shape.data.len()], // 2^-100
    );
    // 2^-130, from its bits: a debug build's `powi` overflows on the way there.
    let subnormal = f32::from_bits(1 << 19);
    for (numerics, want) in [(Numerics::Fast, 0.0), (Numerics::Exact, subnormal)] {
        let jit = backend::jit(&m, &src, numerics, 2).expect("compiles");
        let mut params = (jit.program)
            .params(&ppc_runtime::init::Source::Seeded(0))
            .expect("params");
        let mut y = jit.program.output_buffer();
        (jit.program)
            .run(&mut HostBuffer::from_tensor(&x), &mut params, &mut y)
            .expect("runs");
        let y = y.to_tensor();
        let wrong = y.data.iter().filter(|&&v| v != want).count();
        assert_eq!(
            wrong,
            0,
            "{numerics:?}: {wrong} of {} elements are not {want:e}",
            y.data.len()
        );
    }
}
