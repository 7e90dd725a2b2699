//! `ppc schedule`: the pictures of a pipeline's time × stage grid. Without options, the
//! forward loop the passes generate; with `--schedule` (or the model file's `schedule = ...`),
//! a training schedule's published timetable; with `--train` (and for interleaved 1F1B, which
//! has no published table here), the compiled training step as the schedule proof reads it off
//! the program.

use super::loaded::load;
use crate::cli::ModelArgs;
use crate::passes::Options;
use crate::schedule::Schedule;
use crate::timetable::{Kind, Timetable};
use ppc_runtime::files::write_file;
use std::io::Write;
use std::path::Path;

pub(super) fn schedule_command(
    model: &ModelArgs,
    svg: Option<&Path>,
    schedule: Option<Kind>,
    train: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut l = load(model)?;
    let named = l.module.schedule.is_some().then(|| Kind::of(&l.module));
    let kind = schedule.or(named);
    // A circular pipeline's 1F1B is the interleaved order, which only the program has.
    let interleaved = kind == Some(Kind::OneFOneB) && l.module.pipeline.repeats > 1;
    let (text, picture) = match (train || interleaved, kind) {
        (true, kind) => {
            let opts = Options {
                train: true,
                schedule: kind.unwrap_or_default(),
                ..Options::default()
            };
            l.compile(&opts, None, None)?;
            let m = &l.module;
            let proof = ppc_dialect::schedule_check::check(m)
                .map_err(|d| l.fail(&[d]))?
                .ok_or_else(|| anyhow::anyhow!("the module has no training step to draw"))?;
            let text = crate::program_picture::text(&proof, m);
            (text, crate::program_picture::svg(&proof, m))
        }
        (false, None) => {
            l.compile(&Options::default(), None, None)?;
            let s = Schedule::of(&l.module)?;
            (s.text(), s.svg())
        }
        (false, Some(kind)) => {
            let m = &l.module;
            let t = timetable(m, kind)?;
            let mut text = t.picture(m.pipeline.ranks);
            match kind {
                Kind::Gpipe => {}
                Kind::OneFOneB => text.push_str(
                    "`--train --schedule 1f1b` compiles this order as a lockstep loop over ticks \
                     (in each, the stages of one parity run a forward, the others a backward): \
                     the same bubble, S-s stage inputs kept on stage s (`--report=json`: \
                     schedule_check; `ppc schedule --train` draws it)\n",
                ),
                Kind::ZbH1 => text.push_str(
                    "`--train --schedule zb-h1` compiles 1F1B's lockstep loop with each backward \
                     cut in two: the input gradient (B) in the backward tick, the weight gradient \
                     (W) a tick later, in the stage's forward tick (the last W after the loop); \
                     the same slots as 1F1B, with a stage's forward and backward ticks of about \
                     the same work (`ppc schedule --train --schedule zb-h1` draws it)\n",
                ),
            }
            (text, t.svg())
        }
    };
    out.write_all(text.as_bytes())?;
    if let Some(path) = svg {
        write_file(path, picture.as_bytes())?;
        writeln!(err, "wrote {}", path.display())?;
    }
    Ok(())
}

/// The timetable of training schedule `kind` for `m`'s stages and microbatches, checked.
fn timetable(m: &ppc_dialect::Module, kind: Kind) -> anyhow::Result<Timetable> {
    let p = m.pipeline;
    if p.repeats > 1 {
        anyhow::bail!(
            "timetables are drawn for pipelines without repeats; this one has repeats = {} \
             (`--schedule gpipe --train` draws the compiled circular program, and `--schedule \
             1f1b` its interleaved order)",
            p.repeats
        );
    }
    let t = Timetable::build(kind, p.stages, p.microbatches);
    t.check().map_err(|e| {
        anyhow::anyhow!(
            "internal error: the {} timetable is unsound: {e}",
            kind.name()
        )
    })?;
    Ok(t)
}
