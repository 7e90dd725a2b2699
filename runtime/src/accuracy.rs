//! Accuracy of a classifier's outputs: the share of rows whose largest logit (the last axis;
//! ties go to the lower class, so the count is the same on any machine) is the target class.
//! Rows whose target is the loss's `ignore_index` count in neither the hits nor the rows, as
//! they count in neither the loss's sum nor its mean.

/// Hits and counted rows, summed over batches.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Accuracy {
    pub hits: u64,
    pub rows: u64,
}

impl Accuracy {
    /// The counts of `logits` (rows of `classes` values) against one target class per row.
    pub fn of(logits: &[f32], classes: usize, targets: &[i32], ignore: Option<i32>) -> Accuracy {
        let mut a = Accuracy::default();
        for (row, &t) in logits.chunks(classes.max(1)).zip(targets) {
            if Some(t) == ignore {
                continue;
            }
            a.rows += 1;
            a.hits += u64::from(usize::try_from(t).is_ok_and(|t| is_argmax(row, t)));
        }
        a
    }

    /// The share of counted rows that hit; NaN where no row counted.
    pub fn share(self) -> f64 {
        self.hits as f64 / self.rows as f64
    }
}

impl std::ops::Add for Accuracy {
    type Output = Accuracy;

    fn add(self, o: Accuracy) -> Accuracy {
        Accuracy {
            hits: self.hits + o.hits,
            rows: self.rows + o.rows,
        }
    }
}

/// Whether `t` is [`argmax`]`(row)`, reading the row only until a value beats `row[t]`: a
/// miss (most rows of an untrained language model's 50k logits) costs a few values, not the row.
fn is_argmax(row: &[f32], t: usize) -> bool {
    let Some(&target) = row.get(t) else {
        return false;
    };
    // NaNs never win, as in `argmax`; a NaN target never does either.
    !target.is_nan()
        && row[..t].iter().all(|&v| v < target || v.is_nan())
        && row[t + 1..].iter().all(|&v| v <= target || v.is_nan())
}

/// The index of the largest value of `row`, the lowest among equals; NaNs are never largest.
pub fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| {
        if row[i] > row[b] || row[b].is_nan() && !row[i].is_nan() {
            i
        } else {
            b
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_class_and_ignored_rows_count_nowhere() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), 1);
        let logits = [0.0, 1.0, 5.0, 2.0, 7.0, 7.0];
        // Rows: argmax 1, 0, 0 (a tie); targets 1, 1, -1 (ignored).
        let a = Accuracy::of(&logits, 2, &[1, 1, -1], Some(-1));
        assert_eq!(a, Accuracy { hits: 1, rows: 2 });
        assert_eq!(a.share(), 0.5);
        assert!(Accuracy::default().share().is_nan());
        // The early exit agrees with argmax on seeded rows with ties and NaNs.
        let mut rng = crate::rng::Rng::stream(1, "accuracy", 0);
        for _ in 0..2000 {
            let row: Vec<f32> = (0..6)
                .map(|_| match rng.next_u64() % 7 {
                    0 => f32::NAN,
                    k => (k % 3) as f32,
                })
                .collect();
            for t in 0..6 {
                let want = argmax(&row) == t && !row[t].is_nan();
                assert_eq!(is_argmax(&row, t), want, "{row:?} {t}");
            }
        }
    }
}
