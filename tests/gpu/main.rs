//! The `gpu` test binary: tests that open a GPU adapter (lavapipe in CI). Every
//! GPU kernel and the GPU engine against the CPU twins, on fresh random inputs
//! with poisoned outputs, `GpuBatch`, device readouts, the parity ladder, the
//! engine builder, hardening and per-kernel profiles; no `cqlm` process. Each
//! test skips without an adapter unless `CQLM_REQUIRE_GPU` is set. CI runs this
//! binary again at other lavapipe subgroup sizes (`.ci/run`).
//!
//! One binary per need (`lib`, `gpu`, `bin`, `e2e`), so wgpu and the naive model
//! link once per binary; each module is one family of checks, and no module name
//! repeats across binaries.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod block;
mod builder;
mod cq;
mod cq_aliasing;
mod engine;
mod gpu_batch;
mod hardening;
mod lean;
mod parity;
mod portability;
mod profile;
mod sample;
mod shader_targets;
