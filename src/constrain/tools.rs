//! Tool calls: a tool set in the OpenAI `tools` format, the choice of
//! `auto | required | none | <name>`, the grammar of a call and the parsing of
//! calls out of the generated text.
//!
//! A call is the JSON object `{"name": <a tool's name>, "arguments": <an object
//! valid against that tool's parameters>}`. With `required` or a name the whole
//! output is one call (or, parallel, a JSON array of at least one); with `auto`
//! it is free text (not starting with the start marker's first character) or
//! one call between the markers (`<tool_call>` … `</tool_call>` by default, or the
//! archive's `cqlm.tool_call_markers`); with `none`, free text.

use super::spec::JsonWhitespace;
use crate::error::{Error, Result};
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::{json, Value};

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
    tools: Vec<Tool>,
    markers: ToolMarkers,
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
    /// Its arguments (an object valid against the tool's parameters).
    pub arguments: Value,
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument(format!("tool set: {msg}"))
}

impl ToolChoice {
    /// Check that a named choice names a tool of `tools`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name no tool has.
    pub fn check(&self, tools: &ToolSet) -> Result<()> {
        if let ToolChoice::Function(n) = self {
            if !tools.tools.iter().any(|t| &t.name == n) {
                let names: Vec<&str> = tools.tools.iter().map(|t| t.name.as_str()).collect();
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
            let ok = (1..=64).contains(&name.len())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(bad(format!(
                    "tools[{i}].function.name `{name}`: 1 to 64 of A-Z, a-z, 0-9, _ and -"
                )));
            }
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
            markers: ToolMarkers::default(),
        })
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
    fn call_schema(&self, only: Option<&str>) -> Value {
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
    /// JSON Schema alone for `required` and a named tool, Lark for `auto` and
    /// `none`. (llguidance builds its Lark lexer anew for each Lark grammar, about
    /// 1.5 ms here, so a grammar that needs no Lark is not written in it.)
    pub(crate) fn grammar(&self, choice: &ToolChoice, parallel: bool) -> TopLevelGrammar {
        let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let only = match choice {
            ToolChoice::Function(n) => Some(n.as_str()),
            _ => None,
        };
        let mut call = self.call_schema(only);
        JsonWhitespace::default().apply(&mut call);
        match choice {
            ToolChoice::None => TopLevelGrammar::from_lark("start: /(.|\\n)*/\n".to_string()),
            ToolChoice::Required | ToolChoice::Function(_) => {
                let mut top = if parallel {
                    json!({"type": "array", "items": call, "minItems": 1})
                } else {
                    call
                };
                JsonWhitespace::default().apply(&mut top);
                TopLevelGrammar::from_json_schema(top)
            }
            // Free text may not begin with the start marker's first character, so
            // the choice between text and a call is made by the first token.
            // The call is a grammar of its own, so the Lark text stays short.
            ToolChoice::Auto => TopLevelGrammar {
                grammars: vec![
                    GrammarWithLexer {
                        name: None,
                        json_schema: None,
                        lark_grammar: Some(format!(
                            "start: TEXT | {} @call {}\nTEXT: /([^{}](.|\\n)*)?/\n",
                            lit(&self.markers.start),
                            lit(&self.markers.end),
                            class_escape(self.markers.start.chars().next().unwrap_or('<')),
                        )),
                    },
                    GrammarWithLexer {
                        name: Some("call".into()),
                        json_schema: Some(call),
                        lark_grammar: None,
                    },
                ],
                max_tokens: None,
            },
        }
    }

    /// The calls in `text` as `choice` lays them out (none for free text).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a call does not parse or names no tool.
    pub(crate) fn parse_calls(&self, choice: &ToolChoice, text: &str) -> Result<Vec<ToolCall>> {
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
                })
            })
            .collect()
    }
}
