//! A training timetable (`timetable.rs`) drawn for `ppc schedule --schedule`: as text, one row
//! per stage, and as an SVG picture with one colour per phase.

use crate::grid::{cells, Cell, Grid};
use crate::timetable::{Kind, Phase, Timetable, Unit};
use std::fmt::Write;

impl Timetable {
    fn title(&self) -> String {
        let name = match self.kind {
            Kind::Gpipe => "GPipe",
            Kind::OneFOneB => "1F1B",
            Kind::ZbH1 => "ZB-H1",
        };
        let busy = 3 * self.microbatches * self.stages;
        let all = self.ticks() as u64 * self.stages;
        format!(
            "{name} training timetable: {} stages, {} microbatches: {} ticks, {} of {all} stage-ticks idle (bubble {:.1}%, the formula's {:.1}%)",
            self.stages,
            self.microbatches,
            self.ticks(),
            all - busy,
            100.0 * self.bubble_fraction(),
            100.0 * self.kind.bubble_formula(self.stages, self.microbatches),
        )
    }

    /// The title, a legend, the memory lines and the grid; rows are stages (with their rank
    /// when `ranks > 1`), columns ticks.
    pub fn picture(&self, ranks: u64) -> String {
        let list = |v: Vec<u64>| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.title());
        out.push_str("cells: F, B, W = the forward, input gradient and weight gradient of microbatch N, a tick each; `..` idles\n");
        let _ = writeln!(
            out,
            "stage inputs kept at most, per stage: {}; per rank: {}",
            list(self.kept_inputs()),
            list(self.kept_inputs_per_rank(ranks))
        );
        let _ = writeln!(
            out,
            "weight gradients pending at most, per stage: {}",
            list(self.pending_weight_grads())
        );
        out.push_str(&self.grid().text(ranks));
        out
    }

    /// The grid as an SVG picture.
    pub fn svg(&self) -> String {
        self.grid().svg()
    }

    /// The grid both pictures draw: forwards blue, input gradients green, weight gradients
    /// orange.
    fn grid(&self) -> Grid {
        let cells = cells(&self.slots, |u: Unit| Cell {
            fill: match u.phase {
                Phase::F => "hsl(210,60%,72%)",
                Phase::B => "hsl(130,45%,65%)",
                Phase::W => "hsl(30,80%,70%)",
            }
            .to_string(),
            label: u.to_string(),
        });
        Grid {
            title: self.title(),
            axis: "time (tick) →",
            cells,
            idle: "..",
            notes: Vec::new(),
        }
    }
}
