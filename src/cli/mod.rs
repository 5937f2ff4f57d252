//! Subcommands of the `cqlm` binary, one file each, and what they share.

mod bench;
mod bench_batch;
mod chat;
mod devices;
mod eval;
mod generate;
mod serve;
pub use generate::Incomplete;
mod inspect;
mod logits;
mod pack;
mod parity;
mod profile;
mod synth;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use cqlm::cq::plan_for_preset;
use cqlm::make::synth::synth_model;
use cqlm::{Config, Engine, EngineBuilder, Model};
use std::path::PathBuf;
use std::sync::Arc;

/// Codebook-quantized language models, token by token, on the GPU or the CPU.
#[derive(Debug, Parser)]
#[command(name = "cqlm", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run ids through `step` and write the logits as a float32 .npy (docs/SPEC.md §7).
    Logits(logits::Args),
    /// Print an archive's config, tensor count, bytes per kind and bits/group histogram.
    Inspect(inspect::Args),
    /// Write a random but well-conditioned archive for a preset or config.
    Synth(synth::Args),
    /// Quantize a float checkpoint into an archive, with a per-tensor error report.
    Pack(pack::Args),
    /// Generate from a text or id prompt, greedy or sampled, streamed to stdout.
    Generate(generate::Args),
    /// Perplexity and bits per byte of a text file, streamed through the engine.
    Eval(eval::Args),
    /// Measure prefill and decode throughput.
    Bench(bench::Args),
    /// Per-kernel timings of a decode step (GPU timestamps or CPU timers).
    Profile(profile::Args),
    /// List the GPU adapters wgpu can see.
    Devices,
    /// Check the GPU against the CPU reference rung by rung (the parity ladder of docs/SEED.md).
    Parity(parity::Args),
    /// Serve the OpenAI chat and completion API over HTTP.
    Serve(serve::Args),
    /// Chat with the model in the terminal: its chat template, streamed answers,
    /// tools, history; with piped input, one exchange per line.
    Chat(chat::Args),
}

/// Dispatch a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let Some(command) = cli.command else {
        // `cqlm` alone: the command list, on stdout, and success.
        use clap::CommandFactory;
        Cli::command().print_help()?;
        return Ok(());
    };
    match command {
        Command::Logits(a) => logits::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Pack(a) => pack::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Profile(a) => profile::run(a),
        Command::Devices => devices::run(),
        Command::Parity(a) => parity::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Chat(a) => chat::run(a),
    }
}

/// Which engine runs the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU reference engine.
    Cpu,
    /// The wgpu engine.
    Gpu,
}

/// Default seed of `--preset` weights.
pub const BUILTIN_SEED: u64 = 2026;

/// Where the model comes from: an archive, or a preset synthesized in memory.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// Archive to load (a cqlm safetensors file); default: the built-in trained model
    /// (`models/cqlm-small.safetensors`, compiled into the binary).
    #[arg(long, value_name = "PATH", conflicts_with = "preset")]
    model: Option<PathBuf>,
    /// Synthesize this preset in memory instead (random weights): tiny, default or large.
    #[arg(long, value_name = "NAME")]
    preset: Option<String>,
    /// Seed of the `--preset` weights.
    #[arg(long, default_value_t = BUILTIN_SEED)]
    weights_seed: u64,
}

impl ModelArgs {
    /// The model id a server names: the archive's file stem, the preset's name,
    /// or `cqlm-small` for the built-in model.
    pub fn id(&self) -> String {
        if let Some(p) = &self.model {
            return p
                .file_stem()
                .map_or("model".into(), |s| s.to_string_lossy().into_owned());
        }
        self.preset.clone().unwrap_or_else(|| "cqlm-small".into())
    }

    /// Load the archive, synthesize the preset (saying on stderr that its weights are
    /// random), or, when neither is given, parse the built-in trained model.
    pub fn load(&self) -> Result<Arc<Model>> {
        if let Some(path) = &self.model {
            return Ok(Arc::new(Model::load(path)?));
        }
        let Some(name) = self.preset.as_deref() else {
            return Ok(Arc::new(cqlm::model::builtin::model()?));
        };
        let Some(config) = Config::preset(name) else {
            bail!("unknown preset `{name}` (expected tiny, default or large)");
        };
        eprintln!(
            "note: using the `{name}` preset synthesized with seed {} (random weights, the output is meaningless)",
            self.weights_seed
        );
        Ok(Arc::new(synth_model(
            &config,
            &plan_for_preset(name),
            self.weights_seed,
        )?))
    }
}

/// Backend choice shared by the commands that run a model.
#[derive(Debug, Clone, clap::Args)]
pub struct BackendArgs {
    /// Backend; default: gpu on a hardware GPU, else cpu (with a notice; a software
    /// adapter such as lavapipe runs only with --backend gpu).
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// GPU adapter whose name contains this (case-insensitive); default: `CQLM_ADAPTER`, then the best one.
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,
    /// Prefill: prompt tokens per layer-by-layer chunk (1 = one step per token; the
    /// logits are the same for every value). Default: the engine's (CPU 256; the GPU
    /// its token slots, 32, which is also the most it takes).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub prefill_chunk: Option<u32>,
    /// Arithmetic of the CQ matvecs (docs/SPEC.md §6.1): fast (int8 activations, the CPU
    /// engine's) or exact (the reference). Default: fast for generate, bench and
    /// profile, exact for logits and eval. The GPU engine is always exact.
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
}

/// `--precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// docs/SPEC.md §6: f32 throughout (the reference).
    Exact,
    /// docs/SPEC.md §6.1: int8 activations inside the CQ matvecs (CPU).
    Fast,
}

impl From<PrecisionArg> for cqlm::Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::Exact => cqlm::Precision::Exact,
            PrecisionArg::Fast => cqlm::Precision::Fast,
        }
    }
}

impl BackendArgs {
    /// The GPU options these arguments name.
    pub fn gpu_options(&self) -> cqlm::gpu::GpuOptions {
        cqlm::gpu::GpuOptions {
            adapter: self.adapter.clone(),
            ..Default::default()
        }
    }

    /// The engine builder these flags describe (`--backend` absent: auto, which
    /// takes a hardware GPU when there is one, else the CPU), with `default` the
    /// precision when `--precision` is absent.
    pub fn builder(&self, model: Arc<Model>, default: cqlm::Precision) -> EngineBuilder {
        let opts = self.gpu_options();
        let backend = match self.backend {
            Some(Backend::Cpu) => cqlm::Backend::Cpu,
            Some(Backend::Gpu) => cqlm::Backend::Gpu(opts),
            None => cqlm::Backend::Auto(opts),
        };
        let b = EngineBuilder::new(model)
            .backend(backend)
            .prefill_chunk(self.prefill_chunk.map(|n| n as usize))
            .default_precision(default);
        match self.precision {
            Some(p) => b.precision(p.into()),
            None => b,
        }
    }

    /// Reject flags that the chosen backend would ignore.
    ///
    /// # Errors
    /// `--adapter` with `--backend cpu`.
    pub fn check(&self) -> Result<()> {
        if self.backend == Some(Backend::Cpu) && self.adapter.is_some() {
            bail!("--adapter chooses a GPU adapter and has no effect with --backend cpu");
        }
        Ok(())
    }
}

/// Say on stderr why auto runs on the CPU (`notice`), or only log it (`logits`
/// keeps stderr for its one error line).
pub fn report_notice(notice: Option<&str>, to_stderr: bool) {
    if let Some(why) = notice {
        if to_stderr {
            eprintln!("note: {why}");
        } else {
            log::info!("{why}");
        }
    }
}

/// Build the engine the flags describe (`default` the precision without
/// `--precision`), saying on stderr when auto runs on the CPU if `notice`.
pub fn make_engine(
    model: Arc<Model>,
    b: &BackendArgs,
    default: cqlm::Precision,
    notice: bool,
) -> Result<Box<dyn Engine>> {
    b.check()?;
    let (engine, why) = b.builder(model, default).build()?;
    report_notice(why.as_deref(), notice);
    Ok(engine)
}

/// Build the batch engine of `slots` sequences the flags describe (fast
/// precision without `--precision`), saying on stderr why auto runs on the CPU.
pub fn make_batch(
    model: Arc<Model>,
    b: &BackendArgs,
    slots: usize,
) -> Result<Box<dyn cqlm::BatchEngine>> {
    Ok(build_batch(model, b, slots)?.batch)
}

/// [`make_batch`] with the factory of more like it (the server's).
pub fn build_batch(
    model: Arc<Model>,
    b: &BackendArgs,
    slots: usize,
) -> Result<cqlm::session::builder::BuiltBatch> {
    b.check()?;
    let built = b.builder(model, cqlm::Precision::Fast).build_batch(slots)?;
    report_notice(built.notice.as_deref(), true);
    Ok(built)
}

/// A parsed `--ids` value.
#[derive(Debug, Clone)]
pub struct Ids(pub Vec<u32>);

/// Parse `--ids`: a non-empty comma-separated list of unsigned decimal integers.
pub fn parse_ids(s: &str) -> std::result::Result<Ids, String> {
    if s.is_empty() {
        return Err("the list of ids is empty".into());
    }
    s.split(',')
        .map(|part| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("`{part}` is not an unsigned decimal integer"));
            }
            part.parse::<u32>()
                .map_err(|_| format!("`{part}` does not fit in 32 bits"))
        })
        .collect::<std::result::Result<Vec<u32>, String>>()
        .map(Ids)
}

/// A `/proc/self/status` size field in bytes (Linux), if known.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Current resident set size of this process in bytes (Linux `VmRSS`), if known.
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// Context helper: attach the path to I/O errors.
pub fn with_path<T, E: std::error::Error + Send + Sync + 'static>(
    r: std::result::Result<T, E>,
    path: &std::path::Path,
) -> Result<T> {
    r.with_context(|| path.display().to_string())
}
