//! `cqlm bench`: prefill and decode throughput, median over repetitions.

use super::{make_engine, peak_rss_bytes, rss_bytes, BackendArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use cqlm::diag::stats::median;
use cqlm::host::pool::Pool;
use cqlm::session::sample::argmax;
use cqlm::Readout;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    backend: BackendArgs,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Generated tokens for the decode measurement (logits every token).
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Repetitions; medians and ranges are reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Instead: decode N sequences together through the backend's batch engine
    /// (what `cqlm serve` runs), for each N of this list (e.g. 1,4,8): aggregate
    /// tok/s, ms a pass, and the ratio to one sequence; `--prompt-len` tokens of
    /// prompt each, `--tokens` passes.
    #[arg(long, value_name = "N,...", value_delimiter = ',')]
    sequences: Option<Vec<usize>>,
}

/// Greedy steps measured per repetition (a soak's long decode is not repeated).
const GREEDY_TOKENS: usize = 256;

/// Memory and speed over a long decode (see `run`).
#[derive(Debug, Default)]
struct Soak {
    /// (RSS bytes, device bytes) after 1,000 tokens.
    at_1000: (u64, u64),
    /// (RSS bytes, device bytes) after the last token.
    at_end: (u64, u64),
    /// ms/token of each consecutive window of 1,000 tokens.
    window_ms: Vec<f64>,
}

pub fn run(a: Args) -> Result<()> {
    a.backend.check()?;
    if a.prompt_len == 0 || a.tokens == 0 || a.reps == 0 {
        bail!("--prompt-len, --tokens and --reps must be at least 1");
    }
    if let Some(seqs) = &a.sequences {
        return super::bench_batch::run(
            &a.model,
            &a.backend,
            seqs,
            a.prompt_len,
            a.tokens,
            a.reps,
            a.json,
        );
    }
    let model = a.model.load()?;
    let vocab = model.config.vocab as u32;
    let bytes_per_step = model.weight_bytes_per_step();
    let mut engine = make_engine(model, &a.backend, cqlm::Precision::Fast, true)?;
    let pool = engine.computes_on_host().then(Pool::global);
    let pool_before = pool.map(Pool::stats);
    // A fixed pseudo-random prompt.
    let prompt: Vec<u32> = (0..a.prompt_len as u64)
        .map(|i| ((i.wrapping_mul(2654435761) >> 7) % vocab as u64) as u32)
        .collect();
    let (mut prefill, mut decode, mut greedy) = (Vec::new(), Vec::new(), Vec::new());
    // Soak figures of the first repetition, for runs of at least 2,000 tokens:
    // RSS and device bytes at token 1,000 and at the end, and ms/token of every
    // whole window of 1,000 tokens (a growth with position shows as a trend).
    let mut soak: Option<Soak> = None;
    // Host microseconds per decode step with logits, per rep (device backends).
    let mut host_us: Vec<f64> = Vec::new();
    for rep in 0..a.reps {
        engine.reset();
        let t0 = Instant::now();
        let mut logits = engine.prefill(&prompt)?;
        prefill.push(a.prompt_len as f64 / t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        let h1 = engine.host_time();
        let mut window = Instant::now();
        let mut s = Soak::default();
        for i in 0..a.tokens {
            let next = argmax(&logits);
            logits = engine
                .step(next, Readout::Logits)?
                .logits()
                .map(<[f32]>::to_vec)
                .unwrap_or_default();
            if rep == 0 && a.tokens >= 2000 && (i + 1) % 1000 == 0 {
                // Seconds per 1,000 tokens is milliseconds per token.
                s.window_ms.push(window.elapsed().as_secs_f64());
                window = Instant::now();
                if i + 1 == 1000 {
                    s.at_1000 = (rss_bytes().unwrap_or(0), engine.device_bytes());
                }
            }
        }
        if rep == 0 && a.tokens >= 2000 {
            s.at_end = (rss_bytes().unwrap_or(0), engine.device_bytes());
            soak = Some(s);
        }
        decode.push(a.tokens as f64 / t1.elapsed().as_secs_f64());
        if let (Some(h0), Some(h)) = (h1, engine.host_time()) {
            host_us.extend(h.us_per_step_since(h0));
        }
        // Greedy decode as `generate` runs it: the engine picks the token (the GPU
        // on the device, reading back 8 bytes), continuing from the same state.
        let mut next = argmax(&logits);
        let t2 = Instant::now();
        for _ in 0..a.tokens.min(GREEDY_TOKENS) {
            next = engine
                .step(next, Readout::Argmax)?
                .token()
                .context("the engine returned no token")?;
        }
        greedy.push(a.tokens.min(GREEDY_TOKENS) as f64 / t2.elapsed().as_secs_f64());
    }
    let (pmin, pmax) = (
        prefill.iter().cloned().fold(f64::MAX, f64::min),
        prefill.iter().cloned().fold(0.0, f64::max),
    );
    let (dmin, dmax) = (
        decode.iter().cloned().fold(f64::MAX, f64::min),
        decode.iter().cloned().fold(0.0, f64::max),
    );
    let p = median(&mut prefill);
    let d = median(&mut decode);
    let gd = median(&mut greedy);
    let host_us_per_token = (!host_us.is_empty()).then(|| median(&mut host_us));
    let rss = peak_rss_bytes().unwrap_or(0);
    let spread = spread_warning(&[("prefill", pmin, pmax), ("decode", dmin, dmax)]);
    if let Some(w) = &spread {
        eprintln!("warning: {w}");
    }
    // What the CPU pool did during the bench, and how its size was chosen.
    let pool_done = pool
        .zip(pool_before)
        .map(|(pool, before)| pool.stats().since(&before));
    let pool_line = pool_done.map(|p| {
        serde_json::json!({
            "threads": p.threads,
            "threads_why": Pool::why(),
            "split_jobs": p.split_jobs,
            "alone_jobs": p.alone_jobs,
            "split_share": p.split_share(),
            "parts_taken_by_caller": p.parts_taken_by_caller,
            "alone_under_load": p.alone_under_load,
            "switches": p.switches,
        })
    });
    if a.json {
        let v = serde_json::json!({
            "backend": engine.describe(),
            "precision": engine.precision().as_str(),
            "prompt_len": a.prompt_len,
            "tokens": a.tokens,
            "reps": a.reps,
            "prefill_tok_s": p,
            "prefill_tok_s_min": pmin,
            "prefill_tok_s_max": pmax,
            "decode_tok_s": d,
            "decode_tok_s_min": dmin,
            "decode_tok_s_max": dmax,
            "decode_ms_per_token": 1000.0 / d,
            "decode_greedy_tok_s": gd,
            "weight_bytes_per_step": bytes_per_step,
            "dispatches_per_token": engine.dispatches_per_token(),
            "host_us_per_token": host_us_per_token,
            "prefill_chunk": engine.prefill_chunk(),
            "peak_rss_bytes": rss,
            "gpu_buffer_bytes": engine.device_bytes(),
            "cpu_pool": pool_line,
            "spread_warning": spread,
            "soak": soak.as_ref().map(|s| serde_json::json!({
                "rss_bytes_at_1000": s.at_1000.0, "rss_bytes_at_end": s.at_end.0,
                "gpu_bytes_at_1000": s.at_1000.1, "gpu_bytes_at_end": s.at_end.1,
                "ms_per_token_per_1000": s.window_ms,
            })),
        });
        println!("{v}");
    } else {
        println!("backend   {}", engine.describe());
        println!(
            "prefill   {p:10.1} tok/s  (median of {}, range {pmin:.1} .. {pmax:.1}; {} tokens, no logits but the last)",
            a.reps, a.prompt_len
        );
        println!(
            "decode    {d:10.1} tok/s  (median of {}, range {dmin:.1} .. {dmax:.1}; {} tokens, logits every token) = {:.2} ms/token",
            a.reps,
            a.tokens,
            1000.0 / d
        );
        println!(
            "greedy    {gd:10.1} tok/s  (median of {}; {} tokens picked by the engine, no logits read back)",
            a.reps,
            a.tokens.min(GREEDY_TOKENS)
        );
        println!(
            "weights   {:.2} MB read per decode step, {:.2} GB/s effective",
            bytes_per_step as f64 / 1e6,
            bytes_per_step as f64 * d / 1e9
        );
        println!("peak RSS  {:.1} MB", rss as f64 / 1e6);
        if let Some(p) = &pool_done {
            println!(
                "threads   {} ({}); {:.0}% of {} pool jobs split over them, {} of their parts run by the caller because no other thread had claimed them (threads the OS had not run); {} jobs run on one thread because the cores were all taken ({} turns between the two)",
                p.threads,
                Pool::why(),
                p.split_share() * 100.0,
                p.split_jobs + p.alone_jobs,
                p.parts_taken_by_caller,
                p.alone_under_load,
                p.switches,
            );
        }
        if let Some(s) = &soak {
            let (x, y) = (s.at_1000, s.at_end);
            let w = &s.window_ms;
            let (lo, hi) = (
                w.iter().cloned().fold(f64::MAX, f64::min),
                w.iter().cloned().fold(0.0, f64::max),
            );
            println!(
                "soak      RSS {:.2} MB at token 1000, {:.2} MB at token {} ({:+.2}%); device {} -> {} bytes",
                x.0 as f64 / 1e6,
                y.0 as f64 / 1e6,
                a.tokens,
                (y.0 as f64 / x.0.max(1) as f64 - 1.0) * 100.0,
                x.1,
                y.1,
            );
            println!(
                "soak      ms/token per 1000 tokens: first {:.3}, last {:.3}, min {lo:.3}, max {hi:.3}; all: {}",
                w.first().copied().unwrap_or(0.0),
                w.last().copied().unwrap_or(0.0),
                w.iter().map(|v| format!("{v:.3}")).collect::<Vec<_>>().join(" ")
            );
        }
        if let Some(d) = engine.dispatches_per_token() {
            println!(
                "gpu       {d} dispatches per token, {:.1} MB of device buffers",
                engine.device_bytes() as f64 / 1e6
            );
        }
        if let Some(h) = host_us_per_token {
            println!(
                "host      {h:10.1} µs per decode token (median of {}): step buffer, recording, submit; not the wait",
                a.reps
            );
        }
    }
    Ok(())
}

/// A warning when the repetitions of a figure (name, slowest, fastest) spread
/// more than 2x: the machine was busy, and the medians are not the engine's.
fn spread_warning(figures: &[(&str, f64, f64)]) -> Option<String> {
    let wide: Vec<String> = figures
        .iter()
        .filter(|(_, lo, hi)| *hi > 2.0 * *lo)
        .map(|(name, lo, hi)| {
            format!(
                "{name} {lo:.1} .. {hi:.1} tok/s ({:.1}x)",
                hi / lo.max(f64::MIN_POSITIVE)
            )
        })
        .collect();
    (!wide.is_empty()).then(|| {
        format!(
            "the repetitions spread more than 2x ({}): other programs were using the cores, so these figures are not the engine's; rerun on an idle machine or compare variants interleaved",
            wide.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::spread_warning;

    #[test]
    fn a_spread_over_2x_is_named_and_a_narrow_one_is_not() {
        assert_eq!(spread_warning(&[("decode", 900.0, 1700.0)]), None);
        let w = spread_warning(&[("prefill", 1000.0, 1900.0), ("decode", 63.3, 1400.9)])
            .expect("a 22x spread warns");
        assert!(w.contains("decode 63.3 .. 1400.9 tok/s (22.1x)"), "{w}");
        assert!(!w.contains("prefill"), "{w}");
    }
}
