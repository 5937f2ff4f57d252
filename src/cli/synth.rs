//! `cqlm synth`: write a random but well-conditioned archive, or (`--float`) a
//! random float checkpoint for `cqlm pack`.

use anyhow::{bail, Context, Result};
use cqlm::archive::{write_float_checkpoint, FloatDtype};
use cqlm::cq::{plan_for_preset, BitsPlan};
use cqlm::make::synth::{synth_float_tensors, synth_tensors};
use cqlm::Config;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Preset: tiny, default or large.
    #[arg(
        long,
        value_name = "NAME",
        required_unless_present = "config",
        conflicts_with = "config"
    )]
    preset: Option<String>,
    /// A config JSON file (docs/SPEC.md §1) instead of a preset.
    #[arg(long, value_name = "FILE.json")]
    config: Option<PathBuf>,
    /// Seed; the same seed gives the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a float checkpoint (dense random weights, the input of `cqlm pack`) instead of an archive.
    #[arg(long)]
    float: bool,
    /// Storage dtype of `--float` checkpoints.
    #[arg(long, value_enum, default_value = "f32", requires = "float")]
    dtype: Dtype,
    /// Output path.
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
}

/// Storage dtype of a float checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dtype {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

pub fn run(a: Args) -> Result<()> {
    let (config, plan) = match (&a.preset, &a.config) {
        (Some(name), _) => match Config::preset(name) {
            Some(c) => (c, plan_for_preset(name)),
            None => bail!("unknown preset `{name}` (expected tiny, default or large)"),
        },
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
            let c = Config::from_json(&text).with_context(|| format!("{}", path.display()))?;
            (c, BitsPlan::standard())
        }
        (None, None) => bail!("give --preset or --config"),
    };
    if a.float {
        let tensors = synth_float_tensors(&config, a.seed);
        let dtype = match a.dtype {
            Dtype::F32 => FloatDtype::F32,
            Dtype::F16 => FloatDtype::F16,
            Dtype::Bf16 => FloatDtype::BF16,
        };
        write_float_checkpoint(&a.out, Some(&config), &tensors, dtype)?;
        let bytes = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
        eprintln!(
            "wrote float checkpoint {} ({bytes} bytes, {dtype:?}, seed {})",
            a.out.display(),
            a.seed
        );
        return Ok(());
    }
    let tensors = synth_tensors(&config, &plan, a.seed);
    cqlm::archive::write_archive_file(&a.out, &config, None, &tensors)?;
    let bytes = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
    eprintln!("wrote {} ({bytes} bytes, seed {})", a.out.display(), a.seed);
    Ok(())
}
