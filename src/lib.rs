//! # cqlm
//!
//! Token-by-token inference of small codebook-quantized (CQ) language models.
//! `../shared/SPEC.md` (shipped beside the repository) defines every number:
//!
//! * [`config`]: the model config (SPEC §1) and presets;
//! * [`simd`]: CPU feature detection ([`simd::CpuSimd`], the SIMD level of the CPU paths);
//! * [`cq`]: CQ matrices, the Hadamard transform, CPU matvec and the quantizer (SPEC §2);
//! * [`archive`]: the safetensors archive, read (memory-mapped, validated) and written (SPEC §3, §5);
//! * [`weights`]: the typed [`Model`];
//! * [`kernels`]: the CPU reference kernels of the token step (SPEC §4);
//! * [`cpu`]: [`CpuEngine`], the reference step;
//! * [`engine`]: the [`Engine`] trait every backend implements, and its [`Readout`]s;
//! * [`builder`]: [`EngineBuilder`], which chooses and configures the engine;
//! * [`profile`]: per-kernel timings of a decode step on either backend;
//! * [`synth`]: random well-conditioned archives (and float checkpoints) for tests and benchmarks;
//! * [`pack`]: float checkpoint → archive, through the quantizer.
//!
//! ```no_run
//! use cqlm::{Config, CpuEngine, Engine, synth};
//! use std::sync::Arc;
//! let model = synth::synth_model(&Config::preset_tiny(), &cqlm::cq::BitsPlan::mixed(), 7)?;
//! let mut engine = CpuEngine::new(Arc::new(model))?;
//! let logits = engine.prefill(&[1, 42, 7])?;
//! println!("next token: {}", cqlm::sample::argmax(&logits));
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
pub mod builder;
pub mod builtin;
pub mod config;
pub mod constrain;
pub mod cpu;
pub mod cq;
pub mod engine;
pub mod engram;
pub mod error;
pub mod eval;
pub mod gpu;
pub mod kernels;
pub mod pack;
pub mod parity;
pub mod pool;
pub mod precision;
pub mod profile;
pub mod sample;
#[cfg(feature = "server")]
pub mod serve;
pub mod session;
pub mod simd;
pub mod stats;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use builder::{Backend, EngineBuilder};
pub use config::{Config, EngramConfig};
pub use cpu::{CpuBatch, CpuEngine};
pub use engine::{BatchEngine, Engine, HostTime, Readout, StepOut};
pub use error::{ArchiveError, ConfigError, Error, Result};
pub use gpu::{GpuBatch, GpuEngine};
pub use precision::Precision;
pub use weights::Model;
