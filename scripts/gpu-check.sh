#!/usr/bin/env bash
# The GPU check of `ppc compile --target cuda`, in two halves.
#
#   scripts/gpu-check.sh prepare [DIR]
#       On the Debian build machine, after scripts/setup.sh: builds ppc (release), compiles every
#       case below for --target cuda into DIR/bin, writes the interpreter's outputs (DIR/ref)
#       and the CPU executables' training losses, copies the shared libraries the executables
#       and MPICH's launcher need (DIR/lib), and packs it all into DIR.tar.xz (~13 MB).
#   scripts/gpu-check.sh run [DIR or DIR.tar.xz]
#       On a GPU host that has the CUDA driver, cuBLAS 12 or 13 (a CUDA toolkit's, or Python's
#       NVIDIA wheels') and Python with JAX (CUDA), nothing else (glibc 2.34 or later: Debian 12,
#       Ubuntu 22.04); about 2.5 minutes on an H200 (2026-12-04): the GPU and its managed-memory
#       attributes, the smallest case alone with every launch synchronous, the runtime's GEMMs
#       against an f64 product (examples/gpu_gemm.rs of the runtime), every case on the GPU
#       against its reference, then the bf16 transformer pipeline sized to keep an H200 busy
#       (TFLOP/s, and MFU against the measured bf16 GEMM rate of 790 TFLOP/s), then JAX's SPMD
#       GPipe of the same shape on the same GPU, then GPT-2 small's training step with its
#       optimizer on the GPU against on the host, then where the bench's step goes
#       (PPC_CUDA_PROFILE=1). Exit status 0 only when all passed; GPU_CHECK_LOGS=DIR keeps
#       every case's log.
#
# PPC_GPU_CHECK_CPU=1 prepares CPU executables instead, and a small bench shape: the same run
# half then checks this script itself on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
MODE=${1:-}
DIR=${2:-out/gpu-check}
CPU=${PPC_GPU_CHECK_CPU:-0}
PEAK_TFLOPS=790 # H200 dense bf16 GEMM rate, measured (gpu-recipe.md)
PYTHON=${PYTHON:-python3} # with NumPy and JAX

# name | model | flags | ranks: the forward cases, each checked against the interpreter.
FORWARD=(
  "tiny_f32|examples/tiny.ppc||1"
  "tiny_bf16|examples/tiny.ppc|--dtype bf16|1"
  "mlp_f32|examples/mlp.ppc||1"
  "mlp_bf16|examples/mlp.ppc|--dtype bf16|1"
  "mlp_f16|examples/mlp.ppc|--dtype f16|1"
  "mlp_circular|examples/mlp.ppc|--repeats 2|1"
  "mlp_2ranks|examples/mlp.ppc|--ranks 2|2"
  "transformer_f32|examples/transformer.ppc||1"
  "transformer_bf16|examples/transformer.ppc|--dtype bf16|1"
  "transformer_2ranks_bf16|examples/transformer.ppc|--ranks 2 --dtype bf16|2"
  # Rows a block of threads reduces (gpu_reduce.rs): softmax rows of 48 (32 threads, some
  # with two elements), layernorm rows of 96 (64 threads).
  "transformer_rows_f32|examples/transformer.ppc|--dim t=48 --dim heads=3 --dim dh=32|1"
)
# The training step: losses of 5 steps against the CPU executable's.
TRAIN=(
  "train_mlp|examples/mlp.ppc||1"
  "train_transformer_bf16|examples/transformer.ppc|--dtype bf16|1"
  # Interleaved 1F1B on one stage: the repeat's weights as views, its gradients added in place.
  "train_mlp_interleaved|examples/mlp.ppc|--schedule 1f1b --repeats 2 --stages 1|1"
  # The tick loops: 1F1B's `call_if`s into carried buffers; ZB-H1's B and W, on 2 ranks.
  "train_mlp_1f1b|examples/mlp.ppc|--schedule 1f1b|1"
  "train_mlp_zbh1_2ranks|examples/mlp.ppc|--schedule zb-h1 --ranks 2|2"
  # A language model: token embedding and head, cross-entropy, bf16; on 2 ranks the
  # embedding's and head's gradients are summed across the pipeline through the host.
  "train_gpt2_bf16|examples/gpt2.ppc|--dtype bf16|1"
  "train_gpt2_2ranks_bf16|examples/gpt2.ppc|--dtype bf16 --ranks 2|2"
)
# The bench: a decoder pipeline of 4 stages × 2 layers, d = 4096, f = 16384, 8 microbatches of
# 4 × 1024 tokens, bf16 (110 TFLOP a step); the same shape in JAX.
BENCH_DIMS="--dim b=4 --dim t=1024 --dim heads=32 --dim dh=128"
BENCH_JAX="--model transformer --b 4 --t 1024 --heads 32 --dh 128 --layers-per-stage 2 --stages 4 --microbatches 8"
# The training bench: GPT-2 small's shape (d = 768, 12 layers on 4 stages, 50304 tokens,
# 8 microbatches of 4 × 1024 tokens) in bf16, its optimizer on the GPU against on the host.
TRAIN_BENCH_DIMS="--dim b=4 --dim t=1024 --dim heads=12 --dim dh=64 --dim vocab=50304 --layers-per-stage 3 --microbatches 8"
if [ "$CPU" = 1 ]; then
  TRAIN_BENCH_DIMS="--dim b=2 --dim t=64 --dim heads=2 --dim dh=32 --layers-per-stage 3 --microbatches 8"
  BENCH_DIMS="--dim b=2 --dim t=64 --dim heads=4 --dim dh=32"
  BENCH_JAX="--model transformer --b 2 --t 64 --heads 4 --dh 32 --layers-per-stage 2 --stages 4 --microbatches 8"
fi

# The dtype a case's flags name (f32 when none).
dtype_of() {
  local d=f32
  [[ "$1" =~ --dtype\ ([a-z0-9]+) ]] && d=${BASH_REMATCH[1]}
  echo "$d"
}

prepare() {
  local ppc="$ROOT/target/release/ppc" target=(--target cuda) case name model flags ranks
  [ "$CPU" = 1 ] && target=()
  cargo build --release -q -p ppc -p ppc-exe
  cargo build --release -q -p ppc-runtime --example gpu_gemm
  rm -rf "$DIR" && mkdir -p "$DIR"/{bin,ref,lib}
  for case in "${FORWARD[@]}"; do
    IFS='|' read -r name model flags ranks <<<"$case"
    # shellcheck disable=SC2086
    "$ppc" compile "$model" $flags "${target[@]}" -o "$DIR/bin/$name" 2>/dev/null
    # The pipeline's output does not depend on how its stages are split over ranks.
    # shellcheck disable=SC2086
    "$ppc" run "$model" ${flags/--ranks 2/} --backend interp --seed 0 --output "$DIR/ref/$name.safetensors" >/dev/null 2>&1
    echo "forward $name $ranks $(dtype_of "$flags")" >>"$DIR/cases"
  done
  for case in "${TRAIN[@]}"; do
    IFS='|' read -r name model flags ranks <<<"$case"
    # shellcheck disable=SC2086
    "$ppc" compile "$model" --train $flags "${target[@]}" -o "$DIR/bin/$name" 2>/dev/null
    # The losses do not depend on the rank count: the reference runs on one rank.
    # shellcheck disable=SC2086
    "$ppc" compile "$model" --train ${flags/--ranks 2/} -o "$DIR/cpu_train" 2>/dev/null
    "$DIR/cpu_train" --steps 5 --json >"$DIR/ref/$name.jsonl"
    rm "$DIR/cpu_train"
    echo "train $name $ranks $(dtype_of "$flags")" >>"$DIR/cases"
  done
  # shellcheck disable=SC2086
  "$ppc" compile examples/transformer.ppc --dtype bf16 $BENCH_DIMS "${target[@]}" -o "$DIR/bin/bench" 2>/dev/null
  echo "$BENCH_JAX" >"$DIR/bench_jax_args"
  # shellcheck disable=SC2086
  "$ppc" compile examples/gpt2.ppc --train --dtype bf16 $TRAIN_BENCH_DIMS "${target[@]}" -o "$DIR/bin/train_bench" 2>/dev/null
  cp target/release/examples/gpu_gemm "$DIR/bin/"
  cp bench/jax_gpipe.py "$DIR/"
  strip "$DIR"/bin/*
  # The libraries outside glibc that the executables and MPICH's launcher load.
  cp /usr/bin/mpiexec.hydra /usr/bin/hydra_pmi_proxy "$DIR/bin/"
  ldd "$DIR"/bin/* 2>/dev/null | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$DIR/lib/"; done
  tar -C "$(dirname "$DIR")" -cJf "$DIR.tar.xz" "$(basename "$DIR")"
  echo "gpu-check: prepared $(wc -l <"$DIR/cases") cases and the bench in $DIR.tar.xz ($(du -h "$DIR.tar.xz" | cut -f1))"
}

# compare.py WANT GOT DTYPE: the largest difference relative to the largest reference value
# (ppc verify's measure), within the dtype's tolerance (compare.rs).
COMPARE='
import json, struct, sys
import numpy as np
def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    e = head["output"]
    raw = data[e["data_offsets"][0]:e["data_offsets"][1]]
    if e["dtype"] == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, {"F32": np.float32, "F16": np.float16}[e["dtype"]]).astype(np.float32)
want, got, dtype = read(sys.argv[1]), read(sys.argv[2]), sys.argv[3]
tol = {"f32": 1e-5, "bf16": 3.2e-2, "f16": 4e-3}[dtype]
err = float(np.max(np.abs(want - got)) / max(np.max(np.abs(want)), 1e-30))
ok = want.shape == got.shape and np.all(np.isfinite(got)) and err <= tol
print(f"{err:.2e} (tolerance {tol:.0e})")
sys.exit(0 if ok else 1)
'

# losses.py WANT GOT TOL: the losses of each step within TOL, relative.
LOSSES='
import json, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if l.startswith("{") and "loss" in l]
want, got, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
err = max(abs(w - g) / abs(w) for w, g in zip(want, got)) if want and len(want) == len(got) else float("inf")
print(f"{err:.2e} (tolerance {tol:.0e}), last loss {got[-1] if got else None}")
sys.exit(0 if err <= tol else 1)
'

run() {
  local dir=$DIR kind name ranks dtype out failed=0 line
  if [[ "$dir" == *.tar.xz ]]; then
    local tmp
    tmp=$(mktemp -d)
    tar -C "$tmp" -xJf "$dir"
    dir="$tmp/$(basename "$dir" .tar.xz)"
  fi
  dir=$(cd "$dir" && pwd)
  # cuBLAS: the newest found in Python's NVIDIA wheels (JAX's and PyTorch's) or a CUDA toolkit,
  # under the unversioned name the runtime also looks for; the driver is the host's.
  local cublas blas_dir
  cublas=$("$PYTHON" -c "
import glob, os, sys
dirs = [os.path.join(p, 'nvidia') for p in sys.path] + glob.glob('/usr/local/cuda*/lib64')
found = sorted(f for d in dirs for f in glob.glob(os.path.join(d, '**', 'libcublas.so.*'), recursive=True))
print(found[-1] if found else '')" 2>/dev/null || true)
  blas_dir=$(mktemp -d)
  [ -n "$cublas" ] && ln -s "$cublas" "$blas_dir/libcublas.so"
  export LD_LIBRARY_PATH="$dir/lib:$blas_dir${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$dir/bin:$PATH"
  "$PYTHON" -c "import numpy, jax" || { echo "gpu-check: $PYTHON needs NumPy and JAX (set PYTHON)"; return 1; }
  echo "cuBLAS: ${cublas:-not found}"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,compute_mode,mig.mode.current,memory.total,clocks.max.sm --format=csv
    nvidia-smi | grep -m1 "CUDA Version" || true
  fi
  # Managed memory: concurrent access lets the host write managed buffers while kernels run.
  "$PYTHON" -c "
import cupy
rt = cupy.cuda.runtime
names = {83: 'managedMemory', 88: 'pageableMemoryAccess', 89: 'concurrentManagedAccess',
         100: 'pageableMemoryAccessUsesHostPageTables', 101: 'directManagedMemAccessFromHost'}
print('managed memory:', ', '.join(f'{n}={rt.deviceGetAttribute(a, 0)}' for a, n in names.items()))
" 2>/dev/null || echo "managed memory: attributes not read (no CuPy)"
  # The first launch alone, with every launch synchronous: a fault is named where it happens.
  if CUDA_LAUNCH_BLOCKING=1 PPC_CUDA_SYNC=1 timeout 60 "$dir/bin/tiny_f32" --seed 0 --output "$blas_dir/tiny.safetensors" </dev/null >"$blas_dir/tiny.log" 2>&1; then
    echo "ok    tiny_f32 alone, CUDA_LAUNCH_BLOCKING=1 PPC_CUDA_SYNC=1"
  else
    echo "FAIL  tiny_f32 alone, CUDA_LAUNCH_BLOCKING=1 PPC_CUDA_SYNC=1:"
    tail -5 "$blas_dir/tiny.log"
    failed=1
  fi
  # The runtime's GEMMs on cuBLAS against an f64 product, case by case.
  timeout 120 "$dir/bin/gpu_gemm" || failed=1
  out=$(mktemp -d)
  while read -r kind name ranks dtype; do
    local launch=()
    [ "$ranks" -gt 1 ] && launch=(mpiexec.hydra -n "$ranks")
    if [ "$kind" = forward ]; then
      if timeout 120 "${launch[@]}" "$dir/bin/$name" --seed 0 --output "$out/$name.safetensors" </dev/null >"$out/$name.log" 2>&1 &&
        line=$("$PYTHON" -c "$COMPARE" "$dir/ref/$name.safetensors" "$out/$name.safetensors" "$dtype"); then
        echo "ok    $name: max relative difference to the interpreter $line"
      else
        echo "FAIL  $name: ${line:-$(tail -3 "$out/$name.log")}"
        failed=1
        # Again, waiting after every launch and GEMM: the error names the kernel.
        PPC_CUDA_SYNC=1 timeout 120 "${launch[@]}" "$dir/bin/$name" --seed 0 --output "$out/$name.sync.safetensors" </dev/null 2>&1 | tail -3 | sed 's/^/      PPC_CUDA_SYNC=1: /' || true
      fi
    else
      local tol=1e-3
      [ "$dtype" = bf16 ] && tol=3e-2
      if timeout 180 "${launch[@]}" "$dir/bin/$name" --steps 5 --json --save "$out/$name.gpu.ckpt" </dev/null >"$out/$name.jsonl" 2>"$out/$name.log" &&
        line=$("$PYTHON" -c "$LOSSES" "$dir/ref/$name.jsonl" "$out/$name.jsonl" "$tol"); then
        echo "ok    $name: losses of 5 steps against the CPU's $line"
        # The optimizer's update as the program's kernels against the host's update of the
        # same program: the same bytes (weights, moments, masters; lower/update.rs).
        if timeout 180 "${launch[@]}" "$dir/bin/$name" --steps 5 --json --host-optimizer --save "$out/$name.host.ckpt" </dev/null >/dev/null 2>"$out/$name.host.log" &&
          cmp -s "$out/$name.gpu.ckpt" "$out/$name.host.ckpt"; then
          echo "ok    $name: the update on the GPU wrote the host's bytes"
        else
          echo "FAIL  $name: the update on the GPU and the host's differ $(tail -1 "$out/$name.host.log")"
          failed=1
        fi
      else
        echo "FAIL  $name: ${line:-$(tail -3 "$out/$name.log")}"
        failed=1
      fi
    fi
    line=""
  done <"$dir/cases"
  # The output does not depend on the rank count, bit for bit, as on the CPU.
  for pair in "mlp_f32 mlp_2ranks" "transformer_bf16 transformer_2ranks_bf16"; do
    set -- $pair
    if cmp -s "$out/$1.safetensors" "$out/$2.safetensors"; then
      echo "ok    $2: the same bytes as $1"
    else
      echo "FAIL  $2: not the same bytes as $1"
      failed=1
    fi
  done
  # The bench: ppc, then JAX on the same GPU.
  local ppc_json jax_json
  ppc_json=$(timeout 200 "$dir/bin/bench" --bench 5 | tail -1) || { echo "FAIL  bench: $ppc_json"; failed=1; }
  # shellcheck disable=SC2046
  jax_json=$(timeout 150 "$PYTHON" "$dir/jax_gpipe.py" $(cat "$dir/bench_jax_args") --dtype bf16 --steps 5 | tail -1) ||
    { echo "FAIL  JAX bench"; failed=1; }
  [ -n "$ppc_json" ] && [ -n "$jax_json" ] && "$PYTHON" - "$ppc_json" "$jax_json" "$PEAK_TFLOPS" <<'PY' || true
import json, sys
ppc, jax, peak = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
# JAX's step leaves its arguments and results on the GPU: ppc's is compared without its copies.
p, j = ppc["useful_gflops_without_copies"] / 1e3, jax["useful_gflops"] / 1e3
print(f"bench transformer bf16: ppc {p:.1f} TFLOP/s ({100 * p / peak:.1f}% MFU, "
      f"{ppc['median_step_s'] * 1e3:.1f} ms/step of which {ppc['host_copy_s'] * 1e3:.1f} ms copies "
      f"between host and GPU; {ppc['useful_gflops'] / 1e3:.1f} TFLOP/s with them); "
      f"JAX {j:.1f} TFLOP/s ({100 * j / peak:.1f}% MFU, "
      f"jit {jax['jit_s']:.1f} s, {jax['devices']}); ppc/JAX {p / j:.2f}x")
PY
  # The training bench: the optimizer on the GPU (weights, gradients and its state stay there)
  # against on the host (weights in, gradients out, AdamW on the CPU every step).
  local on_gpu on_host
  on_gpu=$(timeout 200 "$dir/bin/train_bench" --steps 0 --bench 5 </dev/null 2>"$out/train_bench.log" | tail -1) || { echo "FAIL  train bench: $(tail -1 "$out/train_bench.log")"; failed=1; }
  on_host=$(timeout 200 "$dir/bin/train_bench" --steps 0 --bench 5 --host-optimizer </dev/null 2>>"$out/train_bench.log" | tail -1) || { echo "FAIL  train bench --host-optimizer"; failed=1; }
  [ -n "$on_gpu" ] && [ -n "$on_host" ] && "$PYTHON" - "$on_gpu" "$on_host" "$PEAK_TFLOPS" <<'PY' || true
import json, sys
gpu, host, peak = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
g, h = gpu["median_step_s"], host["median_step_s"]
print(f"train bench GPT-2 small bf16: optimizer on the GPU {g * 1e3:.1f} ms/step "
      f"({gpu['useful_gflops'] / 1e3:.1f} TFLOP/s, {100 * gpu['useful_gflops'] / 1e3 / peak:.1f}% MFU), "
      f"on the host {h * 1e3:.1f} ms/step; {h / g:.2f}x")
PY
  # Where the bench's forward step goes, kernel by kernel (each waited for: slower overall).
  [ "$CPU" = 1 ] || PPC_CUDA_PROFILE=1 timeout 120 "$dir/bin/bench" --seed 0 2>&1 | grep -A32 "GPU profile" || true
  # GPU_CHECK_LOGS=DIR keeps every case's log (DIR/gpu-check-logs.tar.gz).
  if [ -n "${GPU_CHECK_LOGS:-}" ]; then
    (cd "$out" && tar -czf "$GPU_CHECK_LOGS/gpu-check-logs.tar.gz" ./*.log ./*.jsonl) || true
  fi
  rm -rf "$out" "$blas_dir"
  [ "$failed" = 0 ] && echo "gpu-check: every check passed" || echo "gpu-check: FAILED"
  return "$failed"
}

case "$MODE" in
  prepare) prepare ;;
  run) run ;;
  *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
