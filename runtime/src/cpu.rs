//! The CPU an executable runs on, and the CPU it was compiled for.
//!
//! Generated code is compiled for a CPU named at compile time (`ppc compile --target-cpu`); the
//! manifest lists the instruction-set features that target implies, and executables check them
//! at start so that a wrong node gets a message instead of `SIGILL`. The runtime's own kernels
//! are compiled for the x86-64 baseline and choose a faster instruction set at run time through
//! [`has`], so one executable is fast on both AVX2 and AVX-512 nodes.
//!
//! `PPC_CPU_DISABLE=avx512f,...` makes [`has`] report those features absent: it runs the
//! portable kernels and the start-up check on a machine that has the features (the way glibc's
//! `glibc.cpu.hwcaps` tunable masks them).

/// The x86-64 micro-architecture levels of the psABI and the features each adds to the previous
/// one, as LLVM defines the CPUs `x86-64`, `x86-64-v2`, `x86-64-v3` and `x86-64-v4` (only the
/// features a program can detect are listed).
const LEVELS: [(&str, &[&str]); 4] = [
    ("x86-64", &["sse", "sse2", "fxsr"]),
    (
        "x86-64-v2",
        &["cmpxchg16b", "popcnt", "sse3", "ssse3", "sse4.1", "sse4.2"],
    ),
    (
        "x86-64-v3",
        &[
            "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave",
        ],
    ),
    (
        "x86-64-v4",
        &["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
    ),
];

/// The CPU names whose features [`features_of`] knows, oldest first.
pub fn levels() -> impl Iterator<Item = &'static str> {
    LEVELS.iter().map(|(name, _)| *name)
}

/// Every feature the check knows of the CPU `name` (one of [`levels`]), or `None`.
pub fn features_of(name: &str) -> Option<Vec<&'static str>> {
    let n = LEVELS.iter().position(|(l, _)| *l == name)?;
    Some(
        LEVELS[..=n]
            .iter()
            .flat_map(|(_, f)| f.iter().copied())
            .collect(),
    )
}

/// Whether this CPU has `feature` (a name from [`KNOWN`]) and `PPC_CPU_DISABLE` does not hide it.
pub fn has(feature: &str) -> bool {
    detected(feature) && !disabled().iter().any(|d| d == feature)
}

/// Features of `required` that this CPU lacks, in order.
pub fn missing(required: &[String]) -> Vec<&str> {
    required
        .iter()
        .map(String::as_str)
        .filter(|f| !has(f))
        .collect()
}

/// The features of [`KNOWN`] this CPU has, whatever `PPC_CPU_DISABLE` says: what LLVM uses
/// when it compiles for `native`.
pub fn host_features() -> Vec<&'static str> {
    KNOWN.iter().copied().filter(|f| detected(f)).collect()
}

/// Code compiled for a CPU with features this one lacks.
#[derive(Debug, thiserror::Error)]
#[error(
    "this executable was compiled for the CPU `{cpu}` (ppc compile --target-cpu {cpu}) and needs {}, which this CPU lacks; \
     rebuild it for the oldest CPU of the nodes it runs on, e.g. --target-cpu x86-64-v3 (AVX2) or x86-64-v2",
    .lacking.join(", ")
)]
pub struct MissingFeatures {
    pub cpu: String,
    pub lacking: Vec<String>,
}

/// Whether code compiled for `target` can run here; the error names what this CPU lacks.
pub fn check(target: &crate::manifest::Target) -> Result<(), MissingFeatures> {
    let lacking = missing(&target.features);
    if lacking.is_empty() {
        return Ok(());
    }
    Err(MissingFeatures {
        cpu: target.cpu.clone(),
        lacking: lacking.into_iter().map(str::to_string).collect(),
    })
}

fn disabled() -> Vec<String> {
    std::env::var("PPC_CPU_DISABLE")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Every feature [`has`] can detect: the levels' and the later extensions LLVM uses for
/// `native` on recent CPUs.
pub const KNOWN: &[&str] = &[
    "sse",
    "sse2",
    "fxsr",
    "cmpxchg16b",
    "popcnt",
    "sse3",
    "ssse3",
    "sse4.1",
    "sse4.2",
    "avx",
    "avx2",
    "bmi1",
    "bmi2",
    "f16c",
    "fma",
    "lzcnt",
    "movbe",
    "xsave",
    "avx512f",
    "avx512bw",
    "avx512cd",
    "avx512dq",
    "avx512vl",
    "avx512ifma",
    "avx512vbmi",
    "avx512vbmi2",
    "avx512vnni",
    "avx512bitalg",
    "avx512vpopcntdq",
    "avx512bf16",
    "avx512fp16",
    "avxvnni",
    "gfni",
    "vaes",
    "vpclmulqdq",
    "pclmulqdq",
    "aes",
    "sha",
    "adx",
];

#[cfg(target_arch = "x86_64")]
fn detected(feature: &str) -> bool {
    use std::arch::is_x86_feature_detected as d;
    match feature {
        "sse" => d!("sse"),
        "sse2" => d!("sse2"),
        "fxsr" => d!("fxsr"),
        "cmpxchg16b" => d!("cmpxchg16b"),
        "popcnt" => d!("popcnt"),
        "sse3" => d!("sse3"),
        "ssse3" => d!("ssse3"),
        "sse4.1" => d!("sse4.1"),
        "sse4.2" => d!("sse4.2"),
        "avx" => d!("avx"),
        "avx2" => d!("avx2"),
        "bmi1" => d!("bmi1"),
        "bmi2" => d!("bmi2"),
        "f16c" => d!("f16c"),
        "fma" => d!("fma"),
        "lzcnt" => d!("lzcnt"),
        "movbe" => d!("movbe"),
        "xsave" => d!("xsave"),
        "avx512f" => d!("avx512f"),
        "avx512bw" => d!("avx512bw"),
        "avx512cd" => d!("avx512cd"),
        "avx512dq" => d!("avx512dq"),
        "avx512vl" => d!("avx512vl"),
        "avx512ifma" => d!("avx512ifma"),
        "avx512vbmi" => d!("avx512vbmi"),
        "avx512vbmi2" => d!("avx512vbmi2"),
        "avx512vnni" => d!("avx512vnni"),
        "avx512bitalg" => d!("avx512bitalg"),
        "avx512vpopcntdq" => d!("avx512vpopcntdq"),
        "avx512bf16" => d!("avx512bf16"),
        "avx512fp16" => d!("avx512fp16"),
        "avxvnni" => d!("avxvnni"),
        "gfni" => d!("gfni"),
        "vaes" => d!("vaes"),
        "vpclmulqdq" => d!("vpclmulqdq"),
        "pclmulqdq" => d!("pclmulqdq"),
        "aes" => d!("aes"),
        "sha" => d!("sha"),
        "adx" => d!("adx"),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detected(_: &str) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_includes_the_previous_one() {
        let names: Vec<_> = levels().collect();
        for pair in names.windows(2) {
            let (older, newer) = (features_of(pair[0]).unwrap(), features_of(pair[1]).unwrap());
            assert!(older.len() < newer.len());
            assert!(older.iter().all(|f| newer.contains(f)), "{pair:?}");
        }
        assert!(features_of("x86-64-v3").unwrap().contains(&"avx2"));
        assert!(!features_of("x86-64-v3").unwrap().contains(&"avx512f"));
        assert_eq!(features_of("pentium"), None);
    }

    #[test]
    fn every_level_feature_is_detectable() {
        for f in features_of("x86-64-v4").unwrap() {
            assert!(KNOWN.contains(&f), "{f} is not in KNOWN");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_x86_64_cpu_has_the_baseline_and_unknown_names_are_absent() {
        let base: Vec<String> = features_of("x86-64")
            .unwrap()
            .iter()
            .map(|f| f.to_string())
            .collect();
        assert!(missing(&base).is_empty());
        assert_eq!(
            missing(&["no-such-feature".to_string()]),
            ["no-such-feature"]
        );
        assert!(host_features().contains(&"sse2"));
        let t = crate::manifest::Target {
            cpu: "imaginary".into(),
            features: vec!["sse2".into(), "no-such-feature".into()],
        };
        let e = check(&t).expect_err("lacks a feature").to_string();
        assert!(
            e.contains("`imaginary`") && e.contains("needs no-such-feature,"),
            "{e}"
        );
        assert!(!e.contains("sse2"), "{e}");
    }
}
