//! The CPU reference engine: SPEC §4 composed from the twins of [`crate::kernels`].
//!
//! [`CpuEngine`] (engine.rs) composes the parts, which never import it:
//! `state` (position, history, KV cache, rings), `hooks` ([`Probe`], the kernel
//! clock and the non-finite tracking, shared by step and prefill), `step` (the
//! decode step), `prefill` with `prefill_attn` (the batched prefill and its
//! chunk attention), `prep` (prepared-input caches), `par` (token-parallel
//! helpers) and `profile`.

mod engine;
mod hooks;
mod par;
mod prefill;
mod prefill_attn;
mod prep;
mod profile;
mod state;
mod step;

pub use engine::CpuEngine;
pub use hooks::Probe;
