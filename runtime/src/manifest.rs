//! The manifest: what a compiled pipeline takes and returns, embedded as text in every
//! executable (and handed to the JIT), so the runtime can build its buffers without the compiler.
//!
//! ```text
//! ppc-manifest 1
//! model examples/mlp.ppc
//! pipeline 4 8 1 4
//! ranks 2
//! flops 1073741824
//! target x86-64-v3 sse,sse2,fxsr,cmpxchg16b,popcnt,sse3,ssse3,sse4.1,sse4.2,avx,avx2,...
//! arg input x f32 8,16,256
//! arg param w1 f32 2,256,1024 normal 0.0625 layer_axes 1 shard_axis 0
//! arg output y f32 8,16,256
//! arg target target f32 8,16,256       (training programs: also `loss` and one `grad` per param)
//! group relu+add, line 14
//! train optimizer=sgd lr=0.05
//! ```
//! `pipeline` is stages, microbatches, repeats, layers; `ranks` the processes the stage axis is
//! split over (1 when absent); `target` the CPU the code was compiled for and the features it needs
//! (absent for the JIT, which compiles for the CPU it runs on). A parameter's `shard_axis` holds this rank's slice of the stage
//! axis. Arguments are listed in the order the entry function takes them. `group` lines name the
//! loop nests that generated code marks for `--trace`, numbered from 0 in order.

use crate::rng::Init;
use crate::tensor::DType;
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Input,
    Param,
    Output,
    /// Training programs: the targets of the loss, `[microbatches, ...target]`.
    Target,
    /// Training programs: the loss (f32 scalar).
    Loss,
    /// Training programs: the f32 gradient of the parameter of the same name.
    Grad,
}

impl Role {
    /// What the program writes: the output, the loss, the gradients.
    pub fn is_result(self) -> bool {
        matches!(self, Role::Output | Role::Loss | Role::Grad)
    }

    const ALL: [Role; 6] = [
        Role::Input,
        Role::Param,
        Role::Output,
        Role::Target,
        Role::Loss,
        Role::Grad,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Input => "input",
            Role::Param => "param",
            Role::Output => "output",
            Role::Target => "target",
            Role::Loss => "loss",
            Role::Grad => "grad",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub role: Role,
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Parameters only.
    pub init: Init,
    pub layer_axes: usize,
    /// Sharded parameters only: the axis that holds this rank's stages.
    pub shard_axis: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub model: String,
    pub stages: u64,
    pub microbatches: u64,
    pub repeats: u64,
    pub layers: u64,
    pub ranks: u64,
    /// Training programs: pipelines run side by side on `replicas × ranks` processes, each on its
    /// own microbatches, their gradients summed once per step (data × pipeline parallel).
    pub replicas: u64,
    /// Floating-point operations of one forward step of the sequential model (no bubbles).
    pub flops: u64,
    pub target: Option<Target>,
    /// `--target cuda`: the GPU architecture of the kernels (`sm_90`); `None` for the CPU.
    pub gpu: Option<String>,
    pub args: Vec<Arg>,
    /// Names of the traced loop nests (`ppc_trace_group_begin`'s numbers index them).
    pub groups: Vec<String>,
    /// Training programs: the model file's `train { ... }` settings (the optimizer's defaults).
    pub train: Vec<(String, String)>,
}

/// The CPU generated code was compiled for (`ppc compile --target-cpu`).
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The name given to `--target-cpu`, as the user wrote it (`x86-64-v3`, `native`).
    pub cpu: String,
    /// Instruction-set features the code may use ([`crate::cpu::KNOWN`] names).
    pub features: Vec<String>,
}

impl Manifest {
    pub fn input(&self) -> &Arg {
        self.args
            .iter()
            .find(|a| a.role == Role::Input)
            .expect("invariant: a manifest has an input")
    }

    pub fn output(&self) -> &Arg {
        self.args
            .iter()
            .find(|a| a.role == Role::Output)
            .expect("invariant: a manifest has an output")
    }

    /// The argument of role `role` (the first, if several).
    pub fn arg(&self, role: Role) -> Option<&Arg> {
        self.args.iter().find(|a| a.role == role)
    }

    /// True for a training step (`ppc compile --train`): it takes targets and returns the loss
    /// and the gradients.
    pub fn trains(&self) -> bool {
        self.arg(Role::Loss).is_some()
    }

    pub fn to_text(&self) -> String {
        let mut s = String::from("ppc-manifest 1\n");
        let _ = writeln!(s, "model {}", self.model);
        let _ = writeln!(
            s,
            "pipeline {} {} {} {}",
            self.stages, self.microbatches, self.repeats, self.layers
        );
        if self.ranks != 1 {
            let _ = writeln!(s, "ranks {}", self.ranks);
        }
        if self.replicas != 1 {
            let _ = writeln!(s, "replicas {}", self.replicas);
        }
        let _ = writeln!(s, "flops {}", self.flops);
        if let Some(t) = &self.target {
            let _ = writeln!(s, "target {} {}", t.cpu, t.features.join(","));
        }
        if let Some(arch) = &self.gpu {
            let _ = writeln!(s, "gpu {arch}");
        }
        for a in &self.args {
            let role = a.role.name();
            let shape: Vec<String> = a.shape.iter().map(|d| d.to_string()).collect();
            let _ = write!(s, "arg {role} {} {} {}", a.name, a.dtype, shape.join(","));
            if a.role == Role::Param {
                let init = match a.init {
                    Init::Zeros => "zeros".to_string(),
                    Init::Ones => "ones".to_string(),
                    Init::Normal(std) => format!("normal {std:?}"),
                    Init::Uniform(lo, hi) => format!("uniform {lo:?} {hi:?}"),
                };
                let _ = write!(s, " {init} layer_axes {}", a.layer_axes);
                if let Some(axis) = a.shard_axis {
                    let _ = write!(s, " shard_axis {axis}");
                }
            }
            s.push('\n');
        }
        for g in &self.groups {
            let _ = writeln!(s, "group {g}");
        }
        if !self.train.is_empty() {
            let kv: Vec<String> = self.train.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "train {}", kv.join(" "));
        }
        s
    }

    pub fn parse(text: &str) -> Result<Manifest, String> {
        let mut lines = text.lines();
        if lines.next() != Some("ppc-manifest 1") {
            return Err("not a ppc manifest (version 1)".into());
        }
        let mut m = Manifest {
            model: String::new(),
            stages: 0,
            microbatches: 0,
            repeats: 0,
            layers: 0,
            ranks: 1,
            replicas: 1,
            flops: 0,
            target: None,
            gpu: None,
            args: vec![],
            groups: vec![],
            train: vec![],
        };
        let num = |w: Option<&str>| -> Result<u64, String> {
            w.and_then(|w| w.parse().ok())
                .ok_or_else(|| format!("bad number in manifest: {w:?}"))
        };
        let float = |w: Option<&str>| -> Result<f64, String> {
            w.and_then(|w| w.parse().ok())
                .ok_or_else(|| format!("bad number in manifest: {w:?}"))
        };
        for line in lines {
            let mut w = line.split(' ');
            match w.next() {
                Some("model") => m.model = w.collect::<Vec<_>>().join(" "),
                Some("group") => m.groups.push(w.collect::<Vec<_>>().join(" ")),
                Some("train") => {
                    for kv in w {
                        let (k, v) = kv.split_once('=').ok_or("bad training setting")?;
                        m.train.push((k.to_string(), v.to_string()));
                    }
                }
                Some("pipeline") => {
                    m.stages = num(w.next())?;
                    m.microbatches = num(w.next())?;
                    m.repeats = num(w.next())?;
                    m.layers = num(w.next())?;
                }
                Some("ranks") => {
                    m.ranks = num(w.next())?;
                    if m.ranks == 0 {
                        return Err("a program needs at least one rank".into());
                    }
                }
                Some("replicas") => {
                    m.replicas = num(w.next())?;
                    if m.replicas == 0 {
                        return Err("a program needs at least one replica".into());
                    }
                }
                Some("flops") => m.flops = num(w.next())?,
                Some("target") => {
                    let cpu = w
                        .next()
                        .filter(|c| !c.is_empty())
                        .ok_or("target without a CPU")?;
                    let features = w.next().unwrap_or_default();
                    m.target = Some(Target {
                        cpu: cpu.to_string(),
                        features: features
                            .split(',')
                            .filter(|f| !f.is_empty())
                            .map(str::to_string)
                            .collect(),
                    });
                }
                Some("gpu") => {
                    m.gpu = Some(w.next().ok_or("gpu without an architecture")?.to_string());
                }
                Some("arg") => {
                    let word = w.next();
                    let role = Role::ALL
                        .into_iter()
                        .find(|r| Some(r.name()) == word)
                        .ok_or_else(|| format!("bad argument role {word:?}"))?;
                    let name = w.next().ok_or("argument without a name")?.to_string();
                    let dtype = w.next().and_then(DType::from_name).ok_or("bad dtype")?;
                    let shape_text = w.next().ok_or("argument without a shape")?;
                    let shape = if shape_text.is_empty() {
                        vec![]
                    } else {
                        shape_text
                            .split(',')
                            .map(|d| num(Some(d)).map(|v| v as usize))
                            .collect::<Result<_, _>>()?
                    };
                    let (mut init, mut layer_axes, mut shard_axis) = (Init::Zeros, 0, None);
                    if role == Role::Param {
                        init = match w.next() {
                            Some("zeros") => Init::Zeros,
                            Some("ones") => Init::Ones,
                            Some("normal") => Init::Normal(float(w.next())?),
                            Some("uniform") => Init::Uniform(float(w.next())?, float(w.next())?),
                            other => return Err(format!("bad initializer {other:?}")),
                        };
                        if w.next() != Some("layer_axes") {
                            return Err("expected layer_axes".into());
                        }
                        layer_axes = num(w.next())? as usize;
                        match w.next() {
                            Some("shard_axis") => shard_axis = Some(num(w.next())? as usize),
                            None => {}
                            Some(other) => {
                                return Err(format!("unexpected `{other}` after layer_axes"))
                            }
                        }
                    }
                    m.args.push(Arg {
                        role,
                        name,
                        dtype,
                        shape,
                        init,
                        layer_axes,
                        shard_axis,
                    });
                }
                Some("") | None => {}
                Some(other) => return Err(format!("unknown manifest line `{other}`")),
            }
        }
        if m.args.iter().filter(|a| a.role == Role::Input).count() != 1
            || m.args.iter().filter(|a| a.role == Role::Output).count() != 1
        {
            return Err("a manifest needs exactly one input and one output".into());
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let m = Manifest {
            model: "examples/my model.ppc".into(),
            stages: 4,
            microbatches: 8,
            repeats: 2,
            layers: 8,
            ranks: 2,
            replicas: 3,
            flops: 123,
            target: Some(Target {
                cpu: "x86-64-v3".into(),
                features: vec!["avx2".into(), "fma".into()],
            }),
            gpu: Some("sm_90".into()),
            args: vec![
                Arg {
                    role: Role::Input,
                    name: "x".into(),
                    dtype: DType::F32,
                    shape: vec![8, 16],
                    init: Init::Zeros,
                    layer_axes: 0,
                    shard_axis: None,
                },
                Arg {
                    role: Role::Param,
                    name: "w".into(),
                    dtype: DType::BF16,
                    shape: vec![2, 4, 16, 16],
                    init: Init::Uniform(-0.5, 0.25),
                    layer_axes: 2,
                    shard_axis: Some(1),
                },
                Arg {
                    role: Role::Param,
                    name: "s".into(),
                    dtype: DType::F32,
                    shape: vec![],
                    init: Init::Normal(0.02),
                    layer_axes: 0,
                    shard_axis: None,
                },
                Arg {
                    role: Role::Grad,
                    name: "w".into(),
                    dtype: DType::F32,
                    shape: vec![2, 4, 16, 16],
                    init: Init::Zeros,
                    layer_axes: 0,
                    shard_axis: None,
                },
                Arg {
                    role: Role::Output,
                    name: "y".into(),
                    dtype: DType::F32,
                    shape: vec![8, 16],
                    init: Init::Zeros,
                    layer_axes: 0,
                    shard_axis: None,
                },
            ],
            groups: vec!["gelu+add, line 60".into(), "softmax, line 39".into()],
            train: vec![
                ("optimizer".into(), "sgd".into()),
                ("lr".into(), "1e-3".into()),
            ],
        };
        assert_eq!(Manifest::parse(&m.to_text()), Ok(m));
        assert!(Manifest::parse("nonsense").is_err());
    }
}
