//! What each `ppc` command does. Errors come back as an `anyhow::Error`; [`shown`] gives the
//! text to print: rendered diagnostics with file:line:col as they are, or an `error:` line.

mod compile;
mod loaded;
mod run;
mod sample;
mod tokenize;
mod verify;

use crate::cli::Command;
use crate::passes::Options;
use crate::schedule::Schedule;
use crate::timetable::Kind;
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
            train: true,
        } => {
            let mut l = load(&model)?;
            let opts = Options {
                train: true,
                schedule: schedule.unwrap_or_else(|| Kind::of(&l.module)),
                ..Options::default()
            };
            l.compile(&opts, None, None)?;
            let m = &l.module;
            let proof = ppc_dialect::schedule_check::check(m)
                .map_err(|d| l.fail(&[d]))?
                .ok_or_else(|| anyhow::anyhow!("the module has no training step to draw"))?;
            out.write_all(crate::program_picture::text(&proof, m).as_bytes())?;
            if let Some(path) = svg {
                write_file(&path, crate::program_picture::svg(&proof, m).as_bytes())?;
                writeln!(err, "wrote {}", path.display())?;
            }
        }
        Command::Schedule {
            model,
            svg,
            schedule,
            train: false,
        } => {
            let mut l = load(&model)?;
            let named = l.module.schedule.is_some().then(|| Kind::of(&l.module));
            let Some(kind) = schedule.or(named) else {
                l.compile(&Options::default(), None, None)?;
                let s = Schedule::of(&l.module)?;
                out.write_all(s.text().as_bytes())?;
                if let Some(path) = svg {
                    write_file(&path, s.svg().as_bytes())?;
                    writeln!(err, "wrote {}", path.display())?;
                }
                return Ok(0);
            };
            let m = l.module;
            let t = timetable(&m, kind)?;
            out.write_all(t.picture(m.pipeline.ranks).as_bytes())?;
            match kind {
                Kind::Gpipe => {}
                Kind::OneFOneB => writeln!(
                    out,
                    "`--train --schedule 1f1b` compiles this order as a lockstep loop over ticks: \
                     the same bubble, 2(S-1-s)+1 stage inputs kept on stage s (`--report=json`: training.tick_loop)"
                )?,
                Kind::ZbH1 => writeln!(
                    out,
                    "training compiles GPipe's or 1F1B's program; this timetable is checked, not yet compiled"
                )?,
            }
            if let Some(path) = svg {
                write_file(&path, t.svg().as_bytes())?;
                writeln!(err, "wrote {}", path.display())?;
            }
        }
        Command::Tokenize {
            texts,
            out: dir,
            val_fraction,
            token_dtype,
        } => tokenize::tokenize(&texts, &dir, val_fraction, token_dtype, out)?,
        Command::Sample(a) => return sample_command(a, out, err),
    }
    Ok(0)
}

/// The timetable of training schedule `kind` for `m`'s stages and microbatches, checked.
fn timetable(
    m: &ppc_dialect::Module,
    kind: crate::timetable::Kind,
) -> anyhow::Result<crate::timetable::Timetable> {
    let p = m.pipeline;
    if p.repeats > 1 {
        anyhow::bail!(
            "timetables are drawn for pipelines without repeats; this one has repeats = {}",
            p.repeats
        );
    }
    let t = crate::timetable::Timetable::build(kind, p.stages, p.microbatches);
    t.check().map_err(|e| {
        anyhow::anyhow!(
            "internal error: the {} timetable is unsound: {e}",
            kind.name()
        )
    })?;
    Ok(t)
}
