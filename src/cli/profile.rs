//! `cqlm profile`: per-kernel timings of decode steps, as a table, JSON or an SVG bar chart.

use super::{BackendArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use cqlm::engine::profile::{per_pass, profile_batch, KernelProfile, Timing};
use cqlm::model::weights::Model;
use cqlm::session::builder::AnyEngine;
use cqlm::Engine;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    backend: BackendArgs,
    /// Decode steps to profile (logits every token); times are averaged per token
    /// (with `--sequences`: passes, averaged per pass).
    #[arg(long, default_value_t = 8)]
    tokens: usize,
    /// Prompt tokens stepped first, unprofiled (warm-up; also fills the KV cache).
    #[arg(long, default_value_t = 8)]
    prompt_len: usize,
    /// On the GPU, time each dispatch with its own submit and wait even where
    /// timestamp queries exist (the fallback used where they don't).
    #[arg(long)]
    per_dispatch: bool,
    /// Profile the prefill of the prompt (`--prompt-len` tokens in chunks of
    /// `--prefill-chunk`, logits after the last) instead of decode steps, averaged
    /// per prompt token; `--tokens` is then unused. CPU backend only.
    #[arg(long)]
    prefill: bool,
    /// Profile a pass of N sequences stepped together by the backend's batch
    /// engine (what `cqlm serve --parallel N` runs): each sequence prefills its own
    /// `--prompt-len` tokens unprofiled, then `--tokens` passes of one token of
    /// every sequence are timed, averaged per pass.
    #[arg(long, value_name = "N")]
    sequences: Option<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write a horizontal bar chart of the kernel times to this SVG file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    a.backend.check()?;
    if a.tokens == 0 {
        bail!("--tokens must be at least 1");
    }
    match a.sequences {
        Some(0) => bail!("--sequences must be at least 1"),
        Some(_) if a.prefill => {
            bail!("--prefill profiles one sequence's prefill: drop --sequences")
        }
        _ => {}
    }
    let model = a.model.load()?;
    if let Some(n) = a.sequences {
        return batch(&a, model, n);
    }
    let vocab = model.config.vocab as u64;
    let built = a
        .backend
        .builder(model, cqlm::Precision::Fast)
        .build_any()?;
    super::report_notice(built.notice.as_deref(), true);
    let mut p = built.engine;
    // A fixed pseudo-random sequence: the prompt, then the profiled tokens.
    let ids: Vec<u32> = (0..(a.prompt_len + a.tokens) as u64)
        .map(|i| ((i.wrapping_mul(2654435761) >> 7) % vocab) as u32)
        .collect();
    let (prompt, decode) = ids.split_at(a.prompt_len);
    if a.prefill {
        let AnyEngine::Cpu(e) = &mut p else {
            bail!("--prefill profiles the CPU engine only (add --backend cpu)");
        };
        if prompt.is_empty() {
            bail!("--prefill needs --prompt-len of at least 1");
        }
        // Once unprofiled first: the scratch buffers' first touch is not the
        // prefill's cost.
        e.prefill(prompt)?;
        e.reset();
        let profile = e.profile_prefill(prompt)?;
        let backend = p.as_dyn().describe();
        return report(
            &a,
            &profile,
            &backend,
            p.as_dyn().precision().as_str(),
            0,
            None,
            None,
            "prefill",
        );
    }
    p.as_dyn().prefill(prompt)?;
    let first = p.as_dyn().position();
    let h0 = p.as_dyn().host_time();
    let (profile, dispatches) = match &mut p {
        AnyEngine::Cpu(e) => (e.profile(decode)?, None),
        AnyEngine::Gpu(e) => {
            let timing = if a.per_dispatch {
                Timing::PerDispatch
            } else {
                Timing::Auto
            };
            if !e.context().caps.timestamps {
                eprintln!(
                    "note: adapter `{}` has no timestamp queries inside passes (TIMESTAMP_QUERY + \
                     TIMESTAMP_QUERY_INSIDE_PASSES; or CQLM_NO_TIMESTAMPS is set): timing each \
                     dispatch with its own submit and wait instead, which includes that overhead",
                    e.context().info.name
                );
            }
            (e.profile(decode, timing)?, Some(e.dispatches_per_token().1))
        }
    };
    // Host time of the profiled steps (the in-pass timestamps add a few writes;
    // one submit per dispatch is not a step and reports none).
    let host_us = match (h0, p.as_dyn().host_time()) {
        (Some(h0), Some(h)) => h.us_per_step_since(h0),
        _ => None,
    };
    let backend = p.as_dyn().describe();
    let precision = p.as_dyn().precision().as_str();
    report(
        &a, &profile, &backend, precision, first, dispatches, host_us, "decode",
    )
}

/// `--sequences n`: `a.tokens` passes of one token of each of `n` sequences
/// (after each sequence's own prompt), every dispatch or kernel of the passes
/// timed, averaged per pass.
fn batch(a: &Args, model: Arc<Model>, n: usize) -> Result<()> {
    let mut b = super::make_batch(model, &a.backend, n)?;
    let timing = if a.per_dispatch {
        Timing::PerDispatch
    } else {
        Timing::Auto
    };
    let slots: Vec<usize> = (0..n).collect();
    let profile = profile_batch(b.as_mut(), &slots, a.prompt_len, a.tokens, timing)?;
    report(
        a,
        &profile,
        &b.describe(),
        b.precision().as_str(),
        a.prompt_len as u64,
        None,
        None,
        &format!("batch of {n}"),
    )
}

/// Print (and chart) a profile of `kind` passes (`decode` steps from position
/// `first`, a `prefill`, or passes of a `batch of N` sequences).
#[allow(clippy::too_many_arguments)]
fn report(
    a: &Args,
    profile: &KernelProfile,
    backend: &str,
    precision: &str,
    first: u64,
    dispatches: Option<usize>,
    host_us: Option<f64>,
    kind: &str,
) -> Result<()> {
    if let Some(path) = &a.svg {
        let unit = if kind.starts_with("batch") {
            "pass"
        } else {
            "token"
        };
        svg_chart(path, profile, backend, unit)
            .with_context(|| format!("writing the chart {}", path.display()))?;
    }
    if a.json {
        let rows = profile.rows_json();
        let v = serde_json::json!({
            "backend": backend,
            "precision": precision,
            "pass": kind,
            "method": profile.method,
            "prompt_len": a.prompt_len,
            "tokens": profile.tokens,
            "first_position": first,
            "step_us": profile.step_seconds * 1e6,
            "kernel_sum_us": profile.kernel_seconds() * 1e6,
            "calls_per_token": profile.calls_per_token(),
            "dispatches_per_token": dispatches,
            "host_us_per_token": host_us,
            "bytes_per_token": profile.bytes_per_token(),
            "rows": rows,
        });
        // A batch profile averages per pass: say so in every key.
        let v = if kind.starts_with("batch") {
            per_pass(v)
        } else {
            v
        };
        println!("{v}");
    } else {
        print_table(profile, backend, first, dispatches, kind, a.prompt_len);
        if let Some(h) = host_us {
            println!("host      {h:.1} µs per token recording and submitting (not the wait)");
        }
    }
    Ok(())
}

fn fmt_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.1} kB", b / 1e3)
    }
}

fn print_table(
    p: &KernelProfile,
    backend: &str,
    first: u64,
    dispatches: Option<usize>,
    kind: &str,
    prompt_len: usize,
) {
    println!("backend   {backend}");
    println!("method    {}", p.method);
    let batched = kind.starts_with("batch");
    let unit = if batched { "pass" } else { "token" };
    if kind == "prefill" {
        println!("prefill   {prompt_len} prompt tokens in chunks, logits after the last, averaged per token");
    } else if batched {
        println!(
            "passes    {} passes of one token of each sequence ({kind}, each after its own \
             {prompt_len}-token prompt), logits of every sequence, averaged per pass",
            p.tokens
        );
    } else {
        println!(
            "steps     {} decode steps with logits at positions {first}..{}, averaged per token",
            p.tokens,
            first + p.tokens as u64
        );
    }
    println!();
    let w = p
        .rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .max(12);
    println!(
        "{:<w$}  {:>6}  {:>12}  {:>6}  {:>11}  {:>8}",
        "kernel",
        "calls",
        format!("µs/{unit}"),
        "share",
        "bytes",
        "GB/s"
    );
    // A prefill's kernels run once per chunk, not per token.
    let calls = |c: usize| match kind {
        "prefill" => "-".to_string(),
        _ => c.to_string(),
    };
    for r in &p.rows {
        println!(
            "{:<w$}  {:>6}  {:>12.1}  {:>5.1}%  {:>11}  {:>8.3}",
            r.name,
            calls(r.calls_per_token),
            r.seconds_per_token * 1e6,
            100.0 * p.share(r),
            fmt_bytes(r.bytes_per_token),
            r.gb_per_s()
        );
    }
    let sum = p.kernel_seconds();
    println!(
        "{:<w$}  {:>6}  {:>12.1}  {:>5.1}%  {:>11}  {:>8.3}",
        "kernels",
        calls(p.calls_per_token()),
        sum * 1e6,
        100.0 * sum / p.step_seconds.max(f64::MIN_POSITIVE),
        fmt_bytes(p.bytes_per_token()),
        p.bytes_per_token() as f64 / sum.max(f64::MIN_POSITIVE) / 1e9
    );
    println!(
        "{:<w$}  {:>6}  {:>12.1}  100.0%   (other: {:.1} µs outside the kernels: host work, submit, readback, gaps)",
        format!("{} (wall)", if batched { "pass" } else { "step" }),
        "",
        p.step_seconds * 1e6,
        (p.step_seconds - sum) * 1e6
    );
    if let Some(d) = dispatches {
        println!("gpu       {d} dispatches per token with logits");
    }
}

/// A horizontal bar chart of µs per `unit` (token or pass) per kernel, largest on top.
fn svg_chart(path: &Path, p: &KernelProfile, backend: &str, unit: &str) -> Result<()> {
    use plotters::prelude::*;
    let n = p.rows.len().max(1);
    let max_us = p
        .rows
        .iter()
        .map(|r| r.seconds_per_token * 1e6)
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let label_w = p.rows.iter().map(|r| r.name.len()).max().unwrap_or(8) as u32 * 9 + 16;
    let height = 110 + 30 * n as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let title = format!(
        "cqlm profile: {backend}: {:.1} µs per {}, {:.1} µs in kernels",
        p.step_seconds * 1e6,
        if unit == "pass" { "pass" } else { "step" },
        p.kernel_seconds() * 1e6
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(label_w)
        // n rows: the discrete values 0 ..= n − 1, one segment each.
        .build_cartesian_2d(0.0..max_us * 1.3, (0..n - 1).into_segmented())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Row i (largest first) sits at the top: segment n − 1 − i.
    let names: Vec<String> = p.rows.iter().map(|r| r.name.clone()).collect();
    let label = move |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(k) | SegmentValue::Exact(k) if *k < n => {
            names.get(n - 1 - k).cloned().unwrap_or_default()
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&label)
        .x_desc(format!("µs per {unit}"))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let bar = RGBColor(66, 114, 196);
    chart
        .draw_series(p.rows.iter().enumerate().map(|(i, r)| {
            let y = n - 1 - i;
            let mut rect = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(y)),
                    (r.seconds_per_token * 1e6, SegmentValue::Exact(y + 1)),
                ],
                bar.filled(),
            );
            rect.set_margin(4, 4, 0, 0);
            rect
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(p.rows.iter().enumerate().map(|(i, r)| {
            let y = n - 1 - i;
            Text::new(
                format!(
                    "{:.1} µs, {:.1}%, ×{}",
                    r.seconds_per_token * 1e6,
                    100.0 * p.share(r),
                    r.calls_per_token
                ),
                (
                    r.seconds_per_token * 1e6 + max_us * 0.01,
                    SegmentValue::CenterOf(y),
                ),
                ("sans-serif", 12).into_font(),
            )
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
