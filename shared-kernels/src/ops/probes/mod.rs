//! Device ceiling probes for benchmarks and tests, not used by the model: the HBM read rate
//! (`hbm_read`), the tensor-core peak (`mma_peak`) and the index arithmetic at the top of the u32
//! range (`index_probe`, the boundary tests).

pub mod hbm_read;
pub mod index_probe;
pub mod mma_peak;
