//! `ppc compile --time-passes`: where compile time goes, phase by phase (each ppc pass, the MLIR
//! parse and pipeline, the translation to LLVM IR, LLVM's optimization and code generation, the link).
//!
//! Phases record into this thread's collector while one is started, and cost nothing otherwise,
//! so the code that does the work only wraps itself in [`phase`].

use std::cell::RefCell;
use std::time::{Duration, Instant};

thread_local! {
    static PHASES: RefCell<Option<Vec<(String, Duration)>>> = const { RefCell::new(None) };
}

/// Collects this thread's phases until finished or dropped.
pub struct Collector(());

/// Starts collecting on this thread.
pub fn start() -> Collector {
    PHASES.with(|p| *p.borrow_mut() = Some(Vec::new()));
    Collector(())
}

impl Collector {
    /// Stops collecting; the phases in the order they ran.
    pub fn finish(self) -> Vec<(String, Duration)> {
        PHASES.with(|p| p.borrow_mut().take()).unwrap_or_default()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        PHASES.with(|p| p.borrow_mut().take());
    }
}

/// Runs `f`, recording its time as `name` if collecting.
pub fn phase<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let result = f();
    let took = t.elapsed();
    PHASES.with(|p| {
        if let Some(v) = p.borrow_mut().as_mut() {
            v.push((name.to_string(), took));
        }
    });
    result
}

/// The phases as a table: seconds, share of the total, name; the total last.
pub fn table(phases: &[(String, Duration)]) -> String {
    let total: Duration = phases.iter().map(|(_, d)| *d).sum();
    let mut s = String::from("  seconds   share  phase\n");
    for (name, d) in phases {
        let share = 100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-12);
        s.push_str(&format!("{:9.4} {share:6.1}%  {name}\n", d.as_secs_f64()));
    }
    s.push_str(&format!(
        "{:9.4} {:6.1}%  total\n",
        total.as_secs_f64(),
        100.0
    ));
    s
}
