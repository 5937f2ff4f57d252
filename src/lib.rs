//! # cqlm
//!
//! Token-by-token inference of small codebook-quantized (CQ) language models.
//! `docs/SPEC.md` defines every number.
//! The modules, from the bottom up:
//!
//! * [`host`]: the CPU substrate: the engine's thread pool and SIMD feature
//!   detection ([`host::simd::CpuSimd`]);
//! * [`model`]: the model: its config (SPEC §1) and presets, the typed
//!   [`Model`], the engram history and hashing, the built-in trained model;
//! * [`cq`]: CQ matrices, the Hadamard transform, CPU matvec and the quantizer (SPEC §2);
//! * [`archive`]: the safetensors archive, read (memory-mapped, validated) and written (SPEC §3, §5);
//! * [`kernels`]: the CPU reference kernels of the token step (SPEC §4), the
//!   twin of every GPU kernel;
//! * [`engine`]: the [`Engine`] and [`BatchEngine`] traits every backend
//!   implements, their [`Readout`]s, the precision and kernel profiles;
//! * [`cpu`], [`gpu`]: [`CpuBatch`] and [`GpuBatch`], several sequences stepped
//!   together, and [`CpuEngine`] and [`GpuEngine`], their one-slot views;
//! * [`constrain`]: structured output and tool calls through llguidance;
//! * [`session`]: what runs on an engine: [`EngineBuilder`], the sampler, the
//!   tokenizer and streamed text, and [`session::Generation`], the one
//!   generation loop of the CLI, the library ([`session::Session`]) and the server;
//! * `serve` (feature `server`): the OpenAI-compatible HTTP server;
//! * [`demo_tools`]: the four tools the built-in model was trained to call,
//!   run in-process (`cqlm chat`, the server's web page);
//! * [`make`]: archives made here: random well-conditioned ones (synth) and
//!   float checkpoints packed through the quantizer (pack);
//! * [`diag`]: diagnostics: the GPU-vs-CPU parity ladder, perplexity and bits
//!   per byte, statistics of benchmark samples.
//!
//! ```no_run
//! use cqlm::{Config, CpuEngine, Engine};
//! use std::sync::Arc;
//! let plan = cqlm::cq::BitsPlan::mixed();
//! let model = cqlm::make::synth::synth_model(&Config::preset_tiny(), &plan, 7)?;
//! let mut engine = CpuEngine::new(Arc::new(model))?;
//! let logits = engine.prefill(&[1, 42, 7])?;
//! println!("next token: {}", cqlm::session::sample::argmax(&logits));
//! # Ok::<(), cqlm::Error>(())
//! ```
//!
//! ## Cargo features
//!
//! * `cli` (default; turns on `server`): the `cqlm` binary (clap, env_logger,
//!   indicatif, plotters, ctrlc, npyz, anyhow);
//! * `server`: the `serve` module, the OpenAI-compatible HTTP server (axum,
//!   tokio, minijinja, prometheus-client).
//!
//! `cqlm = { version = "0.1", default-features = false }` links the engine alone:
//! every module but `serve`, none of those crates.

#![warn(missing_docs)]

pub mod archive;
pub mod constrain;
pub mod cpu;
pub mod cq;
pub mod demo_tools;
pub mod diag;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod host;
pub mod kernels;
pub mod make;
pub mod model;
#[cfg(feature = "server")]
pub mod serve;
pub mod session;

pub use cpu::{CpuBatch, CpuEngine};
pub use engine::precision::Precision;
pub use engine::{BatchEngine, Engine, HostTime, Readout, StepOut};
pub use error::{ArchiveError, ConfigError, Error, Result};
pub use gpu::{GpuBatch, GpuEngine};
pub use model::config::{Config, EngramConfig};
pub use model::weights::Model;
pub use session::builder::{Backend, EngineBuilder};
