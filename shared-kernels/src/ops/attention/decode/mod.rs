//! Decode rows: the tensor-core partials (`mma_decode`, `mma_decode_narrow`; the `cmma` set in
//! `cmma`), the CUDA-core split kernel (`split_kv`) with its fixed-order combine, and the decode
//! path's fused attention inputs (`inputs`).

pub mod mma_decode;
pub mod mma_decode_narrow;
pub mod split_kv;
pub mod cmma;
pub mod inputs;
pub(crate) mod inputs_planes;
