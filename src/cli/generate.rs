//! `cqlm generate`: text or ids in, tokens streamed out, a stats line on stderr.

use super::{parse_ids, BackendArgs, Ids, ModelArgs};
use anyhow::{bail, Context, Result};
use cqlm::constrain::{ConstraintSpec, JsonWhitespace, TokenSpace, ToolMarkers, ToolSet};
use cqlm::session::sample::{Sampler, SamplerConfig};
use cqlm::session::tokenizer::{TextStream, TextTokenizer};
use cqlm::session::{Finish, Generation, Session};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text, tokenized with the archive's embedded tokenizer (BOS added when
    /// its post-processor doesn't). Without --prompt, --prompt-file or --ids, a
    /// prompt piped on standard input is read; else the prompt is the model's BOS.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["ids", "prompt_file"])]
    prompt: Option<String>,
    /// Read the prompt text from this file.
    #[arg(long, value_name = "FILE", conflicts_with = "ids")]
    prompt_file: Option<PathBuf>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_name = "IDS", value_parser = parse_ids)]
    ids: Option<Ids>,
    /// Most tokens to generate; generation also ends at the end of text
    /// (-1: no limit but the end of text or Ctrl-C).
    #[arg(long, default_value_t = 256, allow_negative_numbers = true, value_parser = max_tokens)]
    max_tokens: i64,
    /// Sampling temperature; 0 is greedy (the most likely token, every time).
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Sample only among the k most likely tokens (0: all) [default: 40].
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probability reaches p [default: 0.95].
    #[arg(long)]
    top_p: Option<f32>,
    /// Sample only among tokens at least this likely relative to the most likely one
    /// (0: off) [default: 0.05].
    #[arg(long)]
    min_p: Option<f32>,
    /// Penalise tokens seen in the last 64 (1: off).
    #[arg(long)]
    repeat_penalty: Option<f32>,
    /// Sampling seed: the same seed and flags give the same text [default: a random
    /// one, printed in the stats line].
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when the generated text contains this (repeatable; needs a tokenizer).
    #[arg(long, value_name = "STRING")]
    stop: Vec<String>,
    #[command(flatten)]
    constraint: ConstraintArgs,
    #[command(flatten)]
    constraint_options: ConstraintOptions,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Structured output: at most one of a schema, a pattern, a grammar or a tool set.
#[derive(Debug, clap::Args)]
#[group(multiple = false, id = "constraint")]
struct ConstraintArgs {
    /// Output JSON valid against this JSON Schema file (compact unless --json-whitespace).
    #[arg(long, value_name = "FILE", conflicts_with = "stop")]
    json_schema: Option<PathBuf>,
    /// Output text that matches this regular expression as a whole.
    #[arg(long, value_name = "PATTERN", conflicts_with = "stop")]
    regex: Option<String>,
    /// Output text in the language of this Lark grammar file (llguidance's dialect).
    #[arg(long, value_name = "FILE.lark", conflicts_with = "stop")]
    grammar: Option<PathBuf>,
    /// Output a tool call over these tools (an OpenAI `tools` array in a JSON file).
    #[arg(long, value_name = "FILE.json", conflicts_with = "stop")]
    tools: Option<PathBuf>,
}

/// Options of a constrained output (outside the group: they qualify one of it).
#[derive(Debug, clap::Args)]
struct ConstraintOptions {
    /// With --tools: auto (text or a call between <tool_call> markers), required
    /// (a call), none (text) or a tool's name (a call of it).
    #[arg(long, value_name = "C", default_value = "auto", requires = "tools")]
    tool_choice: String,
    /// With --tools and a required or named choice: a JSON array of one or more calls.
    #[arg(long, requires = "tools")]
    parallel_tool_calls: bool,
    /// With --json-schema: allow up to N whitespace characters wherever JSON allows
    /// them (0: compact).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "json_schema")]
    json_whitespace: usize,
}

/// A constrained output cut by `--max-tokens` before it was complete (exit 3).
#[derive(Debug)]
pub struct Incomplete(pub usize);

impl std::fmt::Display for Incomplete {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--max-tokens {} reached before the output was complete",
            self.0
        )
    }
}

impl std::error::Error for Incomplete {}

fn read(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))
}

fn read_json(path: &Path, what: &str) -> Result<serde_json::Value> {
    let text = read(path, what)?;
    serde_json::from_str(&text)
        .with_context(|| format!("the {what} {} is not valid JSON", path.display()))
}

impl ConstraintArgs {
    /// The constraint these flags ask for, if any (a tool set's calls between
    /// `markers` in `auto` mode).
    fn spec(&self, o: &ConstraintOptions, markers: &ToolMarkers) -> Result<Option<ConstraintSpec>> {
        Ok(Some(if let Some(p) = &self.json_schema {
            ConstraintSpec::JsonSchema {
                schema: read_json(p, "JSON schema")?,
                whitespace: JsonWhitespace(o.json_whitespace),
            }
        } else if let Some(rx) = &self.regex {
            ConstraintSpec::Regex(rx.clone())
        } else if let Some(p) = &self.grammar {
            ConstraintSpec::Lark(read(p, "grammar")?)
        } else if let Some(p) = &self.tools {
            ConstraintSpec::Tools {
                tools: ToolSet::from_openai(&read_json(p, "tool set")?)?
                    .with_markers(markers.clone()),
                choice: o.tool_choice.parse()?,
                parallel: o.parallel_tool_calls,
            }
        } else {
            return Ok(None);
        }))
    }
}

/// Set by Ctrl-C; generation stops at the next token and still prints its stats.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} tokens ({per_sec})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_message(msg.to_string());
    pb
}

pub fn run(a: Args) -> Result<()> {
    a.backend.check()?;
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst));
    let model = a.model.load()?;
    let tok = match model.tokenizer.is_some() {
        true => Some(TextTokenizer::for_model(&model)?),
        false => None,
    };
    if !a.stop.is_empty() && tok.is_none() {
        bail!("--stop needs the archive's tokenizer to see text");
    }
    // A constraint is compiled before anything runs: one that can't be is an
    // error with nothing on stdout, never unconstrained output.
    let constraint = match a
        .constraint
        .spec(&a.constraint_options, &model.tool_markers)?
    {
        Some(spec) => Some(TokenSpace::for_model(&model)?.compile(&spec)?),
        None => None,
    };
    let prompt_text = match (&a.prompt, &a.prompt_file) {
        (Some(text), _) => Some(text.clone()),
        (None, Some(path)) => Some(read(path, "prompt file")?),
        (None, None) if a.ids.is_none() && !std::io::stdin().is_terminal() => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read the prompt from standard input")?;
            // An empty stdin (/dev/null, a closed pipe) is no prompt.
            (!text.is_empty()).then_some(text)
        }
        (None, None) => None,
    };
    if prompt_text.is_some() && tok.is_none() {
        bail!("this archive has no embedded tokenizer (cqlm.tokenizer): give --ids instead of a text prompt");
    }
    let ids = match (&prompt_text, &a.ids) {
        (Some(text), _) => tok
            .as_ref()
            .map(|t| t.encode(text))
            .transpose()?
            .unwrap_or_default(),
        (None, Some(ids)) => ids.0.clone(),
        (None, None) => vec![model.config.bos],
    };
    let (sampler, seed) = sampler(&a)?;
    if a.max_tokens == 0 {
        bail!("--max-tokens 0 generates nothing (-1: no limit)");
    }
    let max_tokens = usize::try_from(a.max_tokens).unwrap_or(usize::MAX);
    let load = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    load.set_message("loading the model onto the device");
    load.enable_steady_tick(std::time::Duration::from_millis(120));
    let mut session =
        Session::from_builder(a.backend.builder(Arc::clone(&model), cqlm::Precision::Fast))?;
    load.finish_and_clear();
    super::report_notice(session.fallback_reason(), true);

    let t0 = Instant::now();
    let pb = bar(ids.len() as u64, "prefill");
    if ids.len() < 64 {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    let done = session.prefill_with(&ids, |n| {
        pb.set_position(n as u64);
        !INTERRUPTED.load(Ordering::SeqCst)
    })?;
    pb.finish_and_clear();
    let prefill_s = t0.elapsed().as_secs_f64();

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let nucleus_draws = sampler.top_p_only().is_some();
    let (eos, vocab) = (model.config.eos, model.config.vocab);
    let mut generation = Generation::new(Vec::new(), sampler, eos, max_tokens);
    if let Some(t) = &tok {
        generation = generation.with_text(TextStream::new(t, a.stop.clone()));
    }
    let constrained = constraint.is_some();
    if let Some(c) = constraint {
        generation = generation.with_constraint(c, vocab);
    }
    let t1 = Instant::now();
    let mut error = None;
    let mut finish = Finish::Cancelled;
    if done == ids.len() {
        // Text as it grows (never a partial character, never what could still
        // become a stop string); ids when the archive has no tokenizer.
        let has_text = tok.is_some();
        let mut print = |e: cqlm::session::Emitted<'_>| -> std::io::Result<()> {
            if has_text {
                out.write_all(e.text.as_bytes())?;
            } else {
                for id in e.ids {
                    write!(out, "{id} ")?;
                }
            }
            out.flush()
        };
        finish = session.run(&mut generation, |e| {
            if let Err(err) = print(e) {
                error = Some(err);
                return false;
            }
            !INTERRUPTED.load(Ordering::SeqCst)
        })?;
    }
    if let Some(e) = error {
        return Err(e.into());
    }
    let generated = generation.generated();
    if let Some(text) = generation.text() {
        out.write_all(text.rest()?.as_bytes())?;
    }
    writeln!(out)?;
    let decode_s = t1.elapsed().as_secs_f64();
    // A top-p sampler without a top-k draws from the engine's 256 best candidates
    // unless they can't decide; say how often the logits had to be read.
    let nucleus = match nucleus_draws {
        true => format!(
            " | top-p: {} of {generated} draws read the logits",
            session.nucleus_misses()
        ),
        false => String::new(),
    };
    // Constrained: the mask time per masked token, and the forced share.
    let stats = generation.constraint_stats();
    let masks = if constrained {
        format!(
            " | mask {:.1} µs/token, {} of {generated} tokens forced",
            stats.mask_us(),
            stats.forced.min(generated)
        )
    } else {
        String::new()
    };
    let interrupted = INTERRUPTED.load(Ordering::SeqCst);
    eprintln!(
        "{}prompt {} tokens, prefill {:.1} tok/s | generated {generated} tokens, decode {:.1} tok/s | {} | {}{nucleus}{masks}",
        if interrupted { "interrupted | " } else { "" },
        done,
        done as f64 / prefill_s.max(1e-9),
        generated as f64 / decode_s.max(1e-9),
        seed.map_or("greedy".to_string(), |s| format!("seed {s}")),
        session.engine().describe()
    );
    if constrained && finish != Finish::Complete {
        if interrupted {
            bail!("interrupted before the output was complete");
        }
        return Err(Incomplete(max_tokens).into());
    }
    Ok(())
}

/// The sampler the flags describe, with llama.cpp's defaults (temperature 0.8,
/// top-k 40, top-p 0.95, min-p 0.05, a random seed), and the seed it draws
/// with (`None` when greedy). At temperature 0 the sampling flags change
/// nothing: a note says so rather than ignoring them silently.
fn sampler(a: &Args) -> Result<(Sampler, Option<u64>)> {
    let greedy = a.temperature == 0.0;
    if greedy {
        let given: Vec<&str> = [
            ("--top-k", a.top_k.is_some()),
            ("--top-p", a.top_p.is_some()),
            ("--min-p", a.min_p.is_some()),
            ("--seed", a.seed.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
        if !given.is_empty() {
            eprintln!(
                "note: {} {} no effect at --temperature 0 (greedy)",
                given.join(", "),
                if given.len() == 1 { "has" } else { "have" }
            );
        }
    }
    let seed = a.seed.unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let sampler = Sampler::new(SamplerConfig {
        temperature: a.temperature,
        top_k: a.top_k.unwrap_or(40),
        top_p: a.top_p.unwrap_or(0.95),
        min_p: a.min_p.unwrap_or(0.05),
        repeat_penalty: a.repeat_penalty.unwrap_or(1.0),
        seed,
        ..SamplerConfig::default()
    })?;
    Ok((sampler, (!greedy).then_some(seed)))
}

/// `--max-tokens`: a count of tokens, or -1 for no limit.
fn max_tokens(s: &str) -> std::result::Result<i64, String> {
    match s.parse::<i64>() {
        Ok(n) if n >= -1 => Ok(n),
        _ => Err("expected a number of tokens, or -1 for no limit".into()),
    }
}
