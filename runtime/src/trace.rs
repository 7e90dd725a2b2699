//! `--trace FILE`: what a run did and when, as a Chrome/Perfetto trace (the JSON trace-event
//! format: open it in ui.perfetto.dev or chrome://tracing).
//!
//! One process per rank (`pid` = rank), one track per thread: each step, each iteration of the
//! GPipe loop (numbered as `ppc schedule` numbers them, from 0; in the training step also each
//! iteration of the backward loop, numbered by the forward iteration it reverses), each loop nest of generated code
//! (a fused group, named by its ops and model line, with its parallel loop's threads inside),
//! each GEMM on the thread that called it (its shape and operand layout in its arguments: the
//! rate of each kind of product can be read off the trace) and each block of it on the thread
//! that computed it,
//! each exchange with its wait, each training step's optimizer update, and each labelling of a
//! synthetic batch (the iterations of its forward pass inside). Laid over the schedule, the
//! iterations show the pipeline's diagonal and its bubble.
//!
//! Recording costs one relaxed atomic load while tracing is off. Ranks share a clock by wall
//! time, so the tracks of several processes on one node line up.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// What a span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Step = 0,
    Iteration = 1,
    Gemm = 2,
    GemmBlock = 3,
    Exchange = 4,
    Group = 5,
    Optimizer = 6,
    BackwardIteration = 7,
    /// A training run's labelling of a synthetic batch (its index), before the step that
    /// first trains on it.
    Labelling = 8,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::Step,
        Kind::Iteration,
        Kind::Gemm,
        Kind::GemmBlock,
        Kind::Exchange,
        Kind::Group,
        Kind::Optimizer,
        Kind::BackwardIteration,
        Kind::Labelling,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Step => "step",
            Kind::Iteration => "iteration",
            Kind::Gemm => "GEMM",
            Kind::GemmBlock => "GEMM block",
            Kind::Exchange => "exchange (wait included)",
            Kind::Group => "loop nest",
            Kind::Optimizer => "optimizer update",
            Kind::BackwardIteration => "backward iteration",
            Kind::Labelling => "labelling synthetic batch",
        }
    }
}

/// One span: what, which (step, iteration, ...), on which thread, from when, how long (µs);
/// a GEMM's also its shape.
#[derive(Clone, Copy, Debug)]
struct Span {
    kind: Kind,
    index: i64,
    thread: u32,
    start_us: f64,
    dur_us: f64,
    gemm: Option<Gemm>,
}

/// A GEMM call's shape: `batch` products of `[m, k] · [k, n]`, how each operand is laid out,
/// and whether it adds to `C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gemm {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Layout,
    pub b: Layout,
    pub accumulate: bool,
}

/// How a GEMM operand lies in memory: row-major, read transposed (column-major), or neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    RowMajor = 0,
    Transposed = 1,
    Strided = 2,
}

impl Layout {
    /// The layout of a matrix with these strides (in elements) between rows and columns.
    pub fn of(row_stride: isize, col_stride: isize) -> Layout {
        match (row_stride, col_stride) {
            (_, 1) => Layout::RowMajor,
            (1, _) => Layout::Transposed,
            _ => Layout::Strided,
        }
    }

    fn from_code(code: f64) -> Layout {
        [Layout::RowMajor, Layout::Transposed, Layout::Strided][code as usize]
    }

    /// How the trace writes operand `name` in this layout: `A`, `Aᵀ`, `A (strided)`.
    fn written(self, name: &str) -> String {
        match self {
            Layout::RowMajor => name.to_string(),
            Layout::Transposed => format!("{name}ᵀ"),
            Layout::Strided => format!("{name} (strided)"),
        }
    }
}

/// Numbers per span in the rows gathered across ranks: kind, index, thread, start, duration,
/// then a GEMM's batch, m, n, k, layouts of `A` and `B`, and whether it accumulates (NaN for
/// other spans).
const ROW: usize = 12;

static ON: AtomicBool = AtomicBool::new(false);
static SPANS: Mutex<Vec<Span>> = Mutex::new(Vec::new());
/// The wall-clock time of an `Instant`, fixed when tracing starts.
static ORIGIN: OnceLock<(Instant, f64)> = OnceLock::new();
static NEXT_THREAD: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static THREAD: u32 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// Starts recording, from nothing, until [`write`]. Tracing is per process: a process that
/// runs several programs at once (a test harness) traces them all.
pub fn enable() {
    SPANS.lock().unwrap_or_else(|e| e.into_inner()).clear();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6);
    ORIGIN.get_or_init(|| (Instant::now(), wall));
    THREAD.with(|_| {}); // the enabling thread is track 0
    ON.store(true, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

fn micros(t: Instant) -> f64 {
    let (origin, wall) = *ORIGIN.get().expect("invariant: set by enable");
    wall + t.saturating_duration_since(origin).as_secs_f64() * 1e6
}

/// The start of a span: now, while tracing (and nothing, without reading the clock, otherwise).
pub fn start() -> Option<Instant> {
    enabled().then(Instant::now)
}

/// Records a span of `kind` number `index` that began at `start` and ends now.
pub fn record(kind: Kind, index: i64, start: Option<Instant>) {
    push(kind, index, start, None);
}

/// Records a GEMM call that began at `start` and ends now, of the shape `gemm` gives (asked
/// only while tracing: the GEMM is called thousands of times a step).
pub fn record_gemm(start: Option<Instant>, gemm: impl FnOnce() -> Gemm) {
    if start.is_some() {
        let gemm = gemm();
        push(Kind::Gemm, gemm.batch as i64, start, Some(gemm));
    }
}

fn push(kind: Kind, index: i64, start: Option<Instant>, gemm: Option<Gemm>) {
    let Some(start) = start.filter(|_| enabled()) else {
        return;
    };
    let end = Instant::now();
    let span = Span {
        kind,
        index,
        thread: THREAD.with(|t| *t),
        start_us: micros(start),
        dur_us: end.saturating_duration_since(start).as_secs_f64() * 1e6,
        gemm,
    };
    SPANS.lock().unwrap_or_else(|e| e.into_inner()).push(span);
}

thread_local! {
    static ITERATION: std::cell::Cell<Option<(i32, Instant)>> = const { std::cell::Cell::new(None) };
    static GROUP: std::cell::Cell<Option<(i32, Instant)>> = const { std::cell::Cell::new(None) };
}

/// Names of the loop nests generated code numbers (the manifest's `group` lines).
static GROUP_NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Names the loop nests of the program about to run.
pub fn name_groups(names: &[String]) {
    *GROUP_NAMES.lock().unwrap_or_else(|e| e.into_inner()) = names.to_vec();
}

/// Called by generated code before loop nest number `id`.
#[no_mangle]
pub extern "C" fn ppc_trace_group_begin(id: i32) {
    open(&GROUP, id);
}

/// Called by generated code after loop nest number `id`.
#[no_mangle]
pub extern "C" fn ppc_trace_group_end(_id: i32) {
    close(&GROUP, Kind::Group);
}

/// Called by generated code at the top of each iteration of the GPipe loop.
#[no_mangle]
pub extern "C" fn ppc_trace_iteration_begin(t: i32) {
    open(&ITERATION, t);
}

/// Called by generated code at the bottom of each iteration of the GPipe loop.
#[no_mangle]
pub extern "C" fn ppc_trace_iteration_end(_t: i32) {
    close(&ITERATION, Kind::Iteration);
}

/// Called by generated code at the top of each iteration of the training step's backward
/// loop, with the number of the forward iteration it reverses.
#[no_mangle]
pub extern "C" fn ppc_trace_backward_begin(t: i32) {
    open(&ITERATION, t);
}

/// Called by generated code at the bottom of each iteration of the backward loop.
#[no_mangle]
pub extern "C" fn ppc_trace_backward_end(_t: i32) {
    close(&ITERATION, Kind::BackwardIteration);
}

/// The span of one kind that generated code is in on this thread: its number and start.
type Open = std::thread::LocalKey<std::cell::Cell<Option<(i32, Instant)>>>;

fn open(span: &'static Open, id: i32) {
    if enabled() {
        span.with(|c| c.set(Some((id, Instant::now()))));
    }
}

fn close(span: &'static Open, kind: Kind) {
    if let Some((id, start)) = span.with(|c| c.take()) {
        record(kind, i64::from(id), Some(start));
    }
}

/// Stops recording; this process's spans as rows of numbers, for gathering across ranks.
fn take_rows() -> Vec<f64> {
    ON.store(false, Ordering::Relaxed);
    let spans = std::mem::take(&mut *SPANS.lock().unwrap_or_else(|e| e.into_inner()));
    spans
        .iter()
        .flat_map(|s| {
            let gemm = s.gemm.map_or([f64::NAN; ROW - 5], |g| {
                [
                    g.batch as f64,
                    g.m as f64,
                    g.n as f64,
                    g.k as f64,
                    g.a as u8 as f64,
                    g.b as u8 as f64,
                    f64::from(u8::from(g.accumulate)),
                ]
            });
            let span = [
                s.kind as u8 as f64,
                s.index as f64,
                f64::from(s.thread),
                s.start_us,
                s.dur_us,
            ];
            span.into_iter().chain(gemm)
        })
        .collect()
}

/// Gathers every rank's spans; rank 0 writes them to `path` (atomically). Every rank calls it.
pub fn write(path: &std::path::Path) -> Result<(), crate::files::WriteError> {
    let rows = take_rows();
    // Ranks hold different numbers of spans: pad every rank's to the longest with NaN rows.
    let mut rows = rows;
    rows.resize(crate::comm::max(rows.len() as f64) as usize, f64::NAN);
    let Some(all) = crate::comm::gather(&rows) else {
        return Ok(());
    };
    let ranks = crate::comm::size().max(1);
    let per_rank = all.len() / ranks;
    let groups = GROUP_NAMES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let mut events = Vec::new();
    for rank in 0..ranks {
        events.push(format!(
            r#"{{"ph":"M","name":"process_name","pid":{rank},"tid":0,"args":{{"name":"rank {rank}"}}}}"#
        ));
        let mut threads = std::collections::BTreeSet::new();
        for r in all[rank * per_rank..(rank + 1) * per_rank].chunks(ROW) {
            if r[0].is_nan() {
                continue;
            }
            let kind = Kind::ALL[r[0] as usize];
            let thread = r[2] as u32;
            threads.insert(thread);
            let index = r[1] as i64;
            let name = match kind {
                Kind::Iteration | Kind::BackwardIteration | Kind::Step | Kind::Labelling => {
                    format!("{} {index}", kind.name())
                }
                Kind::Group => usize::try_from(index)
                    .ok()
                    .and_then(|i| groups.get(i))
                    .map_or_else(|| format!("loop nest {index}"), |g| json_escape(g)),
                _ => kind.name().to_string(),
            };
            let args = match kind {
                Kind::Iteration | Kind::BackwardIteration => format!(r#""iteration":{index}"#),
                // `[batch, m, n, k]`, the layouts (`Aᵀ·B`), whether it adds to C.
                Kind::Gemm if !r[5].is_nan() => format!(
                    r#""batch":{},"m":{},"n":{},"k":{},"product":"{}·{}","accumulate":{}"#,
                    r[5] as u64,
                    r[6] as u64,
                    r[7] as u64,
                    r[8] as u64,
                    Layout::from_code(r[9]).written("A"),
                    Layout::from_code(r[10]).written("B"),
                    r[11] != 0.0
                ),
                _ => format!(r#""index":{index}"#),
            };
            events.push(format!(
                r#"{{"ph":"X","name":"{name}","cat":"{}","pid":{rank},"tid":{thread},"ts":{:.3},"dur":{:.3},"args":{{{args}}}}}"#,
                kind.name(),
                r[3],
                r[4],
            ));
        }
        for t in threads {
            let name = if t == 0 {
                "main".to_string()
            } else {
                format!("pool thread {t}")
            };
            events.push(format!(
                r#"{{"ph":"M","name":"thread_name","pid":{rank},"tid":{t},"args":{{"name":"{name}"}}}}"#
            ));
        }
    }
    let json = format!(
        "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{}\n]}}\n",
        events.join(",\n")
    );
    crate::files::write_file(path, json.as_bytes())
}

/// `s` inside a JSON string literal.
fn json_escape(s: &str) -> String {
    let quoted = serde_json::Value::String(s.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}
