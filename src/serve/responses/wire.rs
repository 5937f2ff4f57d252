//! OpenAI's Responses API request, read into the chat path's own request
//! ([`ChatRequest`]): `instructions` becomes a system message; `input` (a
//! string, or items: messages with `input_text`/`output_text` parts,
//! `function_call` and `function_call_output`, `custom_tool_call` and
//! `custom_tool_call_output`) becomes messages, calls and tool results;
//! `function` tools, `tool_choice` and `text.format` become their chat forms.
//! A `custom` tool named by `tool_choice` constrains the whole output to its
//! grammar ([`Translated::custom`]); custom tools offered under `auto` or
//! `required` join the function tools in one tool constraint
//! ([`Translated::custom_tools`]), each call between the tool-call markers
//! (see [`crate::constrain::ToolSet`]), as a `custom_tool_call` item in the
//! input is written into the prompt. Hosted tools the engine cannot run are
//! left out and named ([`Translated::skipped_tools`]); stateful features
//! (`previous_response_id`, `conversation`, `background`) are refused.

use crate::constrain::{ConstraintSpec, CustomTool, TextGrammar, ToolMarkers};
use crate::serve::error::ApiError;
use crate::serve::wire::{ChatRequest, Content, Message, Sampling};
use serde_json::{json, Map, Value};

/// The fields a Responses request may carry. `store`, `metadata`,
/// `client_metadata` (Codex CLI's session ids), `user`,
/// `safety_identifier`, `prompt_cache_key`, `service_tier`, `reasoning`,
/// `truncation` (`disabled` or `auto`: the prompt is never cut) and `include`
/// without logprobs are accepted and change nothing (nothing is stored; the
/// cache is automatic; the model does not reason). `seed` is cqlm's own, as on
/// chat completions.
const KNOWN: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "stream",
    "store",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "reasoning",
    "truncation",
    "include",
    "previous_response_id",
    "conversation",
    "background",
    "top_logprobs",
    "seed",
    "client_metadata",
];

/// A custom tool's constraint and name, when `tool_choice` names it.
pub(crate) struct CustomCall {
    pub(crate) name: String,
    /// Its grammar (none: free text).
    pub(crate) spec: Option<ConstraintSpec>,
}

/// A Responses request read into the chat path's form.
pub(crate) struct Translated {
    pub(crate) chat: ChatRequest,
    /// The named custom tool whose input the whole output is.
    pub(crate) custom: Option<CustomCall>,
    /// Custom tools offered beside the function tools (under `auto`, `required`
    /// or `allowed_tools`), for the tool constraint.
    pub(crate) custom_tools: Vec<CustomTool>,
    /// The tools the prompt lists: the function tools, and each custom tool as
    /// a function whose parameter is its text (`None`: no tools).
    pub(crate) prompt_tools: Option<Value>,
    /// Types of the tools left out (hosted tools the engine cannot run).
    pub(crate) skipped_tools: Vec<String>,
    /// The request's tools and tool choice as given (echoed in the response).
    pub(crate) tools: Value,
    pub(crate) tool_choice: Value,
}

fn bad(msg: impl Into<String>, at: &str) -> ApiError {
    ApiError::bad(msg, Some(at))
}

fn message(role: &str, text: Option<String>) -> Message {
    Message {
        role: role.into(),
        content: text.map(Content::Text),
        tool_calls: None,
        tool_call_id: None,
        name: None,
    }
}

/// The text of a message's content or of a tool's output: a string or text
/// parts (`input_text`, `output_text`).
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                let at = format!("{at}[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        s.push_str(p.get("text").and_then(Value::as_str).ok_or_else(|| {
                            bad(format!("{at}.text must be a string"), &format!("{at}.text"))
                        })?)
                    }
                    other => {
                        return Err(bad(
                            format!("{at}: parts of type {other:?} are not supported (text only)"),
                            &format!("{at}.type"),
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(bad(
            format!("{at} must be a string or a list of text parts"),
            at,
        )),
    }
}

/// A call in the chat form: `arguments` a JSON string.
fn call(item: &Value, at: &str, arguments: String) -> Result<Value, ApiError> {
    let name = item
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{at}.name must be a string"), &format!("{at}.name")))?;
    let id = item.get("call_id").cloned().unwrap_or(Value::Null);
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
}

/// `input` as messages (a custom tool's call written as the assistant's text
/// between `markers`, as the model writes it).
fn input(v: &Value, out: &mut Vec<Message>, markers: &ToolMarkers) -> Result<(), ApiError> {
    let items = match v {
        Value::String(s) => {
            out.push(message("user", Some(s.clone())));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => return Err(bad("input must be a string or a list of items", "input")),
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        let field = |k: &str| {
            item.get(k)
                .ok_or_else(|| bad(format!("{at}.{k} is missing"), &format!("{at}.{k}")))
        };
        // Calls join the assistant turn they follow (one turn, several calls).
        let push_call = |c: Value, out: &mut Vec<Message>| match out.last_mut() {
            Some(m) if m.role == "assistant" => m.tool_calls.get_or_insert_with(Vec::new).push(c),
            _ => {
                let mut m = message("assistant", None);
                m.tool_calls = Some(vec![c]);
                out.push(m);
            }
        };
        match kind {
            None | Some("message") => {
                let role = field("role")?.as_str().unwrap_or_default();
                if !matches!(role, "user" | "assistant" | "system" | "developer") {
                    return Err(bad(format!("{at}.role: user, assistant, system or developer"), &format!("{at}.role")));
                }
                let text = text_of(field("content")?, &format!("{at}.content"))?;
                out.push(message(role, Some(text)));
            }
            Some("function_call") => {
                let args = field("arguments")?
                    .as_str()
                    .ok_or_else(|| bad(format!("{at}.arguments must be a JSON string"), &format!("{at}.arguments")))?;
                push_call(call(item, &at, args.to_string())?, out);
            }
            Some("custom_tool_call") => {
                let input = field("input")?.as_str().unwrap_or_default();
                let name = field("name")?.as_str().ok_or_else(|| {
                    bad(format!("{at}.name must be a string"), &format!("{at}.name"))
                })?;
                let text = format!("{}{name}\n{input}{}", markers.start, markers.end);
                match out.last_mut() {
                    Some(Message {
                        role,
                        content: Some(Content::Text(t)),
                        ..
                    }) if role == "assistant" => t.push_str(&text),
                    Some(m) if m.role == "assistant" && m.content.is_none() => {
                        m.content = Some(Content::Text(text));
                    }
                    _ => out.push(message("assistant", Some(text))),
                }
            }
            Some("function_call_output" | "custom_tool_call_output") => {
                let mut m = message("tool", Some(text_of(field("output")?, &format!("{at}.output"))?));
                m.tool_call_id = field("call_id")?.as_str().map(str::to_string);
                out.push(m);
            }
            // The model does not reason: earlier reasoning items carry nothing for it.
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(
                    format!("{at}: items of type `{other}` are not supported (message, function_call, function_call_output, custom_tool_call, custom_tool_call_output)"),
                    &format!("{at}.type"),
                ))
            }
        }
    }
    Ok(())
}

/// A custom tool's grammar (`format`: text, or a Lark or regex grammar).
fn custom_grammar(t: &Value, at: &str) -> Result<Option<TextGrammar>, ApiError> {
    let Some(f) = t.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("grammar") => {
            let def = f
                .get("definition")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad(
                        "a grammar format needs a definition",
                        &format!("{at}.format.definition"),
                    )
                })?
                .to_string();
            match f.get("syntax").and_then(Value::as_str) {
                Some("lark") => Ok(Some(TextGrammar::Lark(def))),
                Some("regex") => Ok(Some(TextGrammar::Regex(def))),
                _ => Err(bad(
                    "format.syntax: lark or regex",
                    &format!("{at}.format.syntax"),
                )),
            }
        }
        _ => Err(bad(
            "format.type: text or grammar",
            &format!("{at}.format.type"),
        )),
    }
}

/// A custom tool as the prompt lists it: a function whose one parameter is
/// its input text, described with how a call is written and its grammar.
fn custom_listing(c: &CustomTool, markers: &ToolMarkers) -> Value {
    let how = format!(
        "Call it with {}{}, a newline, then its input as plain text, then {}.",
        markers.start, c.name, markers.end
    );
    let description = match &c.description {
        Some(d) => format!("{d} {how}"),
        None => how,
    };
    let input = match &c.grammar {
        None => "free text".to_string(),
        Some(TextGrammar::Lark(g)) => format!("text in this Lark grammar:\n{g}"),
        Some(TextGrammar::Regex(r)) => format!("text matching this regular expression: {r}"),
    };
    json!({"type": "function", "function": {"name": c.name, "description": description,
        "parameters": {"type": "string", "description": input}}})
}

/// A request's tools, sorted.
#[derive(Default)]
struct Tools {
    /// Function tools in the chat form.
    functions: Vec<Value>,
    /// Custom tools.
    custom: Vec<CustomTool>,
    /// The types left out (hosted tools).
    skipped: Vec<String>,
}

/// The tools of `tools`.
fn tools(v: &Value) -> Result<Tools, ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| bad("tools must be a list", "tools"))?;
    let (mut functions, mut custom, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let name = || {
            t.get("name")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(format!("{at}.name must be a string"), &format!("{at}.name")))
        };
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut f = Map::new();
                f.insert("name".into(), name()?.into());
                for k in ["description", "parameters"] {
                    if let Some(x) = t.get(k).filter(|x| !x.is_null()) {
                        f.insert(k.into(), x.clone());
                    }
                }
                functions.push(json!({"type": "function", "function": f}));
            }
            Some("custom") => custom.push(CustomTool {
                name: name()?,
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                grammar: custom_grammar(t, &at)?,
            }),
            Some(other) => skipped.push(other.to_string()),
            None => return Err(bad(format!("{at}.type is missing"), &format!("{at}.type"))),
        }
    }
    Ok(Tools {
        functions,
        custom,
        skipped,
    })
}

/// Read a Responses request body.
///
/// # Errors
/// A 400 naming the field at fault: an unknown field, a stateful feature, an
/// item or tool of the wrong shape, a `top_logprobs` that is not a count, a custom tool
/// under `auto` or `required` (only a `tool_choice` naming it constrains its
/// input to its grammar in this version).
pub(crate) fn translate(v: &Value, markers: &ToolMarkers) -> Result<Translated, ApiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::bad("the request body must be a JSON object", None))?;
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(bad(
            format!("`{k}`: this server does not implement this field"),
            k,
        ));
    }
    for k in ["previous_response_id", "conversation"] {
        if obj.get(k).is_some_and(|x| !x.is_null()) {
            return Err(bad(
                format!("`{k}`: this server is stateless (nothing is stored); send the whole conversation as `input`"),
                k,
            ));
        }
    }
    if obj.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(bad(
            "`background`: responses are not run in the background here",
            "background",
        ));
    }
    let logprobs = obj
        .get("include")
        .and_then(Value::as_array)
        .is_some_and(|l| l.iter().any(|x| x == "message.output_text.logprobs"));
    let top_logprobs = match obj.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(n) => Some(
            n.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    bad(
                        "top_logprobs must be an integer from 0 to 20",
                        "top_logprobs",
                    )
                })?,
        ),
    };
    let mut messages = Vec::new();
    if let Some(i) = obj.get("instructions").filter(|i| !i.is_null()) {
        let text = i
            .as_str()
            .ok_or_else(|| bad("instructions must be a string", "instructions"))?;
        messages.push(message("system", Some(text.to_string())));
    }
    input(
        obj.get("input")
            .ok_or_else(|| bad("input is required", "input"))?,
        &mut messages,
        markers,
    )?;
    let Tools {
        functions,
        custom,
        skipped: skipped_tools,
    } = match obj.get("tools") {
        Some(t) if !t.is_null() => tools(t)?,
        _ => Tools::default(),
    };
    let given_choice = obj.get("tool_choice").cloned().unwrap_or(json!("auto"));
    let named_custom = (given_choice.get("type") == Some(&json!("custom")))
        .then(|| given_choice.get("name").and_then(Value::as_str))
        .flatten();
    let mut custom_call = None;
    let (mut functions, mut custom, mut choice) = (functions, custom, given_choice.clone());
    if let Some(name) = named_custom {
        let tool = custom.iter().find(|c| c.name == name).ok_or_else(|| {
            bad(
                format!("tool_choice names `{name}`, which is no custom tool of `tools`"),
                "tool_choice.name",
            )
        })?;
        custom_call = Some(CustomCall {
            name: name.to_string(),
            spec: tool.grammar.clone().map(|g| match g {
                TextGrammar::Lark(l) => ConstraintSpec::Lark(l),
                TextGrammar::Regex(r) => ConstraintSpec::Regex(r),
            }),
        });
        functions.clear();
        custom.clear();
        choice = json!("none");
    }
    // The chat form of the choice: allowed_tools narrows the tools.
    if let Some("allowed_tools") = choice.get("type").and_then(Value::as_str) {
        let allowed: Vec<&str> = choice
            .get("tools")
            .and_then(Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(|t| t.get("name").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        functions.retain(|f| allowed.contains(&f["function"]["name"].as_str().unwrap_or_default()));
        custom.retain(|c| allowed.contains(&c.name.as_str()));
        choice = choice.get("mode").cloned().unwrap_or(json!("auto"));
    } else if let Some("function") = choice.get("type").and_then(Value::as_str) {
        let name = choice.get("name").cloned().unwrap_or(Value::Null);
        choice = json!({"type": "function", "function": {"name": name}});
    }
    let format = obj
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null());
    let response_format = match format.and_then(|f| f.get("type")).and_then(Value::as_str) {
        None | Some("text") => None,
        Some("json_object") => Some(json!({"type": "json_object"})),
        Some("json_schema") => {
            let schema = format
                .and_then(|f| f.get("schema"))
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    bad(
                        "text.format json_schema needs a schema object",
                        "text.format.schema",
                    )
                })?;
            Some(json!({"type": "json_schema", "json_schema": {"schema": schema}}))
        }
        Some(_) => {
            return Err(bad(
                "text.format.type: text, json_object or json_schema",
                "text.format.type",
            ))
        }
    };
    let number = |k: &str| -> Result<Option<f32>, ApiError> {
        match obj.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(|f| Some(f as f32))
                .ok_or_else(|| bad(format!("{k} must be a number"), k)),
        }
    };
    let max_tokens = match obj.get("max_output_tokens") {
        None | Some(Value::Null) => None,
        Some(n) => Some(
            n.as_u64()
                .filter(|&n| n >= 1)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    bad(
                        "max_output_tokens must be a whole number ≥ 1",
                        "max_output_tokens",
                    )
                })?,
        ),
    };
    let sampling = Sampling {
        model: obj.get("model").and_then(Value::as_str).map(str::to_string),
        max_tokens,
        temperature: number("temperature")?,
        top_p: number("top_p")?,
        stream: obj.get("stream").and_then(Value::as_bool),
        seed: obj.get("seed").and_then(Value::as_i64),
        ..Sampling::default()
    };
    let tools_given = obj.get("tools").cloned().unwrap_or(json!([]));
    if choice == json!("none") {
        custom.clear();
    }
    let mut listed = functions.clone();
    listed.extend(custom.iter().map(|c| custom_listing(c, markers)));
    Ok(Translated {
        chat: ChatRequest {
            messages,
            sampling,
            response_format,
            tools: (!functions.is_empty()).then_some(Value::Array(functions)),
            tool_choice: Some(choice),
            parallel_tool_calls: Some(
                obj.get("parallel_tool_calls")
                    .and_then(Value::as_bool)
                    .unwrap_or(true),
            ),
            logprobs: Some(logprobs),
            top_logprobs,
        },
        custom: custom_call,
        custom_tools: custom,
        prompt_tools: (!listed.is_empty()).then_some(Value::Array(listed)),
        skipped_tools,
        tools: tools_given,
        tool_choice: given_choice,
    })
}
