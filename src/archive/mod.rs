//! SPEC §3 and §5: the safetensors archive: which tensors it holds, reading
//! (memory-mapped, fully validated) and writing; and the float checkpoints
//! `cqlm pack` reads (`float.rs`).

mod float;
mod reader;
mod spec;
mod writer;

pub(crate) use float::{expected_text, shape_ok};
pub use float::{
    read_float_checkpoint, write_float_checkpoint, FloatCheckpoint, FloatDtype, FloatTensor,
};
pub use reader::{read_archive, read_archive_file, RawArchive};
pub use spec::{cq_parts, engram_table_names, expected_tensors, TensorKind, TensorSpec};
pub use writer::{set_file_mode, write_archive, write_archive_file, write_archive_file_with_chat};

use crate::cq::CqMatrix;

/// One decoded logical tensor of an archive.
#[derive(Debug, Clone)]
pub enum Tensor {
    /// A CQ matrix.
    Cq(CqMatrix),
    /// A dense F32 tensor: shape and row-major values.
    F32 {
        /// Shape.
        shape: Vec<usize>,
        /// Values, `shape.iter().product()` of them.
        data: Vec<f32>,
    },
}

/// Metadata key of the config JSON.
pub const CONFIG_KEY: &str = "cqlm.config";
/// Metadata key of the optional Hugging Face `tokenizer.json` text.
pub const TOKENIZER_KEY: &str = "cqlm.tokenizer";
/// Metadata key of the optional chat template (Jinja, in the Hugging Face
/// convention: `messages`, `tools`, `add_generation_prompt`, `bos_token`,
/// `eos_token`), rendered by `cqlm serve`.
pub const CHAT_TEMPLATE_KEY: &str = "cqlm.chat_template";
/// Metadata key of the optional tool-call markers: a JSON array of two non-empty
/// strings, the text before and after a call in `auto` tool mode (default
/// `["<tool_call>", "</tool_call>"]`).
pub const TOOL_MARKERS_KEY: &str = "cqlm.tool_call_markers";
