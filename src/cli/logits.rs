//! `cqlm logits` (docs/SPEC.md §7): the conformance entry point. Keep its form.

use super::{make_engine, parse_ids, with_path, BackendArgs, Ids};
use anyhow::Result;
use cqlm::{Model, Readout};
use npyz::WriterBuilder;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Archive to run.
    #[arg(long, value_name = "PATH")]
    model: PathBuf,
    /// Comma-separated token ids, e.g. 3,17,4.
    #[arg(long, value_name = "IDS", value_parser = parse_ids)]
    ids: Ids,
    #[command(flatten)]
    backend: BackendArgs,
    /// Write the logits after every id ([P, vocab]) instead of only the last ([1, vocab]).
    #[arg(long)]
    all_positions: bool,
    /// Output .npy path (written only on success).
    #[arg(long, value_name = "PATH.npy")]
    out: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    a.backend.check()?;
    let model = Arc::new(Model::load(&a.model)?);
    let vocab = model.config.vocab;
    let mut engine = make_engine(model, &a.backend, cqlm::Precision::Exact, false)?;
    let n = a.ids.0.len();
    let mut rows: Vec<f32> = Vec::with_capacity(if a.all_positions { n * vocab } else { vocab });
    if a.all_positions {
        for &id in &a.ids.0 {
            if let Some(l) = engine.step(id, Readout::Logits)?.logits() {
                rows.extend_from_slice(l);
            }
        }
    } else if let Some(l) = engine.step_many(&a.ids.0, Readout::Logits)?.logits() {
        // Earlier ids prefilled without logits (in chunks on the CPU: the same bits).
        rows.extend_from_slice(l);
    }
    let p = rows.len() / vocab;
    // Write through a temporary file beside the target so a failure leaves nothing behind.
    let dir = a
        .out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let tmp = with_path(tempfile::NamedTempFile::new_in(dir), &a.out)?;
    {
        let mut w = std::io::BufWriter::new(tmp.as_file());
        let mut npy = with_path(
            npyz::WriteOptions::<f32>::new()
                .default_dtype()
                .shape(&[p as u64, vocab as u64])
                .writer(&mut w)
                .begin_nd(),
            &a.out,
        )?;
        with_path(npy.extend(rows.iter().copied()), &a.out)?;
        with_path(npy.finish(), &a.out)?;
        with_path(w.flush(), &a.out)?;
    }
    with_path(tmp.persist(&a.out).map_err(|e| e.error), &a.out)?;
    with_path(cqlm::archive::set_file_mode(&a.out), &a.out)?;
    Ok(())
}
