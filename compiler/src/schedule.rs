//! The time × stage grid of the generated GPipe loop: which microbatch (and repeat) each stage
//! holds at each iteration, and which slots are bubbles. Drawn as text and as SVG by
//! `ppc schedule`, and counted for the report's bubble fraction.
//!
//! The grid is read off the generated `@pipeline`: its loop's trip count, and the stage axis
//! and microbatch axis of its types. Stage `s` at iteration `t` works on item `w = t - s`
//! (stage 0 takes item `t`, and the shift moves it one stage per iteration); item `w` is
//! microbatch `w mod M` in repeat `w div M`, and slots with `w` outside `0..R*M` are bubbles.

use crate::grid::{cells, Cell, Grid};
use ppc_dialect::ir::{names, Module};
use ppc_dialect::op::OpKind;
use ppc_dialect::Type;
use std::fmt::Write;

/// A module without the generated GPipe loop the schedule is read from.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("the module has no `@pipeline`: run `gpipe-loop` first")]
    NoPipeline,
    #[error("`@pipeline` has no loop")]
    NoLoop,
    #[error("the module has no `@stage`")]
    NoStage,
    #[error("`@stage` takes {0}, which has no stage axis")]
    NoStageAxis(Type),
}

/// What one stage works on in one iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    pub microbatch: u64,
    pub repeat: u64,
    /// The model layers among the stage's `k` slots of this repeat: fewer than `k` where the
    /// layers do not fill the slots (uneven depth), whose empty slots pass their input on.
    pub layers: u64,
}

#[derive(Clone, Debug)]
pub struct Schedule {
    /// All stages, over all ranks.
    pub stages: u64,
    /// Processes the stages are split over; rank `r` runs stages `r*S/R ..`.
    pub ranks: u64,
    pub microbatches: u64,
    pub repeats: u64,
    /// `slots[t][s]`: the work of stage `s` at iteration `t`; `None` is a bubble.
    pub slots: Vec<Vec<Option<Work>>>,
    /// `k`: the layer slots each stage runs per repeat.
    pub layers_per_stage: u64,
    /// Whether `@embed` runs before the loop and `@head` after it (on all microbatches, on the
    /// first and the last rank).
    pub embed: bool,
    pub head: bool,
}

impl Schedule {
    /// The schedule of a module that went through `gpipe-loop`.
    pub fn of(m: &Module) -> Result<Schedule, ScheduleError> {
        let p = m.func(names::PIPELINE).ok_or(ScheduleError::NoPipeline)?;
        let trips = p
            .body
            .ops
            .iter()
            .find_map(|&id| match &p.ops[id].kind {
                OpKind::Loop { trips, .. } => Some(*trips),
                _ => None,
            })
            .ok_or(ScheduleError::NoLoop)?;
        let stage = m.func(names::STAGE).ok_or(ScheduleError::NoStage)?;
        // A sharded `@stage` holds one rank's stages; every rank runs the same loop.
        let ranks = m.pipeline.ranks;
        let stages = crate::report::stages_held(stage)? * ranks;
        let microbatches = m.pipeline.microbatches;
        let repeats = m.pipeline.repeats;
        let items = (repeats * microbatches) as i64;
        let k = m.pipeline.layers_per_stage();
        // Layer `(r·S + s)·k + j` runs in slot j of stage s in repeat r; those past the
        // model's depth are empty.
        let layers = |r: u64, s: u64| {
            let first = (r * stages + s) * k;
            m.pipeline.layers.saturating_sub(first).min(k)
        };
        let slots = (0..trips as i64)
            .map(|t| {
                (0..stages as i64)
                    .map(|s| {
                        let w = t - s;
                        (0..items).contains(&w).then(|| Work {
                            microbatch: w as u64 % microbatches,
                            repeat: w as u64 / microbatches,
                            layers: layers(w as u64 / microbatches, s as u64),
                        })
                    })
                    .collect()
            })
            .collect();
        Ok(Schedule {
            stages,
            ranks,
            microbatches,
            repeats,
            slots,
            layers_per_stage: k,
            embed: m.func(names::EMBED).is_some(),
            head: m.func(names::HEAD).is_some(),
        })
    }

    pub fn iterations(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Idle stage-iterations: bubbles, and stages whose slots are all empty (uneven depth).
    pub fn bubble_slots(&self) -> u64 {
        self.slots
            .iter()
            .flatten()
            .filter(|w| w.is_none_or(|w| w.layers == 0))
            .count() as u64
    }

    pub fn total_slots(&self) -> u64 {
        self.iterations() * self.stages
    }

    /// The share of layer slots that run no layer, over all stage-iterations: with every slot
    /// filled, bubble slots over all slots, (S-1)/(R·M+S-1); an empty layer slot (uneven depth)
    /// is idle too, as it costs no matrix product.
    pub fn bubble_fraction(&self) -> f64 {
        let busy: u64 = self
            .slots
            .iter()
            .flatten()
            .flatten()
            .map(|w| w.layers)
            .sum();
        let all = self.total_slots() * self.layers_per_stage;
        (all - busy) as f64 / all as f64
    }

    /// What runs outside the loop: `@embed` before it, `@head` after it, one line each.
    fn ends(&self) -> [Option<String>; 2] {
        let all = format!("all {} microbatches at once", self.microbatches);
        let on = |stage: u64| match self.ranks {
            1 => String::new(),
            _ => format!(
                ", on rank {} (stage {stage}'s)",
                stage / (self.stages / self.ranks)
            ),
        };
        [
            self.embed
                .then(|| format!("before the loop: @embed on {all}{}", on(0))),
            self.head
                .then(|| format!("after the loop: @head on {all}{}", on(self.stages - 1))),
        ]
    }

    fn label(&self, w: Option<Work>) -> String {
        match w {
            None => ".".into(),
            Some(w) if w.layers == 0 => "-".into(),
            Some(w) if self.repeats == 1 => w.microbatch.to_string(),
            Some(w) => format!("{}:{}", w.repeat, w.microbatch),
        }
    }

    /// Rows are stages, columns iterations; cells are microbatches (`repeat:microbatch` when
    /// circular) and `.` for bubbles.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "GPipe schedule: {} stages, {} microbatches, {} repeat{}: {} iterations, {} of {} slots idle (bubble {:.1}%)",
            self.stages,
            self.microbatches,
            self.repeats,
            if self.repeats == 1 { "" } else { "s" },
            self.iterations(),
            self.bubble_slots(),
            self.total_slots(),
            100.0 * self.bubble_fraction()
        );
        if self.repeats > 1 {
            out.push_str("cells are repeat:microbatch, `.` is a bubble\n");
        } else {
            out.push_str("cells are microbatches, `.` is a bubble\n");
        }
        if self.slots.iter().flatten().flatten().any(|w| w.layers == 0) {
            out.push_str(
                "`-` is a stage whose layer slots are empty: it passes the microbatch on\n",
            );
        }
        let [before, after] = self.ends();
        if let Some(line) = before {
            let _ = writeln!(out, "{line}");
        }
        out.push_str(&self.grid().text(self.ranks));
        if let Some(line) = after {
            let _ = writeln!(out, "{line}");
        }
        out
    }

    /// The same grid as an SVG picture: one colour per microbatch, darker for later repeats,
    /// hatched grey bubbles.
    pub fn svg(&self) -> String {
        self.grid().svg()
    }

    /// The grid both pictures draw: one colour per microbatch, darker for later repeats.
    fn grid(&self) -> Grid {
        let cells = cells(&self.slots, |wk: Work| {
            let hue = wk.microbatch * 360 / self.microbatches.max(1);
            let light = 75 - (wk.repeat * 35 / self.repeats.max(1));
            let saturation = if wk.layers == 0 { 0 } else { 60 };
            Cell {
                fill: format!("hsl({hue},{saturation}%,{light}%)"),
                label: self.label(Some(wk)),
            }
        });
        Grid {
            title: format!(
                "GPipe: {} stages, {} microbatches, {} repeats, {} iterations, bubble {:.1}%",
                self.stages,
                self.microbatches,
                self.repeats,
                self.iterations(),
                100.0 * self.bubble_fraction()
            ),
            axis: "time (loop iteration) →",
            cells,
            idle: ".",
            notes: self.ends().into_iter().flatten().collect(),
        }
    }
}
