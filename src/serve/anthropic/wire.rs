//! Anthropic's Messages API as the `anthropic` client and Claude Code send it,
//! read into the chat path's own request ([`ChatRequest`]): `system` becomes a
//! system message, a user turn's `tool_result` blocks become `tool` messages
//! and its text a user message, an assistant turn's `tool_use` blocks become
//! its tool calls; `tools` (`input_schema`) and `tool_choice` (auto, any, tool,
//! none; `disable_parallel_tool_use`) become their OpenAI forms. So one
//! template, one tokenization and one constraint serve both APIs, and
//! `count_tokens` counts exactly what `messages` would prefill.

use crate::serve::error::ApiError;
use crate::serve::wire::{ChatRequest, Content, Message, Sampling, StopSpec};
use serde_json::{json, Map, Value};

/// The top-level fields a Messages request may carry. Some are accepted and
/// change nothing: `metadata`, `service_tier`, `speed`, `inference_geo`,
/// `user_profile_id`, `workspace_id` (hints about billing and routing),
/// `cache_control` (the prompt cache is automatic), `thinking`,
/// `output_config.effort` and `context_management` (the model has no thinking;
/// the answer has no thinking blocks to clear). Any other field is a 400
/// naming it, so nothing a client asks for is silently dropped.
const KNOWN: [&str; 21] = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "tools",
    "tool_choice",
    "output_config",
    "thinking",
    "metadata",
    "service_tier",
    "speed",
    "inference_geo",
    "user_profile_id",
    "workspace_id",
    "cache_control",
    "context_management",
];

/// A Messages request read into the chat path's form.
pub(crate) struct Translated {
    /// The chat request (messages, sampling, tools, tool choice).
    pub(crate) chat: ChatRequest,
    /// Tools of a type the engine cannot run (`web_search_…`, `bash_…`, …), left
    /// out of the prompt: their types, for the request log.
    pub(crate) skipped_tools: Vec<String>,
}

fn bad(msg: impl Into<String>, at: &str) -> ApiError {
    ApiError::bad(msg, Some(at))
}

/// The text of a `system` field: a string or a list of `text` blocks.
fn text_blocks(v: &Value, at: &str) -> Result<String, ApiError> {
    blocks_text(v, at, false)
}

/// The text of a `tool_result`'s content as the model reads it: a string or a
/// list of blocks, where besides `text` an agent's tools return
/// `tool_reference` blocks (a deferred tool the result loads, read as
/// `Tool loaded: NAME`; see [`referenced_tools`]) and `image` or `document`
/// blocks, which a text model cannot read (a line saying so stands in for
/// each, so that the agent's turn goes on instead of failing).
fn result_blocks(v: &Value, at: &str) -> Result<String, ApiError> {
    blocks_text(v, at, true)
}

fn blocks_text(v: &Value, at: &str, tool_result: bool) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            // Text blocks run on as one text; a stand-in is a line of its own.
            let mut s = String::new();
            let mut last_was_text = None;
            for (i, b) in blocks.iter().enumerate() {
                let field = |k: &str| {
                    b.get(k).and_then(Value::as_str).ok_or_else(|| {
                        bad(
                            format!("{at}[{i}].{k} must be a string"),
                            &format!("{at}[{i}].{k}"),
                        )
                    })
                };
                let (part, is_text) = match b.get("type").and_then(Value::as_str) {
                    Some("text") => (field("text")?.to_string(), true),
                    Some("tool_reference") if tool_result => {
                        (format!("Tool loaded: {}", field("tool_name")?), false)
                    }
                    Some(kind @ ("image" | "document")) if tool_result => (
                        format!("[{kind} omitted: this model reads text only]"),
                        false,
                    ),
                    other => {
                        let allowed = if tool_result {
                            "text, tool_reference, image, document"
                        } else {
                            "text only"
                        };
                        return Err(bad(
                            format!("{at}[{i}]: blocks of type {other:?} are not supported here ({allowed})"),
                            &format!("{at}[{i}].type"),
                        ));
                    }
                };
                if last_was_text.is_some_and(|t| !(t && is_text)) {
                    s.push('\n');
                }
                s.push_str(&part);
                last_was_text = Some(is_text);
            }
            Ok(s)
        }
        Value::Null => Ok(String::new()),
        _ => Err(bad(
            format!("{at} must be a string or a list of text blocks"),
            at,
        )),
    }
}

/// The tools that `tool_reference` blocks in the conversation's tool results
/// name: deferred tools (`defer_loading: true`) the agent has loaded.
fn referenced_tools(turns: &[Value]) -> Vec<String> {
    let mut names = Vec::new();
    for m in turns {
        let Some(blocks) = m.get("content").and_then(Value::as_array) else {
            continue;
        };
        for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
            let Some(inner) = b.get("content").and_then(Value::as_array) else {
                continue;
            };
            for r in inner.iter().filter(|r| r["type"] == "tool_reference") {
                if let Some(n) = r.get("tool_name").and_then(Value::as_str) {
                    names.push(n.to_string());
                }
            }
        }
    }
    names
}

fn message(role: &str, text: String) -> Message {
    Message {
        role: role.into(),
        content: Some(Content::Text(text)),
        tool_calls: None,
        tool_call_id: None,
        name: None,
    }
}

/// One Anthropic message as the chat path's messages (a user turn with tool
/// results gives one `tool` message per result, then its text, if any; a
/// `system` turn, which Claude Code sends among the others, a system message).
fn turn(m: &Value, i: usize, out: &mut Vec<Message>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    if role == "system" {
        let content = m.get("content").unwrap_or(&Value::Null);
        out.push(message(
            "system",
            text_blocks(content, &format!("{at}.content"))?,
        ));
        return Ok(());
    }
    if role != "user" && role != "assistant" {
        return Err(bad(
            format!("{at}.role must be \"user\", \"assistant\" or \"system\""),
            &format!("{at}.role"),
        ));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        _ => {
            return Err(bad(
                format!("{at}.content must be a string or a list of blocks"),
                &format!("{at}.content"),
            ))
        }
    };
    let (mut text, mut calls) = (String::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let field = |k: &str| {
            b.get(k)
                .ok_or_else(|| bad(format!("{at}.{k} is missing"), &format!("{at}.{k}")))
        };
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(
                field("text")?
                    .as_str()
                    .ok_or_else(|| bad(format!("{at}.text must be a string"), &format!("{at}.text")))?,
            ),
            Some("tool_use") if role == "assistant" => {
                let name = field("name")?.as_str().unwrap_or_default();
                calls.push(json!({
                    "id": field("id")?,
                    "type": "function",
                    "function": {"name": name, "arguments": field("input")?.to_string()},
                }));
            }
            Some("tool_result") if role == "user" => {
                let content = b.get("content").unwrap_or(&Value::Null);
                let mut result = message("tool", result_blocks(content, &format!("{at}.content"))?);
                result.tool_call_id = field("tool_use_id")?.as_str().map(str::to_string);
                out.push(result);
            }
            // Thinking blocks come back only from a model that thinks: none here.
            Some("thinking" | "redacted_thinking") => {}
            other => {
                return Err(bad(
                    format!("{at}: a {role} block of type {other:?} is not supported (text, tool_use in assistant turns, tool_result in user turns)"),
                    &format!("{at}.type"),
                ))
            }
        }
    }
    if role == "assistant" {
        let mut a = message("assistant", text);
        a.tool_calls = (!calls.is_empty()).then_some(calls);
        out.push(a);
    } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
        out.push(message("user", text));
    }
    Ok(())
}

/// `tools` in their OpenAI form, and the types of those left out. A tool with
/// `defer_loading: true` (Anthropic's tool search) stays out of the prompt
/// until a `tool_reference` in a tool result (`loaded`) names it, as the
/// Messages API expands it only then.
fn tools(v: &Value, loaded: &[String]) -> Result<(Option<Value>, Vec<String>), ApiError> {
    let list = v
        .as_array()
        .ok_or_else(|| bad("tools must be a list", "tools"))?;
    let (mut kept, mut skipped) = (Vec::new(), Vec::new());
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                skipped.push(other.to_string());
                continue;
            }
        }
        let at = format!("tools[{i}]");
        let name = t
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.name must be a string"), &format!("{at}.name")))?;
        let schema = t
            .get("input_schema")
            .filter(|s| s.is_object())
            .ok_or_else(|| {
                bad(
                    format!("{at}.input_schema must be a JSON Schema object"),
                    &format!("{at}.input_schema"),
                )
            })?;
        let deferred = t.get("defer_loading").and_then(Value::as_bool) == Some(true);
        if deferred && !loaded.iter().any(|n| n == name) {
            continue;
        }
        let mut f = Map::new();
        f.insert("name".into(), name.into());
        if let Some(d) = t.get("description") {
            f.insert("description".into(), d.clone());
        }
        f.insert("parameters".into(), schema.clone());
        kept.push(json!({"type": "function", "function": f}));
    }
    Ok(((!kept.is_empty()).then(|| Value::Array(kept)), skipped))
}

/// `tool_choice` in its OpenAI form, and whether several calls may come.
fn tool_choice(v: Option<&Value>) -> Result<(Option<Value>, bool), ApiError> {
    let Some(v) = v else {
        return Ok((None, true));
    };
    let parallel = !v
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let choice = match v.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = v
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice of type tool needs a name", "tool_choice.name"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(bad(
                "tool_choice.type: auto, any, tool or none",
                "tool_choice.type",
            ))
        }
    };
    Ok((Some(choice), parallel))
}

/// `output_config`: its `format` (`{"type": "json_schema", "schema"}`) as the
/// chat path's `response_format`; `effort` accepted (no thinking to spend it on).
fn output_format(v: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(c) = v.filter(|c| !c.is_null()) else {
        return Ok(None);
    };
    let c = c
        .as_object()
        .ok_or_else(|| bad("output_config must be an object", "output_config"))?;
    if let Some(k) = c
        .keys()
        .find(|k| !["format", "effort"].contains(&k.as_str()))
    {
        let at = format!("output_config.{k}");
        return Err(bad(
            format!("`{at}`: this server does not implement this field"),
            &at,
        ));
    }
    match c.get("format").filter(|f| !f.is_null()) {
        None => Ok(None),
        Some(f) if f.get("type") == Some(&json!("json_schema")) => {
            let schema = f.get("schema").filter(|s| s.is_object()).ok_or_else(|| {
                bad(
                    "output_config.format.schema must be a JSON Schema object",
                    "output_config.format.schema",
                )
            })?;
            Ok(Some(
                json!({"type": "json_schema", "json_schema": {"schema": schema}}),
            ))
        }
        Some(_) => Err(bad(
            "output_config.format.type must be \"json_schema\"",
            "output_config.format.type",
        )),
    }
}

/// Read a Messages request body (`count`: a `count_tokens` body, which has no
/// `max_tokens`).
///
/// # Errors
/// A 400 naming the field at fault: an unknown top-level field, a missing
/// `model`, `messages` or (not `count`) `max_tokens`, a block or tool of the
/// wrong shape.
pub(crate) fn translate(v: &Value, count: bool) -> Result<Translated, ApiError> {
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::bad("the request body must be a JSON object", None))?;
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(bad(
            format!("`{k}`: this server does not implement this field"),
            k,
        ));
    }
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("model: a string is required", "model"))?;
    let max_tokens = match v.get("max_tokens") {
        None if count => None,
        Some(n) => Some(
            n.as_u64()
                .filter(|&n| n >= 1)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad("max_tokens must be a whole number ≥ 1", "max_tokens"))?,
        ),
        None => return Err(bad("max_tokens: a number is required", "max_tokens")),
    };
    let turns = v
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages: a list is required", "messages"))?;
    if turns.is_empty() {
        return Err(bad("messages must not be empty", "messages"));
    }
    let mut messages = Vec::new();
    if let Some(s) = v.get("system") {
        let s = text_blocks(s, "system")?;
        if !s.is_empty() {
            messages.push(message("system", s));
        }
    }
    for (i, m) in turns.iter().enumerate() {
        turn(m, i, &mut messages)?;
    }
    let (tools, skipped_tools) = match v.get("tools") {
        Some(t) => tools(t, &referenced_tools(turns))?,
        None => (None, Vec::new()),
    };
    let (choice, parallel) = tool_choice(v.get("tool_choice"))?;
    let response_format = output_format(v.get("output_config"))?;
    let number = |k: &str| -> Result<Option<f64>, ApiError> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(format!("{k} must be a number"), k)),
        }
    };
    let stops = match v.get("stop_sequences") {
        None | Some(Value::Null) => None,
        Some(s) => Some(
            serde_json::from_value::<Vec<String>>(s.clone())
                .map_err(|_| bad("stop_sequences must be a list of strings", "stop_sequences"))?,
        ),
    };
    let top_k = number("top_k")?
        .map(|k| {
            (k >= 0.0 && k.fract() == 0.0)
                .then_some(k as usize)
                .ok_or_else(|| bad("top_k must be a whole number ≥ 0", "top_k"))
        })
        .transpose()?;
    let sampling = Sampling {
        model: Some(model.to_string()),
        max_tokens,
        temperature: number("temperature")?.map(|t| t as f32),
        top_p: number("top_p")?.map(|t| t as f32),
        top_k,
        stop: stops.map(StopSpec::Many),
        stream: v.get("stream").and_then(Value::as_bool),
        ..Sampling::default()
    };
    Ok(Translated {
        chat: ChatRequest {
            messages,
            sampling,
            response_format,
            tools,
            tool_choice: choice,
            parallel_tool_calls: Some(parallel),
            logprobs: None,
            top_logprobs: None,
        },
        skipped_tools,
    })
}
