pub mod compute_cmma;
pub mod compute_direct;
pub mod launch_overhead;
pub mod memory_direct;
pub mod memory_probe;
pub mod memory_read;
pub mod memory_write;
