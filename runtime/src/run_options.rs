//! The options of runs, declared once. A forward run's: `ppc run` flattens them into its
//! command line, executables parse them (`ppc-exe`), and `ppc run --backend cuda` hands them on
//! to its scratch executable with [`RunOptions::to_args`], which a test holds to the parser. A
//! training run's: training executables parse them, with one option per optimizer setting of
//! [`optim::SETTINGS`].

use crate::optim::{self, Config, Kind};
use clap::{Arg, ArgMatches, Args};
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
    /// Read the inputs from tensor `input` of this safetensors file: [microbatches, ...input]
    /// for one call; or a data set of any length, [N, ...sample] (one sample a row: the input
    /// after its batch axis) or [K, ...input] (K microbatches), run batch by batch, the last
    /// padded with zeros whose outputs are dropped, `output` written in the same layout; with
    /// a tensor `target` of class ids beside it (one per output row), the accuracy of the
    /// outputs' largest logits. Default: seeded synthetic inputs.
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
    /// GEMM (with its shape: batch, m, n, k, which operands are read transposed) and exchange.
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
    /// Where the run's numbers come from, for the summary: `seed 0`, or the files that
    /// replaced what the seed would draw (`parameters from w.safetensors, inputs of seed 0`).
    pub fn origin(&self) -> String {
        let from = |what: &str, file: &Option<PathBuf>| match file {
            Some(f) => format!("{what} from {}", f.display()),
            None => format!("{what} of seed {}", self.seed),
        };
        match (&self.params.file, &self.input) {
            (None, None) => format!("seed {}", self.seed),
            (params, input) => format!("{}, {}", from("parameters", params), from("inputs", input)),
        }
    }

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

/// What a training run is asked to do.
#[derive(Args, Clone, Debug)]
pub struct TrainOptions {
    /// Training steps.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub steps: u32,
    /// Train on FILE: a token stream if its name ends in `.bin` (token ids with no header,
    /// nanoGPT's train.bin; each sequence a seeded window of t + 1 tokens, its targets the
    /// next tokens; `ppc tokenize` makes one from text), else tensors `input` [N, ...input] and
    /// `target` [N, ...target] of a safetensors file, M rows per step, cycling. Default: a
    /// seeded synthetic task (the same model with other weights labels 8 seeded batches of
    /// inputs, each when training first reaches it; its argmax for softmax_cross_entropy).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Report the validation loss on FILE (read as --data is): the mean over 4 fixed batches,
    /// every --val-every steps and after the last.
    #[arg(long, value_name = "FILE")]
    pub val_data: Option<PathBuf>,
    /// Steps between validations (with --val-data).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub val_every: u32,
    /// How token streams store ids: u16 (nanoGPT's) or u32.
    #[arg(long, value_enum, value_name = "DTYPE", default_value = "u16")]
    pub token_dtype: crate::tokens::TokenDType,
    /// After the last step, write weights (`layers.L.NAME`, as --params files name them),
    /// optimizer state and step to a safetensors file, atomically.
    #[arg(long, value_name = "CKPT")]
    pub save: Option<PathBuf>,
    /// Start from a checkpoint written by --save (the step count goes on).
    #[arg(long, value_name = "CKPT")]
    pub resume: Option<PathBuf>,
    /// Fine-tune: start from the weights of FILE (a parameter file as `--dump-params` writes
    /// it, or a `--save` checkpoint's weights), with fresh optimizer state at step 0. Every
    /// missing, extra or ill-shaped tensor is reported at once and nothing trains. Not with
    /// --resume, which goes on with a run's optimizer state and step.
    #[arg(long, value_name = "FILE", conflicts_with = "resume")]
    pub params: Option<PathBuf>,
    /// Seed of the initial weights and of the synthetic task.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// One JSON line per step on stdout: {"step":N,"loss":X,"step_s":T}, instead of the
    /// progress display.
    #[arg(long)]
    pub json: bool,
    /// After the run, time N more steps (forward, backward, update) and print one JSON line as
    /// forward executables do.
    #[arg(long, value_name = "N")]
    pub bench: Option<u32>,
    /// Write a Chrome/Perfetto trace of the steps (ui.perfetto.dev): per step, GPipe loop
    /// iteration (forward and backward), loop nest, GEMM (with its shape) and exchange.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// --target cuda: run the optimizer on the host, copying the weights to the GPU and the
    /// gradients back every step (by default it runs on the GPU, where they stay), to compare.
    #[arg(long)]
    pub host_optimizer: bool,
    /// The optimizer and its settings: the model file's `train { ... }` block, then the
    /// command line's (see [`optimizer_args`]).
    #[arg(skip = Config::new(Kind::AdamW))]
    pub optimizer: Config,
}

/// One option per optimizer setting: `--optimizer NAME`, `--lr X`, `--weight-decay X`, ...
pub fn optimizer_args() -> impl Iterator<Item = Arg> {
    optim::SETTINGS.into_iter().map(|key| {
        let arg = Arg::new(key).long(key.replace('_', "-"));
        match key {
            "optimizer" => arg.value_name("NAME").help(
                "adamw (lr 1e-3, betas 0.9 0.999, eps 1e-8, weight decay 0.01) or sgd (lr 0.01, \
                 momentum 0.9, no weight decay); default: the model file's `train` block, else adamw",
            ),
            _ => arg
                .value_name("X")
                .help(format!("The optimizer's `{key}`; overrides the model file's `train` block")),
        }
    })
}

/// The optimizer settings the command line gave, as the model file writes them.
pub fn optimizer_settings(m: &ArgMatches) -> Vec<(String, String)> {
    optim::SETTINGS
        .into_iter()
        .filter_map(|key| Some((key.to_string(), m.get_one::<String>(key)?.clone())))
        .collect()
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
