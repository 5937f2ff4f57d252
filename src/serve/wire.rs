//! The OpenAI wire format as the official clients send and parse it: request
//! bodies (a field the server does not implement is refused, never silently
//! dropped: [`SAMPLING_FIELDS`]), response and chunk bodies, the error shape.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl StopSpec {
    /// The strings.
    pub fn strings(&self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s.clone()],
            StopSpec::Many(v) => v.clone(),
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Add a last chunk with `usage` (and no choices).
    #[serde(default)]
    pub include_usage: bool,
}

/// A message's `content`: a string or a list of parts (`{"type": "text", "text"}`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts; the text parts are joined.
    Parts(Vec<ContentPart>),
}

/// One part of a list content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (other kinds are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// A chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (absent or null for an assistant turn that only called tools).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's tool calls (as the API returned them).
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// A tool message's call id.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A name (of the participant or the tool).
    #[serde(default)]
    pub name: Option<String>,
}

/// The fields chat and completion requests share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    /// The model id.
    #[serde(default)]
    pub model: Option<String>,
    /// Most tokens to generate.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The newer name of `max_tokens` (chat).
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Softmax temperature (default 1, as OpenAI's).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus cut.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Stop strings (not emitted).
    #[serde(default)]
    pub stop: Option<StopSpec>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Choices to generate: 1 only.
    #[serde(default)]
    pub n: Option<u32>,
    /// cqlm's own: keep the k most likely tokens.
    #[serde(default)]
    pub top_k: Option<usize>,
    /// cqlm's own: the repetition penalty.
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    /// Keep tokens at least this likely relative to the most likely one.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// OpenAI's frequency penalty (−2 to 2).
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// OpenAI's presence penalty (−2 to 2).
    #[serde(default)]
    pub presence_penalty: Option<f32>,
}

/// The fields every generating OpenAI request may carry ([`Sampling`]'s), and
/// those accepted without effect: `user`, `store` and `metadata` (nothing is
/// stored), `service_tier`, `safety_identifier`, `prompt_cache_key` (the
/// prompt cache is automatic).
pub const SAMPLING_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "top_k",
    "repeat_penalty",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "user",
    "store",
    "metadata",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
];

/// [`ChatRequest`]'s own fields.
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
];

/// [`CompletionRequest`]'s own fields.
pub const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs"];

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Sampling and output settings.
    #[serde(flatten)]
    pub sampling: Sampling,
    /// `{"type": "text" | "json_object" | "json_schema", ...}`.
    #[serde(default)]
    pub response_format: Option<Value>,
    /// OpenAI `tools`.
    #[serde(default)]
    pub tools: Option<Value>,
    /// `"auto" | "required" | "none" | {"type": "function", "function": {"name"}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Allow several calls (a JSON array).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Report each output token's log-probability.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// And this many most likely alternatives at its position (0-20).
    #[serde(default)]
    pub top_logprobs: Option<u32>,
}

/// `prompt`: a string, strings (one only), or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Texts (exactly one).
    Texts(Vec<String>),
    /// Token ids.
    Ids(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Report each output token's log-probability and this many most likely
    /// alternatives (0-5).
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// Sampling and output settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `usage`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Of the prompt tokens, those a kept state covered.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    /// Prompt tokens the prompt cache covered (not prefilled again).
    pub cached_tokens: usize,
}

/// The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Debug, Clone, Serialize)]
pub struct ErrorDetail {
    /// What went wrong.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A short code, if any.
    pub code: Option<String>,
}
