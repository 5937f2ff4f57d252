//! The CPU reference engine: SPEC §4 composed from the kernels of [`crate::kernels`].

mod engine;
mod prep;

pub use engine::{CpuEngine, Probe};
