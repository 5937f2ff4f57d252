//! The wgpu backend: device setup, upload, WGSL kernels and the one-encoder token step.
//!
//! The engine ([`GpuEngine`], `engine.rs`) composes parts that own their data
//! and never import it: `upload` (weights), `layout` (activation offsets and
//! token slots), `state` (device buffers), `program` (the step's dispatch lists
//! and capture points: the standard program and the lean 3-dispatch-per-layer
//! one for hardware GPUs), `readback`, `prefill` (chunked prompts), `batch` ([`GpuBatch`]:
//! several sequences in one pass), `capture`, and
//! `recorder`, the one recorder every way of running the step goes through.

pub mod arena;
mod batch;
mod capture;
mod context;
mod dispatch;
mod engine;
pub mod kernels;
mod layout;
mod matvec_plan;
mod prefill;
pub mod profile;
mod program;
mod readback;
mod recorder;
mod selftest;
pub mod shader_check;
mod state;
pub mod step_input;
mod upload;

pub use batch::GpuBatch;
pub use capture::Captured;
pub use context::{
    device_type_name, env_flag, list_adapters, Capabilities, GpuContext, GpuOptions, MlpWorkgroup,
};
pub use dispatch::{grid, run_dispatches, Dispatch, Kernel, Window, STORAGE};
pub use engine::GpuEngine;
pub use layout::PREFILL_SLOTS;
pub use program::{Fault, ProgramKind};
