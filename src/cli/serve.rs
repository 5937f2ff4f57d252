//! `cqlm serve`: the OpenAI-compatible server (`cqlm::serve`).

use super::{BackendArgs, ModelArgs};
use anyhow::Result;
use cqlm::serve::ServeOptions;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    backend: BackendArgs,
    /// Address to bind (loopback by default; 0.0.0.0 serves every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free one; the address is printed when ready).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences that generate at once, each with its own KV cache and sampler.
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// MiB of sequence states the prompt cache keeps across requests (least
    /// recently used out first; on a GPU, device memory; 0: no cache).
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    cache_mb: u64,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on the API routes.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Requests that may wait for a sequence; beyond them the server answers 503.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_queue: usize,
    /// Longest prompt in tokens (a longer one is a 400). The sliding window
    /// bounds each sequence's memory at any length; this bounds the time one
    /// prompt's prefill may take. Coding agents send 10-25k tokens of
    /// instructions and tools.
    #[arg(long, value_name = "N", default_value_t = 32768)]
    ctx_tokens: usize,
    /// Tokens generated when a request sets no max_tokens.
    #[arg(long, value_name = "N", default_value_t = 256)]
    default_max_tokens: usize,
    /// Most tokens one request generates, whatever it asks for (it ends there
    /// with the finish reason of its limit: `length`, `max_tokens`,
    /// `max_output_tokens`); default: what it asks for.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens_cap: Option<u32>,
    /// The model id clients name (default: the archive's file stem, or cqlm-small).
    #[arg(long, value_name = "ID")]
    model_id: Option<String>,
    /// Shortest time between two text chunks of a stream, in milliseconds: the
    /// tokens of a faster stream go out together (the first at once, the last
    /// with the end), which spares the server and the client a wakeup and a
    /// parse per token (0: a chunk per token).
    #[arg(long, value_name = "MS", default_value_t = 1.0)]
    stream_interval_ms: f64,
}

pub fn run(a: Args) -> Result<()> {
    check_port(&a.host, a.port)?;
    let stream_interval = interval(a.stream_interval_ms)?;
    let model = a.model.load()?;
    let model_id = a.model_id.clone().unwrap_or_else(|| a.model.id());
    // Every sequence a slot of one batched pass (CpuBatch or GpuBatch).
    let parallel = a.parallel.max(1);
    let engine = super::build_batch(Arc::clone(&model), &a.backend, parallel)?;
    let opts = ServeOptions {
        host: a.host,
        port: a.port,
        max_queue: a.max_queue,
        api_key: a.api_key,
        ctx_tokens: a.ctx_tokens,
        default_max_tokens: a.default_max_tokens.max(1),
        max_tokens_cap: a.max_tokens_cap.map(|n| n as usize),
        cache_mb: a.cache_mb,
        model_id,
        stream_interval,
    };
    let how = engine.batch.describe();
    cqlm::serve::serve(model, engine, opts, |addr| {
        eprintln!(
            "cqlm serve: listening on http://{addr}/v1 ({parallel} parallel, batched on {how})"
        );
    })?;
    eprintln!("cqlm serve: stopped");
    Ok(())
}

/// `--stream-interval-ms` as a duration (finite, 0 to 1000 ms).
fn interval(ms: f64) -> Result<std::time::Duration> {
    if !(0.0..=1000.0).contains(&ms) {
        anyhow::bail!("--stream-interval-ms must be between 0 and 1000, got {ms}");
    }
    Ok(std::time::Duration::from_secs_f64(ms / 1000.0))
}

/// Fail before the model loads when the address can't be listened on (a port in
/// use, an unknown host), naming the address and the cause.
fn check_port(host: &str, port: u16) -> Result<()> {
    if let Err(e) = std::net::TcpListener::bind((host, port)) {
        let why = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                "the address is in use (another server? --port picks another)".to_string()
            }
            _ => e.to_string(),
        };
        anyhow::bail!("cannot listen on {host}:{port}: {why}");
    }
    Ok(())
}
