#!/usr/bin/env bash
# `make bench`: ppc's compiled executable against JAX's SPMD GPipe (jax_gpipe.py), same models
# (the MLP at two widths, the transformer at the example's and a larger shape; the training
# step of the MLP, of the transformer example and of GPT-2 at a size a user trains on a CPU
# (d = 256, 4 heads, 8 layers, t = 256, byte vocabulary; embedding and head outside the loop),
# with each rematerialization; and at d = 1024, 8 layers, one round each, with peak RSS and ppc's
# share of the machine's GEMM rate), in one run:
# ROUNDS rounds of each, interleaved (the machine is noisy). Prints the median throughput of
# each, their ratio, the ratio of every round, and compile times; training rows also the memory
# each keeps for the backward (ppc: the activations its report counts in the generated program;
# JAX: XLA's temporary buffers of the whole step, its only figure).
# Needs: a release build of ppc and ppc-exe (the Makefile does it).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/training_rows.sh
STEPS=${STEPS:-30}
# Each measurement times at least STEPS steps and at least MIN_SECONDS of ppc's steps (a 2 ms
# step timed 20 times is mostly noise), but no more than MAX_SECONDS of them (and at least 3):
# a row of second-long steps (GPT-2) runs fewer than STEPS. JAX runs the same number of steps.
MIN_SECONDS=${MIN_SECONDS:-1}
MAX_SECONDS=${MAX_SECONDS:-15}
# ONLY=REGEX runs only the rows whose name matches (ONLY=train: the training rows).
ONLY=${ONLY:-}
ROUNDS=${ROUNDS:-3}
PPC=target/release/ppc
VENV=${VENV:-bench/.venv}  # any virtual environment with jax[cpu] (tests/oracle/.venv has one)
if [ ! -x "$VENV/bin/python" ]; then
  echo "bench: installing jax[cpu] from PyPI into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "jax[cpu]"
fi
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.readlines()[-1])['$1'])"; }

printf '%-40s %12s %12s %8s %16s %14s %12s %6s %s\n' config "ppc GFLOP/s" "jax GFLOP/s" ratio "ratio per round" "ppc compile s" "jax jit s" steps "kept MB ppc / XLA temp MB"

# compare NAME MODEL "PPC DIMS" "JAX ARGS" [REMAT]: ROUNDS rounds of ppc then JAX, back to back,
# so that both see the same machine; one table row with the median of each and the ratio of the
# medians. With a fifth argument `stage` or `none`, the training step (forward, backward, AdamW)
# of both with that rematerialization (`--remat` of both).
compare() {
  local name=$1 model=$2 dims=$3 jax_args=$4 remat=${5:-}
  [[ $name =~ $ONLY ]] || return 0
  local t0 t1 exe="$OUT/model" ppc_flags="" run_flags="" memory=""
  if [ -n "$remat" ]; then
    ppc_flags="--train --remat $remat" run_flags="--steps 0" jax_args="$jax_args --train --remat $remat"
    # shellcheck disable=SC2086
    memory=$($PPC compile "$model" $dims $ppc_flags --report=json |
      python3 -c "import json,sys; print(json.load(sys.stdin)['training']['kept_activation_bytes_per_rank'] / 1e6)")
  fi
  # The median of three compiles: the first after JAX's runs also reads ppc's 230 MB binary
  # back into the page cache (0.6 s against 0.2 s for the MLP).
  local compiles=()
  for _ in 1 2 3; do
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    $PPC compile "$model" $dims $ppc_flags -o "$exe" 2>/dev/null
    t1=$(date +%s.%N)
    compiles+=("$(python3 -c "print($t1 - $t0)")")
  done
  local compile_s
  compile_s=$(printf '%s\n' "${compiles[@]}" | sort -n | sed -n 2p)
  local ppc_all=() jax_all=() jit_all=() jax_json ppc_json steps
  # shellcheck disable=SC2086
  steps=$("$exe" $run_flags --bench 3 | tail -1 | python3 -c "
import json, math, sys
step = json.load(sys.stdin)['median_step_s']
print(min(max($STEPS, math.ceil($MIN_SECONDS / step)), max(3, math.floor($MAX_SECONDS / step))))")
  for _ in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    ppc_json=$("$exe" $run_flags --bench "$steps" | tail -1)
    ppc_all+=("$(echo "$ppc_json" | field useful_gflops)")
    # shellcheck disable=SC2086
    jax_json=$("$VENV/bin/python" bench/jax_gpipe.py $jax_args --steps "$steps")
    jax_all+=("$(echo "$jax_json" | field useful_gflops)")
    jit_all+=("$(echo "$jax_json" | field jit_s)")
  done
  if [ -n "$remat" ]; then
    memory="$memory $(echo "$jax_json" | python3 -c "import json,sys; print(json.load(sys.stdin)['temp_bytes'] / 1e6)")"
  fi
  python3 - "$name" "$compile_s" "$memory" "$steps" "${#ppc_all[@]}" "${ppc_all[@]}" "${jax_all[@]}" "${jit_all[@]}" <<'PY'
import statistics as st, sys
name, compile_s, memory = sys.argv[1], float(sys.argv[2]), sys.argv[3]
steps, n = sys.argv[4], int(sys.argv[5])
v = [float(x) for x in sys.argv[6:]]
ppc, jax, jit = v[:n], v[n:2 * n], v[2 * n:]
rounds = " ".join(f"{p / j:.2f}" for p, j in zip(ppc, jax))
kept = " / ".join(f"{float(x):.2f}" for x in memory.split())
print(f"{name:40s} {st.median(ppc):12.2f} {st.median(jax):12.2f} "
      f"{st.median(ppc) / st.median(jax):7.2f}x {rounds:>16s} {compile_s:14.2f} {st.median(jit):12.2f} {steps:>6s} {kept}")
PY
}

# run_rss CMD...: runs CMD, prints its last line of output, then its peak RSS in MB.
run_rss() {
  python3 - "$@" <<'PY'
import resource, subprocess, sys
out = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, check=True).stdout.decode()
print(out.strip().splitlines()[-1])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e3)
PY
}

# gemm_rate: the machine's GEMM rate now, in GFLOP/s: the best two-thread rate of ppc's GEMM on
# the d = 1024 products (the `gemm` example), which #34 holds a training step's useful rate to.
gemm_rate() {
  cargo run -q --release -p ppc-runtime --example gemm -- --two-threads |
    awk 'NR > 1 && $2 > best { best = $2 } END { print best }'
}

# at_scale NAME MODEL "PPC DIMS" "JAX ARGS" [REMAT]: as `compare`, for sizes whose steps take
# seconds to a minute here: one round of SCALE_STEPS steps of each, one compile, each
# program's peak RSS (ppc's includes labelling its training batches, JAX's its runtime), and
# ppc's useful rate as a share of the machine's GEMM rate, measured just before and just after
# ppc's steps: the higher of the two (a dip while one is measured would flatter the share).
SCALE_STEPS=${SCALE_STEPS:-2}
at_scale() {
  local name=$1 model=$2 dims=$3 jax_args=$4 remat=${5:-}
  [[ $name =~ $ONLY ]] || return 0
  local exe="$OUT/model" ppc_flags="" run_flags="" t0 t1 ppc jax before after
  if [ -n "$remat" ]; then
    ppc_flags="--train --remat $remat" run_flags="--steps 0" jax_args="$jax_args --train --remat $remat"
  fi
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  $PPC compile "$model" $dims $ppc_flags -o "$exe" 2>/dev/null
  t1=$(date +%s.%N)
  before=$(gemm_rate)
  # shellcheck disable=SC2086
  ppc=$(run_rss "$exe" $run_flags --bench "$SCALE_STEPS")
  after=$(gemm_rate)
  # shellcheck disable=SC2086
  jax=$(run_rss "$VENV/bin/python" bench/jax_gpipe.py $jax_args --steps "$SCALE_STEPS")
  python3 - "$name" "$(python3 -c "print($t1 - $t0)")" "$ppc" "$jax" "$SCALE_STEPS" "$before" "$after" <<'PY'
import json, sys
name, compile_s, ppc, jax, steps = sys.argv[1], float(sys.argv[2]), *sys.argv[3:5], sys.argv[5]
before, after = float(sys.argv[6]), float(sys.argv[7])
rate = max(before, after)
(p, p_rss), (j, j_rss) = ppc.splitlines(), jax.splitlines()
p, j = json.loads(p)["useful_gflops"], json.loads(j)
print(f"{name:40s} {p:12.2f} {j['useful_gflops']:12.2f} {p / j['useful_gflops']:7.2f}x {'1 round':>16s} "
      f"{compile_s:14.2f} {j['jit_s']:12.2f} {steps:>6s} peak RSS MB {float(p_rss):.0f} / {float(j_rss):.0f}, "
      f"ppc at {p / rate:.0%} of the GEMM's {rate:.0f} GFLOP/s (before {before:.0f}, after {after:.0f})")
PY
}

for cfg in "256 1024" "512 2048"; do
  set -- $cfg
  compare "mlp d=$1 h=$2" examples/mlp.ppc "--dim d=$1 --dim h=$2" "--d $1 --h $2"
done
compare "transformer (example)" examples/transformer.ppc "" "--model transformer --b 2 --t 16 --heads 4 --dh 16"
compare "transformer b=8 t=128 h=8 dh=32" examples/transformer.ppc \
  "--dim b=8 --dim t=128 --dim heads=8 --dim dh=32" \
  "--model transformer --b 8 --t 128 --heads 8 --dh 32"
training_rows compare
at_scale "transformer d=1024" examples/transformer.ppc "$scale_dims" "$scale_jax"
for remat in none stage; do
  at_scale "train --remat=$remat: transformer d=1024" examples/transformer.ppc "$scale_dims" "$scale_jax" $remat
done
# GPT-2 at GPT-2's vocabulary (#67): d = 256, t = 256, 8 layers on 4 stages, 8 microbatches of 2,
# V = 50,304, with peak RSS (the head's and the loss's [tokens, V] values dominate it).
at_scale "train --remat=stage: gpt2 V=50304" examples/gpt2.ppc \
  "--dim t=256 --dim heads=4 --dim dh=64 --dim vocab=50304 --layers 8 --microbatches 8" \
  "--model gpt2 --b 2 --t 256 --heads 4 --dh 64 --microbatches 8 --vocab 50304" stage
echo
echo "compile time of every example (ppc compile -o, release build):"
for f in examples/*.ppc; do
  t0=$(date +%s.%N); $PPC compile "$f" -o "$OUT/exe" 2>/dev/null; t1=$(date +%s.%N)
  python3 -c "print(f'  {\"$f\":28s} {$t1-$t0:.2f} s')"
done
echo "ppc's GEMM kernels: $("$OUT/exe" --bench 1 | tail -1 | field gemm_kernels)"
