//! MLIR text that is not an op: source locations, literals, string escapes, affine maps.

use std::fmt::Write;

/// Line and column (1-based) of byte offsets in the source, for MLIR locations.
pub struct Lines {
    starts: Vec<usize>,
}

impl Lines {
    pub fn new(src: &str) -> Lines {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        Lines { starts }
    }

    /// The byte offset of a 1-based line and column, if the source has it.
    pub fn offset(&self, line: usize, col: usize) -> Option<usize> {
        Some(self.starts.get(line.checked_sub(1)?)? + col.checked_sub(1)?)
    }

    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let line = self.starts.partition_point(|&s| s <= offset);
        (line, offset - self.starts[line - 1] + 1)
    }
}

/// `d0, d1, ...` for an identity map of rank `r`.
pub fn identity(r: usize) -> String {
    (0..r)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The map reading an operand of shape `src` (NumPy-broadcast) at each index of `dst`.
pub fn broadcast_map(src: &[u64], dst: &[u64]) -> String {
    let off = dst.len() - src.len();
    (0..src.len())
        .map(|i| {
            if src[i] == 1 && dst[i + off] != 1 {
                "0".to_string()
            } else {
                format!("d{}", i + off)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// An f32 literal MLIR reads back to the same bits.
pub fn float_literal(x: f32) -> String {
    if x.is_finite() {
        // MLIR's float literals need a `.` in the mantissa: `1e0` must be `1.0e0`.
        let s = format!("{x:e}");
        match s.split_once('e') {
            Some((m, e)) if !m.contains('.') => format!("{m}.0e{e}"),
            _ => s,
        }
    } else {
        format!("0x{:08X}", x.to_bits())
    }
}

/// A string for an MLIR string literal.
pub fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_graphic() && b != b'"' && b != b'\\' || b == b' ' {
            out.push(b as char);
        } else {
            let _ = write!(out, "\\{b:02X}");
        }
    }
    out
}
