//! What a [`super::Generation`] reports: why it ended ([`Finish`]), what it
//! produced ([`Output`]) and what its constraint cost ([`ConstraintStats`]).

use crate::constrain::ToolCall;

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It generated its token limit (a constrained output is then incomplete).
    Length,
    /// The model chose its end-of-sequence token (not emitted).
    Eos,
    /// The text reached a stop string (the text ends before it).
    StopString,
    /// The constraint's output is complete: no token can follow, or the model
    /// chose EOS where the output may end (EOS is not emitted).
    Complete,
    /// Stopped from outside before any of the above: a callback that returned
    /// false, a client that left, a shutdown.
    Cancelled,
}

/// What a finished generation produced ([`Generation::output`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// Why it ended.
    pub finish: Finish,
    /// Tokens generated (forced ones included).
    pub tokens: usize,
    /// The whole text (up to a stop string; empty without a tokenizer).
    pub text: String,
    /// The tool calls of a tool constraint's complete output (empty otherwise).
    pub tool_calls: Vec<ToolCall>,
    /// The stop string the text ended at ([`Finish::StopString`]).
    pub stop_string: Option<String>,
}

impl Output {
    /// The OpenAI `finish_reason`: `tool_calls` when the output is calls,
    /// `length` at the token limit (and for a generation stopped from outside),
    /// else `stop`.
    pub fn finish_reason(&self) -> &'static str {
        if !self.tool_calls.is_empty() {
            return "tool_calls";
        }
        match self.finish {
            Finish::Length | Finish::Cancelled => "length",
            Finish::Eos | Finish::StopString | Finish::Complete => "stop",
        }
    }
}

/// What a constrained generation spent on its constraint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConstraintStats {
    /// Each mask's time in µs, in order.
    pub mask_us_each: Vec<f32>,
    /// Token masks computed.
    pub masks: usize,
    /// Seconds spent computing them.
    pub mask_seconds: f64,
    /// Tokens the constraint forced (appended without a choice).
    pub forced: usize,
    /// Tokens chosen under a mask.
    pub chosen: usize,
}

impl ConstraintStats {
    /// Mean mask time per mask, in µs (0 without masks).
    pub fn mask_us(&self) -> f64 {
        if self.masks == 0 {
            0.0
        } else {
            self.mask_seconds * 1e6 / self.masks as f64
        }
    }
}
