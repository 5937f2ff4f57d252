//! Random but well-conditioned archives for a config (`cqlm synth`), deterministic
//! for a seed: every tensor draws from its own ChaCha stream keyed by its name.
//! [`synth_float_tensors`] makes the float checkpoints that `cqlm pack` reads.

use crate::archive::{
    engram_table_names, expected_tensors, write_archive, FloatTensor, Tensor, TensorKind,
};
use crate::cq::quantize::lloyd_max_gaussian;
use crate::cq::{BitsPlan, CqMatrix};
use crate::error::Result;
use crate::model::config::Config;
use crate::model::engram::fnv1a64_words;
use crate::model::weights::Model;
use half::f16;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Engram table sizes used by synthesized archives: 65,521 rows (the largest
/// prime below 2^16) for large configs, small distinct primes for tiny ones.
fn table_rows(config: &Config, k: usize) -> usize {
    if config.hidden >= 256 {
        65521
    } else {
        [97, 89, 83, 79, 73, 71, 67, 61][k % 8]
    }
}

fn rng_for(seed: u64, name: &str) -> ChaCha8Rng {
    let words = name.bytes().map(u32::from);
    ChaCha8Rng::seed_from_u64(fnv1a64_words(words) ^ seed.rotate_left(17))
}

/// A random CQ matrix whose dense weights have standard deviation `std`:
/// uniform random indices over the Gaussian Lloyd–Max levels, norms jittered by ±10%.
pub fn random_cq(
    rng: &mut ChaCha8Rng,
    rows: usize,
    cols: usize,
    bits: u32,
    group: usize,
    std: f32,
) -> CqMatrix {
    let groups = cols.div_ceil(group);
    let (levels, _) = lloyd_max_gaussian(bits);
    let codebook: Vec<f32> = levels.iter().map(|&v| v as f32).collect();
    let level_var = codebook.iter().map(|v| v * v).sum::<f32>() / codebook.len() as f32;
    let base = std / level_var.sqrt();
    let norms: Vec<f32> = (0..rows * groups)
        .map(|_| f16::from_f32(base * rng.random_range(0.9f32..1.1)).to_f32())
        .collect();
    let row_bytes = groups * group * bits as usize / 8;
    let mut packed = vec![0u8; rows * row_bytes];
    rng.fill_bytes(&mut packed);
    CqMatrix::from_parts(rows, cols, bits, group, groups, codebook, norms, packed)
}

fn random_f32(rng: &mut ChaCha8Rng, name: &str, shape: &[usize], config: &Config) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let last = name.rsplit('.').next().unwrap_or(name);
    let normal = |rng: &mut ChaCha8Rng, mean: f32, std: f32| -> Vec<f32> {
        let d =
            Normal::new(mean, std).unwrap_or_else(|_| Normal::new(0.0, 1.0).expect("unit normal"));
        (0..n).map(|_| d.sample(rng)).collect()
    };
    let ratio = (config.hadamard_dim as f32 / config.hidden as f32).sqrt();
    match last {
        "a_pre" | "a_post" | "a_res" => normal(rng, 0.5, 0.1),
        "b_pre" | "b_post" => normal(rng, 0.0, 0.5),
        "b_res" => normal(rng, 0.0, 1.0),
        "attn_out_scale" => normal(rng, 1.0, 0.1),
        "mlp_d1" => (0..n)
            .map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 })
            .collect(),
        "mlp_d2" => (0..n)
            .map(|_| {
                let s = if rng.random::<bool>() { 1.0 } else { -1.0 };
                s * ratio * rng.random_range(0.5f32..1.5)
            })
            .collect(),
        "mlp_d3" => normal(rng, 0.0, 1.0),
        "conv" => normal(rng, 0.0, 0.5 / (shape[0] as f32).sqrt()),
        // ZCRMS gains: near the identity.
        _ => normal(rng, 0.0, 0.1),
    }
}

/// Every tensor of a random archive for `config`.
pub fn synth_tensors(config: &Config, plan: &BitsPlan, seed: u64) -> BTreeMap<String, Tensor> {
    let tables = engram_table_names(config);
    let specs = expected_tensors(config);
    specs
        .par_iter()
        .map(|spec| {
            let mut rng = rng_for(seed, &spec.name);
            let t = match &spec.kind {
                TensorKind::F32 { shape } => Tensor::F32 {
                    shape: shape.clone(),
                    data: random_f32(&mut rng, &spec.name, shape, config),
                },
                TensorKind::Cq { rows, cols } => {
                    let rows = rows.unwrap_or_else(|| {
                        let k = tables.iter().position(|n| n == &spec.name).unwrap_or(0);
                        table_rows(config, k)
                    });
                    let bits = plan.bits_for(&spec.name);
                    let group = plan.group_for(*cols);
                    // Unit-variance outputs for unit-RMS inputs; table rows are unit-RMS themselves.
                    let std = if spec.name.starts_with("engram.table.") {
                        1.0
                    } else {
                        1.0 / (*cols as f32).sqrt()
                    };
                    Tensor::Cq(random_cq(&mut rng, rows, *cols, bits, group, std))
                }
            };
            (spec.name.clone(), t)
        })
        .collect()
}

/// A random float checkpoint for `config` (the input of `cqlm pack`), deterministic
/// for `seed`: every CQ matrix of SPEC §3 is one dense `[rows, cols]` tensor of
/// Gaussian weights with the scales [`synth_tensors`] gives its CQ matrices (standard
/// deviation `1/sqrt(cols)`, 1 for engram tables, whose row counts are the same), and
/// the F32 vectors are exactly those of [`synth_tensors`] for the same seed.
pub fn synth_float_tensors(config: &Config, seed: u64) -> BTreeMap<String, FloatTensor> {
    let tables = engram_table_names(config);
    let specs = expected_tensors(config);
    specs
        .par_iter()
        .map(|spec| {
            let mut rng = rng_for(seed, &spec.name);
            let t = match &spec.kind {
                TensorKind::F32 { shape } => FloatTensor {
                    shape: shape.clone(),
                    data: random_f32(&mut rng, &spec.name, shape, config),
                },
                TensorKind::Cq { rows, cols } => {
                    let rows = rows.unwrap_or_else(|| {
                        let k = tables.iter().position(|n| n == &spec.name).unwrap_or(0);
                        table_rows(config, k)
                    });
                    let std = if spec.name.starts_with("engram.table.") {
                        1.0
                    } else {
                        1.0 / (*cols as f32).sqrt()
                    };
                    let d = Normal::new(0.0f32, std)
                        .unwrap_or_else(|_| Normal::new(0.0, 1.0).expect("unit normal"));
                    FloatTensor {
                        shape: vec![rows, *cols],
                        data: (0..rows * cols).map(|_| d.sample(&mut rng)).collect(),
                    }
                }
            };
            (spec.name.clone(), t)
        })
        .collect()
}

/// Synthesize archive bytes for `config` (validated first).
///
/// # Errors
/// [`crate::Error::Config`] if `config` breaks SPEC §1.
pub fn synth_archive(config: &Config, plan: &BitsPlan, seed: u64) -> Result<Vec<u8>> {
    config.validate()?;
    let tensors = synth_tensors(config, plan, seed);
    write_archive(config, None, &tensors)
}

/// Synthesize and load a model in memory (through the same archive reader as files).
///
/// # Errors
/// [`crate::Error::Config`] if `config` breaks SPEC §1.
pub fn synth_model(config: &Config, plan: &BitsPlan, seed: u64) -> Result<Model> {
    let bytes = synth_archive(config, plan, seed)?;
    Model::from_bytes(&bytes, "<synth>")
}
