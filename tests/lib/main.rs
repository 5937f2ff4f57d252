//! The `lib` test binary: the library alone, no GPU adapter and no `cqlm`
//! process. The CPU reference against naive f64 loops, the kernels, the
//! quantizer and packing, archives and their rejections, the CPU engine and
//! batch, sampling and generation, structured generation and tool calls.
//!
//! One binary per need (`lib`, `gpu`, `bin`, `e2e`), so wgpu and the naive model
//! link once per binary; each module is one family of checks, and no module name
//! repeats across binaries.

#[path = "../common/mod.rs"]
mod common;

mod archive_errors;
mod constrained_generation;
mod cpu_batch;
mod cq_kernels;
mod custom_tools;
mod demo_tools;
mod fast_engine;
mod fast_kernels;
mod fuzz_regressions;
mod generation;
mod grammar_cache;
mod kernels;
mod pack;
mod prompt_cache;
mod properties;
mod quantizer;
mod reference_step;
mod sampler;
mod tool_markers;
mod tool_parts;
