//! The model: its config (SPEC §1) and presets ([`config`]), the typed
//! weights ([`weights::Model`]), the engram token history and n-gram hashing
//! every backend shares ([`engram`]), and the built-in trained model
//! ([`builtin`]).

pub mod builtin;
pub mod config;
pub mod engram;
pub mod weights;
