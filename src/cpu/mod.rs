//! The CPU reference engine: SPEC §4 composed from the kernels of [`crate::kernels`].

mod block;
mod engine;
mod prefill;
mod prep;

pub use engine::{CpuEngine, Probe};
