//! Writing an archive (SPEC §5) from decoded tensors; used by `synth`, `pack` and tests.

use super::spec::cq_parts;
use super::{Tensor, CONFIG_KEY, TOKENIZER_KEY};
use crate::config::Config;
use crate::error::{Error, Result};
use safetensors::tensor::View;
use safetensors::Dtype;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
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
/// against the config), so tests can build deliberately broken archives.
///
/// # Errors
/// [`Error::InvalidArgument`] if safetensors refuses the data (e.g. a shape that does not match its bytes).
pub fn write_archive(
    config: &Config,
    tokenizer: Option<&str>,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<Vec<u8>> {
    let b = blobs(tensors);
    safetensors::serialize(
        b.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata(config, tokenizer)),
    )
    .map_err(|e| Error::InvalidArgument(format!("cannot serialize archive: {e}")))
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

/// Write named blobs and string metadata as a safetensors file at `path`.
pub(crate) fn write_blobs_file(
    path: &Path,
    blobs: &[(String, Blob)],
    metadata: HashMap<String, String>,
) -> Result<()> {
    safetensors::serialize_to_file(
        blobs.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata),
        path,
    )
    .map_err(|e| match e {
        safetensors::SafeTensorError::IoError(err) => Error::Io {
            path: path.to_path_buf(),
            err,
        },
        other => Error::InvalidArgument(format!("cannot serialize {}: {other}", path.display())),
    })?;
    set_file_mode(path).map_err(|err| Error::Io {
        path: path.to_path_buf(),
        err,
    })
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
