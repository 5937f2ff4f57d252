//! `cqlm generate`: greedy generation from token ids.

use super::{make_engine, parse_ids, BackendArgs, Ids, ModelArgs};
use anyhow::Result;
use cqlm::sample::argmax;
use std::io::Write;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt token ids, comma-separated (default: the model's BOS).
    #[arg(long, value_name = "IDS", value_parser = parse_ids)]
    ids: Option<Ids>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load()?;
    let c = model.config.clone();
    let ids = a.ids.map(|i| i.0).unwrap_or_else(|| vec![c.bos]);
    let mut engine = make_engine(model, &a.backend, true)?;
    let t0 = Instant::now();
    let mut logits = engine.prefill(&ids)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    let t1 = Instant::now();
    let mut generated = 0usize;
    while generated < a.max_tokens {
        let next = argmax(&logits);
        generated += 1;
        write!(out, "{next} ")?;
        out.flush()?;
        if next == c.eos || generated == a.max_tokens {
            break;
        }
        logits = engine
            .step(next, true)?
            .map(<[f32]>::to_vec)
            .unwrap_or_default();
    }
    writeln!(out)?;
    let decode_s = t1.elapsed().as_secs_f64();
    eprintln!(
        "prompt {} tokens, prefill {:.1} tok/s | generated {generated} tokens, decode {:.1} tok/s | {}",
        ids.len(),
        ids.len() as f64 / prefill_s.max(1e-9),
        generated as f64 / decode_s.max(1e-9),
        engine.describe()
    );
    Ok(())
}
