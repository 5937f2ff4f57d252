//! Structured generation: output constrained to a JSON Schema, a regular
//! expression, a Lark grammar or a tool call, through llguidance.
//!
//! A [`TokenSpace`] (built once per model from its tokenizer) compiles a
//! [`ConstraintSpec`] into a [`Constraint`], the per-request state: the tokens it
//! forces, the [`TokenMask`] of each step, and whether the output is complete.
//! [`crate::session::Session::generate_constrained`] drives it.

mod custom;
mod mask;
mod space;
mod spec;
mod tools;

pub use custom::{CustomTool, TextGrammar};
pub use mask::TokenMask;
pub use space::TokenSpace;
pub use spec::{Constraint, ConstraintSpec};
pub use tools::{JsonWhitespace, Tool, ToolCall, ToolChoice, ToolMarkers, ToolSet};
