//! GPU kernel families, each the twin of a CPU kernel family, with its WGSL in shaders/.

pub mod cq;
