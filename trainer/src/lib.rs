pub use sampler;
