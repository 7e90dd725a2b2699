"""A cost model of training schedules run as one lockstep loop (BENCHMARKS.md, 2026-12-06, "the
training compile under JAX's jit at every size"): each tick lasts as long as the busiest rank's
work in it, a rank holding `S / ranks` consecutive stages. F, B and W cost one unit each, B two
with `--remat stage` (it recomputes the stage's forward). Prints, per order, a rank's share of
the work over the sum of its ticks; and, as "dataflow", the same share if the exchanges did not
hold the ranks in step: each rank runs its ticks' work in order (a tick's F, then B, then W),
each unit starting once the unit it needs from the neighbouring stage is done (would asynchronous
exchanges reach #32's 0.95? BENCHMARKS.md, 2026-12-06, "what bounds the d = 1024 training step",
answers no).

The orders: the compiled parity order of `--schedule 1f1b` and `zb-h1` (one_f_one_b.rs: stage g
runs the forward of entering microbatch n in tick g + 2n, its backward in 2S - 1 - g + 2n, and
under zb-h1 its W in the tick after; also with W cut in two halves, one in each tick, which is
not built), and the drawn timetables of `ppc schedule`, one unit a tick.

    python3 bench/lockstep_model.py [STAGES MICROBATCHES RANKS]   # default: make bench-mpi's 4 8 2
"""
import subprocess
import sys


def parity_order(stages, microbatches, split_w=False):
    """Per tick and stage, the phases it runs; with `split_w`, half of each W's weights in the
    backward tick, after B, and half in the forward tick after it (not built: a candidate)."""
    ticks = [[[] for _ in range(stages)] for _ in range(2 * (microbatches + stages - 1) + 1)]
    for g in range(stages):
        for n in range(microbatches):
            ticks[g + 2 * n][g].append("F")
            backward = 2 * stages - 1 - g + 2 * n
            ticks[backward][g].append("B")
            if split_w:
                ticks[backward][g].append("w")
                ticks[backward + 1][g].append("w")
            else:
                ticks[backward + 1][g].append("W")
    return ticks


def drawn(schedule, stages, microbatches):
    """`ppc schedule --schedule SCHEDULE`'s table, as phases per tick and stage."""
    text = subprocess.run(
        ["target/release/ppc", "schedule", "examples/mlp.ppc", "--schedule", schedule,
         "--stages", str(stages), "--microbatches", str(microbatches)],
        check=True, capture_output=True, text=True).stdout
    rows = [line.split()[2:] for line in text.splitlines()
            if line.startswith("stage ") and line.split()[1].isdigit()]
    return [[[] if row[t] == ".." else [row[t][0]] for row in rows] for t in range(len(rows[0]))]


def efficiency(ticks, stages, microbatches, ranks, b_cost):
    cost = {"F": 1, "B": b_cost, "W": 1, "w": 0.5}
    per_rank = stages // ranks
    total = sum(
        max(sum(cost[p] for s in range(r * per_rank, (r + 1) * per_rank) for p in tick[s])
            for r in range(ranks))
        for tick in ticks)
    work = per_rank * microbatches * (2 + b_cost)
    return work / total


def dataflow(ticks, stages, microbatches, ranks, b_cost):
    """A rank's share of the work when each unit waits only for what it reads: F for the
    previous stage's F of its microbatch, B for its own F and the next stage's B, W for its B;
    a rank runs its units in the table's order."""
    cost = {"F": 1, "B": b_cost, "W": 1, "w": 0.5}
    per_rank = stages // ranks
    seen, done, clock = {}, {}, [0.0] * ranks
    phase = {"F": 0, "B": 1, "W": 2, "w": 2}
    for tick in ticks:
        for r in range(ranks):
            units = []
            for s in range(r * per_rank, (r + 1) * per_rank):
                for p in tick[s]:
                    n = seen.get((p, s), 0)
                    seen[(p, s)] = n + 1
                    units.append((phase[p], s if p == "F" else -s, p, s, n if p != "w" else n // 2))
            for _, _, p, s, n in sorted(units):
                ready = 0.0
                if p == "F" and s > 0:
                    ready = done[("F", s - 1, n)]
                elif p == "B":
                    ready = max(done[("F", s, n)], done.get(("B", s + 1, n), 0.0))
                elif p in "Ww":
                    ready = done[("B", s, n)]
                clock[r] = max(clock[r], ready) + cost[p]
                done[(p, s, n)] = clock[r]
    return per_rank * microbatches * (2 + b_cost) / max(clock)


def main():
    stages, microbatches, ranks = (int(a) for a in (sys.argv[1:4] or (4, 8, 2)))
    orders = {
        "compiled parity order (1f1b, zb-h1)": parity_order(stages, microbatches),
        "parity order, W split over both ticks": parity_order(stages, microbatches, True),
        "drawn zb-h1 timetable": drawn("zb-h1", stages, microbatches),
        "drawn 1f1b timetable": drawn("1f1b", stages, microbatches),
    }
    print(f"S={stages} M={microbatches} ranks={ranks}: a rank's work over its ticks")
    print(f"{'order':40s} {'--remat none':>13s} {'--remat stage':>14s} {'dataflow none':>14s} {'stage':>6s}")
    for name, ticks in orders.items():
        none, stage = (efficiency(ticks, stages, microbatches, ranks, b) for b in (1, 2))
        f_none, f_stage = (dataflow(ticks, stages, microbatches, ranks, b) for b in (1, 2))
        print(f"{name:40s} {none:13.3f} {stage:14.3f} {f_none:14.3f} {f_stage:6.3f}")


if __name__ == "__main__":
    main()
