//! The wgpu backend: device setup, upload, WGSL kernels and the one-encoder token step.
//!
//! [`GpuBatch`] (`batch.rs`) steps several sequences in one pass and
//! [`GpuEngine`] (`engine.rs`) is its one-slot view. The batch owns a `model`
//! (`model::GpuModel`: context, kernels, weights, token slots, device state,
//! program) and composes parts that own their data and never import it:
//! `upload` (weights), `layout` (activation offsets and token slots), `state`
//! (device buffers), `program` (the step's dispatch lists and capture points:
//! the standard program and the lean 3-dispatch-per-layer one for hardware
//! GPUs), `prefill` (a pass's dispatches for chunks and several sequences),
//! `readout` (what each item reads back: device argmax, top-k, masks, logits),
//! `capture` (the captured step of the parity ladder), and `recorder`, the one
//! recorder every way of running a step goes through (plain, captured, timed).

pub mod arena;
mod batch;
mod capture;
mod context;
mod device_errors;
mod dispatch;
mod engine;
pub mod kernels;
mod layout;
mod matvec_plan;
mod model;
mod prefill;
mod program;
mod readout;
mod recorder;
mod saved;
mod selftest;
pub mod shader_check;
mod state;
pub mod step_input;
pub mod timing;
mod upload;

pub use batch::GpuBatch;
pub use capture::Captured;
pub use context::{
    device_type_name, env_flag, list_adapters, Capabilities, DeviceLimits, GpuContext, GpuOptions,
    MlpWorkgroup, PipelineSource,
};
pub use dispatch::{grid, run_dispatches, Dispatch, Kernel, Window, STORAGE};
pub use engine::GpuEngine;
pub use layout::PREFILL_SLOTS;
pub use program::{Fault, ProgramKind};
