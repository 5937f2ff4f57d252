//! The `cli` test binary: the `cqlm` binary, the engine builder, sessions,
//! generation and profiles.
//!
//! One binary per group, so wgpu and the naive model link once per group; each
//! module is one family of checks.

#[path = "../common/mod.rs"]
mod common;

mod builder;
mod chat_model;
mod cli;
mod constrained;
mod generate;
mod hardening;
mod profile;
mod serve;
mod serve_gpu;
mod serve_ops;
