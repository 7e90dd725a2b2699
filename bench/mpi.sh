#!/usr/bin/env bash
# `make bench-mpi`: the same model on 1 rank and on 2 ranks (mpirun.mpich, stages split by
# `ppc compile --ranks`), mlp and its wider variant. Prints throughput, the ratio 2 ranks / 1
# rank, and where each rank's step went (computing, waiting in exchanges, measured bubble).
# Then the MLP's training step under each compiled schedule (gpipe; 1f1b with --remat stage
# and tick; zb-h1 with stage and none; gpipe and interleaved 1f1b on a circular pipeline of
# 2 repeats), against GPipe on 1 rank on the same cores.
# Needs: a release build of ppc and ppc-exe (the Makefile does it).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-30}
train_base=""
PPC=target/release/ppc
OUT=$(mktemp -d)
# The runs' progress goes to a log, shown only if the script fails.
LOG="$OUT/runs.log"
trap 'status=$?; if [ $status -ne 0 ] && [ -s "$LOG" ]; then
  echo "bench-mpi failed; the runs last printed:" >&2; tail -n 20 "$LOG" >&2; fi; rm -rf "$OUT"' EXIT
summary() {
  python3 -c '
import json, sys
j = json.loads([l for l in sys.stdin if l.startswith("{")][-1])
ranks = "  ".join(
    "r%d: compute %.2f ms, wait %.2f ms, bubble %.3f"
    % (r["rank"], r["compute_s"] * 1e3, r["exchange_wait_s"] * 1e3, r["measured_bubble"])
    for r in j["per_rank"])
print("%.2f %.2f %s" % (j["useful_gflops"], j["median_step_s"] * 1e3, ranks))'
}
printf '%-20s %6s %12s %10s %8s  %s\n' config ranks "GFLOP/s" "step ms" "vs 1" "per rank"
for cfg in "256 1024" "512 2048"; do
  set -- $cfg; d=$1; h=$2
  base=""
  for ranks in 1 2; do
    $PPC compile examples/mlp.ppc --dim d=$d --dim h=$h --ranks $ranks -o "$OUT/mlp_$ranks" 2>/dev/null
    read -r gflops step rest < <(mpirun.mpich -n $ranks "$OUT/mlp_$ranks" --bench "$STEPS" 2>>"$LOG" | summary)
    base=${base:-$gflops}
    ratio=$(python3 -c "print(f'{$gflops/$base:.2f}x')")
    printf '%-20s %6s %12s %10s %8s  %s\n' "mlp d=$d h=$h" "$ranks" "$gflops" "$step" "$ratio" "$rest"
  done
done

# schedule:remat:repeats; repeats 2 is the same 4 layers as a circular pipeline of 2 stages
# (one per rank on 2 ranks), under 1f1b the interleaved order.
for entry in gpipe:stage:1 1f1b:stage:1 1f1b:tick:1 zb-h1:stage:1 zb-h1:none:1 gpipe:stage:2 1f1b:stage:2; do
  IFS=: read -r schedule remat repeats <<< "$entry"
  stages=$((4 / repeats))
  for ranks in 1 2; do
    exe="$OUT/train_${schedule}_${remat}_${repeats}_$ranks"
    $PPC compile examples/mlp.ppc --train --schedule $schedule --remat $remat --repeats $repeats \
      --stages $stages --dim d=256 --dim h=1024 --ranks $ranks -o "$exe" 2>/dev/null
    read -r gflops step rest < <(mpirun.mpich -n $ranks "$exe" --bench "$STEPS" 2>>"$LOG" | summary)
    train_base=${train_base:-$gflops}
    ratio=$(python3 -c "print(f'{$gflops/$train_base:.2f}x')")
    label="train $schedule $remat"
    [ "$repeats" = 1 ] || label="$label R=$repeats"
    printf '%-20s %6s %12s %10s %8s  %s\n' "$label" "$ranks" "$gflops" "$step" "$ratio" "$rest"
  done
done
