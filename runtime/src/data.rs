//! Where a training run's batches come from: a token stream (`--data train.bin`,
//! [`crate::tokens`]), a safetensors file of input and target rows (`--data FILE`), or by
//! default a seeded synthetic task a model can learn: the same model with other weights (a
//! *teacher*) labels a pool of seeded input batches (for `softmax_cross_entropy`, the argmax of
//! its logits). `--val-data` is read the same way.

use crate::exec::Program;
use crate::init::{self, Source};
use crate::manifest::{Arg, Manifest, Role};
use crate::memref::HostBuffer;
use crate::run_options::TrainOptions;
use crate::safetensors;
use crate::tensor::{DType, Tensor};
use crate::tokens::TokenStream;
use crate::train::{Buffers, TrainError};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// The teacher of the synthetic task is the model drawn with `seed + TEACHER_SEED_OFFSET`.
pub const TEACHER_SEED_OFFSET: u64 = 1_000_003;
/// Input batches the synthetic task cycles through.
pub const SYNTHETIC_BATCHES: u64 = 8;

/// The synthetic task's state: the teacher until every batch is labelled, and the batches.
pub(crate) struct Synthetic {
    teacher: Option<Vec<HostBuffer>>,
    batches: Vec<Option<(HostBuffer, HostBuffer)>>,
    seed: u64,
}

/// Batches of inputs and targets, `[M, ...]` each.
pub(crate) enum Data {
    /// Batch `b` is `b mod SYNTHETIC_BATCHES`, labelled when first used ([`Data::prepare`]).
    Synthetic(Synthetic),
    /// `[N, ...]` rows, in an order of their own each epoch ([`rows`]).
    File {
        input: Tensor,
        target: Tensor,
        seed: u64,
    },
    /// Seeded windows of a token stream, drawn from the stream `(name, b)` of `seed`.
    Tokens {
        stream: TokenStream,
        seed: u64,
        name: &'static str,
    },
}

impl Data {
    /// The training data: `--data`, else the synthetic task, which is said on `progress`
    /// (`None`: nothing said), as labelling its batches takes time.
    pub(crate) fn training(
        program: &Program,
        opts: &TrainOptions,
        progress: Option<&mut dyn Write>,
    ) -> Result<Data, TrainError> {
        match &opts.data {
            Some(path) => Data::file(program, path, opts, "train"),
            None => Data::synthetic(program, opts, progress),
        }
    }

    /// Makes batch `b` ready: a synthetic batch not labelled yet is labelled now, by a forward
    /// run of the teacher in `bufs` (the training's own buffers: no second set is held; the
    /// whole step where the program has no forward-only entry, `--target cuda`); returns the
    /// seconds that took, if it ran. Other data is always ready.
    pub(crate) fn prepare(
        &mut self,
        program: &Program,
        bufs: &mut Buffers,
        b: u64,
    ) -> Result<Option<f64>, TrainError> {
        let Data::Synthetic(task) = self else {
            return Ok(None);
        };
        let slot = (b % SYNTHETIC_BATCHES) as usize;
        if task.batches[slot].is_some() {
            return Ok(None);
        }
        let started = Instant::now();
        let m = &program.manifest;
        let (input, target) = (m.input(), m.arg(Role::Target).expect("invariant: training"));
        let x = HostBuffer::from_tensor(&init::synthetic_inputs(
            task.seed.wrapping_mul(SYNTHETIC_BATCHES) + slot as u64,
            input.dtype,
            input.init,
            &input.shape[1..],
            input.shape[0],
        ));
        let teacher = task
            .teacher
            .as_mut()
            .expect("invariant: a batch is unlabelled");
        let zero = HostBuffer::zeros(target.dtype, &target.shape);
        // The teacher's weights are staged for the call only: the trained ones stay.
        bufs.evaluate(
            program,
            x.clone(),
            zero,
            teacher,
            crate::exec::Staging::Once,
        )?;
        let y = bufs.output.to_tensor();
        let t = match target.dtype {
            DType::I32 => argmax_last(&y, target),
            _ => Tensor::new(target.dtype, target.shape.clone(), y.data),
        };
        task.batches[slot] = Some((x, HostBuffer::from_tensor(&t)));
        crate::trace::record(
            crate::trace::Kind::Labelling,
            slot as i64 + 1,
            Some(started),
        );
        if task.batches.iter().all(Option::is_some) {
            task.teacher = None;
        }
        Ok(Some(started.elapsed().as_secs_f64()))
    }

    /// The data of `path` (`--data`, `--val-data`): a token stream when its name ends in
    /// `.bin`, else a safetensors file of `input` and `target` rows.
    pub(crate) fn file(
        program: &Program,
        path: &Path,
        opts: &TrainOptions,
        name: &'static str,
    ) -> Result<Data, TrainError> {
        let m = &program.manifest;
        let (input, target) = (m.input(), m.arg(Role::Target).expect("invariant: training"));
        if path.extension().is_some_and(|e| e == "bin") {
            let stream = TokenStream::open(path, opts.token_dtype)?;
            stream.check(input, target)?;
            // The first batch is read now, so that a file of the wrong width or vocabulary
            // says so before anything runs.
            stream.batch(input, vocab(m), opts.seed, name, 0)?;
            return Ok(Data::Tokens {
                stream,
                seed: opts.seed,
                name,
            });
        }
        let read = |name: &str, a: &Arg| -> Result<Tensor, TrainError> {
            let b = safetensors::read_tensor(path, name)?;
            if b.shape.len() != a.shape.len() || b.shape[1..] != a.shape[1..] || b.shape[0] == 0 {
                return Err(TrainError::DataShape {
                    path: path.to_path_buf(),
                    tensor: name.to_string(),
                    dtype: b.dtype,
                    shape: b.shape,
                    want: a.shape[1..].to_vec(),
                    want_dtype: a.dtype,
                });
            }
            Ok(b.to_tensor())
        };
        let (x, y) = (read("input", input)?, read("target", target)?);
        if x.shape[0] != y.shape[0] {
            return Err(TrainError::DataRows {
                path: path.to_path_buf(),
                inputs: x.shape[0],
                targets: y.shape[0],
            });
        }
        if m.cross_entropy {
            check_classes(&y, m, path)?;
        }
        Ok(Data::File {
            input: x,
            target: y,
            seed: opts.seed,
        })
    }

    /// What a user should know of the data before the first step: a file with fewer rows
    /// than a step takes, whose steps then repeat rows.
    pub(crate) fn note(&self, m: &Manifest, path: &Path) -> Option<String> {
        let Data::File { input, .. } = self else {
            return None;
        };
        let (n, per_step) = (input.shape[0], m.input().shape[0]);
        (n < per_step).then(|| {
            format!(
                "note: {} holds {n} rows (microbatches), fewer than the {per_step} a step takes: each step repeats some",
                path.display()
            )
        })
    }

    /// The synthetic task: the model with other weights (the teacher, seeded with
    /// `seed + TEACHER_SEED_OFFSET`) labels [`SYNTHETIC_BATCHES`] seeded input batches, each
    /// when training first reaches it: the first step waits for one labelling, not all of them.
    fn synthetic(
        program: &Program,
        opts: &TrainOptions,
        progress: Option<&mut dyn Write>,
    ) -> Result<Data, TrainError> {
        if let Some(w) = progress {
            writeln!(
                w,
                "the synthetic task: {SYNTHETIC_BATCHES} batches, each labelled by a teacher model \
                 when training first reaches it (--data FILE trains on your data)"
            )?;
        }
        Ok(Data::Synthetic(Synthetic {
            teacher: Some(program.params(&Source::Seeded(opts.seed + TEACHER_SEED_OFFSET))?),
            batches: vec![None; SYNTHETIC_BATCHES as usize],
            seed: opts.seed,
        }))
    }

    /// Batch `b`.
    pub(crate) fn batch(
        &self,
        m: &Manifest,
        step: u64,
    ) -> Result<(HostBuffer, HostBuffer), TrainError> {
        Ok(match self {
            Data::Synthetic(task) => task.batches[(step % SYNTHETIC_BATCHES) as usize]
                .clone()
                .expect("invariant: prepared before use"),
            Data::Tokens { stream, seed, name } => {
                stream.batch(m.input(), vocab(m), *seed, name, step)?
            }
            Data::File {
                input,
                target,
                seed,
            } => {
                let target_arg = m.arg(Role::Target).expect("invariant: training");
                let order = order(input.shape[0], m.input().shape[0], *seed, step);
                (
                    rows(input, m.input(), &order),
                    rows(target, target_arg, &order),
                )
            }
        })
    }
}

/// The classes of the outputs' last axis (a language model's vocabulary).
fn vocab(m: &Manifest) -> usize {
    *m.output()
        .shape
        .last()
        .expect("invariant: outputs have axes")
}

/// The rows of a file of `n` that step `step` trains on, `mb` a step: rows `step·mb + i` of
/// the sequence in which every epoch (every `n` rows) takes each row once, in an order drawn
/// for the epoch from the run's seed (`("epoch", e)`), so that the same step reads the same
/// rows on any rank and replica count, after a resume too.
fn order(n: usize, mb: usize, seed: u64, step: u64) -> Vec<usize> {
    let first = step as usize * mb;
    let mut epochs: std::collections::HashMap<usize, Vec<usize>> = Default::default();
    (first..first + mb)
        .map(|k| {
            let perm = epochs.entry(k / n).or_insert_with(|| {
                let mut rng = crate::rng::Rng::stream(seed, "epoch", (k / n) as u64);
                let mut p: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    p.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                }
                p
            });
            perm[k % n]
        })
        .collect()
}

/// Rows `order` of `t`, as argument `a` takes a step's microbatches.
fn rows(t: &Tensor, a: &Arg, order: &[usize]) -> HostBuffer {
    let inner: usize = a.shape[1..].iter().product();
    let data = (order.iter())
        .flat_map(|&r| t.data[r * inner..(r + 1) * inner].to_vec())
        .collect();
    HostBuffer::from_tensor(&Tensor::new(a.dtype, a.shape.clone(), data))
}

/// Every class id of `--data`'s targets is a class of the outputs or the loss's
/// `ignore_index`: a bad label is refused before training, not scored as some other class.
fn check_classes(y: &Tensor, m: &Manifest, path: &Path) -> Result<(), TrainError> {
    let classes = vocab(m);
    let per_row = (y.len() / y.shape[0].max(1)).max(1);
    let bad = (0..y.len())
        .map(|i| (i, y.int(i)))
        .find(|&(_, v)| Some(v) != m.ignore_index && !(0..classes as i64).contains(&i64::from(v)));
    match bad {
        None => Ok(()),
        Some((i, value)) => Err(TrainError::TargetClass {
            path: path.to_path_buf(),
            row: i / per_row,
            element: i % per_row,
            value,
            classes,
            ignore: m.ignore_index,
        }),
    }
}

/// The index of the largest logit of each row (the last axis of `y`).
fn argmax_last(y: &Tensor, target: &Arg) -> Tensor {
    let classes = *y.shape.last().expect("invariant: logits have a class axis");
    let ids = (y.data.chunks(classes)).map(|row| crate::accuracy::argmax(row) as i32);
    Tensor::from_ints(target.shape.clone(), ids)
}

#[cfg(test)]
mod tests {
    use super::order;

    #[test]
    fn each_epoch_takes_every_row_once_in_an_order_of_its_own() {
        // 10 rows, 4 a step: steps 0..5 are epochs 0 and 1 whole.
        let rows: Vec<usize> = (0..5).flat_map(|s| order(10, 4, 7, s)).collect();
        let (e0, e1) = rows.split_at(10);
        for e in [e0, e1] {
            let mut sorted = e.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(e0, e1, "each epoch draws its own order");
        assert_ne!(e0, (0..10).collect::<Vec<_>>(), "shuffled");
        assert_eq!(order(10, 4, 7, 3), order(10, 4, 7, 3), "seeded");
        assert_ne!(order(10, 4, 7, 0), order(10, 4, 8, 0), "by the run's seed");
        // Fewer rows than a step: the step spans epochs.
        let mut small = order(3, 4, 7, 0);
        small.truncate(3);
        small.sort_unstable();
        assert_eq!(small, [0, 1, 2]);
    }
}
