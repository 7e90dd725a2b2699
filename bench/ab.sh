#!/usr/bin/env bash
# bench/ab.sh OLD NEW [ROUNDS] [ARGS...]: two executables of the same model (before and after a
# change), ROUNDS interleaved rounds (default 5) of `EXE --bench ARGS` each (ARGS default
# `--bench 20`); prints the median step time of each, new/old speed-up, and every round's.
# The machine is noisy: interleaving lets both see the same load.
set -euo pipefail
old=$1 new=$2 rounds=${3:-5}
shift $(( $# < 3 ? $# : 3 ))
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--bench 20)
step() { "$1" "${args[@]}" | tail -1 | python3 -c "import json,sys; print(json.load(sys.stdin)['median_step_s'])"; }
o=() n=()
for _ in $(seq "$rounds"); do
  o+=("$(step "$old")")
  n+=("$(step "$new")")
done
python3 - "${#o[@]}" "${o[@]}" "${n[@]}" <<'PY'
import statistics as st, sys
k = int(sys.argv[1]); v = [float(x) for x in sys.argv[2:]]
o, n = v[:k], v[k:]
print(f"old {st.median(o) * 1e3:.3f} ms  new {st.median(n) * 1e3:.3f} ms  "
      f"speed-up {st.median(o) / st.median(n):.2f}x  per round "
      + " ".join(f"{a / b:.2f}" for a, b in zip(o, n)))
PY
