//! The ppc test suite, one binary: file-driven pass and error snapshots, the round-trip law,
//! robustness against mutated input, the interpreter's op semantics, the pipelining property
//! (pipelined == sequential, bit for bit) and the command line.

mod cli;
mod cli_runs;
mod common;
mod completeness;
mod conformance;
mod cpu;
mod cuda;
mod determinism;
mod errors;
mod grad;
mod guides;
mod interp_ops;
mod language;
mod lowering;
mod model_ends;
mod mpirun;
mod one_f_one_b;
mod oracle;
mod passes;
mod portable;
mod properties;
mod residency;
mod robustness;
mod roundtrip;
mod schedule_check;
mod structure;
mod timetable;
mod tokenizers;
mod train;
mod verify;
