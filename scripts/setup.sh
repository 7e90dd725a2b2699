#!/usr/bin/env bash
# Installs the Debian packages ppc needs, skipping those already installed.
# Used by `make run`, `make test` and .ci/run; safe to run again.
set -euo pipefail

# LLVM/MLIR 22 for the MLIR lowering (melior / mlir-sys 220) and what they link against
# (tblgen links Polly); LLVM's lld, which links executables (0.07 s for the MLP against gold's 0.17 s; gold, from
# binutils, when lld is missing); binutils' objdump, with which the tests look for AVX-512 in
# baseline executables; MPICH for executables run under mpirun (the `mpi` crate builds against
# mpicc.mpich, executables link libmpich, tests launch mpirun.mpich); LLVM's OpenMP runtime,
# the one thread pool of generated code and the runtime (libomp-22-dev; Debian has it bring the
# ABI-compatible libomp.so.5 of libomp5-19); OpenBLAS, which the runtime's GEMM example times
# ppc's own GEMM against (executables do not link it); Debian's fortune cookies, the texts the
# README's language model trains on (its commands run in tests/suite/guides.rs); GNU time,
# whose peak RSS the tests read (a token stream's size must not show in it).
PACKAGES=(
  llvm-22 llvm-22-dev libmlir-22-dev mlir-22-tools libclang-22-dev libpolly-22-dev lld-22
  libzstd-dev libz3-dev libxml2-dev
  mpich libmpich-dev binutils libomp-22-dev libopenblas-pthread-dev time
  fortunes
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# NumPy and JAX's CPU wheel for the independent oracle of the tests (tests/oracle/oracle.py:
# outputs in NumPy, a training step's gradients in JAX), from PyPI into a virtual environment
# of the project's own; skipped when it is there.
oracle_venv() {
  local venv tests_dir
  tests_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/oracle"
  venv="$tests_dir/.venv"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import numpy, jax" 2>/dev/null; then
    return 0
  fi
  echo "setup: installing numpy and jax[cpu] from PyPI into tests/oracle/.venv" >&2
  if ! python3 -m venv "$venv"; then
    # Debian's own python3 keeps venv in a package of its own.
    rm -rf "$venv"
    ${SUDO:-} apt-get update -qq && ${SUDO:-} apt-get install -y -qq --no-install-recommends python3-venv
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q numpy "jax[cpu]"
}

# CUDA's ptxas and libdevice from PyPI's nvidia-cuda-nvcc-cu12 wheel (no GPU or driver needed),
# unpacked into tools/cuda-nvcc: `ppc compile --target cuda` links libdevice's math functions
# into its kernels, and the tests assemble every generated kernel with ptxas.
cuda_tools() {
  local root dir wheel
  root="$(cd "$(dirname "$0")/.." && pwd)"
  dir="$root/tools/cuda-nvcc"
  if [ -x "$dir/nvidia/cuda_nvcc/bin/ptxas" ] && [ -f "$dir/nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc" ]; then
    return 0
  fi
  echo "setup: unpacking nvidia-cuda-nvcc-cu12 (ptxas, libdevice) from PyPI into tools/cuda-nvcc" >&2
  rm -rf "$dir" && mkdir -p "$dir/wheel"
  "$root/tests/oracle/.venv/bin/pip" download -q --no-deps -d "$dir/wheel" nvidia-cuda-nvcc-cu12==12.9.86
  wheel=$(ls "$dir"/wheel/*.whl)
  python3 -m zipfile -e "$wheel" "$dir"
  rm -rf "$dir/wheel"
  chmod +x "$dir/nvidia/cuda_nvcc/bin/ptxas"
}

if [ ${#missing[@]} -eq 0 ]; then
  oracle_venv
  cuda_tools
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
oracle_venv
cuda_tools
