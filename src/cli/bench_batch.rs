//! `cqlm bench --sequences N,...`: decode throughput of N sequences stepped
//! together by the backend's batch engine (`CpuBatch`, `GpuBatch`; what `cqlm
//! serve` runs), one token of each a pass, against one sequence.

use super::{BackendArgs, ModelArgs};
use anyhow::{bail, Result};
use cqlm::diag::stats::median;
use cqlm::engine::SlotStep;
use cqlm::Readout;
use std::time::Instant;

/// One figure: `n` sequences' aggregate decode rate.
struct Row {
    n: usize,
    agg: f64,
    min: f64,
    max: f64,
}

/// Measure each of `sequences` (after a `prompt_len`-token prompt each),
/// `tokens` passes, median of `reps`; print text or one JSON object.
#[allow(clippy::too_many_arguments)]
pub fn run(
    model: &ModelArgs,
    backend: &BackendArgs,
    sequences: &[usize],
    prompt_len: usize,
    tokens: usize,
    reps: usize,
    json: bool,
) -> Result<()> {
    if sequences.contains(&0) {
        bail!("--sequences: each count must be at least 1");
    }
    let model = model.load()?;
    let vocab = model.config.vocab;
    let most = sequences.iter().copied().max().unwrap_or(1);
    let mut batch = super::make_batch(model, backend, most)?;
    let mut rows = Vec::new();
    for &n in sequences {
        let mut rates = Vec::new();
        for _ in 0..reps {
            // A different prompt per sequence, then greedy tokens, all n a pass.
            let prompts: Vec<Vec<u32>> = (0..n as u64)
                .map(|s| {
                    (0..prompt_len as u64)
                        .map(|i| ((i * 2654435761 + s * 40503) >> 7) as u32 % vocab as u32)
                        .collect()
                })
                .collect();
            for s in 0..n {
                batch.reset(s);
            }
            let work: Vec<(usize, &[u32])> = prompts
                .iter()
                .enumerate()
                .map(|(s, p)| (s, &p[..]))
                .collect();
            let mut next: Vec<[u32; 1]> = step_argmax(batch.as_mut(), &work)?;
            let t0 = Instant::now();
            for _ in 0..tokens {
                let work: Vec<(usize, &[u32])> =
                    next.iter().enumerate().map(|(s, t)| (s, &t[..])).collect();
                next = step_argmax(batch.as_mut(), &work)?;
            }
            rates.push((n * tokens) as f64 / t0.elapsed().as_secs_f64());
        }
        let (min, max) = (
            rates.iter().cloned().fold(f64::MAX, f64::min),
            rates.iter().cloned().fold(0.0, f64::max),
        );
        rows.push(Row {
            n,
            agg: median(&mut rates),
            min,
            max,
        });
    }
    let one = rows.iter().find(|r| r.n == 1).map(|r| r.agg);
    if json {
        let v = serde_json::json!({
            "backend": batch.describe(),
            "prompt_len": prompt_len,
            "tokens": tokens,
            "reps": reps,
            "batched": rows.iter().map(|r| serde_json::json!({
                "sequences": r.n,
                "aggregate_tok_s": r.agg,
                "aggregate_tok_s_min": r.min,
                "aggregate_tok_s_max": r.max,
                "per_sequence_tok_s": r.agg / r.n as f64,
                "ms_per_pass": 1e3 * r.n as f64 / r.agg,
                "vs_one": one.map(|o| r.agg / o),
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
        return Ok(());
    }
    println!("backend   {} (batched)", batch.describe());
    for r in &rows {
        let vs = one.map_or(String::new(), |o| format!(", {:.2}x one", r.agg / o));
        println!(
            "{:3} seq   {:10.1} tok/s aggregate (median of {reps}, range {:.1} .. {:.1}), {:.1} per sequence, {:.2} ms a pass{vs}",
            r.n,
            r.agg,
            r.min,
            r.max,
            r.agg / r.n as f64,
            1e3 * r.n as f64 / r.agg
        );
    }
    Ok(())
}

/// Step `work` and take each item's greedy next token (the device's argmax on
/// the GPU, as a greedy request of the server reads it).
fn step_argmax(b: &mut dyn cqlm::BatchEngine, work: &[(usize, &[u32])]) -> Result<Vec<[u32; 1]>> {
    let steps: Vec<SlotStep<'_>> = work
        .iter()
        .map(|&(slot, ids)| SlotStep::new(slot, ids, Readout::Argmax))
        .collect();
    b.step(&steps)?;
    (0..work.len())
        .map(|k| {
            b.out(k)
                .token()
                .map(|t| [t])
                .ok_or_else(|| anyhow::anyhow!("the batch read out no token"))
        })
        .collect()
}
