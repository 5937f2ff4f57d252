//! GPU kernel families, each the twin of a CPU kernel family, with its WGSL in shaders/.

pub mod attention;
pub mod cq;
pub mod engram;
pub mod layer;
pub mod mhc;
pub mod mlp;
pub mod sample;
