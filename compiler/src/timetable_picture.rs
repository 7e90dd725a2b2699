//! A training timetable (`timetable.rs`) drawn for `ppc schedule --schedule`: as text, one row
//! per stage, and as an SVG picture with one colour per phase.

use crate::timetable::{Kind, Phase, Timetable};
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
        let per_rank = self.stages / ranks;
        let row_name = |s: u64| match ranks {
            1 => format!("stage {s}"),
            _ => format!("stage {s} (rank {})", s / per_rank),
        };
        let head = row_name(self.stages - 1).len();
        let width = self.microbatches.saturating_sub(1).to_string().len() + 1;
        let width = width.max((self.ticks() - 1).to_string().len());
        let _ = write!(out, "{:>head$} ", "t");
        for t in 0..self.ticks() {
            let _ = write!(out, " {t:>width$}");
        }
        out.push('\n');
        for s in 0..self.stages as usize {
            let _ = write!(out, "{:>head$} ", row_name(s as u64));
            for row in &self.slots {
                let cell = row[s].map_or("..".to_string(), |u| u.to_string());
                let _ = write!(out, " {cell:>width$}");
            }
            out.push('\n');
        }
        out
    }

    /// The grid as an SVG picture: forwards blue, input gradients green, weight gradients
    /// orange, idle ticks hatched grey.
    pub fn svg(&self) -> String {
        let (cell, left, top) = (32u64, 72u64, 48u64);
        let w = left + cell * self.ticks() as u64 + 16;
        let h = top + cell * self.stages + 40;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" font-size="11">"#
        );
        out.push_str(r##"<defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#eee"/><line x1="0" y1="0" x2="0" y2="6" stroke="#bbb" stroke-width="2"/></pattern></defs>"##);
        out.push('\n');
        let _ = writeln!(out, r#"<text x="{left}" y="18">{}</text>"#, self.title());
        for s in 0..self.stages {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" text-anchor="end">stage {s}</text>"#,
                left - 8,
                top + s * cell + cell / 2 + 4
            );
        }
        for (t, row) in self.slots.iter().enumerate() {
            for (s, unit) in row.iter().enumerate() {
                let (x, y) = (left + t as u64 * cell, top + s as u64 * cell);
                let fill = match unit.map(|u| u.phase) {
                    None => "url(#idle)",
                    Some(Phase::F) => "hsl(210,60%,72%)",
                    Some(Phase::B) => "hsl(130,45%,65%)",
                    Some(Phase::W) => "hsl(30,80%,70%)",
                };
                let _ = writeln!(
                    out,
                    r#"<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}" stroke="white"/>"#
                );
                if let Some(u) = unit {
                    let _ = writeln!(
                        out,
                        r#"<text x="{}" y="{}" text-anchor="middle">{u}</text>"#,
                        x + cell / 2,
                        y + cell / 2 + 4
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            r#"<text x="{left}" y="{}">time (tick) →</text>"#,
            top + self.stages * cell + 24
        );
        out.push_str("</svg>\n");
        out
    }
}
