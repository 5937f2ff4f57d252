//! The CPU reference engine: SPEC §4 composed from the twins of [`crate::kernels`].
//!
//! [`CpuEngine`] (engine.rs) composes the parts, which never import it:
//! `forward` (the one driver of the SPEC §4 program, for a decode step of one
//! token and a prefill chunk alike), `attention` (the chunk's KV store and
//! causal attention), `scratch` (its token-major work buffers), `state`
//! (position, history, KV cache, rings), `hooks` ([`Probe`], the kernel clock
//! and the non-finite tracking), `prep` (the prepared-input cache and the
//! products), `fast` (the products' fused §6.1 fast forms), `par`
//! (token-parallel helpers) and `profile`.

mod attention;
mod batch;
mod engine;
mod fast;
mod forward;
mod hooks;
mod par;
mod prep;
mod profile;
mod scratch;
mod state;

pub use batch::CpuBatch;
pub use engine::CpuEngine;
pub use hooks::Probe;
