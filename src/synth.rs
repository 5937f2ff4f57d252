//! Random but well-conditioned archives for a config (`cqlm synth`), deterministic
//! for a seed: every tensor draws from its own ChaCha stream keyed by its name.
//! [`synth_float_tensors`] makes the float checkpoints that `cqlm pack` reads.

use crate::archive::{engram_table_names, expected_tensors, write_archive, Tensor, TensorKind};
use crate::config::Config;
use crate::cq::quantize::lloyd_max_gaussian;
use crate::cq::CqMatrix;
use crate::engram::fnv1a64_words;
use crate::error::Result;
use crate::pack::FloatTensor;
use crate::weights::Model;
use half::f16;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use std::collections::BTreeMap;

/// Bits per class of CQ matrix and the group width of a synthesized archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitsPlan {
    /// `embed`.
    pub embed: u32,
    /// `wq`, `wg`.
    pub attn_qg: u32,
    /// `wk`, `wv`.
    pub attn_kv: u32,
    /// `wo`.
    pub attn_o: u32,
    /// `mhc.phi_*`.
    pub phi: u32,
    /// `engram.table.*`.
    pub engram_table: u32,
    /// `engram.*.wk`, `engram.*.wv`.
    pub engram_proj: u32,
    /// Preferred group; a matrix with fewer columns uses the smallest power of two
    /// `>= max(32, cols)` instead.
    pub group: usize,
}

impl BitsPlan {
    /// The plan of the `default` preset: embed 4, attention 2, Φ 4, engram 4, group 128.
    pub fn standard() -> BitsPlan {
        BitsPlan {
            embed: 4,
            attn_qg: 2,
            attn_kv: 2,
            attn_o: 2,
            phi: 4,
            engram_table: 4,
            engram_proj: 4,
            group: 128,
        }
    }

    /// The plan of the `tiny` preset: every bit width appears, group 32.
    pub fn mixed() -> BitsPlan {
        BitsPlan {
            embed: 4,
            attn_qg: 2,
            attn_kv: 8,
            attn_o: 1,
            phi: 4,
            engram_table: 8,
            engram_proj: 2,
            group: 32,
        }
    }

    /// The same bit width for every class, with preferred group `group`.
    pub fn uniform(bits: u32, group: usize) -> BitsPlan {
        BitsPlan {
            embed: bits,
            attn_qg: bits,
            attn_kv: bits,
            attn_o: bits,
            phi: bits,
            engram_table: bits,
            engram_proj: bits,
            group,
        }
    }

    /// This plan with the bit widths of `spec` applied left to right: a
    /// comma-separated list of `CLASS=BITS`, `BITS` one of 1, 2, 4, 8 and `CLASS`
    /// one of `embed`, `attn` (`wq wk wv wg wo`), `attn_qg` (`wq wg`), `attn_kv`
    /// (`wk wv`), `attn_o` (`wo`), `phi` (`mhc.phi_*`), `engram` (tables and
    /// projections), `engram_table`, `engram_proj` or `all`.
    ///
    /// # Errors
    /// A message naming the malformed item, unknown class or bit width.
    pub fn with_bits(&self, spec: &str) -> std::result::Result<BitsPlan, String> {
        let mut plan = self.clone();
        if spec.trim().is_empty() {
            return Err("the list is empty (expected CLASS=BITS,...)".into());
        }
        for item in spec.split(',') {
            let item = item.trim();
            let Some((class, bits)) = item.split_once('=') else {
                return Err(format!("`{item}` is not CLASS=BITS"));
            };
            let bits: u32 = match bits.trim().parse() {
                Ok(b @ (1 | 2 | 4 | 8)) => b,
                _ => {
                    return Err(format!(
                        "`{item}`: bits must be 1, 2, 4 or 8, not `{}`",
                        bits.trim()
                    ))
                }
            };
            let fields: Vec<&mut u32> = match class.trim() {
                "embed" => vec![&mut plan.embed],
                "attn" => vec![&mut plan.attn_qg, &mut plan.attn_kv, &mut plan.attn_o],
                "attn_qg" => vec![&mut plan.attn_qg],
                "attn_kv" => vec![&mut plan.attn_kv],
                "attn_o" => vec![&mut plan.attn_o],
                "phi" => vec![&mut plan.phi],
                "engram" => vec![&mut plan.engram_table, &mut plan.engram_proj],
                "engram_table" => vec![&mut plan.engram_table],
                "engram_proj" => vec![&mut plan.engram_proj],
                "all" => vec![
                    &mut plan.embed,
                    &mut plan.attn_qg,
                    &mut plan.attn_kv,
                    &mut plan.attn_o,
                    &mut plan.phi,
                    &mut plan.engram_table,
                    &mut plan.engram_proj,
                ],
                other => {
                    return Err(format!(
                        "unknown class `{other}` (expected embed, attn, attn_qg, attn_kv, attn_o, phi, engram, engram_table, engram_proj or all)"
                    ))
                }
            };
            for f in fields {
                *f = bits;
            }
        }
        Ok(plan)
    }

    /// Bits of the CQ matrix named `name` (SPEC §3), by its class.
    pub fn bits_for(&self, name: &str) -> u32 {
        let last = name.rsplit('.').next().unwrap_or(name);
        if name == "embed" {
            self.embed
        } else if name.starts_with("mhc.") {
            self.phi
        } else if name.starts_with("engram.table.") {
            self.engram_table
        } else if name.starts_with("engram.") {
            self.engram_proj
        } else {
            match last {
                "wq" | "wg" => self.attn_qg,
                "wk" | "wv" => self.attn_kv,
                _ => self.attn_o,
            }
        }
    }

    /// Group width used for a matrix of `cols` columns.
    pub fn group_for(&self, cols: usize) -> usize {
        self.group.min(cols.next_power_of_two()).max(32)
    }
}

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

/// The plan a preset name uses (`tiny` → mixed, otherwise standard).
pub fn plan_for_preset(name: &str) -> BitsPlan {
    if name == "tiny" {
        BitsPlan::mixed()
    } else {
        BitsPlan::standard()
    }
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
