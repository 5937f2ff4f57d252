//! Chat prompts: the archive's Jinja chat template (`cqlm.chat_template`, the
//! Hugging Face convention) rendered with minijinja, or the plain-text fallback
//! [`FALLBACK_TEMPLATE`].

use super::error::ApiError;
use super::wire::{Content, Message};
use crate::constrain::ToolMarkers;
use serde_json::{json, Value};

/// The template used when the archive has none: each message as `role: content`
/// on its own line (an assistant's tool calls as `<tool_call>{...}</tool_call>`,
/// or between the archive's markers), after a system line listing the tools when
/// there are any, then `assistant:`.
pub const FALLBACK_TEMPLATE: &str = r#"{%- if tools -%}
system: You can call these tools. To call one, answer with {{ tool_call_start }}{"name": <name>, "arguments": <object>}{{ tool_call_end }}.
{% for t in tools %}- {{ t.function.name }}: {{ t.function.description }} Parameters: {{ t.function.parameters | tojson }}
{% endfor -%}
{%- endif -%}
{%- for m in messages -%}
{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls %}{{ tool_call_start }}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}{{ tool_call_end }}{% endfor %}
{% endfor -%}
{%- if add_generation_prompt %}assistant:{% endif -%}"#;

/// A compiled chat template.
///
/// Besides the Hugging Face variables it gets `tool_call_start` and
/// `tool_call_end`, the markers of a call in `auto` tool mode.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    bos: String,
    eos: String,
    markers: ToolMarkers,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// The text of a message's content.
fn text_of(m: &Message, i: usize) -> Result<String, ApiError> {
    Ok(match &m.content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                if p.kind != "text" {
                    return Err(ApiError::bad(
                        format!(
                            "content parts of type `{}` are not supported (text only)",
                            p.kind
                        ),
                        Some(&format!("messages[{i}].content[{j}].type")),
                    ));
                }
                s.push_str(p.text.as_deref().unwrap_or(""));
            }
            s
        }
    })
}

impl ChatTemplate {
    /// `source` (or the fallback), with the tokenizer's BOS and EOS texts.
    ///
    /// # Errors
    /// A message naming the template error.
    pub fn new(source: Option<&str>, bos: &str, eos: &str) -> Result<ChatTemplate, String> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        let src = source.unwrap_or(FALLBACK_TEMPLATE).to_string();
        env.add_template_owned("chat", src.clone())
            .map_err(|e| format!("chat template: {e}"))?;
        Ok(ChatTemplate {
            env,
            source: src,
            bos: bos.to_string(),
            eos: eos.to_string(),
            markers: ToolMarkers::default(),
        })
    }

    /// The template's Jinja source (the archive's, or [`FALLBACK_TEMPLATE`]).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The BOS text it renders as `bos_token`.
    pub fn bos(&self) -> &str {
        &self.bos
    }

    /// The EOS text it renders as `eos_token`.
    pub fn eos(&self) -> &str {
        &self.eos
    }

    /// The same template with other tool-call markers (`tool_call_start`,
    /// `tool_call_end`).
    pub fn with_markers(mut self, markers: ToolMarkers) -> ChatTemplate {
        self.markers = markers;
        self
    }

    /// The prompt text of `messages` (and `tools`, an OpenAI array), ending with
    /// the assistant's turn.
    ///
    /// # Errors
    /// 400 for a message the template cannot take (an unknown role, a
    /// non-text part, a template `raise_exception`).
    pub fn render(&self, messages: &[Message], tools: Option<&Value>) -> Result<String, ApiError> {
        let mut list = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if !matches!(
                m.role.as_str(),
                "system" | "developer" | "user" | "assistant" | "tool"
            ) {
                return Err(ApiError::bad(
                    format!("unknown role `{}`", m.role),
                    Some(&format!("messages[{i}].role")),
                ));
            }
            list.push(json!({
                "role": m.role,
                "content": text_of(m, i)?,
                "tool_calls": m.tool_calls.clone().unwrap_or_default(),
                "tool_call_id": m.tool_call_id,
                "name": m.name,
            }));
        }
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| ApiError::bad(format!("chat template: {e}"), None))?;
        t.render(minijinja::context! {
            messages => list,
            tools => tools.cloned(),
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
            tool_call_start => self.markers.start,
            tool_call_end => self.markers.end,
        })
        .map_err(|e| ApiError::bad(format!("chat template: {e}"), Some("messages")))
    }
}
