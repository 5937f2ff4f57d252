//! Float checkpoint → archive (`cqlm pack`). The float checkpoint format is
//! [`crate::archive::FloatCheckpoint`]'s; its reader and writer are
//! [`crate::archive::read_float_checkpoint`] and [`crate::archive::write_float_checkpoint`].
//!
//! [`pack`] quantizes every matrix with [`crate::cq::quantize`] at the bits and
//! group a [`PackPlan`] gives its class, and reports how far each one moved.

use crate::archive::{expected_tensors, expected_text, shape_ok, FloatTensor, Tensor, TensorKind};
use crate::cq::quantize::quantize;
use crate::cq::BitsPlan;
use crate::error::{Error, Result};
use crate::model::config::Config;
use std::collections::{BTreeMap, HashSet};

/// Bits per class of CQ matrix and the preferred group of a pack; the same plan
/// [`crate::make::synth`] uses (`--bits` syntax: [`BitsPlan::with_bits`]).
pub type PackPlan = BitsPlan;

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
    use crate::archive::{read_float_checkpoint, write_float_checkpoint, FloatDtype};
    use crate::make::synth::synth_float_tensors;

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
