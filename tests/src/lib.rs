//! Test-only crate: see `tests/tests/`.
