//! llama-server's introspection routes: `POST /tokenize` (`content`,
//! `add_special`, `with_pieces`), `POST /detokenize` (`tokens`),
//! `POST /apply-template` (`messages`, `tools`) and `GET /props`
//! (the model, context size, slots, chat template and default sampling
//! settings). Behind the API key when one is set; errors in the OpenAI shape.

use super::error::ApiError;
use super::request::{parse_json, typed};
use super::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// `POST /tokenize`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    /// BOS (and the post-processor's special tokens) as a prompt gets them.
    #[serde(default)]
    add_special: bool,
    /// Each id with its piece: a string, or its bytes when they are not UTF-8
    /// on their own (part of a character).
    #[serde(default)]
    with_pieces: bool,
}

/// `POST /detokenize`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// `POST /apply-template`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApplyTemplateRequest {
    messages: Vec<super::wire::Message>,
    #[serde(default)]
    tools: Option<Value>,
}

/// `POST /apply-template`: `{"prompt": text}`, the chat template's rendering of
/// `messages` (and `tools`) up to the assistant's turn: the text whose
/// `/tokenize` with `add_special` is what `/v1/chat/completions` prefills for
/// the same messages and tools.
pub(super) async fn apply_template(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let r: ApplyTemplateRequest = typed(&parse_json(body)?)?;
    let prompt = st.template.render(&r.messages, r.tools.as_ref())?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// `POST /tokenize`: `{"tokens": [id, ...]}`, or with pieces `{"tokens": [{"id",
/// "piece"}, ...]}`. With `add_special` the ids are exactly what
/// `/v1/completions` prefills for the same text (its `usage.prompt_tokens`).
pub(super) async fn tokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let r: TokenizeRequest = typed(&parse_json(body)?)?;
    let ids = if r.add_special {
        st.tok.encode(&r.content)
    } else {
        st.tok.encode_plain(&r.content)
    }
    .map_err(|e| ApiError::bad(e.to_string(), Some("content")))?;
    if !r.with_pieces {
        return Ok(Json(json!({"tokens": ids})));
    }
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = st.tok.piece(id).unwrap_or_default();
            let piece = match String::from_utf8(bytes) {
                Ok(s) => json!(s),
                Err(e) => json!(e.into_bytes()),
            };
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(Json(json!({"tokens": tokens})))
}

/// `POST /detokenize`: `{"content": text}` (special tokens skipped, as a
/// generation's text).
pub(super) async fn detokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let r: DetokenizeRequest = typed(&parse_json(body)?)?;
    if let Some((i, t)) = r
        .tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= st.vocab)
    {
        return Err(ApiError::bad(
            format!(
                "tokens[{i}] = {t} is not < the vocabulary size {}",
                st.vocab
            ),
            Some("tokens"),
        ));
    }
    let content = st
        .tok
        .decode(&r.tokens)
        .map_err(|e| ApiError::bad(e.to_string(), Some("tokens")))?;
    Ok(Json(json!({"content": content})))
}

/// `GET /props`: what this server runs and how a request is answered when it
/// names no settings.
pub(super) async fn props(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let o = &st.opts;
    Ok(Json(json!({
        "model": o.model_id,
        "backend": st.backend,
        "n_ctx": o.ctx_tokens,
        "total_slots": st.queue.slots(),
        "vocab_size": st.vocab,
        "max_tokens_cap": o.max_tokens_cap,
        "chat_template": st.template.source(),
        "bos_token": st.template.bos(),
        "eos_token": st.template.eos(),
        "default_generation_settings": {
            "max_tokens": o.default_max_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "repeat_last_n": crate::session::sample::SamplerConfig::default().repeat_last_n,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "seed": -1,
        },
    })))
}
