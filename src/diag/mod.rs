//! Diagnostics: the parity ladder, GPU against CPU rung by rung ([`parity`]),
//! perplexity and bits per byte of a text ([`eval`]), and statistics of
//! benchmark samples ([`stats`]).

pub mod eval;
pub mod parity;
pub mod stats;
