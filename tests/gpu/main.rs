//! The `gpu` test binary: every GPU kernel and the GPU engine against the CPU
//! twins, on fresh random inputs with poisoned outputs, and the parity ladder.
//!
//! One binary per group, so wgpu and the naive model link once per group; each
//! module is one family of checks.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod batch;
mod block;
mod cq;
mod cq_aliasing;
mod engine;
mod lean;
mod parity;
mod portability;
mod sample;
