//! Tool calls: a tool set in the OpenAI `tools` format (function tools, and the
//! Responses API's custom tools), the choice of `auto | required | none |
//! <name>`, the grammar of a call and the parsing of calls out of the
//! generated text.
//!
//! A function call is the JSON object `{"name": <a tool's name>, "arguments":
//! <an object valid against that tool's parameters>}`. With `required` or a
//! name the whole output is one call (or, parallel, a JSON array of at least
//! one); with `auto` it is free text (not starting with the start marker's
//! first character) or one call between the markers (`<tool_call>` …
//! `</tool_call>` by default, or the archive's `cqlm.tool_call_markers`); with
//! `none`, free text.
//!
//! A set with custom tools is laid out as `custom.rs` says.

use super::custom::CustomTool;
use crate::error::{Error, Result};
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::{json, Value};

/// How much free whitespace JSON output may hold: none by default (compact), or
/// at most `n` whitespace characters at each place JSON allows them. Unbounded
/// whitespace is the commonest failure of constrained JSON (a model that pads
/// until the token limit), so it is never offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JsonWhitespace(pub usize);

impl JsonWhitespace {
    /// llguidance's options for this whitespace, written into `schema` (an
    /// object) as its `x-guidance` key.
    pub(crate) fn apply(self, schema: &mut Value) {
        let o = llguidance::JsonCompileOptions {
            whitespace_flexible: false,
            whitespace_pattern: (self.0 > 0)
                .then(|| format!(r"[\x20\x0A\x0D\x09]{{1,{}}}", self.0)),
            ..Default::default()
        };
        o.apply_to(schema);
    }
}

/// One tool: a name, a description and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The function's name (`[A-Za-z0-9_-]`, 1 to 64 characters).
    pub name: String,
    /// What the function does (for the prompt; not part of the grammar).
    pub description: Option<String>,
    /// The JSON Schema of the arguments (an object schema).
    pub parameters: Value,
}

/// The llguidance grammars of a constraint.
#[derive(Debug, Clone)]
pub(crate) enum Grammars {
    /// One grammar, from the first token to the end.
    One(TopLevelGrammar),
    /// Free text or one call between markers (`auto`), as parts in turn.
    Call(CallGrammars),
}

/// `auto` mode's output, `TEXT | start call end`, as three grammars run in
/// turn: the head (free text, or the start marker, after which it can only
/// end), the call's JSON, the end marker. Only the call depends on the tool
/// set, and it is JSON Schema: the two Lark grammars depend on the markers
/// alone, so they compile once and are cached (llguidance builds a Lark lexer
/// anew for every Lark grammar it compiles, about 1 ms).
///
/// Run in turn, the parts allow what the whole grammar allows, except a token
/// that crosses from one part into the next (the end of the start marker and
/// the call's `{` in one token, or the call's `}` and the start of the end
/// marker). [`CallGrammars::crossed_by`] finds such tokens; a vocabulary that
/// has any gets [`CallGrammars::whole`] instead.
#[derive(Debug, Clone)]
pub(crate) struct CallGrammars {
    markers: ToolMarkers,
    /// The call's JSON Schema (compact).
    call: Value,
}

impl CallGrammars {
    /// Free text that cannot begin like the start marker, or the start marker.
    pub(crate) fn head(&self) -> TopLevelGrammar {
        TopLevelGrammar::from_lark(format!(
            "start: TEXT | {}\n{}",
            lark_literal(&self.markers.start),
            text_rule(&self.markers)
        ))
    }

    /// The call.
    pub(crate) fn call(&self) -> TopLevelGrammar {
        TopLevelGrammar::from_json_schema(self.call.clone())
    }

    /// The end marker.
    pub(crate) fn end(&self) -> TopLevelGrammar {
        TopLevelGrammar::from_lark(format!("start: {}\n", lark_literal(&self.markers.end)))
    }

    /// All of it as one grammar.
    pub(crate) fn whole(&self) -> TopLevelGrammar {
        TopLevelGrammar {
            grammars: vec![
                GrammarWithLexer {
                    name: None,
                    json_schema: None,
                    lark_grammar: Some(format!(
                        "start: TEXT | {} @call {}\n{}",
                        lark_literal(&self.markers.start),
                        lark_literal(&self.markers.end),
                        text_rule(&self.markers)
                    )),
                },
                GrammarWithLexer {
                    name: Some("call".into()),
                    json_schema: Some(self.call.clone()),
                    lark_grammar: None,
                },
            ],
            max_tokens: None,
        }
    }

    /// The markers.
    pub(crate) fn markers(&self) -> &ToolMarkers {
        &self.markers
    }

    /// Whether a token of these bytes could cross from one part into the next:
    /// a nonempty tail of the start marker followed by the `{` that begins a
    /// call (compact: no whitespace before it), or a `}` followed by the end
    /// marker's beginning.
    /// (A superset of the tokens that do: one that is not among them cannot.)
    pub(crate) fn crossed_by(markers: &ToolMarkers, token: &[u8]) -> bool {
        let start = markers.start.as_bytes();
        let end = markers.end.as_bytes();
        let into_call = (0..start.len()).any(|i| {
            let tail = &start[i..];
            token.len() > tail.len() && token.starts_with(tail) && token[tail.len()] == b'{'
        });
        let into_end = token.iter().enumerate().any(|(k, &b)| {
            let rest = &token[k + 1..];
            b == b'}' && !rest.is_empty() && (end.starts_with(rest) || rest.starts_with(end))
        });
        into_call || into_end
    }
}

/// The Lark rule `TEXT` of free text: empty, or not starting with the start
/// marker's first character (so the first token chooses between text and a call).
pub(super) fn text_rule(markers: &ToolMarkers) -> String {
    format!(
        "TEXT: /([^{}](.|\\n)*)?/\n",
        class_escape(markers.start.chars().next().unwrap_or('<'))
    )
}

/// `s` as a Lark string literal.
pub(super) fn lark_literal(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// `c` inside a regex character class (`[...]`) of a Lark grammar.
fn class_escape(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '^' | '-' | '/' => format!("\\{c}"),
        '\n' => "\\n".into(),
        c => c.to_string(),
    }
}

/// The markers around a call in `auto` mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolMarkers {
    /// Before the call.
    pub start: String,
    /// After the call.
    pub end: String,
}

impl ToolMarkers {
    /// The markers `start` and `end`.
    ///
    /// # Errors
    /// A message when either is empty.
    pub fn new(start: &str, end: &str) -> std::result::Result<ToolMarkers, String> {
        if start.is_empty() || end.is_empty() {
            return Err("a marker is empty".into());
        }
        Ok(ToolMarkers {
            start: start.into(),
            end: end.into(),
        })
    }
}

impl Default for ToolMarkers {
    fn default() -> Self {
        ToolMarkers {
            start: "<tool_call>".into(),
            end: "</tool_call>".into(),
        }
    }
}

/// A tool set.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSet {
    pub(super) tools: Vec<Tool>,
    pub(super) custom: Vec<CustomTool>,
    pub(super) markers: ToolMarkers,
}

/// Whether and which tool the output calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Free text or one call between the markers.
    #[default]
    Auto,
    /// One call (or an array of calls) of any tool.
    Required,
    /// Free text only.
    None,
    /// One call (or an array of calls) of this tool.
    Function(String),
}

impl std::str::FromStr for ToolChoice {
    type Err = Error;

    /// `auto`, `required`, `none`, or a tool's name.
    fn from_str(s: &str) -> Result<ToolChoice> {
        Ok(match s {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            "" => {
                return Err(Error::InvalidArgument(
                    "tool choice: empty (auto, required, none or a tool's name)".into(),
                ))
            }
            name => ToolChoice::Function(name.to_string()),
        })
    }
}

/// A parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// A function's arguments (an object valid against the tool's
    /// parameters); null for a custom tool's call.
    pub arguments: Value,
    /// A custom tool's input (valid under its grammar); `None` for a function's call.
    pub input: Option<String>,
}

pub(super) fn bad(msg: String) -> Error {
    Error::InvalidArgument(format!("tool set: {msg}"))
}

/// Check a tool's name (`what` says where it is): 1 to 64 of `[A-Za-z0-9_-]`.
pub(super) fn check_name(name: &str, what: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "{what} `{name}`: 1 to 64 of A-Z, a-z, 0-9, _ and -"
        )))
    }
}

impl ToolChoice {
    /// Check that a named choice names a tool of `tools`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name no tool has.
    pub fn check(&self, tools: &ToolSet) -> Result<()> {
        if let ToolChoice::Function(n) = self {
            if !tools.names().any(|t| t == n) {
                let names: Vec<&str> = tools.names().collect();
                return Err(Error::InvalidArgument(format!(
                    "tool choice `{n}`: no such tool (the tools are {}; or auto, required, none)",
                    names.join(", ")
                )));
            }
        }
        Ok(())
    }
}

impl ToolSet {
    /// A tool set from the OpenAI `tools` array:
    /// `[{"type": "function", "function": {"name", "description", "parameters"}}]`
    /// (`parameters` defaults to an object without properties).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the entry and field for anything else: not
    /// an array, an empty one, a type other than `function`, a missing or invalid
    /// name, a duplicate name, parameters that are not an object schema.
    pub fn from_openai(v: &Value) -> Result<ToolSet> {
        let list = v
            .as_array()
            .ok_or_else(|| bad("expected a JSON array of tools".into()))?;
        if list.is_empty() {
            return Err(bad("the array is empty".into()));
        }
        let mut tools: Vec<Tool> = Vec::new();
        for (i, t) in list.iter().enumerate() {
            let ty = t.get("type").and_then(Value::as_str);
            if ty != Some("function") {
                return Err(bad(format!("tools[{i}].type must be \"function\"")));
            }
            let f = t
                .get("function")
                .filter(|f| f.is_object())
                .ok_or_else(|| bad(format!("tools[{i}].function must be an object")))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("tools[{i}].function.name must be a string")))?;
            check_name(name, &format!("tools[{i}].function.name"))?;
            if tools.iter().any(|t| t.name == name) {
                return Err(bad(format!("tools[{i}]: a second tool named `{name}`")));
            }
            let description = match f.get("description") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => {
                    return Err(bad(format!(
                        "tools[{i}].function.description must be a string"
                    )))
                }
            };
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p) => {
                    let object = p.is_object()
                        && match p.get("type") {
                            None => p.get("properties").is_some(),
                            Some(t) => t == "object",
                        };
                    if !object {
                        return Err(bad(format!(
                            "tools[{i}] `{name}`: parameters must be an object schema ({{\"type\": \"object\", ...}})"
                        )));
                    }
                    p.clone()
                }
            };
            tools.push(Tool {
                name: name.to_string(),
                description,
                parameters,
            });
        }
        Ok(ToolSet {
            tools,
            custom: Vec::new(),
            markers: ToolMarkers::default(),
        })
    }

    /// The names of every tool, functions first.
    pub(super) fn names(&self) -> impl Iterator<Item = &str> {
        let functions = self.tools.iter().map(|t| t.name.as_str());
        functions.chain(self.custom.iter().map(|c| c.name.as_str()))
    }

    /// The same tools with other `auto` markers.
    pub fn with_markers(mut self, markers: ToolMarkers) -> ToolSet {
        self.markers = markers;
        self
    }

    /// The tools.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The `auto` markers.
    pub fn markers(&self) -> &ToolMarkers {
        &self.markers
    }

    /// The JSON Schema of one call (of `only`, or of any tool), compact.
    pub(super) fn call_schema(&self, only: Option<&str>) -> Value {
        let calls: Vec<Value> = self
            .tools
            .iter()
            .filter(|t| only.is_none_or(|n| n == t.name))
            .map(|t| {
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false
                })
            })
            .collect();
        if calls.len() == 1 {
            calls.into_iter().next().unwrap_or_default()
        } else {
            json!({ "anyOf": calls })
        }
    }

    /// The grammar of the output under `choice`: the call's (or a list of calls')
    /// JSON Schema alone for `required` and a named tool, Lark for `none`, and
    /// for `auto` free text or a call between markers as parts in turn (see
    /// [`CallGrammars`]): no grammar that depends on the tool set is written in
    /// Lark, whose compile costs about 1 ms more.
    pub(crate) fn grammar(&self, choice: &ToolChoice, parallel: bool) -> Grammars {
        let only = match choice {
            ToolChoice::Function(n) => Some(n.as_str()),
            _ => None,
        };
        if !self.custom.is_empty() && *choice != ToolChoice::None {
            return Grammars::One(self.marked_grammar(choice, only, parallel));
        }
        let mut call = self.call_schema(only);
        JsonWhitespace::default().apply(&mut call);
        match choice {
            ToolChoice::None => Grammars::One(TopLevelGrammar::from_lark(
                "start: /(.|\\n)*/\n".to_string(),
            )),
            ToolChoice::Required | ToolChoice::Function(_) => {
                let mut top = if parallel {
                    json!({"type": "array", "items": call, "minItems": 1})
                } else {
                    call
                };
                JsonWhitespace::default().apply(&mut top);
                Grammars::One(TopLevelGrammar::from_json_schema(top))
            }
            ToolChoice::Auto => Grammars::Call(CallGrammars {
                markers: self.markers.clone(),
                call,
            }),
        }
    }

    /// The calls in `text` as `choice` lays them out (none for free text).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a call does not parse or names no tool.
    pub(crate) fn parse_calls(&self, choice: &ToolChoice, text: &str) -> Result<Vec<ToolCall>> {
        if !self.custom.is_empty() {
            return match choice {
                ToolChoice::None => Ok(Vec::new()),
                _ => self.parse_marked(text),
            };
        }
        let body = match choice {
            ToolChoice::None => return Ok(Vec::new()),
            ToolChoice::Auto => {
                let Some(rest) = text.strip_prefix(self.markers.start.as_str()) else {
                    return Ok(Vec::new());
                };
                rest.strip_suffix(self.markers.end.as_str())
                    .ok_or_else(|| {
                        Error::InvalidArgument("tool call: the end marker is missing".into())
                    })?
            }
            _ => text,
        };
        self.parse_json_calls(body)
    }

    /// The function calls of a call's JSON (one call, or an array of them).
    pub(super) fn parse_json_calls(&self, body: &str) -> Result<Vec<ToolCall>> {
        let v: Value = serde_json::from_str(body)
            .map_err(|e| Error::InvalidArgument(format!("tool call: not JSON: {e}")))?;
        let list = match v {
            Value::Array(a) => a,
            one => vec![one],
        };
        list.into_iter()
            .map(|c| {
                let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
                if !self.tools.iter().any(|t| t.name == name) {
                    return Err(Error::InvalidArgument(format!(
                        "tool call: no tool named `{name}`"
                    )));
                }
                Ok(ToolCall {
                    name: name.to_string(),
                    arguments: c.get("arguments").cloned().unwrap_or(Value::Null),
                    input: None,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_that_cross_between_the_parts() {
        let m = ToolMarkers::default();
        let crosses = |t: &str| CallGrammars::crossed_by(&m, t.as_bytes());
        // From the start marker into the call's `{`.
        for t in [">{", "l>{\"", "<tool_call>{", "_call>{"] {
            assert!(crosses(t), "{t:?}");
        }
        // From the call's `}` into the end marker.
        for t in ["}<", "}}<", "\"}</", "}</tool_call>", "}</tool_call>\n"] {
            assert!(crosses(t), "{t:?}");
        }
        // Inside one part, or next to a marker but not across it.
        for t in [
            "<tool_call>",
            ">",
            "{",
            "}",
            "}}",
            "> {",
            "}<x",
            "</tool_call>",
            "x>{",
            "} <",
        ] {
            assert!(!crosses(t), "{t:?}");
        }
    }
}
