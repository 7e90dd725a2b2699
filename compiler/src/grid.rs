//! A time × stage grid, which both of `ppc schedule`'s drawings use (the GPipe loop,
//! `schedule.rs`; a training timetable, `timetable_picture.rs`), written as text (the time
//! steps along the top, a row per stage) and as an SVG picture (also a title, a coloured cell
//! per slot, hatched grey where the stage idles, and lines of notes below).

use std::fmt::Write;

/// One slot: its fill colour and its label.
pub struct Cell {
    pub fill: String,
    pub label: String,
}

/// What to draw: `cells[t][s]` is stage `s` at time step `t` (`None`: idle).
pub struct Grid {
    pub title: String,
    /// What a time step is, under the grid: `time (loop iteration) →`.
    pub axis: &'static str,
    pub cells: Vec<Vec<Option<Cell>>>,
    /// The text of an idle slot.
    pub idle: &'static str,
    pub notes: Vec<String>,
}

/// `slots[t][s]` drawn as `cell` draws each slot that is not idle.
pub fn cells<T: Copy>(
    slots: &[Vec<Option<T>>],
    cell: impl Fn(T) -> Cell,
) -> Vec<Vec<Option<Cell>>> {
    slots
        .iter()
        .map(|row| row.iter().map(|slot| slot.map(&cell)).collect())
        .collect()
}

impl Grid {
    /// The time steps, then one line per stage (with its rank when `ranks > 1`), cells
    /// right-aligned.
    pub fn text(&self, ranks: u64) -> String {
        let stages = self.cells.first().map_or(0, Vec::len);
        fn label<'g>(c: &'g Option<Cell>, idle: &'g str) -> &'g str {
            c.as_ref().map_or(idle, |c| c.label.as_str())
        }
        let width = (self
            .cells
            .iter()
            .flatten()
            .map(|c| label(c, self.idle).len()))
        .chain([self.cells.len().saturating_sub(1).to_string().len()])
        .max()
        .unwrap_or(1);
        let row = |s: usize| match ranks {
            1 => format!("stage {s}"),
            _ => format!("stage {s} (rank {})", s / (stages / ranks as usize)),
        };
        let head = row(stages.saturating_sub(1)).len();
        let mut out = format!("{:>head$} ", "t");
        for t in 0..self.cells.len() {
            let _ = write!(out, " {t:>width$}");
        }
        out.push('\n');
        for s in 0..stages {
            let _ = write!(out, "{:>head$} ", row(s));
            for step in &self.cells {
                let _ = write!(out, " {:>width$}", label(&step[s], self.idle));
            }
            out.push('\n');
        }
        out
    }

    pub fn svg(&self) -> String {
        // Wide enough for the longest label at 12px monospace (about 7.2px a character).
        let longest = self.cells.iter().flatten().flatten().map(|c| c.label.len());
        let cell = longest.max().map_or(36, |n| (8 * n as u64 + 6).max(36));
        let (left, top) = (72u64, 48u64);
        let (steps, stages) = (
            self.cells.len() as u64,
            self.cells.first().map_or(0, Vec::len) as u64,
        );
        let w = left + cell * steps + 16;
        let h = top + cell * stages + 40 + 16 * self.notes.len() as u64;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="monospace" font-size="12">"#
        );
        out.push_str(r##"<defs><pattern id="bubble" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#eee"/><line x1="0" y1="0" x2="0" y2="6" stroke="#bbb" stroke-width="2"/></pattern></defs>"##);
        out.push('\n');
        let _ = writeln!(out, r#"<text x="{left}" y="18">{}</text>"#, self.title);
        for t in 0..steps {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" text-anchor="middle">{t}</text>"#,
                left + t * cell + cell / 2,
                top - 8
            );
        }
        for s in 0..stages {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" text-anchor="end">stage {s}</text>"#,
                left - 8,
                top + s * cell + cell / 2 + 4
            );
        }
        for (t, row) in self.cells.iter().enumerate() {
            for (s, slot) in row.iter().enumerate() {
                let (x, y) = (left + t as u64 * cell, top + s as u64 * cell);
                let fill = slot.as_ref().map_or("url(#bubble)", |c| c.fill.as_str());
                let _ = writeln!(
                    out,
                    r#"<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{fill}" stroke="white"/>"#
                );
                if let Some(c) = slot {
                    let _ = writeln!(
                        out,
                        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                        x + cell / 2,
                        y + cell / 2 + 4,
                        c.label
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            r#"<text x="{left}" y="{}">{}</text>"#,
            top + stages * cell + 24,
            self.axis
        );
        for (i, line) in self.notes.iter().enumerate() {
            let _ = writeln!(
                out,
                r#"<text x="{left}" y="{}">{line}</text>"#,
                top + stages * cell + 40 + 16 * i as u64
            );
        }
        out.push_str("</svg>\n");
        out
    }
}
