//! Float checkpoint → archive (`cqlm pack`).
//!
//! A float checkpoint is a safetensors file with the tensor names of SPEC §3,
//! except that every CQ matrix `P` is one dense F32, F16 or BF16 tensor `P` of
//! shape `[rows, cols]` (engram tables: any `rows >= 1`). The F32 vectors keep
//! their SPEC §3 shapes (F16 and BF16 are accepted and widened). Like an archive,
//! its `__metadata__` may carry `cqlm.config` and `cqlm.tokenizer`.
//!
//! [`pack`] quantizes every matrix with [`crate::cq::quantize`] at the bits and
//! group a [`PackPlan`] gives its class, and reports how far each one moved.

use crate::archive::{
    expected_tensors, map_file, open_container, write_blobs_file, Blob, Tensor, TensorKind,
    CONFIG_KEY, TOKENIZER_KEY,
};
use crate::config::Config;
use crate::cq::quantize::quantize;
use crate::error::{ArchiveError, Error, Result};
use crate::synth::BitsPlan;
use half::{bf16, f16};
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// Bits per class of CQ matrix and the preferred group of a pack; the same plan
/// [`crate::synth`] uses (`--bits` syntax: [`BitsPlan::with_bits`]).
pub type PackPlan = BitsPlan;

/// One dense tensor of a float checkpoint, widened to f32.
#[derive(Debug, Clone, PartialEq)]
pub struct FloatTensor {
    /// Shape.
    pub shape: Vec<usize>,
    /// Row-major values, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

/// How the tensors of a float checkpoint are stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FloatDtype {
    /// IEEE single precision.
    #[default]
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
}

/// A float checkpoint read from a file.
#[derive(Debug, Clone)]
pub struct FloatCheckpoint {
    /// Its config: the caller's, else the file's `cqlm.config`.
    pub config: Config,
    /// The file's `cqlm.tokenizer` text, if any (not parsed).
    pub tokenizer: Option<String>,
    /// Every tensor of SPEC §3 for `config`, CQ matrices as dense `[rows, cols]`.
    pub tensors: BTreeMap<String, FloatTensor>,
}

/// What [`pack`] did to one CQ matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct PackReportRow {
    /// Tensor name (SPEC §3).
    pub name: String,
    /// Output rows.
    pub rows: usize,
    /// Logical input columns.
    pub cols: usize,
    /// Bits per index.
    pub bits: u32,
    /// Columns per group.
    pub group: usize,
    /// Relative mean squared error `‖W − Ŵ‖² / ‖W‖²` of the quantized matrix.
    pub rel_mse: f64,
    /// Bytes of its three stored tensors.
    pub bytes: usize,
}

/// Progress of [`pack`], reported before each CQ matrix and once at the end.
#[derive(Debug, Clone, Copy)]
pub struct PackProgress<'a> {
    /// The matrix about to be quantized; `None` once all are done.
    pub tensor: Option<&'a str>,
    /// Weights (`rows · cols`) of the matrices already quantized.
    pub done: usize,
    /// Weights of all CQ matrices.
    pub total: usize,
}

/// Average stored bits per weight over the matrices of a report
/// (codebooks and norms included; 0 for an empty report).
pub fn bits_per_weight(rows: &[PackReportRow]) -> f64 {
    let bytes: usize = rows.iter().map(|r| r.bytes).sum();
    let weights: usize = rows.iter().map(|r| r.rows * r.cols).sum();
    if weights == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / weights as f64
    }
}

fn dims_text(rows: Option<usize>, cols: usize) -> String {
    match rows {
        Some(r) => format!("[{r}, {cols}]"),
        None => format!("[T >= 1, {cols}]"),
    }
}

fn shape_ok(kind: &TensorKind, shape: &[usize]) -> bool {
    match kind {
        TensorKind::F32 { shape: want } => shape == want.as_slice(),
        TensorKind::Cq { rows, cols } => {
            shape.len() == 2 && shape[1] == *cols && rows.map_or(shape[0] >= 1, |r| shape[0] == r)
        }
    }
}

fn expected_text(kind: &TensorKind) -> String {
    match kind {
        TensorKind::F32 { shape } => format!("{shape:?}"),
        TensorKind::Cq { rows, cols } => dims_text(*rows, *cols),
    }
}

/// Read and validate the float checkpoint at `path` against `config`, or, when
/// `config` is `None`, against the file's own `cqlm.config`.
///
/// # Errors
/// [`Error::Io`] if the file can't be read; [`Error::Archive`] naming the file and
/// the tensor or field at fault for a broken container, a missing or invalid config,
/// a missing or unknown tensor, a dtype other than F32/F16/BF16, or a wrong shape.
pub fn read_float_checkpoint(path: &Path, config: Option<Config>) -> Result<FloatCheckpoint> {
    let map = map_file(path)?;
    parse_float(&map, config).map_err(|kind| Error::Archive {
        archive: path.display().to_string(),
        kind,
    })
}

fn parse_float(
    bytes: &[u8],
    config: Option<Config>,
) -> std::result::Result<FloatCheckpoint, ArchiveError> {
    let (st, meta) = open_container(bytes)?;
    let config = match config {
        Some(c) => {
            c.validate().map_err(ArchiveError::Config)?;
            c
        }
        None => {
            let text = meta.get(CONFIG_KEY).ok_or(ArchiveError::MissingConfig)?;
            Config::from_json(text).map_err(ArchiveError::Config)?
        }
    };
    let specs = expected_tensors(&config);
    let mut tensors = BTreeMap::new();
    for spec in &specs {
        let view = match st.tensor(&spec.name) {
            Ok(v) => v,
            Err(_) if st.tensor(&format!("{}.packed", spec.name)).is_ok() => {
                return Err(ArchiveError::Format(format!(
                    "tensor `{}` is stored as a CQ matrix (`.codebook`, `.norms`, `.packed`): \
                     this is already a cqlm archive, not a float checkpoint",
                    spec.name
                )))
            }
            Err(_) => return Err(ArchiveError::MissingTensor(spec.name.clone())),
        };
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytemuck::pod_collect_to_vec(view.data()),
            Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(view.data())
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            Dtype::BF16 => bytemuck::pod_collect_to_vec::<u8, bf16>(view.data())
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            other => {
                return Err(ArchiveError::WrongDtype {
                    name: spec.name.clone(),
                    expected: "F32, F16 or BF16".into(),
                    found: format!("{other:?}"),
                })
            }
        };
        if !shape_ok(&spec.kind, view.shape()) {
            return Err(ArchiveError::WrongShape {
                name: spec.name.clone(),
                expected: expected_text(&spec.kind),
                found: view.shape().to_vec(),
            });
        }
        tensors.insert(
            spec.name.clone(),
            FloatTensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    let known: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let mut unknown: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|n| !known.contains(n))
        .collect();
    unknown.sort_unstable();
    if let Some(name) = unknown.first() {
        return Err(ArchiveError::UnknownTensor(name.to_string()));
    }
    Ok(FloatCheckpoint {
        config,
        tokenizer: meta.get(TOKENIZER_KEY).cloned(),
        tensors,
    })
}

/// Write a float checkpoint to `path`, every tensor as `dtype`, with `config` (when
/// given) as `cqlm.config`. The tensors are written as given, unchecked, so tests
/// can build broken checkpoints.
///
/// # Errors
/// [`Error::Io`] if the file can't be written, [`Error::InvalidArgument`] if a
/// shape does not match its data.
pub fn write_float_checkpoint(
    path: &Path,
    config: Option<&Config>,
    tensors: &BTreeMap<String, FloatTensor>,
    dtype: FloatDtype,
) -> Result<()> {
    let blobs: Vec<(String, Blob)> = tensors
        .iter()
        .map(|(name, t)| {
            let (dtype, data) = match dtype {
                FloatDtype::F32 => (Dtype::F32, bytemuck::cast_slice(&t.data).to_vec()),
                FloatDtype::F16 => {
                    let v: Vec<f16> = t.data.iter().map(|&x| f16::from_f32(x)).collect();
                    (Dtype::F16, bytemuck::cast_slice(&v).to_vec())
                }
                FloatDtype::BF16 => {
                    let v: Vec<bf16> = t.data.iter().map(|&x| bf16::from_f32(x)).collect();
                    (Dtype::BF16, bytemuck::cast_slice(&v).to_vec())
                }
            };
            (
                name.clone(),
                Blob {
                    dtype,
                    shape: t.shape.clone(),
                    data,
                },
            )
        })
        .collect();
    let mut meta = HashMap::new();
    if let Some(c) = config {
        meta.insert(CONFIG_KEY.to_string(), c.to_json());
    }
    write_blobs_file(path, &blobs, meta)
}

fn pack_error(tensor: &str, reason: impl Into<String>) -> Error {
    Error::Pack {
        tensor: tensor.to_string(),
        reason: reason.into(),
    }
}

/// Quantize the CQ matrices of a float checkpoint and keep its F32 vectors: the
/// tensors of an archive for `config`, and one report row per CQ matrix (SPEC §3
/// order). Matrix `P` gets `plan.bits_for(P)` bits and `plan.group_for(cols)`
/// columns per group. Every tensor is checked (presence, shape, finite values)
/// before any is quantized; `progress` is called before each matrix and once at
/// the end.
///
/// # Errors
/// [`Error::Config`] for a config that breaks SPEC §1, [`Error::InvalidArgument`]
/// for a plan with a bit width outside {1, 2, 4, 8} or a group that is not a power
/// of two `>= 32`, and [`Error::Pack`] naming the tensor that is missing, unknown,
/// misshapen, non-finite, or that the quantizer rejects.
pub fn pack(
    config: &Config,
    tensors: &BTreeMap<String, FloatTensor>,
    plan: &PackPlan,
    mut progress: impl FnMut(PackProgress<'_>),
) -> Result<(BTreeMap<String, Tensor>, Vec<PackReportRow>)> {
    config.validate()?;
    let widths = [
        plan.embed,
        plan.attn_qg,
        plan.attn_kv,
        plan.attn_o,
        plan.phi,
        plan.engram_table,
        plan.engram_proj,
    ];
    if let Some(b) = widths.iter().find(|b| ![1, 2, 4, 8].contains(*b)) {
        return Err(Error::InvalidArgument(format!(
            "bits {b} is not 1, 2, 4 or 8"
        )));
    }
    if plan.group < 32 || !plan.group.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "group {} is not a power of two >= 32",
            plan.group
        )));
    }

    // Check everything before the slow part.
    let specs = expected_tensors(config);
    for spec in &specs {
        let t = tensors
            .get(&spec.name)
            .ok_or_else(|| pack_error(&spec.name, "missing from the checkpoint"))?;
        if !shape_ok(&spec.kind, &t.shape) {
            return Err(pack_error(
                &spec.name,
                format!(
                    "shape {:?}, expected {}",
                    t.shape,
                    expected_text(&spec.kind)
                ),
            ));
        }
        if t.data.len() != t.shape.iter().product::<usize>() {
            return Err(pack_error(
                &spec.name,
                format!("{} values for shape {:?}", t.data.len(), t.shape),
            ));
        }
        if let Some(i) = t.data.iter().position(|v| !v.is_finite()) {
            let at = match (&spec.kind, t.shape.as_slice()) {
                (TensorKind::Cq { .. }, &[_, cols]) => {
                    format!("row {}, column {}", i / cols, i % cols)
                }
                _ => format!("index {i}"),
            };
            return Err(pack_error(
                &spec.name,
                format!("the weight at {at} is {} (not finite)", t.data[i]),
            ));
        }
    }
    let known: HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    if let Some(name) = tensors.keys().find(|n| !known.contains(n.as_str())) {
        return Err(pack_error(name, "not a tensor of SPEC §3 for this config"));
    }

    let total: usize = specs
        .iter()
        .filter(|s| matches!(s.kind, TensorKind::Cq { .. }))
        .map(|s| tensors[&s.name].data.len())
        .sum();
    let mut done = 0usize;
    let mut out = BTreeMap::new();
    let mut report = Vec::new();
    for spec in &specs {
        let t = &tensors[&spec.name];
        match &spec.kind {
            TensorKind::F32 { shape } => {
                out.insert(
                    spec.name.clone(),
                    Tensor::F32 {
                        shape: shape.clone(),
                        data: t.data.clone(),
                    },
                );
            }
            TensorKind::Cq { cols, .. } => {
                progress(PackProgress {
                    tensor: Some(&spec.name),
                    done,
                    total,
                });
                let rows = t.shape[0];
                let bits = plan.bits_for(&spec.name);
                let group = plan.group_for(*cols);
                let q = quantize(&t.data, rows, *cols, bits, group).map_err(|e| match e {
                    Error::InvalidArgument(msg) => pack_error(&spec.name, msg),
                    other => pack_error(&spec.name, other.to_string()),
                })?;
                report.push(PackReportRow {
                    name: spec.name.clone(),
                    rows,
                    cols: *cols,
                    bits,
                    group,
                    rel_mse: q.rel_mse,
                    bytes: q.matrix.stored_bytes(),
                });
                out.insert(spec.name.clone(), Tensor::Cq(q.matrix));
                done += t.data.len();
            }
        }
    }
    progress(PackProgress {
        tensor: None,
        done,
        total,
    });
    Ok((out, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::synth_float_tensors;

    #[test]
    fn half_precision_checkpoints_read_back_widened() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::preset_tiny();
        let t = synth_float_tensors(&c, 3);
        for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::BF16] {
            let path = dir.path().join(format!("{dtype:?}.safetensors"));
            write_float_checkpoint(&path, Some(&c), &t, dtype).unwrap();
            let back = read_float_checkpoint(&path, None).unwrap();
            assert_eq!(back.config, c);
            let (a, b) = (&t["embed"].data, &back.tensors["embed"].data);
            let tol = match dtype {
                FloatDtype::F32 => 0.0,
                FloatDtype::F16 => 1e-3,
                FloatDtype::BF16 => 8e-3,
            };
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= tol * x.abs().max(1e-3),
                    "{dtype:?}: {x} {y}"
                );
            }
        }
    }

    #[test]
    fn plan_checks_and_group_clamping() {
        let c = Config::preset_tiny();
        let t = synth_float_tensors(&c, 1);
        let bad = PackPlan::uniform(3, 32);
        assert!(matches!(
            pack(&c, &t, &bad, |_| {}),
            Err(Error::InvalidArgument(_))
        ));
        let bad = PackPlan::uniform(4, 48);
        assert!(matches!(
            pack(&c, &t, &bad, |_| {}),
            Err(Error::InvalidArgument(_))
        ));
        let mut calls = 0;
        let (_, report) = pack(&c, &t, &PackPlan::uniform(2, 256), |p| {
            calls += 1;
            assert!(p.done <= p.total);
        })
        .unwrap();
        assert_eq!(calls, report.len() + 1);
        for r in &report {
            assert_eq!(
                r.group,
                r.cols.next_power_of_two().clamp(32, 256),
                "{}",
                r.name
            );
        }
    }
}
