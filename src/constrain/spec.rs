//! [`ConstraintSpec`] (what a request asks for) and [`Constraint`] (its compiled,
//! per-request state).

use super::mask::TokenMask;
use super::tools::{Grammars, JsonWhitespace, ToolCall, ToolChoice, ToolSet};
use crate::error::{Error, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::Value;

/// What a constrained generation must produce.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// JSON valid against this JSON Schema (an object; local `$ref`s resolve).
    JsonSchema {
        /// The schema.
        schema: Value,
        /// Free whitespace allowed.
        whitespace: JsonWhitespace,
    },
    /// Text that matches this regular expression as a whole.
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's dialect).
    Lark(String),
    /// A tool call (or free text, as `choice` says) over a tool set.
    Tools {
        /// The tools.
        tools: ToolSet,
        /// Whether and which tool must be called.
        choice: ToolChoice,
        /// With `Required` or a name: the output may be a JSON array of calls.
        parallel: bool,
    },
}

/// What kind of output a constraint produces (for parsing it afterwards).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Output {
    /// Text (a pattern, a grammar, a schema).
    Text,
    /// Tool calls as [`ConstraintSpec::Tools`] lays them out.
    Tools(ToolSet, ToolChoice),
}

impl ConstraintSpec {
    /// A JSON Schema constraint with compact output.
    pub fn json_schema(schema: Value) -> ConstraintSpec {
        ConstraintSpec::JsonSchema {
            schema,
            whitespace: JsonWhitespace::default(),
        }
    }

    /// What this is, for error messages.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonSchema { .. } => "JSON schema",
            ConstraintSpec::Regex(_) => "regular expression",
            ConstraintSpec::Lark(_) => "Lark grammar",
            ConstraintSpec::Tools { .. } => "tool set",
        }
    }

    /// The llguidance grammars of this constraint.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a schema that is not an object, an invalid
    /// regular expression, or a bad tool set.
    pub(crate) fn grammar(&self) -> Result<(Grammars, Output)> {
        let one = |g: TopLevelGrammar| Grammars::One(g);
        Ok(match self {
            ConstraintSpec::JsonSchema { schema, whitespace } => {
                let mut s = schema.clone();
                if !s.is_object() {
                    return Err(Error::InvalidArgument(
                        "JSON schema: the schema must be a JSON object".into(),
                    ));
                }
                whitespace.apply(&mut s);
                (one(TopLevelGrammar::from_json_schema(s)), Output::Text)
            }
            ConstraintSpec::Regex(rx) => {
                // llguidance rewrites the pattern into its own syntax; check it with a
                // full parser first, so a malformed one is reported as such.
                regex_syntax::Parser::new()
                    .parse(rx)
                    .map_err(|e| Error::InvalidArgument(format!("regular expression: {e}")))?;
                (one(TopLevelGrammar::from_regex(rx)), Output::Text)
            }
            ConstraintSpec::Lark(g) => (one(TopLevelGrammar::from_lark(g.clone())), Output::Text),
            ConstraintSpec::Tools {
                tools,
                choice,
                parallel,
            } => {
                choice.check(tools)?;
                (
                    tools.grammar(choice, *parallel),
                    Output::Tools(tools.clone(), choice.clone()),
                )
            }
        })
    }
}

/// A compiled constraint, the state of one request: tokens it forces, the mask
/// of each step, whether the output is complete. Built by
/// [`super::TokenSpace::compile`].
///
/// It runs one llguidance matcher or several in turn (`auto` tool calls, see
/// `CallGrammars`): when the current one can take nothing more, the next one
/// starts where it ended. The output may end (EOS) wherever the current one
/// accepts, so a part that accepts before it stops (the free text of `auto`)
/// ends the output there; it is complete when the last part stops.
pub struct Constraint {
    matcher: Matcher,
    /// The matchers still to run, the next one last.
    then: Vec<Matcher>,
    output: Output,
    vocab: usize,
    eos: u32,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("output", &self.output)
            .field("parts_to_come", &self.then.len())
            .finish_non_exhaustive()
    }
}

/// llguidance's error as ours.
fn llg(e: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("constraint: {e}"))
}

impl Constraint {
    /// A constraint running `first`, then each of `rest` in turn.
    pub(crate) fn new(
        first: Matcher,
        mut rest: Vec<Matcher>,
        output: Output,
        vocab: usize,
        eos: u32,
    ) -> Constraint {
        rest.reverse();
        let mut c = Constraint {
            matcher: first,
            then: rest,
            output,
            vocab,
            eos,
        };
        c.advance();
        c
    }

    /// Move on to the next part while the current one is complete (it can take
    /// no further byte: llguidance stopped it for want of an extension).
    fn advance(&mut self) {
        use llguidance::api::StopReason;
        while matches!(
            self.matcher.stop_reason(),
            StopReason::NoExtension | StopReason::NoExtensionBias
        ) {
            match self.then.pop() {
                Some(next) => self.matcher = next,
                None => return,
            }
        }
    }

    /// The tokens the constraint forces next (none when the next token is a
    /// choice), already committed: the caller appends them without sampling.
    pub fn take_forced(&mut self) -> Vec<u32> {
        let mut forced = Vec::new();
        loop {
            let more = self.matcher.consume_ff_tokens();
            let moved = self.then.len();
            self.advance();
            forced.extend(more);
            if self.then.len() == moved {
                return forced;
            }
        }
    }

    /// The tokens allowed next into `mask` (EOS among them only where the output
    /// may end; EOS alone once it must).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the constraint is in an error state.
    pub fn mask_into(&mut self, mask: &mut TokenMask) -> Result<()> {
        if mask.vocab() != self.vocab {
            *mask = TokenMask::none(self.vocab);
        }
        let v = self.matcher.compute_mask_or_eos().map_err(llg)?;
        mask.set_words(v.as_slice());
        Ok(())
    }

    /// Commit the chosen `token` (it must be allowed).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the constraint does not accept it.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token).map_err(llg)?;
        self.advance();
        Ok(())
    }

    /// Whether the output can end here (EOS is allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the output is finished: no further token is possible.
    pub fn is_stopped(&self) -> bool {
        self.then.is_empty() && self.matcher.is_stopped()
    }

    /// The id that ends the output where it may end.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// The tool calls in `text` (the generated output of a tool constraint); empty
    /// for free text or a constraint of another kind.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a call in `text` does not parse (a cut
    /// output).
    pub fn tool_calls(&self, text: &str) -> Result<Vec<ToolCall>> {
        match &self.output {
            Output::Text => Ok(Vec::new()),
            Output::Tools(tools, choice) => tools.parse_calls(choice, text),
        }
    }
}
