//! Custom tools (OpenAI's Responses API `custom` type: free-text input,
//! optionally in a Lark or regex grammar) in a [`ToolSet`] beside its function
//! tools.
//!
//! A set with custom tools writes every call between the markers, under every
//! choice but `none`: a function call as its JSON, a custom call as the tool's
//! name, a newline and its input (`<tool_call>apply_patch\n*** Begin
//! Patch…</tool_call>`). One Lark grammar holds it all, the custom grammars
//! and the calls' JSON Schema as its sub-grammars, so an input always parses
//! under its tool's grammar (an input ends at the first end marker).

use super::tools::{
    bad, check_name, lark_literal, text_rule, JsonWhitespace, ToolCall, ToolChoice, ToolMarkers,
    ToolSet,
};
use crate::error::{Error, Result};
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::Value;

/// The grammar a custom tool's input must parse under.
#[derive(Debug, Clone, PartialEq)]
pub enum TextGrammar {
    /// llguidance's Lark dialect (its `start` rule).
    Lark(String),
    /// A regular expression the whole input matches.
    Regex(String),
}

/// A custom tool (OpenAI's Responses API `custom` type): its input is free
/// text, in its grammar when it has one.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomTool {
    /// The tool's name (as a function's).
    pub name: String,
    /// What it does (for the prompt).
    pub description: Option<String>,
    /// The input's grammar; `None`: any text without the end marker.
    pub grammar: Option<TextGrammar>,
}

impl ToolSet {
    /// A tool set of the function tools `functions` (the OpenAI `tools` array,
    /// as [`ToolSet::from_openai`]; `None` for none) and the custom tools `custom`.
    ///
    /// # Errors
    /// As [`ToolSet::from_openai`]; also for no tool at all, a custom tool's
    /// invalid name, or a name two tools share.
    pub fn from_parts(functions: Option<&Value>, custom: Vec<CustomTool>) -> Result<ToolSet> {
        let mut set = match functions {
            Some(f) => ToolSet::from_openai(f)?,
            None if custom.is_empty() => return Err(bad("no tools".into())),
            None => ToolSet {
                tools: Vec::new(),
                custom: Vec::new(),
                markers: ToolMarkers::default(),
            },
        };
        for c in custom {
            check_name(&c.name, "a custom tool's name")?;
            if set.names().any(|n| n == c.name) {
                return Err(bad(format!("a second tool named `{}`", c.name)));
            }
            set.custom.push(c);
        }
        Ok(set)
    }

    /// The grammar of a set with custom tools (see the module's note): under
    /// `auto` free text or calls, else calls (of `only` when it names a tool),
    /// each between the markers; several with `parallel`.
    pub(super) fn marked_grammar(
        &self,
        choice: &ToolChoice,
        only: Option<&str>,
        parallel: bool,
    ) -> TopLevelGrammar {
        let (start, end) = (
            lark_literal(&self.markers.start),
            lark_literal(&self.markers.end),
        );
        let mut subs = Vec::new();
        let mut bodies = Vec::new();
        let mut rules = String::new();
        if self.tools.iter().any(|t| only.is_none_or(|n| n == t.name)) {
            let mut call = self.call_schema(only);
            JsonWhitespace::default().apply(&mut call);
            bodies.push(format!("@function_call {end}"));
            subs.push(GrammarWithLexer {
                name: Some("function_call".into()),
                json_schema: Some(call),
                lark_grammar: None,
            });
        }
        for (i, c) in self.custom.iter().enumerate() {
            if only.is_some_and(|n| n != c.name) {
                continue;
            }
            let head = lark_literal(&format!("{}\n", c.name));
            let name = format!("custom_input_{i}");
            let sub = match &c.grammar {
                None => {
                    // Any text up to (and with) the first end marker.
                    bodies.push(format!("{head} free_input_{i}"));
                    rules.push_str(&format!("free_input_{i}[suffix={end}]: /(.|\\n)*/\n"));
                    continue;
                }
                Some(TextGrammar::Lark(g)) => GrammarWithLexer::from_lark(g.clone()),
                Some(TextGrammar::Regex(r)) => GrammarWithLexer::from_regex(r),
            };
            bodies.push(format!("{head} @{name} {end}"));
            subs.push(GrammarWithLexer {
                name: Some(name),
                ..sub
            });
        }
        let calls = if parallel { "call+" } else { "call" };
        let top = if *choice == ToolChoice::Auto {
            format!("start: TEXT | {calls}\n{}", text_rule(&self.markers))
        } else {
            format!("start: {calls}\n")
        };
        let lark = format!(
            "{top}call: {start} body\nbody: {}\n{rules}",
            bodies.join(" | ")
        );
        let mut grammars = vec![GrammarWithLexer::from_lark(lark)];
        grammars.extend(subs);
        TopLevelGrammar {
            grammars,
            max_tokens: None,
        }
    }

    /// The calls in `text`, every one between the markers (a set with custom
    /// tools): none for free text.
    pub(super) fn parse_marked(&self, text: &str) -> Result<Vec<ToolCall>> {
        let (start, end) = (self.markers.start.as_str(), self.markers.end.as_str());
        let mut rest = text;
        let mut calls = Vec::new();
        let missing = || Error::InvalidArgument("tool call: the end marker is missing".into());
        while let Some(after) = rest.strip_prefix(start) {
            if after.starts_with('{') {
                // A function call: its JSON (whose strings may hold the end
                // marker), then the end marker.
                let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
                values
                    .next()
                    .ok_or_else(missing)?
                    .map_err(|e| Error::InvalidArgument(format!("tool call: not JSON: {e}")))?;
                let (json, tail) = after.split_at(values.byte_offset());
                rest = tail.strip_prefix(end).ok_or_else(missing)?;
                calls.extend(self.parse_json_calls(json)?);
                continue;
            }
            let cut = after.find(end).ok_or_else(missing)?;
            let body = &after[..cut];
            rest = &after[cut + end.len()..];
            let (name, input) = body.split_once('\n').ok_or_else(|| {
                Error::InvalidArgument("tool call: no newline after the custom tool's name".into())
            })?;
            if !self.custom.iter().any(|c| c.name == name) {
                return Err(Error::InvalidArgument(format!(
                    "tool call: no custom tool named `{name}`"
                )));
            }
            calls.push(ToolCall {
                name: name.to_string(),
                arguments: Value::Null,
                input: Some(input.to_string()),
            });
        }
        Ok(calls)
    }
}
