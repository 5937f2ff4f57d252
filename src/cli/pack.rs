//! `cqlm pack`: quantize a float checkpoint into an archive.

use anyhow::{bail, Context, Result};
use cqlm::archive::read_float_checkpoint;
use cqlm::constrain::ToolMarkers;
use cqlm::make::pack::{bits_per_weight, pack, PackPlan, PackProgress};
use cqlm::{ArchiveError, Config, Error};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Float checkpoint: safetensors with the docs/SPEC.md §3 names, every CQ matrix one dense
    /// F32/F16/BF16 [rows, cols] tensor (`cqlm synth --float` writes one).
    #[arg(long, value_name = "FLOAT.safetensors")]
    model: PathBuf,
    /// Config JSON (docs/SPEC.md §1); default: the checkpoint's `cqlm.config` metadata.
    #[arg(long, value_name = "FILE.json")]
    config: Option<PathBuf>,
    /// Hugging Face tokenizer.json to embed (default: the checkpoint's `cqlm.tokenizer`, if any).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Jinja chat template to embed as `cqlm.chat_template` (Hugging Face variables:
    /// messages, tools, add_generation_prompt, bos_token, eos_token), for `cqlm serve`
    /// (default: the checkpoint's `cqlm.chat_template`, if any).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// The text before and after a tool call in `auto` mode, to embed as
    /// `cqlm.tool_call_markers` (default: the checkpoint's, if any; without any,
    /// engines use <tool_call> and </tool_call>).
    #[arg(long, num_args = 2, value_names = ["START", "END"])]
    tool_call_markers: Option<Vec<String>>,
    /// Bits per class, CLASS=BITS,... with BITS in 1, 2, 4, 8 and CLASS in embed, attn
    /// (or attn_qg, attn_kv, attn_o), phi, engram (or engram_table, engram_proj), all.
    /// Classes not named keep the defaults embed=4,attn=2,phi=4,engram=4.
    #[arg(long, value_name = "CLASS=BITS,...", value_parser = parse_bits)]
    bits: Option<PackPlan>,
    /// Columns per group: a power of two >= 32; narrower matrices use the smallest
    /// power of two >= max(32, cols).
    #[arg(long, default_value_t = 128, value_parser = parse_group)]
    group: usize,
    /// Output archive path.
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
}

fn parse_bits(s: &str) -> std::result::Result<PackPlan, String> {
    PackPlan::standard().with_bits(s)
}

fn parse_group(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(g) if g >= 32 && g.is_power_of_two() => Ok(g),
        _ => Err(format!("`{s}` is not a power of two >= 32")),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

pub fn run(a: Args) -> Result<()> {
    if same_file(&a.model, &a.out) {
        bail!(
            "--out {} is the input checkpoint: give another path",
            a.out.display()
        );
    }
    let config = match &a.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
            Some(Config::from_json(&text).with_context(|| path.display().to_string())?)
        }
        None => None,
    };
    let tokenizer = match &a.tokenizer {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
            if let Err(e) = text.parse::<tokenizers::Tokenizer>() {
                bail!("{}: not a Hugging Face tokenizer.json: {e}", path.display());
            }
            Some(text)
        }
        None => None,
    };
    // Checked before the (long) packing, as the other inputs are.
    let markers = match &a.tool_call_markers {
        Some(m) => Some(
            ToolMarkers::new(&m[0], &m[1])
                .map_err(|e| anyhow::anyhow!("--tool-call-markers: {e}"))?,
        ),
        None => None,
    };
    let chat_template = match &a.chat_template {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
            if let Err(e) = cqlm::serve::chat::ChatTemplate::new(Some(&text), "", "") {
                bail!("{}: {e}", path.display());
            }
            Some(text)
        }
        None => None,
    };
    let ckpt = match read_float_checkpoint(&a.model, config) {
        Ok(c) => c,
        Err(Error::Archive {
            archive,
            kind: ArchiveError::MissingConfig,
        }) => bail!(
            "{archive}: the checkpoint has no `cqlm.config` metadata: give --config FILE.json"
        ),
        Err(e) => return Err(e.into()),
    };
    let mut plan = a.bits.clone().unwrap_or_else(PackPlan::standard);
    plan.group = a.group;

    // Write beside the target, then rename: a failed write leaves no partial archive.
    // Created before the slow part, so an unwritable --out fails at once.
    let dir = match a.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".cqlm-pack-")
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create the output in {}", dir.display()))?;

    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:40}] {percent:>3}% {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let on_progress = |p: PackProgress<'_>| {
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        if let Some(t) = p.tensor {
            bar.set_message(t.to_string());
        }
    };
    let packed = pack(&ckpt.config, &ckpt.tensors, &plan, on_progress);
    bar.finish_and_clear();
    let (tensors, report) = packed.with_context(|| a.model.display().to_string())?;
    drop(ckpt.tensors);

    let tok = tokenizer.as_deref().or(ckpt.tokenizer.as_deref());
    let template = chat_template.as_deref().or(ckpt.chat_template.as_deref());
    if chat_template.is_none() {
        if let Some(Err(e)) =
            template.map(|t| cqlm::serve::chat::ChatTemplate::new(Some(t), "", ""))
        {
            bail!("{}: its cqlm.chat_template: {e}", a.model.display());
        }
    }
    let markers = markers.or(ckpt.tool_markers.clone());
    cqlm::archive::write_archive_file_with_chat(
        tmp.path(),
        &ckpt.config,
        tok,
        template,
        markers.as_ref(),
        &tensors,
    )?;
    tmp.persist(&a.out)
        .with_context(|| a.out.display().to_string())?;
    cqlm::archive::set_file_mode(&a.out).with_context(|| a.out.display().to_string())?;
    let file_bytes = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);

    // The report goes to stdout in one write; a closed pipe (`| head`) is not an error.
    let mut text = format!(
        "{:<24} {:>13} {:>4} {:>5} {:>10} {:>10}\n",
        "tensor", "rows×cols", "bits", "group", "rel MSE", "bytes"
    );
    for r in &report {
        text += &format!(
            "{:<24} {:>13} {:>4} {:>5} {:>10.3e} {:>10}\n",
            r.name,
            format!("{}×{}", r.rows, r.cols),
            r.bits,
            r.group,
            r.rel_mse,
            r.bytes
        );
    }
    let weights: usize = report.iter().map(|r| r.rows * r.cols).sum();
    let cq_bytes: usize = report.iter().map(|r| r.bytes).sum();
    let mean_mse = report
        .iter()
        .map(|r| r.rel_mse * (r.rows * r.cols) as f64)
        .sum::<f64>()
        / weights.max(1) as f64;
    text += &format!(
        "\ntotal: {} CQ matrices, {weights} weights, {cq_bytes} CQ bytes, {:.3} bits per weight, mean rel MSE {mean_mse:.3e}\n",
        report.len(),
        bits_per_weight(&report)
    );
    text += &format!("archive: {} ({file_bytes} bytes)\n", a.out.display());
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("stdout"),
        _ => Ok(()),
    }
}
