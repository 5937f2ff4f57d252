//! Writing an archive (SPEC §5) from decoded tensors; used by `synth`, `pack` and tests.

use super::spec::cq_parts;
use super::{Tensor, CONFIG_KEY, TOKENIZER_KEY};
use crate::error::{Error, Result};
use crate::model::config::Config;
use safetensors::tensor::View;
use safetensors::Dtype;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

/// One stored tensor: dtype, shape and little-endian bytes.
pub(crate) struct Blob {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<u8>,
}

impl View for &Blob {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn blobs(tensors: &BTreeMap<String, Tensor>) -> Vec<(String, Blob)> {
    let mut out = Vec::new();
    for (name, t) in tensors {
        match t {
            Tensor::F32 { shape, data } => out.push((
                name.clone(),
                Blob {
                    dtype: Dtype::F32,
                    shape: shape.clone(),
                    data: bytemuck::cast_slice(data).to_vec(),
                },
            )),
            Tensor::Cq(m) => {
                let [cb, norms, packed] = cq_parts(name);
                out.push((
                    cb,
                    Blob {
                        dtype: Dtype::F32,
                        shape: vec![m.codebook().len()],
                        data: bytemuck::cast_slice(m.codebook()).to_vec(),
                    },
                ));
                out.push((
                    norms,
                    Blob {
                        dtype: Dtype::F16,
                        shape: vec![m.rows(), m.groups()],
                        data: bytemuck::cast_slice(&m.norms_f16()).to_vec(),
                    },
                ));
                out.push((
                    packed,
                    Blob {
                        dtype: Dtype::U8,
                        shape: vec![m.rows(), m.row_bytes()],
                        data: m.packed().to_vec(),
                    },
                ));
            }
        }
    }
    out
}

fn metadata(config: &Config, tokenizer: Option<&str>) -> HashMap<String, String> {
    let mut meta = HashMap::new();
    meta.insert(CONFIG_KEY.to_string(), config.to_json());
    if let Some(t) = tokenizer {
        meta.insert(TOKENIZER_KEY.to_string(), t.to_string());
    }
    meta
}

/// [`write_archive_file`] with the chat format too: a chat template
/// (`cqlm.chat_template`) and tool-call markers (`cqlm.tool_call_markers`, start
/// and end), each if given.
///
/// # Errors
/// As [`write_archive_file`].
pub fn write_archive_file_with_chat(
    path: &Path,
    config: &Config,
    tokenizer: Option<&str>,
    chat_template: Option<&str>,
    tool_markers: Option<&crate::constrain::ToolMarkers>,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<()> {
    let mut meta = metadata(config, tokenizer);
    if let Some(t) = chat_template {
        meta.insert(super::CHAT_TEMPLATE_KEY.to_string(), t.to_string());
    }
    if let Some(m) = tool_markers {
        meta.insert(
            super::TOOL_MARKERS_KEY.to_string(),
            serde_json::json!([m.start, m.end]).to_string(),
        );
    }
    write_blobs_file(path, &blobs(tensors), meta)
}

/// Serialize an archive to bytes. The tensors are written as given (no check
/// against the config), so tests can build deliberately broken archives. The same
/// inputs give the same bytes on every run (`canonical_metadata`).
///
/// # Errors
/// [`Error::InvalidArgument`] if safetensors refuses the data (e.g. a shape that does not match its bytes).
pub fn write_archive(
    config: &Config,
    tokenizer: Option<&str>,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<Vec<u8>> {
    serialize_blobs(&blobs(tensors), metadata(config, tokenizer), "archive")
}

/// safetensors' serialization of `blobs` and `metadata`, made deterministic; errors
/// name `what` is being written.
fn serialize_blobs(
    blobs: &[(String, Blob)],
    metadata: HashMap<String, String>,
    what: &str,
) -> Result<Vec<u8>> {
    let bad = |e: String| Error::InvalidArgument(format!("cannot serialize {what}: {e}"));
    let bytes = safetensors::serialize(blobs.iter().map(|(n, t)| (n.as_str(), t)), Some(metadata))
        .map_err(|e| bad(e.to_string()))?;
    canonical_metadata(bytes).map_err(bad)
}

/// A safetensors file's bytes with its `__metadata__` entries in name order.
/// safetensors takes the metadata as a `HashMap` and writes it in that map's
/// iteration order, which is random per process; sorted, the same archive is the
/// same bytes on every run (a checksum of a packed model is reproducible). The
/// header is re-serialized (the tensors' entries in the order safetensors gave them)
/// and space-padded to 8 bytes as safetensors pads it, in place (it is the same
/// entries, so the same length); the tensor data, whose offsets are relative to the
/// end of the header, is untouched.
///
/// # Errors
/// What is wrong if `bytes` is not a safetensors file (cannot happen for
/// safetensors' own output).
fn canonical_metadata(mut bytes: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    let len: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or("no header length")?;
    let end = usize::try_from(u64::from_le_bytes(len))
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&end| end <= bytes.len())
        .ok_or("header length past the end")?;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..end]).map_err(|e| e.to_string())?;
    if let Some(serde_json::Value::Object(meta)) = header.get_mut("__metadata__") {
        let sorted: BTreeMap<String, serde_json::Value> =
            std::mem::take(meta).into_iter().collect();
        *meta = sorted.into_iter().collect();
    }
    let mut text = serde_json::to_string(&header).map_err(|e| e.to_string())?;
    text.extend(std::iter::repeat_n(' ', (8 - text.len() % 8) % 8));
    let len = (text.len() as u64).to_le_bytes();
    bytes.splice(..end, len.into_iter().chain(text.into_bytes()));
    Ok(bytes)
}

/// Write an archive to `path` (through a temporary file in the same folder, then a rename).
///
/// # Errors
/// [`Error::Io`] if the file can't be written.
pub fn write_archive_file(
    path: &Path,
    config: &Config,
    tokenizer: Option<&str>,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<()> {
    write_blobs_file(path, &blobs(tensors), metadata(config, tokenizer))
}

/// Write named blobs and string metadata as a safetensors file at `path`
/// ([`canonical_metadata`]: the same inputs, the same bytes), through a temporary
/// file in the same folder and a rename, so a reader never sees half a file (as
/// `safetensors::serialize_to_file` does; that one streams, but writes the header
/// it was given, so the file is assembled in memory here).
pub(crate) fn write_blobs_file(
    path: &Path,
    blobs: &[(String, Blob)],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let bytes = serialize_blobs(blobs, metadata, &path.display().to_string())?;
    let io = |err| Error::Io {
        path: path.to_path_buf(),
        err,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    tmp.write_all(&bytes).map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    set_file_mode(path).map_err(io)
}

/// Give a file written through a temporary file the usual `rw-r--r--` mode
/// (temporary files are created `rw-------`). A no-op off Unix.
///
/// # Errors
/// The operating system's error.
pub fn set_file_mode(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
