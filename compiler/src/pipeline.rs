//! The compilation pipeline: load a model file, then run the passes of [`PASSES`] in order,
//! verifying the IR after each one.

use crate::passes::{Options, PASSES};
use crate::timing;
use ppc_dialect::ir::Item;
use ppc_dialect::{
    check_model, parse, print, schedule_check, verify, Diagnostic, Diagnostics, Module, Overrides,
};
use std::path::Path;

/// Parses and checks a model file's text, and inlines the functions `@layer` calls
/// (`ppc_dialect::inline`), so that every later step sees one `@layer`.
pub fn frontend(text: &str, overrides: &Overrides) -> Result<Module, Diagnostics> {
    let mut m = checked(text, overrides)?;
    ppc_dialect::inline::inline_calls(&mut m).map_err(|d| vec![d])?;
    Ok(m)
}

/// Parses and checks a model file's text, keeping it as written (`ppc fmt`).
pub fn checked(text: &str, overrides: &Overrides) -> Result<Module, Diagnostics> {
    let m = parse(text, overrides)?;
    check_train_settings(&m)?;
    check_model(&m)?;
    Ok(m)
}

/// The `train { ... }` block's settings, as the runtime's optimizer reads them: the first bad
/// one, at its name or its value.
fn check_train_settings(m: &Module) -> Result<(), Diagnostics> {
    for i in 0..m.train.len() {
        if let Err(e) = ppc_runtime::optim::Config::from_settings(&m.train[..=i]) {
            let at = match e.is_about_the_key() {
                true => Item::TrainKey(i),
                false => Item::TrainValue(i),
            };
            let span = m.spans.get(&at);
            return Err(vec![Diagnostic::error(
                e.to_string(),
                span,
                "in this training setting",
            )]);
        }
    }
    Ok(())
}

/// Runs the passes up to and including `until` (all of them if `None`). With `dump`, the IR
/// after each pass is written to `DIR/NN-<pass>.ppc`.
pub fn compile(
    m: &mut Module,
    opts: &Options,
    until: Option<&str>,
    dump: Option<&Path>,
) -> Result<(), PipelineError> {
    // Training passes run for training, or when one of them is asked for by name.
    let train = opts.train
        || until
            .and_then(crate::passes::find)
            .is_some_and(|p| p.training);
    let mut last = PASSES[0].name;
    for (i, pass) in PASSES.iter().enumerate() {
        if pass.training && !train {
            break;
        }
        timing::phase(pass.name, || (pass.run)(m, opts))
            .map_err(|d| PipelineError::Pass(pass.name, d))?;
        timing::phase("verify", || verify(m)).map_err(|d| PipelineError::Invalid(pass.name, d))?;
        if let Some(dir) = dump {
            let path = dir.join(format!("{:02}-{}.ppc", i + 1, pass.name));
            ppc_runtime::files::write_atomic(&path, print(m).as_bytes())
                .map_err(|e| PipelineError::Io(path.display().to_string(), e))?;
        }
        if until == Some(pass.name) {
            return Ok(());
        }
        last = pass.name;
    }
    // The whole pipeline ran: prove its schedule before anything lowers it.
    timing::phase("check-schedule", || schedule_check::check(m))
        .map_err(|d| PipelineError::Invalid(last, vec![d]))?;
    Ok(())
}

#[derive(Debug)]
pub enum PipelineError {
    /// The pass rejected the module (a user error, with spans).
    Pass(&'static str, Diagnostics),
    /// The pass produced invalid IR: a compiler bug.
    Invalid(&'static str, Diagnostics),
    Io(String, std::io::Error),
}
