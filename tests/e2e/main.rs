//! The `e2e` test binary: the built-in trained model end to end against PyTorch
//! fixtures, its chat template against Python's, its tool calls on held-out
//! conversations, and the evaluations (`cqlm eval`, `tools/train/evaluate.py
//! chat` through `cqlm generate` and `cqlm serve`). Uses the library, the `cqlm`
//! binary and, where `CQLM_OPENAI_PYTHON` names one, Python.
//!
//! One binary per need (`lib`, `gpu`, `bin`, `e2e`), so wgpu and the naive model
//! link once per binary; each module is one family of checks, and no module name
//! repeats across binaries.

#[path = "../common/mod.rs"]
mod common;

mod chat_eval;
mod chat_template;
mod chat_tool_calls;
mod eval;
mod trained_model;
