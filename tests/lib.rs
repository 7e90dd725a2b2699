//! Test-only crate: the suite is in `suite/`, its inputs in `errors/` and `passes/`.
