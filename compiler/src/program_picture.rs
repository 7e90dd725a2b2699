//! `ppc schedule MODEL --train`: the compiled training step as the schedule proof reads it off
//! the program (`ppc_dialect::schedule_check`): at each tick, the forward (F), the backward
//! (B) and, under ZB-H1, the weight gradient (W) each stage runs, and the bubble counted from those calls beside the formula. Unlike
//! `--schedule`'s timetable, which is the schedule as published, this is what the generated
//! loops do.

use crate::grid::{Cell, Grid};
use ppc_dialect::schedule_check::{Proof, StageRun};
use ppc_dialect::Module;
use std::fmt::Write;

/// The text: the proof's figures, then the grid.
pub fn text(proof: &Proof, m: &Module) -> String {
    let p = m.pipeline;
    let formula = (p.stages - 1) as f64 / (p.repeats * p.microbatches + p.stages - 1) as f64;
    let mut out = format!("{}\n", title(proof, m));
    let _ = writeln!(
        out,
        "bubble (a forward and a backward one unit each): {:.4}, formula (S-1)/(R·M+S-1) = {formula:.4}",
        proof.bubble_fraction(p.stages)
    );
    let _ = writeln!(
        out,
        "bubble with each call weighed by its matrix products (a tick as long as its busiest stage): {:.4}",
        proof.work_bubble
    );
    let held: Vec<String> = proof.inputs_held.iter().map(usize::to_string).collect();
    let _ = writeln!(
        out,
        "stage inputs held for a pending backward, at most, per stage: {}",
        held.join(", ")
    );
    out.push_str(&grid(proof, m).text(p.ranks));
    out
}

pub fn svg(proof: &Proof, m: &Module) -> String {
    grid(proof, m).svg()
}

fn title(proof: &Proof, m: &Module) -> String {
    let p = m.pipeline;
    let once = match proof.weights {
        0 => "every forward and backward runs once (proved)",
        _ => {
            "every forward, input gradient (B) and weight gradient (W) runs once (proved); \
              the last W runs after the loop"
        }
    };
    format!(
        "@{} as compiled: {} stages, {} microbatches, {} ticks; {once}",
        proof.func, p.stages, p.microbatches, proof.ticks
    )
}

/// A cell per (tick, stage): `F3` a forward of microbatch 3, `B1` a backward (under ZB-H1 its
/// input gradient), `W0` a weight gradient, `F3B1` or `F3W0` two in one tick (with repeats,
/// `F3/1`: microbatch 3 in repeat 1). Forwards blue, backwards green, both teal.
fn grid(proof: &Proof, m: &Module) -> Grid {
    let p = m.pipeline;
    let mut slots: Vec<Vec<[Option<StageRun>; 3]>> =
        vec![vec![[None; 3]; p.stages as usize]; proof.ticks as usize];
    for r in &proof.runs {
        let slot = &mut slots[r.tick as usize][r.stage as usize];
        slot[r.phase as usize] = Some(*r);
    }
    let unit = |r: &StageRun, phase: &str| match p.repeats {
        1 => format!("{phase}{}", r.microbatch),
        _ => format!("{phase}{}/{}", r.microbatch, u64::from(r.group) / p.stages),
    };
    let cells = slots
        .iter()
        .map(|row| {
            row.iter()
                .map(|[f, b, w]| {
                    let fill = match (f, b.or(*w)) {
                        (None, None) => return None,
                        (Some(_), None) => "hsl(210,60%,72%)",
                        (None, Some(_)) => "hsl(130,45%,65%)",
                        (Some(_), Some(_)) => "hsl(170,50%,62%)",
                    };
                    let label = [(f, "F"), (b, "B"), (w, "W")]
                        .iter()
                        .filter_map(|(r, phase)| r.as_ref().map(|r| unit(r, phase)))
                        .collect();
                    Some(Cell {
                        fill: fill.to_string(),
                        label,
                    })
                })
                .collect()
        })
        .collect();
    Grid {
        title: title(proof, m),
        axis: "time (tick) →",
        cells,
        idle: "..",
        notes: Vec::new(),
    }
}
