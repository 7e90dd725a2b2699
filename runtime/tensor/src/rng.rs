//! The one seeded generator of ppc: parameters and synthetic inputs.
//!
//! A value is identified by `(seed, name, index)`: a parameter's name and its layer number, or
//! `"input"` and the microbatch number. Each identity gets its own SplitMix64 stream, so a layer's
//! weights are the same numbers whether the model runs sequentially, vectorized over stages, or
//! split over ranks. Normal draws use Box–Muller in f64 and round once to f32.

/// A parameter initializer, as written after `=` in a `param` line.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Init {
    Zeros,
    Ones,
    /// Normal with mean 0 and this standard deviation.
    Normal(f64),
    /// Uniform on `[low, high)`.
    Uniform(f64, f64),
}

/// SplitMix64: tiny, fast, and statistically good enough for weights and test inputs.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Rng {
    /// The stream for one named value: `index` is the layer or microbatch number.
    pub fn stream(seed: u64, name: &str, index: u64) -> Rng {
        Rng {
            state: mix(seed ^ mix(fnv1a(name.as_bytes()) ^ mix(index.wrapping_add(1)))),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// Uniform on `[0, 1)` with 53 random bits.
    pub fn uniform01(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller, one value per call so streams never depend on parity).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform01(); // (0, 1]: log is finite
        let u2 = self.uniform01();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `n` draws of `init`, rounded to f32.
    pub fn fill(&mut self, init: Init, n: usize) -> Vec<f32> {
        match init {
            Init::Zeros => vec![0.0; n],
            Init::Ones => vec![1.0; n],
            Init::Normal(std) => (0..n).map(|_| (self.normal() * std) as f32).collect(),
            Init::Uniform(lo, hi) => (0..n)
                .map(|_| (lo + (hi - lo) * self.uniform01()) as f32)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let a = Rng::stream(7, "w1", 0).fill(Init::Normal(1.0), 4);
        assert_eq!(a, Rng::stream(7, "w1", 0).fill(Init::Normal(1.0), 4));
        assert_ne!(a, Rng::stream(7, "w1", 1).fill(Init::Normal(1.0), 4));
        assert_ne!(a, Rng::stream(8, "w1", 0).fill(Init::Normal(1.0), 4));
        assert_ne!(a, Rng::stream(7, "w2", 0).fill(Init::Normal(1.0), 4));
    }

    #[test]
    fn moments_are_right() {
        let n = 200_000;
        let x = Rng::stream(1, "x", 0).fill(Init::Normal(2.0), n);
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 4.0).abs() < 0.05, "var {var}");
        let u = Rng::stream(1, "u", 0).fill(Init::Uniform(-3.0, 5.0), n);
        assert!(u.iter().all(|&v| (-3.0..5.0).contains(&v)));
        let mean = u.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
    }
}
