//! The `cpu` test binary: the CPU reference against naive f64 loops, archives,
//! the quantizer and packing.
//!
//! One binary per group, so wgpu and the naive model link once per group; each
//! module is one family of checks.

#[path = "../common/mod.rs"]
mod common;

mod archive_errors;
mod batch;
mod constrained;
mod cq_kernels;
mod fast_engine;
mod fast_kernels;
mod fuzz_regressions;
mod generation;
mod grammar_cache;
mod kernels;
mod pack;
mod properties;
mod quantizer;
mod reference_step;
mod tool_markers;
mod tool_parts;
