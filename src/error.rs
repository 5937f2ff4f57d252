//! Typed errors of the library. The CLI turns each into one `error: …` line.

use std::path::PathBuf;

/// Everything that can go wrong in `cqlm`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened, mapped, read or written.
    #[error("{path}: {err}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The operating system's error (in the message, not repeated as a source).
        err: std::io::Error,
    },
    /// An archive breaks SPEC §1–§5. `archive` names the file (or `<memory>`).
    #[error("{archive}: {kind}")]
    Archive {
        /// The archive's path, or a name such as `<synth>` for an in-memory archive.
        archive: String,
        /// What is wrong with it.
        kind: ArchiveError,
    },
    /// A config (outside an archive) breaks SPEC §1.
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    /// A token id is not below the model's vocabulary size; the state is unchanged.
    #[error("token {token} is out of range: the vocabulary has {vocab} tokens")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// A step produced a non-finite value (NaN or ±inf). `tensor` is the first
    /// intermediate that went non-finite (CPU), or `logits` (GPU: `cqlm parity`
    /// names the first non-finite tensor). The step was taken: reset before reuse.
    #[error("a non-finite value appeared in {tensor} at position {position} (an Inf/NaN weight or an overflow); reset the session before reusing it")]
    NonFinite {
        /// The tensor, e.g. `layer 1 q`.
        tensor: String,
        /// The logical position of the step.
        position: u64,
    },
    /// A buffer (KV cache, ring, …) could not be allocated.
    #[error("cannot allocate {what}: {bytes} bytes")]
    Alloc {
        /// Which buffer.
        what: String,
        /// Its size in bytes (saturated at `u64::MAX`).
        bytes: u64,
    },
    /// The GPU backend failed: no adapter, a missing limit, a lost device.
    #[error("gpu: {0}")]
    Gpu(String),
    /// A tensor of a float checkpoint cannot be packed: missing, misshapen, unknown
    /// or holding a non-finite value (`cqlm pack`).
    #[error("cannot pack tensor `{tensor}`: {reason}")]
    Pack {
        /// The tensor's name (SPEC §3).
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An argument of a library call breaks its documented contract.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// A config field that breaks SPEC §1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `engram.orders` (or `<json>` for a syntax error).
    pub field: String,
    /// Why it is rejected.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Why an archive is rejected. Every variant names the tensor or field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveError {
    /// The file is shorter than its header says, or its data section does not match the offsets.
    #[error("truncated or inconsistent file: {0}")]
    Truncated(String),
    /// The file is no safetensors file at all (a text file, say): its ninth byte
    /// does not open a JSON header.
    #[error(
        "not a cqlm archive (a safetensors file: an 8-byte header length, then a JSON header)"
    )]
    NotAnArchive,
    /// The safetensors container itself is malformed (header, JSON, offsets).
    #[error("not a valid safetensors file: {0}")]
    Format(String),
    /// A `cqlm.*` metadata entry other than the config is malformed.
    #[error("metadata `{key}`: {reason}")]
    Metadata {
        /// The metadata key.
        key: String,
        /// What is wrong with its value.
        reason: String,
    },
    /// `__metadata__` has no `cqlm.config`.
    #[error("metadata key `cqlm.config` is missing")]
    MissingConfig,
    /// `cqlm.config` breaks SPEC §1.
    #[error("cqlm.config {0}")]
    Config(ConfigError),
    /// A tensor that SPEC §3 requires is absent.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor that SPEC §3 does not define is present.
    #[error("unknown tensor `{0}`")]
    UnknownTensor(String),
    /// A tensor has the wrong dtype.
    #[error("tensor `{name}` has dtype {found}, expected {expected}")]
    WrongDtype {
        /// Tensor name.
        name: String,
        /// Required dtype.
        expected: String,
        /// Dtype in the file.
        found: String,
    },
    /// A tensor has the wrong shape.
    #[error("tensor `{name}` has shape {found:?}, expected {expected}")]
    WrongShape {
        /// Tensor name.
        name: String,
        /// Required shape, in words.
        expected: String,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A CQ matrix breaks SPEC §2 (codebook size, group geometry, padding).
    #[error("CQ matrix `{name}`: {reason}")]
    BadCq {
        /// Matrix name (without the `.packed`/`.norms`/`.codebook` suffix).
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
