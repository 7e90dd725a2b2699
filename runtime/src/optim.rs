//! The optimizers of a training step, on f32 master weights: SGD with momentum and AdamW
//! (decoupled weight decay), with PyTorch's default hyper-parameters. Every rank updates the
//! weights of its own stages; the update is elementwise, so it is the same bits on any rank
//! count. Weights stored in bf16/f16 are rounded from the f32 masters after each step; weights
//! stored in f32 are their own masters, updated in place (the update is bound by memory: a
//! master copy to read and write back cost a quarter of its traffic).

use crate::lr_schedule::LrSchedule;
use crate::memref::{encode, HostBuffer};
use crate::tensor::DType;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Sgd,
    AdamW,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sgd => "sgd",
            Kind::AdamW => "adamw",
        }
    }

    pub fn from_name(s: &str) -> Option<Kind> {
        [Kind::Sgd, Kind::AdamW].into_iter().find(|k| k.name() == s)
    }
}

/// Hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    pub kind: Kind,
    pub lr: f32,
    /// SGD's momentum.
    pub momentum: f32,
    /// AdamW's moment decay rates and denominator guard.
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled weight decay (AdamW); L2 added to the gradient (SGD).
    pub weight_decay: f32,
    /// Warmup and decay of `lr` over the steps (`lr_schedule.rs`).
    pub schedule: LrSchedule,
    /// The largest global gradient norm a step applies (`clip.rs`); 0: no clipping.
    pub grad_clip: f32,
}

/// The settings a model file's `train { ... }` block and an executable's command line may give.
pub const SETTINGS: [&str; 11] = [
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "beta1",
    "beta2",
    "eps",
    "warmup_steps",
    "decay_steps",
    "min_lr",
    "grad_clip",
];

/// A training setting that is not valid, as the model file or the command line wrote it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SettingError {
    #[error("unknown training setting `{0}` (expected one of: {list})", list = SETTINGS.join(", "))]
    UnknownKey(String),
    #[error("`{key}` needs a non-negative number, got `{value}`")]
    BadNumber { key: String, value: String },
    #[error("`optimizer` is `sgd` or `adamw`, not `{0}`")]
    UnknownOptimizer(String),
    #[error("`{key}` needs a whole number of steps, got `{value}`")]
    NotSteps { key: String, value: String },
}

impl SettingError {
    /// Whether the setting's name is wrong (else its value).
    pub fn is_about_the_key(&self) -> bool {
        matches!(self, SettingError::UnknownKey(_))
    }
}

impl Config {
    /// The optimizer the settings choose (the last `optimizer = ...`; AdamW if none), with its
    /// defaults, then the other settings applied in order (a later one wins); the first bad one
    /// is an error.
    pub fn from_settings(settings: &[(String, String)]) -> Result<Config, SettingError> {
        let kind = match settings.iter().rev().find(|(k, _)| k == "optimizer") {
            Some((_, v)) => {
                Kind::from_name(v).ok_or_else(|| SettingError::UnknownOptimizer(v.clone()))?
            }
            None => Kind::AdamW,
        };
        let mut c = Config::new(kind);
        for (k, v) in settings.iter().filter(|(k, _)| k != "optimizer") {
            c.set(k, v)?;
        }
        Ok(c)
    }

    /// Sets one numeric setting (`lr`, `momentum`, ...) from its text.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SettingError> {
        let x: f32 = value
            .parse()
            .ok()
            .filter(|x: &f32| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| SettingError::BadNumber {
                key: key.to_string(),
                value: value.to_string(),
            })?;
        if let Some(slot) = match key {
            "warmup_steps" => Some(&mut self.schedule.warmup_steps),
            "decay_steps" => Some(&mut self.schedule.decay_steps),
            _ => None,
        } {
            if x.fract() != 0.0 {
                return Err(SettingError::NotSteps {
                    key: key.to_string(),
                    value: value.to_string(),
                });
            }
            *slot = x as u64;
            return Ok(());
        }
        let slot = match key {
            "lr" => &mut self.lr,
            "min_lr" => &mut self.schedule.min_lr,
            "momentum" => &mut self.momentum,
            "weight_decay" => &mut self.weight_decay,
            "beta1" => &mut self.beta1,
            "beta2" => &mut self.beta2,
            "eps" => &mut self.eps,
            "grad_clip" => &mut self.grad_clip,
            _ => return Err(SettingError::UnknownKey(key.to_string())),
        };
        *slot = x;
        Ok(())
    }

    /// Every setting, as `key=value` pairs a checkpoint records and [`Config::from_settings`]
    /// reads back to the same config.
    pub fn settings(&self) -> Vec<(String, String)> {
        let s = self.schedule;
        let numbers = [
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("weight_decay", self.weight_decay),
            ("beta1", self.beta1),
            ("beta2", self.beta2),
            ("eps", self.eps),
            ("min_lr", s.min_lr),
            ("grad_clip", self.grad_clip),
        ];
        let mut out = vec![("optimizer".to_string(), self.kind.name().to_string())];
        out.extend(numbers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        out.push(("warmup_steps".into(), s.warmup_steps.to_string()));
        out.push(("decay_steps".into(), s.decay_steps.to_string()));
        out
    }

    /// The settings for a parameter that decays or not ([`decays`]).
    pub fn for_param(self, decays: bool) -> Config {
        match decays {
            true => self,
            false => Config {
                weight_decay: 0.0,
                ..self
            },
        }
    }

    pub fn new(kind: Kind) -> Config {
        match kind {
            Kind::Sgd => Config {
                kind,
                lr: 0.01,
                momentum: 0.9,
                beta1: 0.0,
                beta2: 0.0,
                eps: 0.0,
                weight_decay: 0.0,
                schedule: LrSchedule::default(),
                grad_clip: 0.0,
            },
            Kind::AdamW => Config {
                kind,
                lr: 1e-3,
                momentum: 0.0,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                schedule: LrSchedule::default(),
                grad_clip: 0.0,
            },
        }
    }
}

/// The optimizer's state for a list of parameters: f32 masters, moments, the step count.
#[derive(Clone, Debug, PartialEq)]
pub struct Optimizer {
    pub config: Config,
    /// Steps taken.
    pub step: u64,
    /// The f32 masters of the parameters stored in another dtype; empty for those stored in
    /// f32 (their buffers are their masters: [`Optimizer::weights`]).
    pub master: Vec<Vec<f32>>,
    /// SGD: the momentum buffer; AdamW: the first moment.
    pub m: Vec<Vec<f32>>,
    /// AdamW: the second moment (empty for SGD).
    pub v: Vec<Vec<f32>>,
    /// Whether weight decay applies to each parameter ([`decays`]).
    pub decays: Vec<bool>,
}

/// Whether weight decay applies to a parameter: to a layer's matrices, not to its vectors
/// (norm gains, biases), as GPT-2 and Llama are trained (nanoGPT's `configure_optimizers`).
pub fn decays(a: &crate::manifest::Arg) -> bool {
    a.shape.len() - a.layer_axes >= 2
}

impl Optimizer {
    /// Starts from `params` with zero moments.
    pub fn new(config: Config, params: &[HostBuffer]) -> Optimizer {
        let master: Vec<Vec<f32>> = params
            .iter()
            .map(|p| match p.dtype {
                DType::F32 => Vec::new(),
                _ => p.to_tensor().data,
            })
            .collect();
        let zeros = |p: &HostBuffer| vec![0.0f32; p.shape.iter().product()];
        let m = params.iter().map(zeros).collect();
        let v = match config.kind {
            Kind::AdamW => params.iter().map(zeros).collect(),
            Kind::Sgd => Vec::new(),
        };
        Optimizer {
            config,
            step: 0,
            master,
            m,
            v,
            decays: vec![true; params.len()],
        }
    }

    /// The f32 weights of parameter `i` of `params` (the ones this optimizer updates).
    pub fn weights<'a>(&'a self, i: usize, params: &'a [HostBuffer]) -> &'a [f32] {
        params[i].f32s().unwrap_or(&self.master[i])
    }

    /// Counts a step; returns its settings (the scheduled learning rate) and AdamW's bias
    /// corrections `(1 - beta1^t, 1 - beta2^t)`.
    pub fn next_step(&mut self) -> (Config, (f32, f32)) {
        self.step += 1;
        let c = Config {
            lr: self.config.schedule.lr_at(self.config.lr, self.step),
            ..self.config
        };
        let t = self.step as i32;
        (c, (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t)))
    }

    /// One step: updates the masters from `grads` (f32, one per parameter, same sizes) and
    /// writes them, rounded to each parameter's dtype, into `params` in place (an f32
    /// parameter is its own master, updated where it is). Elementwise, so
    /// it runs in chunks on the pool's threads with the same bits whatever the split.
    pub fn update(&mut self, params: &mut [HostBuffer], grads: &[&[f32]]) {
        const CHUNK: usize = 1 << 14;
        let (c, bias) = self.next_step();
        let mut v = self.v.iter_mut();
        let mut chunks = Vec::new();
        for ((((w, m), g), p), &decays) in self
            .master
            .iter_mut()
            .zip(&mut self.m)
            .zip(grads)
            .zip(params)
            .zip(&self.decays)
        {
            let config = c.for_param(decays);
            let (dtype, size) = (p.dtype, p.dtype.size_bytes() as usize);
            // SGD has no second moment: empty slices stand in for its chunks.
            let vs: Box<dyn Iterator<Item = &mut [f32]>> = match v.next() {
                Some(v) => Box::new(v.chunks_mut(CHUNK)),
                None => Box::new(std::iter::repeat_with(<&mut [f32]>::default)),
            };
            // An f32 parameter is updated in place; others through their master.
            let (w, outs): (&mut [f32], StoredChunks) = match dtype {
                DType::F32 => (
                    p.f32s_mut().expect("invariant: an f32 buffer"),
                    Box::new(std::iter::repeat_with(|| None)),
                ),
                _ => (
                    w,
                    Box::new(p.bytes_mut().chunks_mut(CHUNK * size).map(Some)),
                ),
            };
            let parts = w.chunks_mut(CHUNK).zip(m.chunks_mut(CHUNK)).zip(vs);
            let io = g.chunks(CHUNK).zip(outs);
            for (((w, m), v), (g, out)) in parts.zip(io) {
                chunks.push(Mutex::new(Chunk {
                    w,
                    m,
                    v,
                    g,
                    out,
                    dtype,
                    config,
                }));
            }
        }
        crate::pool::parallel_for(chunks.len(), &|k| {
            let mut chunk = chunks[k].lock().expect("invariant: one task per chunk");
            chunk.update(bias);
        });
    }
}

/// The stored bytes of each chunk of a parameter (`None`: stored in f32, updated in place).
type StoredChunks<'a> = Box<dyn Iterator<Item = Option<&'a mut [u8]>> + 'a>;

/// A run of one parameter's elements: its masters, moments, gradient and, when it is not
/// stored in f32, its stored bytes.
struct Chunk<'a> {
    w: &'a mut [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    g: &'a [f32],
    out: Option<&'a mut [u8]>,
    dtype: DType,
    /// The step's settings for this parameter (its weight decay, [`decays`]).
    config: Config,
}

impl Chunk<'_> {
    /// `(b1t, b2t)`: AdamW's bias corrections for this step.
    fn update(&mut self, (b1t, b2t): (f32, f32)) {
        let (w, m, g, c) = (&mut *self.w, &mut *self.m, self.g, self.config);
        match c.kind {
            Kind::Sgd => {
                for ((w, m), &g) in w.iter_mut().zip(m.iter_mut()).zip(g) {
                    let g = g + c.weight_decay * *w;
                    *m = c.momentum * *m + g;
                    *w -= c.lr * *m;
                }
            }
            Kind::AdamW => {
                for (((w, m), v), &g) in
                    w.iter_mut().zip(m.iter_mut()).zip(self.v.iter_mut()).zip(g)
                {
                    *m = c.beta1 * *m + (1.0 - c.beta1) * g;
                    *v = c.beta2 * *v + (1.0 - c.beta2) * g * g;
                    let step = (*m / b1t) / ((*v / b2t).sqrt() + c.eps);
                    *w -= c.lr * (step + c.weight_decay * *w);
                }
            }
        }
        if let Some(out) = &mut self.out {
            encode(self.dtype, self.w, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    /// AdamW on parameters of several chunks, stored in f32 and bf16, against the textbook
    /// update written out here element by element: the same bits, whatever the chunking.
    #[test]
    fn chunked_updates_equal_the_elementwise_formula() {
        let n = 40_000; // three chunks
        let w0: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let grads: Vec<Vec<f32>> = (0..3)
            .map(|s| (0..n).map(|i| ((i * 7 + s) as f32 * 0.11).cos()).collect())
            .collect();
        for dtype in [DType::F32, DType::BF16] {
            let config = Config::new(Kind::AdamW);
            let w = Tensor::new(dtype, vec![n], w0.clone());
            let mut params = vec![HostBuffer::from_tensor(&w)];
            let mut opt = Optimizer::new(config, &params);
            let (mut master, mut m, mut v) = (w.data.clone(), vec![0f32; n], vec![0f32; n]);
            for (t, g) in grads.iter().enumerate() {
                opt.update(&mut params, &[g]);
                let c = config;
                let t = t as i32 + 1;
                let (b1t, b2t) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
                for i in 0..n {
                    m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
                    v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g[i] * g[i];
                    let step = (m[i] / b1t) / ((v[i] / b2t).sqrt() + c.eps);
                    master[i] -= c.lr * (step + c.weight_decay * master[i]);
                }
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(opt.weights(0, &params)),
                bits(&master),
                "{dtype:?}: masters"
            );
            let stored = HostBuffer::from_tensor(&Tensor::new(dtype, vec![n], master));
            assert_eq!(
                params[0].bytes(),
                stored.bytes(),
                "{dtype:?}: stored weights"
            );
        }
    }

    /// The update uses the step's scheduled rate: with a warmup of 2 steps, SGD's first step
    /// moves half as far as without.
    #[test]
    fn updates_follow_the_learning_rate_schedule() {
        let step_of = |warmup: &str| {
            let settings = [
                ("optimizer", "sgd"),
                ("momentum", "0"),
                ("lr", "0.5"),
                ("warmup_steps", warmup),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()));
            let config = Config::from_settings(&settings).expect("valid");
            let w0 = Tensor::new(DType::F32, vec![1], vec![0.0]);
            let mut params = vec![HostBuffer::from_tensor(&w0)];
            Optimizer::new(config, &params).update(&mut params, &[&[1.0]]);
            params[0].to_tensor().data[0]
        };
        assert_eq!(step_of("0"), -0.5);
        assert_eq!(step_of("2"), -0.25);
        let bad = [("warmup_steps", "1.5")].map(|(k, v)| (k.to_string(), v.to_string()));
        assert!(matches!(
            Config::from_settings(&bad),
            Err(SettingError::NotSteps { .. })
        ));
    }

    /// A layer's matrices decay, its vectors (norm gains, biases) do not.
    #[test]
    fn weight_decay_skips_vectors() {
        use crate::manifest::{Arg, Role};
        let arg = |shape: Vec<usize>, layer_axes| Arg {
            role: Role::Param,
            name: "w".into(),
            dtype: DType::F32,
            shape,
            init: crate::Init::Zeros,
            layer_axes,
            shard_axis: None,
        };
        assert!(decays(&arg(vec![4, 8, 8], 1)));
        assert!(!decays(&arg(vec![4, 8], 1)));
        let one = Tensor::new(DType::F32, vec![2], vec![1.0; 2]);
        let mut params = vec![HostBuffer::from_tensor(&one), HostBuffer::from_tensor(&one)];
        let mut opt = Optimizer::new(Config::new(Kind::AdamW), &params);
        opt.decays = vec![true, false];
        opt.update(&mut params, &[&[0.0; 2], &[0.0; 2]]);
        assert!(params[0].to_tensor().data[0] < 1.0, "decayed");
        assert_eq!(params[1].to_tensor().data[0], 1.0, "not decayed");
    }

    /// Minimizes `sum((w - 3)^2)` with each optimizer from w = 0.
    #[test]
    fn both_optimizers_minimize_a_quadratic() {
        for kind in [Kind::Sgd, Kind::AdamW] {
            let mut config = Config::new(kind);
            config.lr = if kind == Kind::Sgd { 0.05 } else { 0.1 };
            config.weight_decay = 0.0;
            let w0 = Tensor::new(DType::F32, vec![4], vec![0.0; 4]);
            let mut params = vec![HostBuffer::from_tensor(&w0)];
            let mut opt = Optimizer::new(config, &params);
            for _ in 0..300 {
                let w = params[0].to_tensor();
                let g: Vec<f32> = w.data.iter().map(|x| 2.0 * (x - 3.0)).collect();
                opt.update(&mut params, &[&g]);
            }
            let w = params[0].to_tensor();
            assert!(
                w.data.iter().all(|x| (x - 3.0).abs() < 1e-2),
                "{kind:?}: {:?}",
                w.data
            );
            assert_eq!(opt.step, 300);
        }
    }
}
