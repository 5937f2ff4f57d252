//! Anthropic's Messages API: `POST /v1/messages` (whole or as named
//! server-sent events) and `POST /v1/messages/count_tokens`, over the chat
//! path (`wire.rs` reads a request into a [`crate::serve::wire::ChatRequest`]),
//! with Anthropic's response, stream and error shapes. The key may come as
//! `x-api-key` or as `Authorization: Bearer`; `anthropic-version` is accepted.

mod wire;

use super::error::{ApiError, Refusal};
use super::job::Event;
use super::metrics::Tracked;
use super::request::{parse_json, Prepared};
use super::respond::{engine_failed, whole, Whole};
use super::AppState;
use crate::session::Output;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A failed request in Anthropic's shape: `{"type": "error", "error": {"type",
/// "message"}}`, with Anthropic's status for a full server (529, overloaded).
pub(super) struct AnthropicError(pub(super) ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl AnthropicError {
    /// The status and the error `type`.
    fn kind(&self) -> (StatusCode, &'static str) {
        let s = self.0.status;
        match s {
            StatusCode::UNAUTHORIZED => (s, "authentication_error"),
            StatusCode::FORBIDDEN => (s, "permission_error"),
            StatusCode::NOT_FOUND => (s, "not_found_error"),
            StatusCode::PAYLOAD_TOO_LARGE => (s, "request_too_large"),
            StatusCode::TOO_MANY_REQUESTS => (s, "rate_limit_error"),
            StatusCode::SERVICE_UNAVAILABLE => {
                (StatusCode::from_u16(529).unwrap_or(s), "overloaded_error")
            }
            s if s.is_server_error() => (s, "api_error"),
            s => (s, "invalid_request_error"),
        }
    }

    /// The body.
    fn body(&self) -> Value {
        let message = match &self.0.param {
            Some(p) if !self.0.message.contains(p.as_str()) => {
                format!("{}: {}", p, self.0.message)
            }
            _ => self.0.message.clone(),
        };
        json!({"type": "error", "error": {"type": self.kind().1, "message": message}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut r = (self.kind().0, Json(self.body())).into_response();
        r.extensions_mut().insert(Refusal(self.0.message.clone()));
        r
    }
}

/// The request read and checked, its prompt tokenized and queued (not for
/// `count`: then only its prompt's length).
fn read(
    st: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    count: bool,
    rec: &Tracked,
) -> Result<(Option<Prepared>, usize), ApiError> {
    st.check_key(headers)?;
    let v = parse_json(body)?;
    let t = wire::translate(&v, count)?;
    if !t.skipped_tools.is_empty() {
        log::info!(
            "messages: tools of types {} left out (the engine cannot run them)",
            t.skipped_tools.join(", ")
        );
    }
    if count {
        st.check_model(&t.chat.sampling)?;
        return Ok((None, st.chat_prompt(&t.chat)?.len()));
    }
    let p = st.queue_chat(&t.chat, rec)?;
    let n = p.prompt_tokens;
    Ok((Some(p), n))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}`, the prompt
/// tokens the same body would prefill on `/v1/messages`.
pub(super) async fn count_tokens(
    State(st): State<Arc<AppState>>,
    Extension(rec): Extension<Tracked>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, AnthropicError> {
    let (_, n) = read(&st, &headers, body, true, &rec)?;
    rec.with(|r| r.prompt_tokens = n);
    Ok(Json(json!({"input_tokens": n})))
}

/// Anthropic's `stop_reason` and `stop_sequence` of an output.
fn stop_reason(out: &Output) -> (&'static str, Option<String>) {
    use crate::session::Finish;
    if !out.tool_calls.is_empty() {
        return ("tool_use", None);
    }
    match out.finish {
        Finish::Length | Finish::Cancelled => ("max_tokens", None),
        Finish::StopString => ("stop_sequence", out.stop_string.clone()),
        Finish::Eos | Finish::Complete => ("end_turn", None),
    }
}

/// The content blocks of an output: its tool calls as `tool_use` blocks, or
/// its text.
fn blocks(out: &Output, id: &str) -> Vec<Value> {
    if out.tool_calls.is_empty() {
        return vec![json!({"type": "text", "text": out.text})];
    }
    out.tool_calls
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"type": "tool_use", "id": format!("toolu_{id}_{i}"), "name": c.name, "input": c.arguments}))
        .collect()
}

/// Note the end of a request in its record.
fn done(rec: &Tracked, out: &Output) {
    let (reason, _) = stop_reason(out);
    rec.with(|r| {
        r.completion_tokens = out.tokens;
        r.outcome = Some(reason);
    });
}

/// Anthropic's `usage`: `input_tokens` are the prompt tokens prefilled, and
/// `cache_read_input_tokens` those a kept state covered (their sum is the
/// prompt, `count_tokens`' figure), as Anthropic's own API counts them.
fn usage(input: usize, cached: usize, output: usize) -> Value {
    json!({"input_tokens": input - cached, "output_tokens": output,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached})
}

/// `POST /v1/messages`: the message, or its events when `stream` is true.
pub(super) async fn messages(
    State(st): State<Arc<AppState>>,
    Extension(rec): Extension<Tracked>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let (Some(mut p), input) = read(&st, &headers, body, false, &rec)? else {
        unreachable!("a messages request is queued");
    };
    let id = st.next_id("msg");
    let tag = id.clone();
    rec.with(|r| {
        r.id = Some(id.clone());
        r.prompt_tokens = input;
    });
    let model = st.opts.model_id.clone();
    let message = move |content: Vec<Value>,
                        stop: (Option<&str>, Option<String>),
                        cached: usize,
                        out: usize| {
        json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop.0, "stop_sequence": stop.1, "usage": usage(input, cached, out)})
    };
    let mut cached = 0;
    if !p.stream {
        let Whole { out, cached, .. } = whole(&mut p.events, &rec).await?;
        done(&rec, &out);
        let (reason, seq) = stop_reason(&out);
        let body = message(blocks(&out, &tag), (Some(reason), seq), cached, out.tokens);
        return Ok(Json(body).into_response());
    }
    let (tx, rx) = mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        rec.with(|r| r.outcome = Some("disconnected"));
        let send = |name: &'static str, v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(SseEvent::default().event(name).data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        // The first event says how much of the prompt the cache covered.
        let mut first = match p.events.recv().await {
            Some(Event::Started { cached_tokens }) => {
                cached = cached_tokens;
                rec.with(|r| r.cached_tokens = cached);
                None
            }
            other => Some(other),
        };
        let start = message(Vec::new(), (None, None), cached, 0);
        if !send(
            "message_start",
            json!({"type": "message_start", "message": start}),
        )
        .await
        {
            return;
        }
        // Text streams in block 0 as it comes; held-back output (tool calls,
        // or the text of a tool request that called none) comes at the end.
        let block_start = |i: usize, b: Value| json!({"type": "content_block_start", "index": i, "content_block": b});
        let delta =
            |i: usize, d: Value| json!({"type": "content_block_delta", "index": i, "delta": d});
        let stop = |i: usize| json!({"type": "content_block_stop", "index": i});
        if p.stream_text
            && !(send(
                "content_block_start",
                block_start(0, json!({"type": "text", "text": ""})),
            )
            .await
                && send("ping", json!({"type": "ping"})).await)
        {
            return;
        }
        let out = loop {
            let event = match first.take() {
                Some(e) => e,
                None => p.events.recv().await,
            };
            match event {
                // The Messages API has no logprobs: none are asked for.
                Some(Event::Started { .. } | Event::Logprobs(_)) => {}
                Some(Event::Text(t)) => {
                    if !send(
                        "content_block_delta",
                        delta(0, json!({"type": "text_delta", "text": t})),
                    )
                    .await
                    {
                        return;
                    }
                }
                Some(Event::Done(out)) => break out,
                Some(Event::Failed(e)) => {
                    rec.with(|r| r.outcome = Some("failed"));
                    let _ = send("error", AnthropicError(engine_failed(&e)).body()).await;
                    return;
                }
                None => return,
            }
        };
        done(&rec, &out);
        let mut events = Vec::new();
        if p.stream_text {
            events.push(("content_block_stop", stop(0)));
        } else {
            for (i, b) in blocks(&out, &tag).into_iter().enumerate() {
                let (start, d) = if b["type"] == "tool_use" {
                    let args = b["input"].to_string();
                    let mut s = b.clone();
                    s["input"] = json!({});
                    (s, json!({"type": "input_json_delta", "partial_json": args}))
                } else {
                    let text = b["text"].clone();
                    (
                        json!({"type": "text", "text": ""}),
                        json!({"type": "text_delta", "text": text}),
                    )
                };
                events.push(("content_block_start", block_start(i, start)));
                events.push(("content_block_delta", delta(i, d)));
                events.push(("content_block_stop", stop(i)));
            }
        }
        let (reason, seq) = stop_reason(&out);
        events.push((
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                "usage": {"output_tokens": out.tokens}}),
        ));
        events.push(("message_stop", json!({"type": "message_stop"})));
        for (name, v) in events {
            if !send(name, v).await {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
