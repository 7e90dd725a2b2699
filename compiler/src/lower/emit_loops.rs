//! The loops the emitter writes around loop nests: `scf.for` and `scf.if` on the host, loops
//! whose stack is given back each iteration (`--target cuda`), regions outlined into functions
//! of their own, the parallel loop over a call's stages (`stage_split.rs`) and over a chain's
//! batch entries (`batch_split.rs`), with the round-robin thread loop both run in.

use super::buf::Buf;
use super::emit::Emitter;
use super::nest::{Entries, Split};
use ppc_dialect::Type;

impl Emitter<'_> {
    /// Opens a loop over `stages` (`stage_split.rs`). Until [`Emitter::end_stage_split`], code
    /// sees each stage's slices; with `parallel`, the stages run in parallel, buffers are
    /// allocated per stage and loop nests are not made parallel themselves; otherwise the
    /// stages run in turn, sharing their buffers, each loop nest parallel as outside.
    ///
    /// With `active` (the call's stage mask, where a bubble stage only fills its results), the
    /// parallel stages are dealt out by the mask: thread `j` of `T` takes the active stages
    /// `j, j + T, ...` in stage order, and the bubble stages by index. The ticked schedules
    /// (1F1B, ZB-H1) run every other stage in a phase: dealt out by index, stages 0 and 2 of 4
    /// would both fall to thread 0, which would run them in turn while thread 1 waits; dealt
    /// out by the mask, the transformer example's 1F1B step on one rank with two threads runs
    /// 1.4–1.5× faster (`./t --bench 20` of `ppc compile examples/transformer.ppc --train
    /// --schedule 1f1b -o t`; BENCHMARKS.md, 2026-12-06).
    pub fn begin_stage_split(&mut self, stages: u64, parallel: bool, active: Option<&Buf>) {
        let (iv, active_seen) = match (parallel, active) {
            (true, Some(mask)) => {
                let (iv, seen) = self.begin_dealt_out(stages, mask);
                (iv, Some(seen))
            }
            (true, None) => (self.begin_round_robin(stages), None),
            (false, _) => {
                let (lo, hi, one) = (self.index(0), self.index(stages), self.index(1));
                let iv = self.fresh();
                self.open(&format!("scf.for {iv} = {lo} to {hi} step {one} {{"));
                (iv, None)
            }
        };
        self.nest.split = Some(Split {
            stages,
            iv,
            parallel,
            active_seen,
        });
    }

    pub fn end_stage_split(&mut self) {
        let split = self
            .nest
            .split
            .take()
            .expect("begin_stage_split opened the loop");
        if let Some(seen) = split.active_seen {
            self.close();
            self.raw(&format!("scf.yield {seen} : index"));
            self.close();
            self.end_round_robin("stages");
        } else if split.parallel {
            self.close();
            self.end_round_robin("stages");
        } else {
            self.indent -= 1;
            let close = format!("}} {{ppc.in_turn_over = \"stages\"}}{}", self.loc);
            self.raw(&close);
        }
    }

    /// Opens the parallel loop over `count` stages dealt out by `mask` (`i1[count]`, see
    /// [`Emitter::begin_stage_split`]): each thread walks every stage, counting the active
    /// ones, and runs those that fall to it. Returns the stage's index and the count after
    /// it, which the walk's `scf.yield` carries ([`Emitter::end_stage_split`] writes it).
    fn begin_dealt_out(&mut self, count: u64, mask: &Buf) -> (String, String) {
        let (lo, hi, one) = (self.index(0), self.index(count), self.index(1));
        let (thread, team) = self.open_team(&lo, &hi, &one);
        let (iv, seen) = (self.fresh(), self.fresh());
        let walked = self.fresh();
        self.open(&format!(
            "{walked} = scf.for {iv} = {lo} to {hi} step {one} iter_args({seen} = {lo}) -> (index) {{"
        ));
        let active = self.let_(&format!("memref.load {}[{iv}] : {}", mask.name, mask.mty()));
        let turn = self.let_(&format!("arith.select {active}, {seen}, {iv} : index"));
        let owner = self.let_(&format!("arith.remui {turn}, {team} : index"));
        let mine = self.let_(&format!("arith.cmpi eq, {owner}, {thread} : index"));
        let counted = self.let_(&format!("arith.addi {seen}, {one} : index"));
        let next = self.let_(&format!("arith.select {active}, {counted}, {seen} : index"));
        self.open(&format!("scf.if {mine} {{"));
        (iv, next)
    }

    /// Closes the parallel loop of [`Emitter::begin_round_robin`], marked with what it runs
    /// over (`ppc.parallel_over`, for readers of the MLIR and tests).
    pub(super) fn end_round_robin(&mut self, over: &str) {
        self.indent -= 1;
        let close = format!("}} {{ppc.parallel_over = \"{over}\"}}{}", self.loc);
        self.raw(&close);
    }

    /// Opens a loop over `count` iterations that run in parallel, thread `j` of `T` taking
    /// iterations `j, j + T, ...` (the stages at work in a pipeline iteration are consecutive,
    /// so in the fill and drain too they spread over the threads as evenly as they can).
    /// Returns the iteration's index; close the inner loop, then [`Emitter::end_round_robin`].
    pub(super) fn begin_round_robin(&mut self, count: u64) -> String {
        let (lo, hi, one) = (self.index(0), self.index(count), self.index(1));
        let (thread, team) = self.open_team(&lo, &hi, &one);
        let iv = self.fresh();
        self.open(&format!("scf.for {iv} = {thread} to {hi} step {team} {{"));
        iv
    }

    /// Opens the parallel loop over the threads that share the `hi` iterations from `lo` (at
    /// most one thread each); returns the thread's index and the team's size. Close with
    /// [`Emitter::end_round_robin`].
    fn open_team(&mut self, lo: &str, hi: &str, one: &str) -> (String, String) {
        self.declarations
            .insert("func.func private @omp_get_max_threads() -> i32".into());
        let threads = self.let_("func.call @omp_get_max_threads() : () -> i32");
        let threads = self.let_(&format!("arith.index_cast {threads} : i32 to index"));
        let team = self.let_(&format!("arith.minsi {threads}, {hi} : index"));
        let team = self.let_(&format!("arith.maxsi {team}, {one} : index"));
        let thread = self.fresh();
        self.open(&format!(
            "scf.parallel ({thread}) = ({lo}) to ({team}) step ({one}) {{"
        ));
        self.nest.thread_body = (self.body.len(), self.indent);
        (thread, team)
    }

    /// Opens a parallel loop over the entries of leading axes of sizes `prefix`, each entry
    /// `tile` of them (`batch_split.rs`); returns the index of an entry's first element along
    /// each axis. Until [`Emitter::end_entries`], buffers are allocated once per thread (at the
    /// top of its part of the loop) and loop nests are not made parallel themselves.
    pub fn begin_entries(&mut self, prefix: &[u64], tile: &[u64]) -> Vec<String> {
        let counts: Vec<u64> = prefix.iter().zip(tile).map(|(p, t)| p / t).collect();
        let mut entry = self.begin_round_robin(counts.iter().product());
        let mut ivs = vec![String::new(); prefix.len()];
        for (i, (&count, &size)) in counts.iter().zip(tile).enumerate().rev() {
            let n = self.index(count);
            ivs[i] = self.let_(&format!("arith.remui {entry}, {n} : index"));
            if size > 1 {
                let size = self.index(size);
                ivs[i] = self.let_(&format!("arith.muli {}, {size} : index", ivs[i]));
            }
            entry = self.let_(&format!("arith.divui {entry}, {n} : index"));
        }
        self.nest.entries = Some(Entries {
            prefix: prefix.to_vec(),
            tile: tile.to_vec(),
            frees: Vec::new(),
        });
        ivs
    }

    pub fn end_entries(&mut self) {
        let entries = self
            .nest
            .entries
            .take()
            .expect("begin_entries opened the loop");
        self.close();
        for free in entries.frees {
            self.raw(&free);
        }
        self.end_round_robin("entries");
    }

    /// Inside a stage-parallel loop: the current stage's slice of `b`, the buffer of a value of
    /// type `ty`, when `ty` has the stage axis (kept, of size 1); `b` itself otherwise, and
    /// outside such a loop.
    pub fn stage_slice(&mut self, b: &Buf, ty: &Type) -> Buf {
        match (&self.nest.split, ty.stage_axis()) {
            (Some(split), Some((axis, _))) => {
                let iv = split.iv.clone();
                self.slot(b, &iv, axis, true)
            }
            _ => b.clone(),
        }
    }

    /// Enters an `scf.for %i = 0 to trips`; returns the induction variable.
    pub fn begin_for(&mut self, trips: u64) -> String {
        let (lo, hi, one) = (self.index(0), self.index(trips), self.index(1));
        let iv = self.fresh();
        self.raw(&format!("scf.for {iv} = {lo} to {hi} step {one} {{"));
        self.indent += 1;
        self.nest.loops += 1;
        if let Some(g) = self.gpu.as_mut() {
            g.residency.enter_loop();
        }
        iv
    }

    /// `scf.if` on the 0-d `i1` buffer `cond`; close it with [`Emitter::end_if`].
    pub fn begin_if(&mut self, cond: &Buf) {
        self.host_reads(cond);
        let c = self.let_(&format!("memref.load {}[] : {}", cond.name, cond.mty()));
        self.raw(&format!("scf.if {c} {{"));
        self.indent += 1;
    }

    /// Ends the `then` region of an `scf.if` and opens its `else` region.
    pub fn begin_else(&mut self) {
        self.indent -= 1;
        self.raw("} else {");
        self.indent += 1;
    }

    pub fn end_if(&mut self) {
        self.close();
    }

    /// Ends an `scf.if` whose `then` region a bubble stage skips, marked `ppc.skips_bubbles`
    /// (for readers of the MLIR and tests).
    pub fn end_bubble_if(&mut self) {
        self.indent -= 1;
        let close = format!("}} {{ppc.skips_bubbles}}{}", self.loc);
        self.raw(&close);
    }

    /// Opens the region the module's transform script outlines into a function of its own
    /// (`transform.loop.outline`: a stage's body, not inlined into the pipeline loop; its
    /// arguments are the buffers and indices it uses from outside).
    pub fn begin_outlined(&mut self) {
        self.open("scf.execute_region {");
    }

    /// Ends the region [`Emitter::begin_outlined`] opened, marked `ppc.outline`.
    pub fn end_outlined(&mut self) {
        self.op("scf.yield");
        self.indent -= 1;
        let close = format!("}} {{ppc.outline}}{}", self.loc);
        self.raw(&close);
    }

    pub fn end_for(&mut self) {
        self.nest.loops -= 1;
        if let Some(g) = self.gpu.as_mut() {
            g.residency.exit_loop();
        }
        self.close();
    }

    /// Enters the loop of an IR `loop` op (the pipeline's iterations, a stage's layers), which
    /// the host runs; returns the induction variable. For `--target cuda` each iteration saves
    /// the stack pointer and restores it at its end: the host's kernel launches and runtime
    /// calls put their argument arrays and memref descriptors on the stack at each call (they
    /// are made later, by `gpu-to-llvm` and `finalize-memref-to-llvm`, so an
    /// `memref.alloca_scope`, which canonicalization drops while it holds no `alloca`, cannot
    /// scope them), and the stack would otherwise grow with every iteration. On the CPU the
    /// stage function and OpenMP's regions scope them.
    pub fn begin_host_loop(&mut self, trips: u64) -> String {
        let iv = self.begin_for(trips);
        if self.gpu.is_some() {
            let saved = self.let_("llvm.intr.stacksave : !llvm.ptr");
            self.nest.saved_stacks.push(saved);
        }
        iv
    }

    /// Ends the loop [`Emitter::begin_host_loop`] opened.
    pub fn end_host_loop(&mut self) {
        if self.gpu.is_some() {
            let saved = self
                .nest
                .saved_stacks
                .pop()
                .expect("begin_host_loop saved it");
            self.op(&format!("llvm.intr.stackrestore {saved} : !llvm.ptr"));
        }
        self.end_for();
    }
}
