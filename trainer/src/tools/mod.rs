//! The CLI's tools beside training and sampling: `bench` (kernel, engine and update timings),
//! `check` (the sampler engine's invariance checks), `report` (a run's metrics as markdown) and
//! the host profiler. They belong to the `lockstep` binary, not to the trainer library.

pub mod bench;
pub mod bench_options;
pub mod bench_ops;
pub mod bench_tiles;
pub mod check;
pub mod host_profile;
pub mod report;
pub mod report_arms;
pub mod scalars;
