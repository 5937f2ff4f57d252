//! `cqlm parity`: the parity ladder of docs/SEED.md, GPU against CPU.

use super::{parse_ids, Ids, ModelArgs};
use anyhow::{bail, Result};
use cqlm::diag::parity::run_ladder;
use cqlm::gpu::{GpuContext, GpuEngine, GpuOptions};
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_name = "IDS", value_parser = parse_ids, required_unless_present = "prompt")]
    ids: Option<Ids>,
    /// Prompt text (needs the archive's embedded tokenizer).
    #[arg(long, value_name = "TEXT", conflicts_with = "ids")]
    prompt: Option<String>,
    /// Greedy steps to compare after the prompt.
    #[arg(long, default_value_t = 16)]
    generate: usize,
    /// GPU adapter whose name contains this (default: `CQLM_ADAPTER`, then the best one).
    #[arg(long, value_name = "NAME")]
    adapter: Option<String>,
    /// Print the rungs as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let model = a.model.load()?;
    let ids = match (&a.ids, &a.prompt) {
        (Some(ids), _) => ids.0.clone(),
        (None, Some(text)) => {
            cqlm::session::tokenizer::TextTokenizer::for_model(&model)?.encode(text)?
        }
        (None, None) => bail!("give --ids or --prompt"),
    };
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= model.config.vocab) {
        bail!(
            "token {bad} is out of range: the vocabulary has {} tokens",
            model.config.vocab
        );
    }
    let opts = GpuOptions {
        adapter: a.adapter.clone(),
        ..Default::default()
    };
    let ctx = GpuContext::new(&opts, 1 << 20)?;
    let mut gpu = GpuEngine::with_context(Arc::clone(&model), Arc::clone(&ctx))?;
    let ladder = run_ladder(&model, &ctx, &mut gpu, &ids, a.generate)?;
    if a.json {
        println!("{}", serde_json::to_string(&ladder)?);
    } else {
        println!("device: {}", ctx.describe());
        println!(
            "{:<4} {:<64} {:>10} {:>10} {:>8}  result",
            "rung", "compared", "rel L2", "max abs", "bound"
        );
        for r in &ladder.rungs {
            println!(
                "{:<4} {:<64} {:>10.2e} {:>10.2e} {:>8.0e}  {}",
                r.rung,
                r.name,
                r.rel_l2,
                r.max_abs,
                r.bound,
                if r.pass { "PASS" } else { "FAIL" }
            );
        }
    }
    if let Some(t) = &ladder.first_divergent {
        let rung = ladder.rungs.iter().find(|r| !r.pass).map_or(0, |r| r.rung);
        bail!("parity fails at rung {rung}: first divergent tensor: {t}");
    }
    Ok(())
}
