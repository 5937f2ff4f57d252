//! The CPU reference engine: SPEC §4 composed from the twins of [`crate::kernels`].
//!
//! [`CpuBatch`] (batch.rs) steps the sequences of its slots together and reads
//! out what each item asks; [`CpuEngine`] (engine.rs) is its one-slot view, so
//! one sequence and a server's batch run the same code. They compose the parts,
//! which never import them: `forward` (the one driver of the SPEC §4 program,
//! for a decode token, a prefill chunk and several sequences alike),
//! `attention` (the chunk's KV store and causal attention), `scratch` (its
//! token-major work buffers), `state` (position, history, KV cache, rings),
//! `hooks` ([`Probe`], the kernel clock and the non-finite tracking), `prep`
//! (the prepared-input cache and the products), `fast` (the products' fused
//! §6.1 fast forms), `par` (token-parallel helpers) and `timing` (the kernel timings of `cqlm profile`).

mod attention;
mod batch;
mod engine;
mod fast;
mod forward;
mod hooks;
mod par;
mod prep;
mod scratch;
mod state;
mod timing;

pub use batch::CpuBatch;
pub use engine::CpuEngine;
pub use hooks::Probe;
