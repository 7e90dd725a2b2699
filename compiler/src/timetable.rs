//! Training schedules as timetables: which unit of work each stage runs at each tick of one
//! lockstep loop, for GPipe, 1F1B and ZB-H1 (Qi et al. 2023). The table is what an SPMD
//! program over ticks would follow (every stage runs one unit per tick, then neighbours
//! exchange), so its bubble and the memory it keeps are read off it, and [`Timetable::check`]
//! proves it sound before anything runs it.
//!
//! A stage's work on a microbatch is three units of one tick each: the forward `F`, the input
//! gradient `B` (what the previous stage waits for) and the weight gradient `W`. GPipe and
//! 1F1B run `W` right after `B` and send the cotangent after both (a whole backward is two
//! ticks); ZB-H1 sends it after `B` and runs `W` later, in ticks that would otherwise idle.
//!
//! 1F1B and ZB-H1 take the microbatches last first. A stage then adds its microbatches' weight
//! gradients in GPipe's order, `M-1` down to `0` (GPipe's backward starts from the last
//! microbatch, and so does the sequential model's gradient), so a program that follows either
//! table can give GPipe's gradients bit for bit.
//!
//! ```text
//! 1F1B, 2 stages, 3 microbatches (12 ticks)
//! stage 0  F2 F1 .. .. B2 W2 F0 B1 W1 .. B0 W0
//! stage 1  .. F2 B2 W2 F1 B1 W1 F0 B0 W0 .. ..
//! ZB-H1, the same (10 ticks)
//! stage 0  F2 F1 .. B2 F0 B1 W2 W1 B0 W0
//! stage 1  .. F2 B2 F1 B1 W2 F0 B0 W1 W0
//! ```
//!
//! With unit costs the tables reach the published figures: GPipe and 1F1B take
//! `3M + 3(S-1)` ticks, a bubble of `(S-1)/(M+S-1)`; GPipe keeps every microbatch's stage
//! input, 1F1B at most `S - s` on stage `s`; ZB-H1 takes `3M + S - 1` ticks (a third of
//! 1F1B's bubble) with 1F1B's activations and at most `S` weight gradients pending per stage.

use std::fmt;

/// Which schedule a timetable follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Every forward, then every backward, the last microbatch's first.
    #[default]
    Gpipe,
    /// One forward, one backward: at most `S - s` microbatches in flight on stage `s`.
    #[value(name = "1f1b")]
    OneFOneB,
    /// 1F1B with each backward split into `B` and `W`, the `W`s filling the bubble.
    #[value(name = "zb-h1")]
    ZbH1,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Gpipe, Kind::OneFOneB, Kind::ZbH1];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Gpipe => "gpipe",
            Kind::OneFOneB => "1f1b",
            Kind::ZbH1 => "zb-h1",
        }
    }

    /// The schedule `m`'s `pipeline` block names, else GPipe.
    pub fn of(m: &ppc_dialect::Module) -> Kind {
        let named = m.schedule.as_deref();
        named.map_or(Kind::Gpipe, |n| {
            (Kind::ALL.into_iter().find(|k| k.name() == n))
                .expect("invariant: the parser accepts only the names of `setting::SCHEDULES`")
        })
    }

    /// The bubble the literature gives for unit costs: `(S-1)/(M+S-1)` for GPipe and 1F1B,
    /// `(S-1)/(3M+S-1)` for ZB-H1 (where `M >= S`).
    pub fn bubble_formula(self, stages: u64, microbatches: u64) -> f64 {
        let (s, m) = (stages as f64, microbatches as f64);
        match self {
            Kind::Gpipe | Kind::OneFOneB => (s - 1.0) / (m + s - 1.0),
            Kind::ZbH1 => (s - 1.0) / (3.0 * m + s - 1.0),
        }
    }

    /// Whether the training step is one lockstep loop over ticks (`one_f_one_b.rs`): 1F1B, and
    /// ZB-H1, which is 1F1B's loop with each backward cut into `B` and `W`.
    pub fn ticked(self) -> bool {
        self != Kind::Gpipe
    }

    /// Whether a stage's cotangent leaves after `B` alone (else after `B` and `W`).
    fn splits_backward(self) -> bool {
        self == Kind::ZbH1
    }
}

/// A unit of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    F,
    B,
    W,
}

/// One stage's work at one tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    pub phase: Phase,
    pub microbatch: u64,
}

/// `slots[t][s]`: what stage `s` runs at tick `t` (`None`: it idles).
#[derive(Clone, Debug, PartialEq)]
pub struct Timetable {
    pub kind: Kind,
    pub stages: u64,
    pub microbatches: u64,
    pub slots: Vec<Vec<Option<Unit>>>,
}

/// Why a timetable is unsound: the tick and stage where it breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("tick {tick}: stage {stage} runs {phase:?} of microbatch {microbatch} {why}")]
    Early {
        tick: usize,
        stage: u64,
        phase: Phase,
        microbatch: u64,
        why: String,
    },
    #[error("stage {stage} runs {phase:?} of microbatch {microbatch} {times} times, not once")]
    Count {
        stage: u64,
        phase: Phase,
        microbatch: u64,
        times: usize,
    },
}

impl Timetable {
    /// The timetable of `kind` for `stages` stages and `microbatches` microbatches: each
    /// stage, at each tick, runs the first unit its rules allow (see [`Kind`]).
    pub fn build(kind: Kind, stages: u64, microbatches: u64) -> Timetable {
        let (s_n, m) = (stages as usize, microbatches);
        let mut state = vec![StageState::default(); s_n];
        let mut done = Done::default();
        let mut slots = Vec::new();
        while state.iter().any(|st| !st.finished(m)) {
            let t = slots.len();
            let row: Vec<Option<Unit>> = (0..s_n)
                .map(|s| next_unit(kind, &state, &done, s, s_n, m, t))
                .collect();
            for (s, unit) in row.iter().enumerate() {
                if let Some(u) = unit {
                    state[s].run(*u);
                    done.set(u.phase, u.microbatch, s, t);
                }
            }
            slots.push(row);
            assert!(
                slots.len() <= 8 * (m as usize + s_n) + 8,
                "invariant: every rule lets some stage run"
            );
        }
        if kind != Kind::Gpipe {
            // The last microbatch first (module docs).
            for u in slots.iter_mut().flatten().flatten() {
                u.microbatch = m - 1 - u.microbatch;
            }
        }
        Timetable {
            kind,
            stages,
            microbatches,
            slots,
        }
    }

    pub fn ticks(&self) -> usize {
        self.slots.len()
    }

    /// The idle share of all stage-ticks.
    pub fn bubble_fraction(&self) -> f64 {
        let busy = 3 * self.microbatches * self.stages;
        1.0 - busy as f64 / (self.ticks() as u64 * self.stages) as f64
    }

    /// Per stage, the most microbatches whose stage input it keeps at once (forward run,
    /// input gradient not yet), which is what its backward recomputes from.
    pub fn kept_inputs(&self) -> Vec<u64> {
        self.peak(INPUTS)
    }

    /// Per stage, the most weight gradients pending at once (`B` run, `W` not yet).
    pub fn pending_weight_grads(&self) -> Vec<u64> {
        self.peak(|p| match p {
            Phase::F => 0,
            Phase::B => 1,
            Phase::W => -1,
        })
    }

    /// Per rank (holding `stages / ranks` consecutive stages), the most stage inputs its
    /// stages keep at once.
    pub fn kept_inputs_per_rank(&self, ranks: u64) -> Vec<u64> {
        let per_rank = (self.stages / ranks) as usize;
        (0..ranks as usize)
            .map(|r| self.peak_of(r * per_rank..(r + 1) * per_rank, INPUTS))
            .collect()
    }

    fn peak(&self, delta: fn(Phase) -> i64) -> Vec<u64> {
        (0..self.stages as usize)
            .map(|s| self.peak_of(s..s + 1, delta))
            .collect()
    }

    /// The most, over ticks, of the running sum of `delta` over the stages `stages`.
    fn peak_of(&self, stages: std::ops::Range<usize>, delta: fn(Phase) -> i64) -> u64 {
        let (mut now, mut most) = (0i64, 0i64);
        for row in &self.slots {
            now += row[stages.clone()]
                .iter()
                .flatten()
                .map(|u| delta(u.phase))
                .sum::<i64>();
            most = most.max(now);
        }
        most as u64
    }

    /// Proves the table sound: every stage runs `F`, `B` and `W` of every microbatch exactly
    /// once, and each unit after what it reads: `F` after the previous stage's `F` (whose
    /// output it receives), `B` after its own `F` and the next stage's backward (`B`, or `B`
    /// and `W` where the backward is not split), `W` after its own `B`; every exchange
    /// happens between ticks, so "after" means at a later tick.
    pub fn check(&self) -> Result<(), TableError> {
        let (s_n, m) = (self.stages as usize, self.microbatches);
        let mut at = Done::default();
        let mut counts = std::collections::HashMap::new();
        for (t, row) in self.slots.iter().enumerate() {
            for (s, unit) in row.iter().enumerate() {
                if let Some(u) = *unit {
                    *counts.entry((s, u.phase, u.microbatch)).or_insert(0) += 1;
                    at.set(u.phase, u.microbatch, s, t);
                }
            }
        }
        for s in 0..s_n {
            for mb in 0..m {
                for phase in [Phase::F, Phase::B, Phase::W] {
                    let times = counts.get(&(s, phase, mb)).copied().unwrap_or(0);
                    if times != 1 {
                        return Err(TableError::Count {
                            stage: s as u64,
                            phase,
                            microbatch: mb,
                            times,
                        });
                    }
                }
            }
        }
        for s in 0..s_n {
            for mb in 0..m {
                for phase in [Phase::F, Phase::B, Phase::W] {
                    let t = at.get(phase, mb, s).expect("counted once");
                    let early = |why: String| TableError::Early {
                        tick: t,
                        stage: s as u64,
                        phase,
                        microbatch: mb,
                        why,
                    };
                    for (need, ns, what) in needs(self.kind, phase, s, s_n) {
                        let before = at.get(need, mb, ns).expect("counted once");
                        if before >= t {
                            return Err(early(format!(
                                "before stage {ns} runs its {need:?} ({what}, tick {before})"
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// One line per stage: `F3`, `B3`, `W3` or `..` per tick.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for s in 0..self.stages as usize {
            let cells: Vec<String> = self
                .slots
                .iter()
                .map(|row| row[s].map_or("..".to_string(), |u| u.to_string()))
                .collect();
            out.push_str(&format!("stage {s}  {}\n", cells.join(" ")));
        }
        out
    }
}

/// How a unit changes the stage inputs a stage keeps.
const INPUTS: fn(Phase) -> i64 = |p| match p {
    Phase::F => 1,
    Phase::B => -1,
    Phase::W => 0,
};

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{:?}{}", self.phase, self.microbatch)
    }
}

/// What unit `phase` of stage `s` reads, as (phase, stage, why) of the same microbatch.
fn needs(kind: Kind, phase: Phase, s: usize, stages: usize) -> Vec<(Phase, usize, &'static str)> {
    let mut out = Vec::new();
    match phase {
        Phase::F if s > 0 => out.push((Phase::F, s - 1, "its input")),
        Phase::F => {}
        Phase::B => {
            out.push((Phase::F, s, "the forward it differentiates"));
            if s + 1 < stages {
                out.push((Phase::B, s + 1, "its output's cotangent"));
                if !kind.splits_backward() {
                    out.push((
                        Phase::W,
                        s + 1,
                        "its output's cotangent, sent after the whole backward",
                    ));
                }
            }
        }
        Phase::W => out.push((Phase::B, s, "the input gradient it follows")),
    }
    out
}

/// When each unit ran, by (phase, microbatch, stage).
#[derive(Default)]
struct Done {
    ticks: std::collections::HashMap<(Phase, u64, usize), usize>,
}

impl Done {
    fn set(&mut self, phase: Phase, mb: u64, s: usize, t: usize) {
        self.ticks.insert((phase, mb, s), t);
    }

    fn get(&self, phase: Phase, mb: u64, s: usize) -> Option<usize> {
        self.ticks.get(&(phase, mb, s)).copied()
    }

    /// Whether the unit ran before tick `t`.
    fn before(&self, phase: Phase, mb: u64, s: usize, t: usize) -> bool {
        self.get(phase, mb, s).is_some_and(|d| d < t)
    }
}

/// A stage's progress: the next microbatch of each phase, and the `W`s waiting.
#[derive(Clone, Default)]
struct StageState {
    forwards: u64,
    backwards: u64,
    pending_w: std::collections::VecDeque<u64>,
}

impl StageState {
    fn finished(&self, m: u64) -> bool {
        self.forwards == m && self.backwards == m && self.pending_w.is_empty()
    }

    fn run(&mut self, u: Unit) {
        match u.phase {
            Phase::F => self.forwards += 1,
            Phase::B => {
                self.backwards += 1;
                self.pending_w.push_back(u.microbatch);
            }
            Phase::W => {
                self.pending_w.pop_front();
            }
        }
    }
}

/// The unit stage `s` runs at tick `t`, by `kind`'s rules.
fn next_unit(
    kind: Kind,
    state: &[StageState],
    done: &Done,
    s: usize,
    stages: usize,
    m: u64,
    t: usize,
) -> Option<Unit> {
    let st = &state[s];
    let unit = |phase| move |microbatch| Unit { phase, microbatch };
    let ready = |phase: Phase, mb: u64| {
        needs(kind, phase, s, stages)
            .into_iter()
            .all(|(need, ns, _)| done.before(need, mb, ns, t))
    };
    // The microbatch of the next `B`: GPipe's backward runs the last microbatch first.
    let b_mb = match kind {
        Kind::Gpipe => m.checked_sub(st.backwards + 1),
        _ => (st.backwards < m).then_some(st.backwards),
    };
    let f = (st.forwards < m && ready(Phase::F, st.forwards)).then_some(st.forwards);
    let b = b_mb.filter(|&mb| ready(Phase::B, mb));
    let w = st.pending_w.front().copied();
    // Microbatches whose stage input this stage keeps (forward run, backward not yet).
    let room = st.forwards - st.backwards < (stages - s) as u64;
    let (f, b, w) = (
        f.map(unit(Phase::F)),
        b.map(unit(Phase::B)),
        w.map(unit(Phase::W)),
    );
    match kind {
        // A whole backward is `B` then `W`; GPipe's starts when the stage's forwards are done.
        Kind::Gpipe => w.or(f).or(b.filter(|_| st.forwards == m)),
        Kind::OneFOneB => w.or(b).or(f.filter(|_| room)),
        // `W`s fill idle ticks, and go before new forwards once `S` of them wait.
        Kind::ZbH1 => {
            let crowded = st.pending_w.len() >= stages;
            b.or(w.filter(|_| crowded)).or(f.filter(|_| room)).or(w)
        }
    }
}
