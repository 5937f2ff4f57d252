//! `cqlm inspect`: what an archive holds.

use anyhow::Result;
use cqlm::archive::{read_archive_file, Tensor};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Archive to describe.
    archive: PathBuf,
}

/// The kind of matrix a tensor name belongs to, for the byte table.
fn class_of(name: &str) -> &'static str {
    if name == "embed" {
        "embed"
    } else if name.starts_with("mhc.phi") {
        "mhc.phi"
    } else if name.starts_with("engram.table.") {
        "engram tables"
    } else if name.starts_with("engram.") && (name.ends_with(".wk") || name.ends_with(".wv")) {
        "engram projections"
    } else if name.starts_with("layers.") && name.contains(".w") {
        "attention (wq wk wv wg wo)"
    } else {
        "f32 vectors"
    }
}

pub fn run(a: Args) -> Result<()> {
    let raw = read_archive_file(&a.archive)?;
    let file_bytes = std::fs::metadata(&a.archive).map(|m| m.len()).unwrap_or(0);
    let c = &raw.config;
    println!("archive   {} ({file_bytes} bytes)", a.archive.display());
    println!("config    {}", c.to_json());
    println!(
        "shape     vocab {} hidden {} layers {} heads {}/{}x{} hadamard {} sink {} window {}",
        c.vocab,
        c.hidden,
        c.layers,
        c.heads,
        c.kv_heads,
        c.head_dim,
        c.hadamard_dim,
        c.sink,
        c.window
    );
    match &c.engram {
        Some(e) => println!(
            "engram    sites {:?} orders {:?} heads {} dim {} taps {} dilation {} (E = {}, ring = {})",
            e.sites, e.orders, e.hash_heads, e.dim, e.taps, e.dilation, e.e_dim(), e.ring()
        ),
        None => println!("engram    none"),
    }
    println!(
        "tokenizer {}",
        if raw.tokenizer.is_some() {
            "embedded"
        } else {
            "none"
        }
    );
    let stored: usize = raw
        .tensors
        .values()
        .map(|t| if matches!(t, Tensor::Cq(_)) { 3 } else { 1 })
        .sum();
    let cq = raw
        .tensors
        .values()
        .filter(|t| matches!(t, Tensor::Cq(_)))
        .count();
    println!(
        "tensors   {stored} stored ({cq} CQ matrices, {} f32)",
        raw.tensors.len() - cq
    );

    let mut by_class: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut hist: BTreeMap<(u32, usize), (usize, usize)> = BTreeMap::new();
    for (name, t) in &raw.tensors {
        let (bytes, params) = match t {
            Tensor::Cq(m) => {
                let e = hist.entry((m.bits(), m.group())).or_default();
                e.0 += 1;
                e.1 += m.rows() * m.cols();
                (m.stored_bytes(), m.rows() * m.cols())
            }
            Tensor::F32 { data, .. } => (data.len() * 4, data.len()),
        };
        let e = by_class.entry(class_of(name)).or_default();
        e.0 += bytes;
        e.1 += params;
    }
    println!(
        "\n{:<28} {:>12} {:>12} {:>8}",
        "kind", "bytes", "weights", "bits/w"
    );
    for (class, (bytes, params)) in &by_class {
        println!(
            "{class:<28} {bytes:>12} {params:>12} {:>8.3}",
            *bytes as f64 * 8.0 / (*params).max(1) as f64
        );
    }
    println!(
        "\n{:<6} {:<6} {:>9} {:>12}",
        "bits", "group", "matrices", "weights"
    );
    for ((bits, group), (n, params)) in &hist {
        println!("{bits:<6} {group:<6} {n:>9} {params:>12}");
    }
    let model = cqlm::Model::from_raw(raw).map_err(|kind| cqlm::Error::Archive {
        archive: a.archive.display().to_string(),
        kind,
    })?;
    println!(
        "\nweights read per decode step: {} bytes",
        model.weight_bytes_per_step()
    );
    Ok(())
}
