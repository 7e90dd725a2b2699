//! The runtime's entry points for generated code, each declared once: its name, its MLIR
//! signature and its implementation. The compiler writes its `func.func private` declarations
//! and its calls from this table and the JIT registers the implementations from it, so a
//! symbol is spelled in one place (besides its `fn`); a test checks that every `#[no_mangle]`
//! entry point of this crate is in the table.
//!
//! The other direction of the ABI — what generated code defines and the executable's runtime
//! calls — is the [`FORWARD`], [`MANIFEST`] and [`MAIN`] names below.

use crate::comm::*;
use crate::gemm::*;
use crate::DType;

/// One function generated code calls.
#[derive(Clone, Copy)]
pub struct EntryPoint {
    /// The name generated code calls (`func.call @name`).
    pub name: &'static str,
    /// Argument types, as MLIR writes them: `memref<*xf32>, i32`.
    pub params: &'static str,
    /// The result type, if any.
    pub result: Option<&'static str>,
    /// Memref arguments travel as C-interface descriptors (`llvm.emit_c_interface`): the
    /// runtime's function is `_mlir_ciface_<name>`.
    pub c_interface: bool,
    implementation: fn() -> *mut (),
}

impl EntryPoint {
    /// The module-level declaration: `func.func private @ppc_rank() -> i32`.
    pub fn declaration(&self) -> String {
        let mut s = format!("func.func private @{}({})", self.name, self.params);
        if let Some(r) = self.result {
            s.push_str(" -> ");
            s.push_str(r);
        }
        if self.c_interface {
            s.push_str(" attributes {llvm.emit_c_interface}");
        }
        s
    }

    /// A call with these SSA operands: `func.call @ppc_rank() : () -> i32`.
    pub fn call(&self, args: &[&str]) -> String {
        format!(
            "func.call @{}({}) : ({}) -> {}",
            self.name,
            args.join(", "),
            self.params,
            self.result.unwrap_or("()")
        )
    }

    /// The symbol the runtime defines (what a JIT must resolve).
    pub fn symbol(&self) -> String {
        if self.c_interface {
            format!("_mlir_ciface_{}", self.name)
        } else {
            self.name.to_string()
        }
    }

    /// The runtime's function.
    pub fn address(&self) -> *mut () {
        (self.implementation)()
    }
}

/// Generated code defines `ppc_forward(...)`, the step the executable's driver runs.
pub const FORWARD: &str = "ppc_forward";
/// A training executable's generated code also defines `ppc_evaluate(...)`: the step without
/// its gradients (the manifest's `evaluate` arguments).
pub const EVALUATE: &str = "ppc_evaluate";
/// Generated code defines `ppc_manifest() -> ptr`, the program's manifest as text.
pub const MANIFEST: &str = "ppc_manifest";
/// The executable's runtime defines `ppc_main(argc, argv) -> i32`, which generated `main` calls.
pub const MAIN: &str = "ppc_main";

macro_rules! entry {
    ($name:literal ($params:literal) $(-> $result:literal)?, $f:path) => {
        EntryPoint {
            name: $name,
            params: $params,
            result: entry!(@result $($result)?),
            c_interface: false,
            implementation: || $f as *mut (),
        }
    };
    (c_interface $name:literal ($params:literal), $f:path) => {
        EntryPoint {
            name: $name,
            params: $params,
            result: None,
            c_interface: true,
            implementation: || $f as *mut (),
        }
    };
    (@result) => { None };
    (@result $r:literal) => { Some($r) };
}

/// This process's rank (`rank` op).
pub const RANK: EntryPoint = entry!("ppc_rank"("") -> "i32", crate::comm::ppc_rank);
/// Generated host code is about to touch a buffer the GPU may be writing.
pub const GPU_SYNC: EntryPoint = entry!("ppc_gpu_sync"(""), crate::cuda::abi::ppc_gpu_sync);

/// A stage call of a pipeline loop offers its stages a slot (`bubble.rs`).
pub const COUNT_STAGE_SLOTS: EntryPoint = entry!(
    c_interface "ppc_count_stage_slots"("memref<*xi1>"),
    crate::bubble::_mlir_ciface_ppc_count_stage_slots
);

/// `--trace` spans: a loop nest by number, a GPipe iteration, a backward iteration.
pub const TRACE_GROUP: [EntryPoint; 2] = [
    entry!(
        "ppc_trace_group_begin"("i32"),
        crate::trace::ppc_trace_group_begin
    ),
    entry!(
        "ppc_trace_group_end"("i32"),
        crate::trace::ppc_trace_group_end
    ),
];
pub const TRACE_ITERATION: [EntryPoint; 2] = [
    entry!(
        "ppc_trace_iteration_begin"("i32"),
        crate::trace::ppc_trace_iteration_begin
    ),
    entry!(
        "ppc_trace_iteration_end"("i32"),
        crate::trace::ppc_trace_iteration_end
    ),
];
pub const TRACE_BACKWARD: [EntryPoint; 2] = [
    entry!(
        "ppc_trace_backward_begin"("i32"),
        crate::trace::ppc_trace_backward_begin
    ),
    entry!(
        "ppc_trace_backward_end"("i32"),
        crate::trace::ppc_trace_backward_end
    ),
];

/// `exchange` (send forward, receive from behind) and its reverse, by element type.
const EXCHANGE: [[EntryPoint; 2]; 3] = [
    [
        entry!(c_interface "ppc_exchange_f32"("memref<*xf32>, memref<*xf32>"), _mlir_ciface_ppc_exchange_f32),
        entry!(c_interface "ppc_exchange_back_f32"("memref<*xf32>, memref<*xf32>"), _mlir_ciface_ppc_exchange_back_f32),
    ],
    [
        entry!(c_interface "ppc_exchange_bf16"("memref<*xbf16>, memref<*xbf16>"), _mlir_ciface_ppc_exchange_bf16),
        entry!(c_interface "ppc_exchange_back_bf16"("memref<*xbf16>, memref<*xbf16>"), _mlir_ciface_ppc_exchange_back_bf16),
    ],
    [
        entry!(c_interface "ppc_exchange_f16"("memref<*xf16>, memref<*xf16>"), _mlir_ciface_ppc_exchange_f16),
        entry!(c_interface "ppc_exchange_back_f16"("memref<*xf16>, memref<*xf16>"), _mlir_ciface_ppc_exchange_back_f16),
    ],
];

/// The GEMMs `c = a · b` / `c += a · b` (c is f32), plain or where a stage mask is true, by
/// operand type.
const MATMUL: [[[EntryPoint; 2]; 2]; 3] = [
    [
        [
            entry!(c_interface "ppc_matmul_f32"("memref<*xf32>, memref<*xf32>, memref<*xf32>"), _mlir_ciface_ppc_matmul_f32),
            entry!(c_interface "ppc_matmul_f32_masked"("memref<*xf32>, memref<*xf32>, memref<*xf32>, memref<*xi1>"), _mlir_ciface_ppc_matmul_f32_masked),
        ],
        [
            entry!(c_interface "ppc_matmul_acc_f32"("memref<*xf32>, memref<*xf32>, memref<*xf32>"), _mlir_ciface_ppc_matmul_acc_f32),
            entry!(c_interface "ppc_matmul_acc_f32_masked"("memref<*xf32>, memref<*xf32>, memref<*xf32>, memref<*xi1>"), _mlir_ciface_ppc_matmul_acc_f32_masked),
        ],
    ],
    [
        [
            entry!(c_interface "ppc_matmul_bf16"("memref<*xbf16>, memref<*xbf16>, memref<*xf32>"), _mlir_ciface_ppc_matmul_bf16),
            entry!(c_interface "ppc_matmul_bf16_masked"("memref<*xbf16>, memref<*xbf16>, memref<*xf32>, memref<*xi1>"), _mlir_ciface_ppc_matmul_bf16_masked),
        ],
        [
            entry!(c_interface "ppc_matmul_acc_bf16"("memref<*xbf16>, memref<*xbf16>, memref<*xf32>"), _mlir_ciface_ppc_matmul_acc_bf16),
            entry!(c_interface "ppc_matmul_acc_bf16_masked"("memref<*xbf16>, memref<*xbf16>, memref<*xf32>, memref<*xi1>"), _mlir_ciface_ppc_matmul_acc_bf16_masked),
        ],
    ],
    [
        [
            entry!(c_interface "ppc_matmul_f16"("memref<*xf16>, memref<*xf16>, memref<*xf32>"), _mlir_ciface_ppc_matmul_f16),
            entry!(c_interface "ppc_matmul_f16_masked"("memref<*xf16>, memref<*xf16>, memref<*xf32>, memref<*xi1>"), _mlir_ciface_ppc_matmul_f16_masked),
        ],
        [
            entry!(c_interface "ppc_matmul_acc_f16"("memref<*xf16>, memref<*xf16>, memref<*xf32>"), _mlir_ciface_ppc_matmul_acc_f16),
            entry!(c_interface "ppc_matmul_acc_f16_masked"("memref<*xf16>, memref<*xf16>, memref<*xf32>, memref<*xi1>"), _mlir_ciface_ppc_matmul_acc_f16_masked),
        ],
    ],
];

/// The GEMMs `c = a · b` whose `c` has the 16-bit type of the operands (bf16, f16), plain or
/// where a stage mask is true: on the GPU cuBLAS rounds its f32 sums into `c` itself, where
/// nothing accumulates into it (`--target cuda`; no f32 scratch and conversion kernel).
const MATMUL_ROUNDED: [[EntryPoint; 2]; 2] = [
    [
        entry!(c_interface "ppc_matmul_bf16_rounded"("memref<*xbf16>, memref<*xbf16>, memref<*xbf16>"), _mlir_ciface_ppc_matmul_bf16_rounded),
        entry!(c_interface "ppc_matmul_bf16_rounded_masked"("memref<*xbf16>, memref<*xbf16>, memref<*xbf16>, memref<*xi1>"), _mlir_ciface_ppc_matmul_bf16_rounded_masked),
    ],
    [
        entry!(c_interface "ppc_matmul_f16_rounded"("memref<*xf16>, memref<*xf16>, memref<*xf16>"), _mlir_ciface_ppc_matmul_f16_rounded),
        entry!(c_interface "ppc_matmul_f16_rounded_masked"("memref<*xf16>, memref<*xf16>, memref<*xf16>, memref<*xi1>"), _mlir_ciface_ppc_matmul_f16_rounded_masked),
    ],
];

fn float_index(d: DType) -> usize {
    match d {
        DType::F32 => 0,
        DType::BF16 => 1,
        DType::F16 => 2,
        DType::I32 | DType::I1 => panic!("the runtime has no {} entry point", d.name()),
    }
}

/// The exchange for float type `d` (`reverse`: send backward, receive from ahead).
pub fn exchange(d: DType, reverse: bool) -> &'static EntryPoint {
    &EXCHANGE[float_index(d)][usize::from(reverse)]
}

/// The GEMM for operands of float type `d`.
pub fn matmul(d: DType, accumulate: bool, masked: bool) -> &'static EntryPoint {
    &MATMUL[float_index(d)][usize::from(accumulate)][usize::from(masked)]
}

/// The GEMM for 16-bit operands of type `d` (bf16, f16) into a result of that type.
pub fn matmul_rounded(d: DType, masked: bool) -> &'static EntryPoint {
    let i = match d {
        DType::BF16 => 0,
        DType::F16 => 1,
        _ => panic!("the runtime has no GEMM rounded into {}", d.name()),
    };
    &MATMUL_ROUNDED[i][usize::from(masked)]
}

/// Every entry point, for registering with a JIT.
pub fn all() -> impl Iterator<Item = &'static EntryPoint> {
    static SINGLES: [EntryPoint; 3] = [RANK, GPU_SYNC, COUNT_STAGE_SLOTS];
    static TRACES: [[EntryPoint; 2]; 3] = [TRACE_GROUP, TRACE_ITERATION, TRACE_BACKWARD];
    static EXCHANGES: [[EntryPoint; 2]; 3] = EXCHANGE;
    static MATMULS: [[[EntryPoint; 2]; 2]; 3] = MATMUL;
    static ROUNDED: [[EntryPoint; 2]; 2] = MATMUL_ROUNDED;
    SINGLES
        .iter()
        .chain(TRACES.iter().flatten())
        .chain(EXCHANGES.iter().flatten())
        .chain(MATMULS.iter().flatten().flatten())
        .chain(ROUNDED.iter().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The runtime's exported entry points as its source defines them: `extern "C" fn ppc_…`
    /// and the `_mlir_ciface_ppc_…` names the matmul and exchange macros are invoked with.
    fn defined_in_source() -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let src = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
        let this_file = src.join("abi.rs");
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") || path == this_file {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, _) in text.match_indices("ppc_") {
                    let before = &text[..i];
                    let exported = before.ends_with("extern \"C\" fn ")
                        || (before.ends_with("_mlir_ciface_")
                            && before[..before.len() - 13]
                                .ends_with(|c: char| c == '(' || c.is_whitespace()));
                    if exported {
                        let name: String = text[i..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        found.insert(name);
                    }
                }
            }
        }
        found
    }

    #[test]
    fn every_entry_point_is_in_the_table_and_every_table_entry_is_defined() {
        let table: BTreeSet<String> = all().map(|e| e.name.to_string()).collect();
        assert_eq!(table.len(), all().count(), "a name is in the table twice");
        assert_eq!(defined_in_source(), table);
        for e in all() {
            assert!(!e.address().is_null(), "{} has no implementation", e.name);
        }
    }

    #[test]
    fn declarations_and_calls_agree() {
        assert_eq!(RANK.declaration(), "func.func private @ppc_rank() -> i32");
        assert_eq!(RANK.call(&[]), "func.call @ppc_rank() : () -> i32");
        let m = matmul(DType::BF16, true, true);
        assert_eq!(m.symbol(), "_mlir_ciface_ppc_matmul_acc_bf16_masked");
        assert_eq!(
            m.call(&["%a", "%b", "%c", "%m"]),
            "func.call @ppc_matmul_acc_bf16_masked(%a, %b, %c, %m) : (memref<*xbf16>, memref<*xbf16>, memref<*xf32>, memref<*xi1>) -> ()"
        );
    }
}
