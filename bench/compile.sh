#!/usr/bin/env bash
# `make bench-compile`: the time to a runnable training step, ppc's `ppc compile -o` against
# JAX's jit (`lower(...).compile()`, bench/jax_gpipe.py --steps 0), for every training row of
# `make bench` (#34 item 3: compile ≤ jit at every size). ROUNDS rounds, ppc and JAX back to
# back in each; prints the median of each and their ratio (above 1: ppc slower). Runs nothing
# but the compilers, so the whole table takes a few minutes, not `make bench`'s hour.
# Needs: a release build of ppc and ppc-exe (the Makefile does it).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/training_rows.sh
ROUNDS=${ROUNDS:-3}
PPC=${PPC:-target/release/ppc}  # PPC=path: another build of ppc (a base to compare)
VENV=${VENV:-bench/.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "bench-compile: installing jax[cpu] from PyPI into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "jax[cpu]"
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

printf '%-44s %10s %10s %12s\n' "training step" "ppc s" "jax jit s" "ppc / jit"
# row NAME MODEL "PPC DIMS" "JAX ARGS" REMAT
row() {
  local name=$1 model=$2 dims=$3 jax_args=$4 remat=$5 ppc_all=() jit_all=() t0 t1
  for _ in $(seq "$ROUNDS"); do
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    $PPC compile "$model" $dims --train --remat "$remat" -o "$OUT/exe" 2>/dev/null
    t1=$(date +%s.%N)
    ppc_all+=("$(python3 -c "print($t1 - $t0)")")
    # shellcheck disable=SC2086
    jit_all+=("$("$VENV/bin/python" bench/jax_gpipe.py $jax_args --train --remat "$remat" --steps 0 |
      python3 -c "import json,sys; print(json.loads(sys.stdin.readlines()[-1])['jit_s'])")")
  done
  python3 - "$name" "${#ppc_all[@]}" "${ppc_all[@]}" "${jit_all[@]}" <<'PY'
import statistics as st, sys
name, n = sys.argv[1], int(sys.argv[2])
v = [float(x) for x in sys.argv[3:]]
ppc, jit = st.median(v[:n]), st.median(v[n:])
print(f"{name:44s} {ppc:10.2f} {jit:10.2f} {ppc / jit:11.2f}x")
PY
}

training_rows row
for remat in stage none; do
  row "train --remat=$remat: transformer d=1024" examples/transformer.ppc "$scale_dims" "$scale_jax" $remat
done
