//! CPU reference kernels of the token step (SPEC §4), one module per kernel family.
//! Each is the exact f32 arithmetic of the SPEC and the twin of a GPU kernel.

pub mod attention;
pub mod kv;
pub mod mhc;
pub mod mlp;
pub mod norm;
pub mod rope;
pub mod vmath;

/// `σ(x) = 1 / (1 + exp(−x))` in f32.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `silu(x) = x · σ(x)` in f32.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}
