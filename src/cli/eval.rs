//! `cqlm eval`: perplexity and bits per byte of a text file, streamed through the engine.

use super::{make_engine, BackendArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use cqlm::diag::eval::score_stream;
use cqlm::session::tokenizer::TextTokenizer;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// UTF-8 text file to score, as one stream: BOS, then its tokens (docs/SPEC.md §4.3's sinks and window apply).
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Score only the first N tokens of the text (the bytes counted are those N tokens' bytes).
    #[arg(long, value_name = "N")]
    max_tokens: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn run(a: Args) -> Result<()> {
    a.backend.check()?;
    let raw =
        std::fs::read(&a.text).with_context(|| format!("cannot read {}", a.text.display()))?;
    let text = String::from_utf8(raw)
        .map_err(|e| anyhow::anyhow!("{} is not UTF-8 text: {e}", a.text.display()))?;
    let model = a.model.load()?;
    let tokenizer = TextTokenizer::for_model(&model)?;
    let mut ids = tokenizer.encode(&text)?;
    let mut bytes = text.len();
    if let Some(n) = a.max_tokens {
        if n == 0 {
            bail!("--max-tokens must be at least 1");
        }
        if ids.len() > n + 1 {
            ids.truncate(n + 1);
            // Byte-level BPE decodes back to exactly the bytes those tokens cover.
            bytes = tokenizer.decode(&ids[1..])?.len();
        }
    }
    if ids.len() < 2 {
        bail!("{} holds no tokens to score", a.text.display());
    }
    let mut engine = make_engine(model, &a.backend, cqlm::Precision::Exact, !a.json)?;
    let describe = engine.describe();
    let pb =
        ProgressBar::with_draw_target(Some(ids.len() as u64 - 1), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("eval {bar:30} {pos}/{len} tokens ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let score = score_stream(engine.as_mut(), &ids, |done| {
        if done % 64 == 0 {
            pb.set_position(done as u64);
        }
    })?;
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let bpb = score.bits_per_byte(bytes);
    if a.json {
        let obj = serde_json::json!({
            "text": a.text.display().to_string(),
            "backend": describe,
            "tokens": score.tokens,
            "bytes": bytes,
            "nll_nats": score.nll_nats,
            "nats_per_token": score.nats_per_token(),
            "perplexity": score.perplexity(),
            "bits_per_byte": bpb,
            "seconds": seconds,
            "tokens_per_second": score.tokens as f64 / seconds,
        });
        println!("{obj}");
    } else {
        println!(
            "{}: {} tokens, {} bytes on {describe}\nperplexity {:.4}  ({:.4} nats/token)\nbits per byte {:.4}\n{:.1} s, {:.0} tokens/s",
            a.text.display(),
            score.tokens,
            bytes,
            score.perplexity(),
            score.nats_per_token(),
            bpb,
            seconds,
            score.tokens as f64 / seconds
        );
    }
    Ok(())
}
