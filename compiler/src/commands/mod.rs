//! What each `ppc` command does. Errors come back as a [`Failure`] holding the text to print:
//! rendered diagnostics with file:line:col, or a one-line `error:` message.

mod compile;
mod loaded;
mod run;
mod verify;

use crate::cli::Command;
use crate::passes::Options;
use crate::schedule::Schedule;
use compile::compile_command;
pub use loaded::Failure;
use loaded::{io, load, load_as_written};
use ppc_dialect::print;
use ppc_runtime::files::write_atomic;
use run::run_command;
use std::io::Write;
use verify::verify_command;

pub fn dispatch(cmd: Command, out: &mut dyn Write, err: &mut dyn Write) -> Result<i32, Failure> {
    match cmd {
        Command::Check(model) => {
            let l = load(&model)?;
            let p = l.module.pipeline;
            writeln!(
                out,
                "ok: {} ({} stages, {} layers, {} microbatches, {} repeats)",
                l.path, p.stages, p.layers, p.microbatches, p.repeats
            )
            .map_err(io)?;
        }
        Command::Fmt { model, write } => {
            let l = load_as_written(&model)?;
            let text = print(&l.module);
            if write {
                write_atomic(&model.file, text.as_bytes())
                    .map_err(|e| Failure(format!("error: cannot write {}: {e}\n", l.path)))?;
            } else {
                out.write_all(text.as_bytes()).map_err(io)?;
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
        Command::Schedule { model, svg } => {
            let mut l = load(&model)?;
            l.compile(&Options::default(), None, None)?;
            let s = Schedule::of(&l.module)?;
            out.write_all(s.text().as_bytes()).map_err(io)?;
            if let Some(path) = svg {
                write_atomic(&path, s.svg().as_bytes()).map_err(|e| {
                    Failure(format!("error: cannot write {}: {e}\n", path.display()))
                })?;
                writeln!(err, "wrote {}", path.display()).map_err(io)?;
            }
        }
    }
    Ok(0)
}
