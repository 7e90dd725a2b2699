#!/usr/bin/env bash
# `make bench`: ppc's compiled executable against JAX's SPMD GPipe (jax_gpipe.py), same model
# and shapes, in one run: ROUNDS rounds of each, interleaved (the machine is noisy). Prints the
# median forward throughput of each, their ratio, the ratio of every round, and compile times.
# Needs: a release build of ppc and ppc-exe (the Makefile does it).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-30}
ROUNDS=${ROUNDS:-3}
PPC=target/release/ppc
VENV=bench/.venv
if [ ! -x "$VENV/bin/python" ]; then
  echo "bench: installing jax[cpu] from PyPI into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "jax[cpu]"
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.readlines()[-1])['$1'])"; }

printf '%-22s %12s %12s %8s %16s %14s %12s\n' config "ppc GFLOP/s" "jax GFLOP/s" ratio "ratio per round" "ppc compile s" "jax jit s"
for cfg in "256 1024" "512 2048"; do
  set -- $cfg; d=$1; h=$2
  t0=$(date +%s.%N)
  $PPC compile examples/mlp.ppc --dim d=$d --dim h=$h -o "$OUT/mlp_$d" 2>/dev/null
  t1=$(date +%s.%N)
  # ROUNDS rounds of ppc then JAX, back to back, so that both see the same machine; the table
  # gives the median of each and the ratio of the medians.
  ppc_all=(); jax_all=(); jit_all=()
  for _ in $(seq "$ROUNDS"); do
    ppc_all+=("$("$OUT/mlp_$d" --bench "$STEPS" | tail -1 | field useful_gflops)")
    jax_json=$("$VENV/bin/python" bench/jax_gpipe.py --d $d --h $h --steps "$STEPS")
    jax_all+=("$(echo "$jax_json" | field useful_gflops)")
    jit_all+=("$(echo "$jax_json" | field jit_s)")
  done
  python3 - "$d" "$h" "$t0" "$t1" "${#ppc_all[@]}" "${ppc_all[@]}" "${jax_all[@]}" "${jit_all[@]}" <<'PY'
import statistics as st, sys
d, h, t0, t1, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
v = [float(x) for x in sys.argv[6:]]
ppc, jax, jit = v[:n], v[n:2 * n], v[2 * n:]
rounds = " ".join(f"{p / j:.2f}" for p, j in zip(ppc, jax))
print(f"{'mlp d=' + d + ' h=' + h:22s} {st.median(ppc):12.2f} {st.median(jax):12.2f} "
      f"{st.median(ppc) / st.median(jax):7.2f}x {rounds:>16s} {t1 - t0:14.2f} {st.median(jit):12.2f}")
PY
done
echo
echo "compile time of every example (ppc compile -o, release build):"
for f in examples/*.ppc; do
  t0=$(date +%s.%N); $PPC compile "$f" -o "$OUT/exe" 2>/dev/null; t1=$(date +%s.%N)
  python3 -c "print(f'  {\"$f\":28s} {$t1-$t0:.2f} s')"
done
