//! lockstep's trainer: GRPO on the shared model forward, with the sampler in the same process.

pub mod chat;
pub mod checkpoint;
pub mod child;
pub mod jsonl;
pub mod losses;
pub mod math_verify;
pub mod memory_plan;
pub mod parquet_rows;
pub mod config;
pub mod distributed;
pub mod eval;
pub mod grpo;
pub mod input_files;
pub mod optim;
pub mod out_of_memory;
pub mod reward_command;
pub mod rng;
pub mod run;
pub mod run_environment;
pub mod run_lock;
pub mod sample_cli;
pub mod sft;
pub mod special_stops;
pub mod tasks;
pub mod telemetry;
pub mod vocab;
