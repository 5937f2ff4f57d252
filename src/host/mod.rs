//! The CPU substrate every CPU path stands on: the engine's persistent
//! fork-join thread pool ([`pool`]) and the CPU's SIMD level ([`simd`]).
//! Imports nothing above it.

pub mod pool;
pub mod simd;
