//! The `bin` test binary: the `cqlm` binary run as a user would
//! (`env!("CARGO_BIN_EXE_cqlm")`): its subcommands, `generate` with and
//! without constraints, `pack`, `profile`, the backend flags, the CPU pool
//! at any thread count, and `cqlm serve`
//! over HTTP and through the official `openai` client. Tests that take the GPU
//! backend skip without an adapter unless `CQLM_REQUIRE_GPU` is set.
//!
//! One binary per need (`lib`, `gpu`, `bin`, `e2e`), so wgpu and the naive model
//! link once per binary; each module is one family of checks, and no module name
//! repeats across binaries.

#[path = "../common/mod.rs"]
mod common;

mod agent_clis;
mod backend_cli;
mod chat_cli;
mod constrained_cli;
mod first_run;
mod generate_cli;
mod pack_cli;
mod profile_cli;
mod serve;
mod serve_cache;
mod serve_gpu;
mod serve_introspect;
mod serve_logprobs;
mod serve_messages;
mod serve_ops;
mod serve_responses;
mod subcommands;
mod threads_cli;
mod web_page;
