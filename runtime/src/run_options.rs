//! The options of a forward run, declared once: `ppc run` flattens them into its command line,
//! executables parse them (`ppc-exe`), and `ppc run --backend cuda` hands them on to its
//! scratch executable with [`RunOptions::to_args`], which a test holds to the parser.

use clap::Args;
use std::ffi::OsString;
use std::path::PathBuf;

/// Forward steps a run takes unless `--steps` says otherwise: one cold step, then warm ones
/// whose median the summary reports.
pub const DEFAULT_STEPS: u32 = 5;

/// What `ppc run` and a forward executable are asked to do.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct RunOptions {
    /// Seed of the generator that draws parameters and synthetic inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How many times to run the forward pass. The summary reports the first (cold) step apart
    /// and the median of the others (warm).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_STEPS)]
    pub steps: u32,
    /// After the steps, time N more (after two warm-up steps) and print one JSON line: the
    /// median step, throughput, and per rank compute, exchange wait and measured bubble.
    #[arg(long, value_name = "N")]
    pub bench: Option<u32>,
    /// Read the input microbatches from tensor `input` of this safetensors file (shape
    /// [microbatches, ...input]); default: seeded synthetic inputs. Rank 0 reads it.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Write the result to tensor `output` of this safetensors file (the last rank writes it).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub params: ParamsFile,
    /// Write the parameters this run uses (drawn from the seed, or read with --params) to
    /// this safetensors file, named as --params reads them, in the model's dtype.
    #[arg(long, value_name = "FILE")]
    pub dump_params: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace of the steps (open it in ui.perfetto.dev): per rank and
    /// thread, each step, each GPipe loop iteration (numbered as `ppc schedule` numbers them),
    /// GEMM and exchange.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// What ran, for the summary: `cpu JIT`, `cpu executable`.
    #[arg(skip)]
    pub backend: String,
}

/// Where parameters come from, for every command that runs a model.
#[derive(Args, Clone, Debug, Default, PartialEq)]
pub struct ParamsFile {
    /// Read the parameters from this safetensors file instead of drawing them from the seed:
    /// tensor `layers.L.NAME` holds parameter NAME (as `@layer` names it) of model layer L
    /// (layer (r·S + s)·k + j is the j-th layer of stage s in repeat r), shaped as in
    /// `@layer`; a stacked `NAME` of shape [layers, ...] is read too. f32, bf16 or f16 in the
    /// file, rounded to the model's dtype. Every missing, extra or ill-shaped tensor is
    /// reported at once and nothing runs; under mpirun each rank reads only its own layers.
    #[arg(id = "params", long = "params", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            seed: 0,
            steps: DEFAULT_STEPS,
            bench: None,
            input: None,
            output: None,
            params: ParamsFile::default(),
            dump_params: None,
            trace: None,
            backend: String::new(),
        }
    }
}

impl RunOptions {
    /// The command-line arguments that parse back into these options (all but `backend`).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--seed".into(),
            self.seed.to_string().into(),
            "--steps".into(),
            self.steps.to_string().into(),
        ];
        if let Some(n) = self.bench {
            args.extend(["--bench".into(), n.to_string().into()]);
        }
        let files = [
            ("--input", &self.input),
            ("--output", &self.output),
            ("--params", &self.params.file),
            ("--dump-params", &self.dump_params),
            ("--trace", &self.trace),
        ];
        for (flag, file) in files {
            if let Some(f) = file {
                args.extend([flag.into(), f.clone().into_os_string()]);
            }
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunOptions,
    }

    fn parse(args: Vec<OsString>) -> RunOptions {
        let argv = std::iter::once(OsString::from("model")).chain(args);
        Cli::try_parse_from(argv).expect("parses").run
    }

    #[test]
    fn every_option_survives_to_args_and_back() {
        let full = RunOptions {
            seed: 7,
            steps: 3,
            bench: Some(4),
            input: Some("in.safetensors".into()),
            output: Some("out dir/y.safetensors".into()),
            params: ParamsFile {
                file: Some("p.safetensors".into()),
            },
            dump_params: Some("d.safetensors".into()),
            trace: Some("t.json".into()),
            backend: String::new(),
        };
        assert_eq!(parse(full.to_args()), full);
        assert_eq!(
            parse(RunOptions::default().to_args()),
            RunOptions::default()
        );
        assert_eq!(parse(Vec::new()), RunOptions::default());
    }
}
