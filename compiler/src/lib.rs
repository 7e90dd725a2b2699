//! The ppc compiler: the front end, the passes over ppc's IR, the pipeline that runs them, and
//! the `ppc` command line.
//!
//! ```text
//! model.ppc ──frontend──▶ Module ──vmap-stages──▶ @stage ──gpipe-loop──▶ @pipeline
//! ```
#![deny(unsafe_code)]

pub mod backend;
pub mod cli;
pub mod commands;
pub mod compare;
mod grid;
pub mod lower;
pub mod passes;
pub mod pipeline;
mod program_picture;
pub mod reference;
pub mod report;
pub mod schedule;
pub mod target;
pub mod timetable;
mod timetable_picture;
pub mod timing;
