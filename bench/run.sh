#!/usr/bin/env bash
# `make bench`: ppc's compiled executable against JAX's SPMD GPipe (jax_gpipe.py), same model
# and shapes, in one run. Prints a table of forward throughput and the ratio ppc / JAX, and the
# compile time of each. Needs: a release build of ppc and ppc-exe (the Makefile does it).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-30}
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

printf '%-22s %12s %12s %8s %14s %12s\n' config "ppc GFLOP/s" "jax GFLOP/s" ratio "ppc compile s" "jax jit s"
for cfg in "256 1024" "512 2048"; do
  set -- $cfg; d=$1; h=$2
  t0=$(date +%s.%N)
  $PPC compile examples/mlp.ppc --dim d=$d --dim h=$h -o "$OUT/mlp_$d" 2>/dev/null
  t1=$(date +%s.%N)
  ppc_json=$("$OUT/mlp_$d" --bench "$STEPS" | tail -1)
  jax_json=$("$VENV/bin/python" bench/jax_gpipe.py --d $d --h $h --steps "$STEPS")
  ppc_g=$(echo "$ppc_json" | field useful_gflops)
  jax_g=$(echo "$jax_json" | field useful_gflops)
  jax_jit=$(echo "$jax_json" | field jit_s)
  ratio=$(python3 -c "print(f'{$ppc_g/$jax_g:.2f}x')")
  compile=$(python3 -c "print(f'{$t1-$t0:.2f}')")
  printf '%-22s %12.2f %12.2f %8s %14s %12.2f\n' "mlp d=$d h=$h" "$ppc_g" "$jax_g" "$ratio" "$compile" "$jax_jit"
done
echo
echo "compile time of every example (ppc compile -o, release build):"
for f in examples/*.ppc; do
  t0=$(date +%s.%N); $PPC compile "$f" -o "$OUT/exe" 2>/dev/null; t1=$(date +%s.%N)
  python3 -c "print(f'  {\"$f\":28s} {$t1-$t0:.2f} s')"
done
