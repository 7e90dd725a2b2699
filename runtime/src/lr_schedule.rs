//! The learning rate of each step: a linear warmup from 0, then a cosine decay to a floor, as
//! GPT-2 and Llama are trained (nanoGPT's `get_lr`). With neither, the rate is constant.
//!
//! Step `s` counts from 1 (the first update). For `s ≤ warmup`: `lr · s / warmup`. Then, over
//! `decay` steps: `min_lr + (lr − min_lr) · (1 + cos(π · (s − warmup) / decay)) / 2`, and
//! `min_lr` after. A function of the step alone, so every rank and every resumed run uses the
//! same rate.

/// `warmup_steps`, `decay_steps` and `min_lr` of a `train { ... }` block.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LrSchedule {
    pub warmup_steps: u64,
    /// Steps of cosine decay after the warmup; 0: no decay.
    pub decay_steps: u64,
    pub min_lr: f32,
}

impl LrSchedule {
    /// The learning rate of update `step` (from 1) for base rate `lr`.
    pub fn lr_at(&self, lr: f32, step: u64) -> f32 {
        if step <= self.warmup_steps {
            return (f64::from(lr) * step as f64 / self.warmup_steps as f64) as f32;
        }
        if self.decay_steps == 0 {
            return lr;
        }
        let t = (step - self.warmup_steps).min(self.decay_steps) as f64 / self.decay_steps as f64;
        let (lr, floor) = (f64::from(lr), f64::from(self.min_lr));
        (floor + (lr - floor) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_rises_linearly_and_cosine_falls_to_the_floor() {
        let s = LrSchedule {
            warmup_steps: 4,
            decay_steps: 10,
            min_lr: 0.1,
        };
        assert_eq!(s.lr_at(1.0, 1), 0.25);
        assert_eq!(s.lr_at(1.0, 4), 1.0);
        // Half way through the decay: the mean of the rate and the floor.
        assert!((s.lr_at(1.0, 9) - 0.55).abs() < 1e-6, "{}", s.lr_at(1.0, 9));
        assert_eq!(s.lr_at(1.0, 14), 0.1);
        assert_eq!(s.lr_at(1.0, 1000), 0.1);
        assert_eq!(LrSchedule::default().lr_at(0.5, 7), 0.5);
    }
}
