//! The conversation: OpenAI-shaped messages, rendered through the archive's
//! chat template ([`cqlm::serve::chat::ChatTemplate`], the server's renderer)
//! and tokenized, kept within the context by dropping the oldest turns.

use anyhow::{anyhow, Result};
use cqlm::serve::chat::ChatTemplate;
use cqlm::serve::wire::Message;
use cqlm::session::tokenizer::TextTokenizer;
use serde_json::{json, Value};

/// The messages so far (the system prompt apart: it never falls out).
#[derive(Debug, Default, Clone)]
pub struct Conversation {
    /// The system prompt, if any.
    pub system: Option<String>,
    /// Every other message, oldest first, as OpenAI chat messages.
    messages: Vec<Value>,
    /// Tool calls made so far (their ids are `call_1`, `call_2`, …).
    calls: usize,
}

impl Conversation {
    /// An empty conversation under `system`.
    pub fn new(system: Option<String>) -> Conversation {
        Conversation {
            system,
            ..Conversation::default()
        }
    }

    /// Forget every message but the system prompt.
    pub fn clear(&mut self) {
        self.messages.clear();
        self.calls = 0;
    }

    /// Append the user's `text`.
    pub fn push_user(&mut self, text: &str) {
        self.messages.push(json!({"role": "user", "content": text}));
    }

    /// Append the assistant's answer `text`.
    pub fn push_assistant(&mut self, text: &str) {
        self.messages
            .push(json!({"role": "assistant", "content": text}));
    }

    /// Append an assistant turn calling `calls` (name, arguments as JSON text)
    /// after `text` (often empty); returns the calls' ids, in order.
    pub fn push_calls(&mut self, text: &str, calls: &[(String, String)]) -> Vec<String> {
        let mut ids = Vec::new();
        let list: Vec<Value> = calls
            .iter()
            .map(|(name, arguments)| {
                self.calls += 1;
                let id = format!("call_{}", self.calls);
                ids.push(id.clone());
                json!({"id": id, "type": "function",
                       "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        let content = if text.is_empty() {
            Value::Null
        } else {
            Value::String(text.into())
        };
        self.messages
            .push(json!({"role": "assistant", "content": content, "tool_calls": list}));
        ids
    }

    /// Append the result of the call `id`.
    pub fn push_tool_result(&mut self, id: &str, content: &str) {
        self.messages
            .push(json!({"role": "tool", "tool_call_id": id, "content": content}));
    }

    /// Turns: user messages, each with the messages after it up to the next.
    pub fn turns(&self) -> usize {
        self.messages.iter().filter(|m| is_user(m)).count()
    }

    /// Drop the oldest turn (everything before the second user message);
    /// false, dropping nothing, when there is at most one turn.
    pub fn drop_oldest_turn(&mut self) -> bool {
        let Some(second) = self
            .messages
            .iter()
            .enumerate()
            .filter(|(_, m)| is_user(m))
            .nth(1)
            .map(|(i, _)| i)
        else {
            return false;
        };
        self.messages.drain(..second);
        true
    }

    /// Every message, the system prompt first: what `/save` writes.
    pub fn messages(&self) -> Vec<Value> {
        let mut all = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = &self.system {
            all.push(json!({"role": "system", "content": s}));
        }
        all.extend(self.messages.iter().cloned());
        all
    }
}

fn is_user(m: &Value) -> bool {
    m.get("role").and_then(Value::as_str) == Some("user")
}

/// The chat template and the tokenizer: conversation in, prompt ids out.
pub struct Renderer {
    template: ChatTemplate,
    tok: TextTokenizer,
}

impl std::fmt::Debug for Renderer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renderer").finish_non_exhaustive()
    }
}

/// A prompt fitted to the context ([`Renderer::fit`]).
#[derive(Debug)]
pub struct Fitted {
    /// The prompt's ids.
    pub ids: Vec<u32>,
    /// Turns dropped to make it fit.
    pub dropped: usize,
}

impl Renderer {
    /// The model's template (the archive's, else the server's fallback) with
    /// its BOS/EOS texts and tool-call markers, over `tok`.
    ///
    /// # Errors
    /// A template that does not compile.
    pub fn new(model: &cqlm::Model, tok: TextTokenizer) -> Result<Renderer> {
        let bos = tok.decode_special(model.config.bos);
        let eos = tok.decode_special(model.config.eos);
        let template = ChatTemplate::new(model.chat_template.as_deref(), &bos, &eos)
            .map_err(|e| anyhow!(e))?
            .with_markers(model.tool_markers.clone());
        Ok(Renderer { template, tok })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tok
    }

    /// The prompt text of `conv` offering `tools` (an OpenAI array), ending
    /// with the assistant's turn.
    ///
    /// # Errors
    /// A message the template cannot take.
    pub fn text(&self, conv: &Conversation, tools: Option<&Value>) -> Result<String> {
        let messages: Vec<Message> = conv
            .messages()
            .into_iter()
            .map(serde_json::from_value)
            .collect::<std::result::Result<_, _>>()?;
        self.template
            .render(&messages, tools)
            .map_err(|e| anyhow!(e.message))
    }

    /// The prompt ids of `conv` offering `tools`.
    ///
    /// # Errors
    /// As [`Renderer::text`]; text that does not tokenize.
    pub fn ids(&self, conv: &Conversation, tools: Option<&Value>) -> Result<Vec<u32>> {
        Ok(self.tok.encode(&self.text(conv, tools)?)?)
    }

    /// The prompt ids of `conv`, dropping its oldest turns (never the system
    /// prompt nor the last turn) while the prompt and `room` answer tokens
    /// would exceed `ctx` tokens.
    ///
    /// # Errors
    /// As [`Renderer::ids`].
    pub fn fit(
        &self,
        conv: &mut Conversation,
        tools: Option<&Value>,
        ctx: usize,
        room: usize,
    ) -> Result<Fitted> {
        let mut dropped = 0;
        loop {
            let ids = self.ids(conv, tools)?;
            if ids.len() + room <= ctx || !conv.drop_oldest_turn() {
                return Ok(Fitted { ids, dropped });
            }
            dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_keeps_the_last_turn_and_the_system_prompt() {
        let mut c = Conversation::new(Some("be brief".into()));
        c.push_user("a");
        c.push_assistant("b");
        c.push_user("c");
        let ids = c.push_calls("", &[("calculate".into(), "{}".into())]);
        assert_eq!(ids, ["call_1"]);
        c.push_tool_result("call_1", "{}");
        assert_eq!(c.turns(), 2);
        assert!(c.drop_oldest_turn());
        let m = c.messages();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0]["role"], "system");
        assert_eq!(m[1]["content"], "c");
        assert!(!c.drop_oldest_turn());
    }
}
