//! Reading and validating an archive (SPEC §5) into decoded tensors.

use super::spec::{cq_parts, expected_tensors, TensorKind};
use super::{Tensor, CONFIG_KEY, TOKENIZER_KEY};
use crate::constrain::ToolMarkers;
use crate::cq::CqMatrix;
use crate::error::{ArchiveError, Error, Result};
use crate::model::config::dupcheck::NoDuplicateKeys;
use crate::model::config::Config;
use half::f16;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// A validated archive: its config, optional tokenizer text and every logical
/// tensor of SPEC §3, decoded.
#[derive(Debug, Clone)]
pub struct RawArchive {
    /// The validated config.
    pub config: Config,
    /// The `cqlm.tokenizer` document, if present (not parsed here).
    pub tokenizer: Option<String>,
    /// The `cqlm.chat_template` text, if present (not parsed here).
    pub chat_template: Option<String>,
    /// The `cqlm.tool_call_markers`, if present.
    pub tool_markers: Option<ToolMarkers>,
    /// Logical tensors by name (CQ matrices under their base name).
    pub tensors: BTreeMap<String, Tensor>,
}

/// Memory-map and read the archive at `path`.
///
/// # Errors
/// [`Error::Io`] if the file can't be opened or mapped, [`Error::Archive`] (naming
/// the file and the tensor or field) if it breaks SPEC §1–§5.
pub fn read_archive_file(path: &Path) -> Result<RawArchive> {
    let map = map_file(path)?;
    read_archive(&map, &path.display().to_string())
}

/// Memory-map a safetensors file read-only, rejecting what is not a regular file
/// or is shorter than the 8-byte header length.
pub(crate) fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let io = |err| Error::Io {
        path: path.to_path_buf(),
        err,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(io(std::io::Error::other("not a regular file")));
    }
    if meta.len() < 8 {
        return Err(Error::Archive {
            archive: path.display().to_string(),
            kind: ArchiveError::Truncated(format!(
                "the file has {} bytes, fewer than the 8-byte header length",
                meta.len()
            )),
        });
    }
    // Loading copies the tensors into memory (norms widen from f16 to f32): refuse
    // up front, with a clear error, a file that can't fit, instead of dying in the
    // allocator halfway through.
    if let Some(avail) = available_memory() {
        if meta.len() > avail {
            return Err(Error::Alloc {
                what: format!(
                    "{}: the archive ({} bytes) exceeds the available memory ({avail} bytes)",
                    path.display(),
                    meta.len()
                ),
                bytes: meta.len(),
            });
        }
    }
    // SAFETY: the map is read-only and lives only while its caller reads the file;
    // cqlm never writes to a file it reads. A file truncated by another process
    // while mapped is outside what any reader can defend against.
    unsafe { memmap2::Mmap::map(&file) }.map_err(io)
}

/// `MemAvailable` of `/proc/meminfo` in bytes (Linux); `None` elsewhere.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn truncated(msg: impl Into<String>) -> ArchiveError {
    ArchiveError::Truncated(msg.into())
}

fn container_error(e: SafeTensorError) -> ArchiveError {
    match e {
        SafeTensorError::HeaderTooSmall | SafeTensorError::InvalidHeaderLength => {
            truncated("the header runs past the end of the file")
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            truncated("the tensor data does not end exactly at the end of the file")
        }
        SafeTensorError::InvalidOffset(name) => ArchiveError::Format(format!(
            "tensor `{name}`: data_offsets are not contiguous from 0"
        )),
        other => ArchiveError::Format(other.to_string()),
    }
}

/// Read and validate an archive held in memory. `source` names it in errors.
///
/// # Errors
/// [`Error::Archive`] naming `source` and the tensor or field at fault.
pub fn read_archive(bytes: &[u8], source: &str) -> Result<RawArchive> {
    parse(bytes).map_err(|kind| Error::Archive {
        archive: source.to_string(),
        kind,
    })
}

/// Check the container of SPEC §5 (header length, duplicate-free JSON header,
/// contiguous offsets covering the data) and return it with its `__metadata__`.
pub(crate) fn open_container(
    bytes: &[u8],
) -> std::result::Result<(SafeTensors<'_>, HashMap<String, String>), ArchiveError> {
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(truncated(format!(
            "the file has {} bytes, fewer than the 8-byte header length",
            bytes.len()
        )));
    };
    let mut n8 = [0u8; 8];
    n8.copy_from_slice(len_bytes);
    let n = u64::from_le_bytes(n8);
    let avail = bytes.len() as u64 - 8;
    // A safetensors file's header is a JSON object right after its length: any
    // other byte there (a text file, say) is not a broken archive but none at all.
    if bytes.get(8).is_some_and(|&b| b != b'{') {
        return Err(ArchiveError::NotAnArchive);
    }
    if n > avail {
        return Err(truncated(format!(
            "the header claims {n} bytes but only {avail} follow"
        )));
    }
    let header = std::str::from_utf8(&bytes[8..8 + n as usize])
        .map_err(|e| ArchiveError::Format(format!("header is not UTF-8: {e}")))?;
    serde_json::from_str::<NoDuplicateKeys>(header)
        .map_err(|e| ArchiveError::Format(format!("header JSON: {e}")))?;
    let st = SafeTensors::deserialize(bytes).map_err(container_error)?;
    let (_, metadata) = SafeTensors::read_metadata(bytes).map_err(container_error)?;
    let meta = metadata.metadata().clone().unwrap_or_default();
    Ok((st, meta))
}

fn parse(bytes: &[u8]) -> std::result::Result<RawArchive, ArchiveError> {
    let (st, meta) = open_container(bytes)?;
    let config_text = meta.get(CONFIG_KEY).ok_or(ArchiveError::MissingConfig)?;
    let config = Config::from_json(config_text).map_err(ArchiveError::Config)?;
    let tokenizer = meta.get(TOKENIZER_KEY).cloned();
    let chat_template = meta.get(super::CHAT_TEMPLATE_KEY).cloned();
    let tool_markers = meta
        .get(super::TOOL_MARKERS_KEY)
        .map(|v| parse_tool_markers(v))
        .transpose()?;

    let specs = expected_tensors(&config);
    let mut known = HashSet::new();
    let mut tensors = BTreeMap::new();
    for spec in &specs {
        match &spec.kind {
            TensorKind::F32 { shape } => {
                known.insert(spec.name.clone());
                let view = get(&st, &spec.name)?;
                check_dtype(&spec.name, &view, Dtype::F32)?;
                if view.shape() != shape.as_slice() {
                    return Err(ArchiveError::WrongShape {
                        name: spec.name.clone(),
                        expected: format!("{shape:?}"),
                        found: view.shape().to_vec(),
                    });
                }
                let data: Vec<f32> = bytemuck::pod_collect_to_vec(view.data());
                tensors.insert(
                    spec.name.clone(),
                    Tensor::F32 {
                        shape: shape.clone(),
                        data,
                    },
                );
            }
            TensorKind::Cq { rows, cols } => {
                let parts = cq_parts(&spec.name);
                known.extend(parts.iter().cloned());
                let m = read_cq(&st, &spec.name, &parts, *rows, *cols)?;
                tensors.insert(spec.name.clone(), Tensor::Cq(m));
            }
        }
    }
    let mut unknown: Vec<&str> = st
        .names()
        .into_iter()
        .filter(|n| !known.contains(*n))
        .collect();
    unknown.sort_unstable();
    if let Some(name) = unknown.first() {
        return Err(ArchiveError::UnknownTensor(name.to_string()));
    }
    Ok(RawArchive {
        config,
        tokenizer,
        chat_template,
        tool_markers,
        tensors,
    })
}

/// `["start", "end"]`: two non-empty strings.
pub(crate) fn parse_tool_markers(v: &str) -> std::result::Result<ToolMarkers, ArchiveError> {
    let bad = |reason: &str| ArchiveError::Metadata {
        key: super::TOOL_MARKERS_KEY.to_string(),
        reason: reason.to_string(),
    };
    let shape = "expected a JSON array of two strings, [start, end]";
    let pair: Vec<String> = serde_json::from_str(v).map_err(|_| bad(shape))?;
    let [s, e] = <[String; 2]>::try_from(pair).map_err(|_| bad(shape))?;
    ToolMarkers::new(&s, &e).map_err(|r| bad(&r))
}

fn get<'a>(st: &SafeTensors<'a>, name: &str) -> std::result::Result<TensorView<'a>, ArchiveError> {
    st.tensor(name)
        .map_err(|_| ArchiveError::MissingTensor(name.to_string()))
}

fn check_dtype(
    name: &str,
    view: &TensorView,
    want: Dtype,
) -> std::result::Result<(), ArchiveError> {
    if view.dtype() != want {
        return Err(ArchiveError::WrongDtype {
            name: name.to_string(),
            expected: format!("{want:?}"),
            found: format!("{:?}", view.dtype()),
        });
    }
    Ok(())
}

fn read_cq(
    st: &SafeTensors,
    name: &str,
    [cb_name, norms_name, packed_name]: &[String; 3],
    rows: Option<usize>,
    cols: usize,
) -> std::result::Result<CqMatrix, ArchiveError> {
    let cb = get(st, cb_name)?;
    let norms = get(st, norms_name)?;
    let packed = get(st, packed_name)?;
    check_dtype(cb_name, &cb, Dtype::F32)?;
    check_dtype(norms_name, &norms, Dtype::F16)?;
    check_dtype(packed_name, &packed, Dtype::U8)?;
    let rows_text = rows.map_or("T >= 1".to_string(), |r| r.to_string());
    if cb.shape().len() != 1 {
        return Err(ArchiveError::WrongShape {
            name: cb_name.clone(),
            expected: "[2^bits] with bits in {1, 2, 4, 8}".into(),
            found: cb.shape().to_vec(),
        });
    }
    let shape2 = |view: &TensorView, n: &str, what: &str| {
        let s = view.shape();
        let ok = s.len() == 2 && rows.map_or(s[0] >= 1, |r| s[0] == r);
        if ok {
            Ok([s[0], s[1]])
        } else {
            Err(ArchiveError::WrongShape {
                name: n.to_string(),
                expected: format!("[{rows_text}, {what}]"),
                found: s.to_vec(),
            })
        }
    };
    let norms_shape = shape2(&norms, norms_name, "groups")?;
    let packed_shape = shape2(&packed, packed_name, "bytes")?;
    let codebook: Vec<f32> = bytemuck::pod_collect_to_vec(cb.data());
    let norm_values: Vec<f16> = bytemuck::pod_collect_to_vec(norms.data());
    CqMatrix::new(
        cols,
        codebook,
        norm_values,
        norms_shape,
        packed.data().to_vec(),
        packed_shape,
    )
    .map_err(|reason| ArchiveError::BadCq {
        name: name.to_string(),
        reason,
    })
}
