//! The `e2e` test binary: the built-in trained model end to end against
//! PyTorch fixtures.
//!
//! One binary per group, so wgpu and the naive model link once per group; each
//! module is one family of checks.

#[path = "../common/mod.rs"]
mod common;

mod chat_model;
mod chat_template;
mod eval;
mod trained_model;
