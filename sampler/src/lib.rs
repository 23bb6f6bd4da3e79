pub use shared_kernels;
