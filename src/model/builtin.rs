//! The built-in model: `models/cqlm-small.safetensors`, compiled into the binary.
//!
//! A small model of the SPEC architecture trained on public-domain English by
//! `tools/train/` (hidden 256, 8 layers, 4 heads / 2 KV heads of 64, vocab 4096
//! byte-level BPE, engram at layers 1 and 5) and packed by `cqlm pack` at 4 bits.
//! It is what `cqlm generate`, `eval`, `bench`, `profile` and `parity` run when
//! given neither `--model` nor `--preset`. `models/README.md` (its model card) records how it
//! was trained and what it scores.

use crate::error::Result;
use crate::model::weights::Model;

/// The archive's bytes (a valid SPEC §5 file with its tokenizer embedded).
pub static ARCHIVE: &[u8] = include_bytes!("../../models/cqlm-small.safetensors");

/// The name errors and notices give the built-in archive.
pub const NAME: &str = "built-in cqlm-small";

/// Parse and validate the built-in archive.
///
/// # Errors
/// [`crate::Error::Archive`] if the embedded bytes break SPEC §1–§5 (a build defect).
pub fn model() -> Result<Model> {
    Model::from_bytes(ARCHIVE, NAME)
}
