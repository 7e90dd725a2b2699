# ppc: thin targets over cargo. `make run` and `make test` install missing system packages first.
CARGO ?= cargo
MODEL ?= examples/mlp.ppc

.PHONY: setup build run test lint fmt bless bench ci loc

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build --release -p ppc

## The main job: run the MLP example on the CPU.
run: setup
	$(CARGO) run --release -q -p ppc -- run $(MODEL)

## Every test: unit tests, the file-driven suite, snapshots (CI=true: missing snapshots fail).
test: setup
	$(CARGO) test --workspace

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Accept changed snapshots; review every .snap diff before committing.
bless:
	INSTA_UPDATE=always $(CARGO) test --workspace

ci: lint test

## Non-comment, non-blank lines of Rust per file, largest first.
loc:
	@find dialect compiler runtime -name '*.rs' | xargs grep -cvE '^\s*(//|$$)' | sort -t: -k2 -rn
