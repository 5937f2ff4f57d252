//! Float checkpoints (the input of `cqlm pack`): read, validated and written.
//!
//! A float checkpoint is a safetensors file with the tensor names of SPEC §3,
//! except that every CQ matrix `P` is one dense F32, F16 or BF16 tensor `P` of
//! shape `[rows, cols]` (engram tables: any `rows >= 1`). The F32 vectors keep
//! their SPEC §3 shapes (F16 and BF16 are accepted and widened). Like an archive,
//! its `__metadata__` may carry `cqlm.config`, `cqlm.tokenizer` and `cqlm.chat_template`.

use super::reader::{map_file, open_container};
use super::spec::{expected_tensors, TensorKind};
use super::writer::{write_blobs_file, Blob};
use super::{CONFIG_KEY, TOKENIZER_KEY};
use crate::error::{ArchiveError, Error, Result};
use crate::model::config::Config;
use half::{bf16, f16};
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

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

/// A float checkpoint read from a file: a safetensors file with the tensor names
/// of SPEC §3, except that every CQ matrix `P` is one dense F32, F16 or BF16
/// tensor `P` of shape `[rows, cols]` (engram tables: any `rows >= 1`); the F32
/// vectors keep their SPEC §3 shapes (F16 and BF16 are accepted and widened), and
/// its `__metadata__` may carry `cqlm.config`, `cqlm.tokenizer` and `cqlm.chat_template`.
#[derive(Debug, Clone)]
pub struct FloatCheckpoint {
    /// Its config: the caller's, else the file's `cqlm.config`.
    pub config: Config,
    /// The file's `cqlm.tokenizer` text, if any (not parsed).
    pub tokenizer: Option<String>,
    /// The file's `cqlm.chat_template` text, if any (not parsed).
    pub chat_template: Option<String>,
    /// The file's `cqlm.tool_call_markers`, if any.
    pub tool_markers: Option<crate::constrain::ToolMarkers>,
    /// Every tensor of SPEC §3 for `config`, CQ matrices as dense `[rows, cols]`.
    pub tensors: BTreeMap<String, FloatTensor>,
}

fn dims_text(rows: Option<usize>, cols: usize) -> String {
    match rows {
        Some(r) => format!("[{r}, {cols}]"),
        None => format!("[T >= 1, {cols}]"),
    }
}

/// Whether `shape` fits `kind` (an engram table may have any `rows >= 1`).
pub(crate) fn shape_ok(kind: &TensorKind, shape: &[usize]) -> bool {
    match kind {
        TensorKind::F32 { shape: want } => shape == want.as_slice(),
        TensorKind::Cq { rows, cols } => {
            shape.len() == 2 && shape[1] == *cols && rows.map_or(shape[0] >= 1, |r| shape[0] == r)
        }
    }
}

/// The shape `kind` wants, as error messages print it.
pub(crate) fn expected_text(kind: &TensorKind) -> String {
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
        chat_template: meta.get(super::CHAT_TEMPLATE_KEY).cloned(),
        tool_markers: meta
            .get(super::TOOL_MARKERS_KEY)
            .map(|v| super::reader::parse_tool_markers(v))
            .transpose()?,
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
