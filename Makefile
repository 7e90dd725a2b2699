# ppc: thin targets over cargo. `make run` and `make test` install missing system packages first.
CARGO ?= cargo
MODEL ?= examples/mlp.ppc

.PHONY: setup build run test lint fmt bless bench bench-compile bench-mpi ci loc

setup:
	@scripts/setup.sh

## The compiler and the runtime library that executables link (target/release/).
build: setup
	$(CARGO) build --release -p ppc -p ppc-exe

## The main job: compile the MLP example through MLIR and run it on the CPU.
run: build
	target/release/ppc run $(MODEL)

## Every test (CI=true: missing or changed snapshots fail). Executables link target/debug/libppc_exe.a;
## the commands of the README and docs/ run target/debug/ppc (tests/suite/guides.rs).
test: setup
	$(CARGO) build -p ppc -p ppc-exe
	$(CARGO) test --workspace

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Accept changed snapshots; review every .snap diff before committing.
bless:
	$(CARGO) build -p ppc -p ppc-exe
	INSTA_UPDATE=always $(CARGO) test --workspace

## ppc against JAX (installed from PyPI into bench/.venv) on examples/mlp.ppc and a wider variant.
bench: build
	bench/run.sh

## The training step's compile against JAX's jit, every training row of `make bench` (minutes).
bench-compile: build
	bench/compile.sh

## One rank against two under mpirun.mpich (stages split by `ppc compile --ranks`), same models.
bench-mpi: build
	bench/mpi.sh

ci: lint test

## Non-comment, non-blank lines of Rust per file, largest first.
loc:
	@find dialect compiler runtime -name '*.rs' | xargs grep -cvE '^\s*(//|$$)' | sort -t: -k2 -rn
