//! CPU reference kernels of the token step (SPEC §4), one module per kernel family.
//! Each is the exact f32 arithmetic of the SPEC and the twin of a GPU kernel:
//! one public function per GPU entry point, named after it and taking the inputs
//! of its params struct as slices and values.
//!
//! | GPU entry point (shader) | CPU twin | GPU-vs-twin test (`tests/gpu/`) |
//! |---|---|---|
//! | `gather` (cq.wgsl) | [`gather::gather`] | `cq.rs`: `gather_*` |
//! | `matvec*` pre-ops, `PrepareMode` (cq.wgsl) | [`prepare::pre_op`] with [`prepare::PrepareMode`], then `prepare` and [`crate::cq::CqMatrix::matvec_rows_prepared`] | `cq.rs`: `matvec_*`; `cq_aliasing.rs` |
//! | `conv` (engram.wgsl) | [`engram::conv`] | `block.rs`: `engram_conv_*` |
//! | `premix` (mhc.wgsl) | [`mhc::premix`] | `block.rs`: `premix_*` |
//! | `qk_store` (attention.wgsl) | [`attention::qk_store`] | `attention.rs`: `qk_store_*` |
//! | `attend` (attention.wgsl) | [`attention::attend`] | `attention.rs`: `attend_*`, `store_then_attend_*` |
//! | `mlp` (mlp.wgsl) | [`mlp::block`] | `block.rs`: `mlp_*` |
//! | `route` (mhc.wgsl) | [`mhc::route`] | `block.rs`: `route_*` |
//! | `qk_attend` (attention.wgsl; the lean program) | [`attention::qk_store`] then [`attention::attend`] | `attention.rs`: `qk_attend_over_steps_*` |
//! | `gather_many` (cq.wgsl; the lean head, every slot of a prefill or batch pass) | [`gather::gather`] per entry | `cq.rs`: `gather_many_*`; `lean.rs` (captured `x0`, `engram.e`) |
//! | `layer_step` (layer.wgsl; the lean program) | [`engram::conv`], matvec, [`mlp::block`], [`mhc::route`], [`mhc::premix`], [`prepare::pre_op`] in turn | `lean.rs`: every captured tensor against the CPU probe's |
//! | `argmax`, `topk` (sample.wgsl) | [`crate::session::sample::argmax`], [`crate::session::sample::top_k_into`] | `sample.rs` |
//!
//! Composed into the step, the twins are checked against an independent f64 step
//! (`tests/lib/reference_step.rs`); their pieces (norms, RoPE, int8, hashing)
//! against naive loops in `tests/lib/kernels.rs`.

pub mod attention;
pub mod engram;
pub mod gather;
pub mod kv;
pub mod mhc;
pub mod mlp;
pub mod norm;
pub mod prepare;
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
