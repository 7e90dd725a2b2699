//! What each `ppc` command does. Errors come back as an `anyhow::Error`; [`shown`] gives the
//! text to print: rendered diagnostics with file:line:col as they are, or an `error:` line.

mod compile;
mod loaded;
mod run;
mod sample;
mod schedule;
mod tokenize;
mod verify;

use crate::cli::Command;
use compile::compile_command;
use loaded::{load, load_as_written};
pub use loaded::{shown, InvalidIr, Rendered};
use ppc_dialect::print;
use ppc_runtime::files::write_file;
use run::run_command;
use sample::sample_command;
use std::io::Write;
use verify::verify_command;

pub fn dispatch(cmd: Command, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<i32> {
    match cmd {
        Command::Check(model) => {
            let l = load(&model)?;
            let p = l.module.pipeline;
            writeln!(
                out,
                "ok: {} ({} stages, {} layers, {} microbatches, {} repeats)",
                l.path, p.stages, p.layers, p.microbatches, p.repeats
            )?;
        }
        Command::Fmt { model, write } => {
            let l = load_as_written(&model)?;
            let text = print(&l.module);
            if write {
                write_file(&model.file, text.as_bytes())?;
            } else {
                out.write_all(text.as_bytes())?;
            }
        }
        Command::Run {
            model,
            backend,
            io,
            codegen,
        } => return run_command(model, backend, io, codegen, out, err),
        Command::Compile(a) => compile_command(a, out, err)?,
        Command::Verify(a) => return verify_command(a, out, err),
        Command::Schedule {
            model,
            svg,
            schedule,
            train,
        } => schedule::schedule_command(&model, svg.as_deref(), schedule, train, out, err)?,
        Command::Tokenize(a) => tokenize::tokenize_command(&a, out)?,
        Command::Sample(a) => return sample_command(a, out, err),
    }
    Ok(0)
}
