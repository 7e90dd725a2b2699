#!/usr/bin/env bash
# `make bench-mpi`: the same model on 1 rank and on 2 ranks (mpirun.mpich, stages split by
# `ppc compile --ranks`), mlp and its wider variant. Prints throughput, the ratio 2 ranks / 1
# rank, and where each rank's step went (computing, waiting in exchanges, measured bubble).
# Then the MLP's training step under each compiled schedule (gpipe; 1f1b with --remat stage
# and tick; zb-h1 with stage and none; gpipe and interleaved 1f1b on a circular pipeline of
# 2 repeats), against GPipe on 1 rank on the same cores.
#
# The machine is shared: one rank's vCPU can run a third slower than the other's for a while.
# So every executable runs ROUNDS times (default 3), the rounds interleaved (each round runs
# every executable once, its baseline first), and each row gives the median step, the median
# of its per-round ratios to the baseline of the same round, and their range. The per-rank
# columns are those of the row's median round.
# Needs: a release build of ppc and ppc-exe (the Makefile does it).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-30}
ROUNDS=${ROUNDS:-3}
PPC=target/release/ppc
OUT=$(mktemp -d)
# The runs' progress goes to a log, shown only if the script fails.
LOG="$OUT/runs.log"
trap 'status=$?; if [ $status -ne 0 ] && [ -s "$LOG" ]; then
  echo "bench-mpi failed; the runs last printed:" >&2; tail -n 20 "$LOG" >&2; fi; rm -rf "$OUT"' EXIT

# Each row: label|ranks|baseline (the label of the row whose ratio is 1)|ppc compile arguments.
rows=()
for cfg in "256 1024" "512 2048"; do
  set -- $cfg
  for ranks in 1 2; do
    rows+=("mlp d=$1 h=$2|$ranks|mlp d=$1 h=$2 1|examples/mlp.ppc --dim d=$1 --dim h=$2 --ranks $ranks")
  done
done
# schedule:remat:repeats; repeats 2 is the same 4 layers as a circular pipeline of 2 stages
# (one per rank on 2 ranks), under 1f1b the interleaved order.
for entry in gpipe:stage:1 1f1b:stage:1 1f1b:tick:1 zb-h1:stage:1 zb-h1:none:1 gpipe:stage:2 1f1b:stage:2; do
  IFS=: read -r schedule remat repeats <<< "$entry"
  label="train $schedule $remat"
  [ "$repeats" = 1 ] || label="$label R=$repeats"
  for ranks in 1 2; do
    rows+=("$label|$ranks|train gpipe stage 1|examples/mlp.ppc --train --schedule $schedule \
--remat $remat --repeats $repeats --stages $((4 / repeats)) --dim d=256 --dim h=1024 --ranks $ranks")
  done
done

for i in "${!rows[@]}"; do
  IFS='|' read -r _ _ _ args <<< "${rows[$i]}"
  # shellcheck disable=SC2086 # the arguments are words
  $PPC compile $args -o "$OUT/exe_$i" 2>>"$LOG"
done
for round in $(seq "$ROUNDS"); do
  for i in "${!rows[@]}"; do
    IFS='|' read -r _ ranks _ _ <<< "${rows[$i]}"
    mpirun.mpich -n "$ranks" "$OUT/exe_$i" --bench "$STEPS" 2>>"$LOG" | grep '^{' | tail -n 1 \
      > "$OUT/round${round}_$i.json"
  done
done

python3 - "$OUT" "$ROUNDS" "${rows[@]}" <<'PY'
import json, statistics, sys
out, rounds, rows = sys.argv[1], int(sys.argv[2]), [r.split("|") for r in sys.argv[3:]]
runs = [[json.load(open(f"{out}/round{k}_{i}.json")) for k in range(1, rounds + 1)]
        for i in range(len(rows))]
row_of = {f"{label} {ranks}": i for i, (label, ranks, _, _) in enumerate(rows)}
print("%-20s %6s %10s %10s %8s %13s  %s" % (
    "config", "ranks", "GFLOP/s", "step ms", "vs 1", "range", f"per rank (median of {rounds} rounds)"))
for i, (label, ranks, base, _) in enumerate(rows):
    base_runs = runs[row_of[base]]
    ratios = [r["useful_gflops"] / b["useful_gflops"] for r, b in zip(runs[i], base_runs)]
    by_step = sorted(runs[i], key=lambda r: r["median_step_s"])
    median = by_step[len(by_step) // 2]
    per_rank = "  ".join(
        "r%d: compute %.2f ms, wait %.2f ms, bubble %.3f"
        % (r["rank"], r["compute_s"] * 1e3, r["exchange_wait_s"] * 1e3, r["measured_bubble"])
        for r in median["per_rank"])
    print("%-20s %6s %10.2f %10.2f %7.2fx %13s  %s" % (
        label, ranks, median["useful_gflops"], median["median_step_s"] * 1e3,
        statistics.median(ratios), "%.2f-%.2fx" % (min(ratios), max(ratios)), per_rank))
PY
