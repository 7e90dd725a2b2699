//! The settings of a model file's `pipeline { ... }` block, declared once: the parser, the
//! printer, shapes that use them as dimensions, diagnostics, `--report=json` and the command
//! line's overrides all name them through [`Setting`].

/// The `pipeline` block's setting that names the training schedule, not a number.
pub const SCHEDULE: &str = "schedule";

/// The schedules `schedule = ...` may name (the compiler's `timetable::Kind`, by name).
pub const SCHEDULES: [&str; 3] = ["gpipe", "1f1b", "zb-h1"];

/// One numeric setting of the `pipeline` block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Setting {
    Stages,
    /// The model's depth (a multiple of `stages · repeats`).
    Layers,
    /// The depth given per stage and repeat instead (`layers` = `stages · repeats · k`).
    LayersPerStage,
    Microbatches,
    /// Circular repeats: layer r·S+s runs on stage s in repeat r.
    Repeats,
    /// MPI ranks the stage axis is split over.
    Ranks,
}

impl Setting {
    /// In canonical order (as `ppc fmt` prints them).
    pub const ALL: [Setting; 6] = [
        Setting::Stages,
        Setting::Layers,
        Setting::LayersPerStage,
        Setting::Microbatches,
        Setting::Repeats,
        Setting::Ranks,
    ];

    /// The key in the model file, in shapes and in `--report=json`.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Stages => "stages",
            Setting::Layers => "layers",
            Setting::LayersPerStage => "layers_per_stage",
            Setting::Microbatches => "microbatches",
            Setting::Repeats => "repeats",
            Setting::Ranks => "ranks",
        }
    }

    pub fn from_name(name: &str) -> Option<Setting> {
        Setting::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The command-line option that overrides it: `--layers-per-stage`.
    pub fn flag(self) -> String {
        format!("--{}", self.name().replace('_', "-"))
    }
}
