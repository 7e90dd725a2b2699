//! `ppc_main`: the entry point of executables written by `ppc compile -o`. The generated object
//! defines `main` (which calls `ppc_main`), `ppc_manifest` (the embedded manifest text) and the
//! packed entry `_mlir__mlir_ciface_ppc_forward`.
#![deny(unsafe_op_in_unsafe_fn)]

use ppc_runtime::exec::{drive, PackedFn, Program, RunOptions};
use ppc_runtime::manifest::Manifest;
use std::ffi::{c_char, c_int, CStr};
use std::path::PathBuf;

extern "C" {
    fn ppc_manifest() -> *const c_char;
    fn _mlir__mlir_ciface_ppc_forward(args: *mut *mut std::ffi::c_void);
}

const USAGE: &str = "usage: MODEL [--seed N] [--input FILE] [--output FILE] [--steps N] [--bench N]

Runs the pipeline-parallel forward pass that ppc compiled into this executable.
  --seed N       seed of parameters and synthetic inputs (default 0)
  --input FILE   read the input microbatches from tensor `input` of a safetensors file
                 (shape [microbatches, ...input]); default: seeded synthetic inputs
  --output FILE  write the result to tensor `output` of a safetensors file
  --steps N      run the forward pass N times (default 1)
  --bench N      after warm-up, time N more steps and print one JSON line
  --help         print this and exit";

fn parse_args(args: &[String]) -> Result<Option<RunOptions>, String> {
    let mut o = RunOptions {
        steps: 1,
        backend: "cpu executable".into(),
        ..Default::default()
    };
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        let number = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{name} needs a non-negative integer, got `{v}`"))
        };
        match a.as_str() {
            "--help" | "-h" => return Ok(None),
            "--seed" => o.seed = number("--seed", value("--seed")?)?,
            "--steps" => {
                o.steps = u32::try_from(number("--steps", value("--steps")?)?)
                    .map_err(|_| "--steps is too large")?
            }
            "--bench" => {
                o.bench = Some(
                    u32::try_from(number("--bench", value("--bench")?)?)
                        .map_err(|_| "--bench is too large")?,
                )
            }
            "--input" => o.input = Some(PathBuf::from(value("--input")?)),
            "--output" => o.output = Some(PathBuf::from(value("--output")?)),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Some(o))
}

/// # Safety
/// Called once by the generated `main` with the process's `argc` and `argv`.
#[no_mangle]
pub unsafe extern "C" fn ppc_main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    let args: Vec<String> = std::env::args().collect();
    let prog = args.first().cloned().unwrap_or_else(|| "model".into());
    let opts = match parse_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{}", USAGE.replace("MODEL", &prog));
            return 0;
        }
        Err(e) => {
            eprintln!("{prog}: error: {e}\n{}", USAGE.replace("MODEL", &prog));
            return 2;
        }
    };
    // SAFETY: the generated object defines `ppc_manifest` returning a NUL-terminated static string.
    let text = unsafe { CStr::from_ptr(ppc_manifest()) }
        .to_string_lossy()
        .into_owned();
    let manifest = match Manifest::parse(&text) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{prog}: error: corrupt embedded manifest: {e}");
            return 1;
        }
    };
    let entry: PackedFn = _mlir__mlir_ciface_ppc_forward;
    // SAFETY: the object that defines the entry was compiled together with this manifest.
    let program = unsafe { Program::new(manifest, entry) };
    match drive(
        &program,
        &opts,
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    ) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("{prog}: error: {e}");
            1
        }
    }
}
