//! The wgpu backend: device setup, upload, WGSL kernels and the one-encoder token step.

pub mod arena;
mod context;
mod engine;
pub mod kernels;
pub mod profile;
pub mod shader_check;
pub mod step;
mod util;

pub use context::{
    device_type_name, env_flag, list_adapters, Capabilities, GpuContext, GpuOptions,
};
pub use engine::{Captured, Fault, GpuEngine};
pub use util::{grid, run_dispatches, Dispatch, Kernel, Window, STORAGE};
