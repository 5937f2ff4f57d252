//! Answering a request: the whole response, or its server-sent events, built
//! from the batch loop's events in the OpenAI wire format.

use super::error::ApiError;
use super::job::Event;
use super::logprobs;
use super::metrics::Tracked;
use super::request::Prepared;
use super::wire::{PromptTokensDetails, Usage};
use super::{now, AppState};
use crate::session::logprobs::TokenLogprob;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Which endpoint answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`, whose prompt's text has `prompt_chars` characters
    /// (where its logprobs' `text_offset` starts).
    Completion {
        /// Characters of the prompt's text.
        prompt_chars: usize,
    },
}

/// The calls as OpenAI's `tool_calls` array (ids from the response's `id`).
fn tool_calls_json(calls: &[crate::constrain::ToolCall], id: &str) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "index": i,
                "id": format!("call_{id}_{i}"),
                "type": "function",
                "function": {"name": c.name, "arguments": serde_json::to_string(&c.arguments).unwrap_or_default()}
            })
        })
        .collect()
}

/// The 500 of a request the engine failed on.
pub(super) fn engine_failed(e: &str) -> ApiError {
    ApiError::status(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the engine failed on this request: {e}"),
        "engine_error",
    )
}

/// A request answered whole.
pub(super) struct Whole {
    /// What it generated.
    pub(super) out: crate::session::Output,
    /// Prompt tokens the prompt cache covered.
    pub(super) cached: usize,
    /// Each token's logprob, when the request asked for them.
    pub(super) logprobs: Vec<TokenLogprob>,
}

/// Wait for a request answered whole: its output, logprobs and the prompt
/// tokens the prompt cache covered (noted in `rec`, the failure too), or the
/// 500 of a request the engine failed on or dropped.
pub(super) async fn whole(
    events: &mut mpsc::UnboundedReceiver<Event>,
    rec: &Tracked,
) -> Result<Whole, ApiError> {
    let mut cached = 0;
    let mut logprobs = Vec::new();
    loop {
        match events.recv().await {
            Some(Event::Started { cached_tokens }) => {
                cached = cached_tokens;
                rec.with(|r| r.cached_tokens = cached);
            }
            Some(Event::Logprobs(l)) => logprobs.extend(l),
            Some(Event::Text(_)) => {}
            Some(Event::Done(out)) => {
                return Ok(Whole {
                    out,
                    cached,
                    logprobs,
                })
            }
            Some(Event::Failed(e)) => {
                rec.with(|r| r.outcome = Some("failed"));
                return Err(engine_failed(&e));
            }
            None => return Err(engine_failed("the request was dropped")),
        }
    }
}

/// Answer the queued request `p` from its events: one JSON body, or a stream
/// of server-sent events when it asked for one.
pub(super) async fn respond(
    st: Arc<AppState>,
    p: Prepared,
    kind: Kind,
    rec: Tracked,
) -> Result<Response, ApiError> {
    let Prepared {
        mut events,
        prompt_tokens,
        stream,
        include_usage,
        stream_text: streamed_text,
        logprobs: wants_logprobs,
    } = p;
    let (prefix, object, chunk_object) = match kind {
        Kind::Chat => ("chatcmpl", "chat.completion", "chat.completion.chunk"),
        Kind::Completion { .. } => ("cmpl", "text_completion", "text_completion"),
    };
    // The `logprobs` of a choice (null unless asked for); a completion's
    // offsets go on from `*at` characters.
    let tok = Arc::clone(&st.tok);
    let logprobs_json = move |lps: &[TokenLogprob], at: &mut usize| -> Value {
        if !wants_logprobs {
            return Value::Null;
        }
        match kind {
            Kind::Chat => logprobs::chat(&tok, lps),
            Kind::Completion { .. } => logprobs::completion(&tok, lps, at),
        }
    };
    let mut offset = match kind {
        Kind::Chat => 0,
        Kind::Completion { prompt_chars } => prompt_chars,
    };
    let id = st.next_id(prefix);
    rec.with(|r| {
        r.id = Some(id.clone());
        r.prompt_tokens = prompt_tokens;
    });
    let created = now();
    let model = st.opts.model_id.clone();
    let usage = move |n: usize, cached_tokens: usize| Usage {
        prompt_tokens,
        completion_tokens: n,
        total_tokens: prompt_tokens + n,
        prompt_tokens_details: PromptTokensDetails { cached_tokens },
    };
    let mut cached = 0;
    if !stream {
        let Whole {
            out,
            cached,
            logprobs: lps,
        } = whole(&mut events, &rec).await?;
        let (reason, completion_tokens) = (out.finish_reason(), out.tokens);
        let (text, tool_calls) = (out.text, out.tool_calls);
        let lp = logprobs_json(&lps, &mut offset);
        let choice = match kind {
            Kind::Chat => {
                let calls = tool_calls_json(&tool_calls, &id);
                let mut message = json!({"role": "assistant", "content": if calls.is_empty() { Value::String(text) } else { Value::Null }});
                if !calls.is_empty() {
                    message["tool_calls"] = Value::Array(calls);
                }
                json!({"index": 0, "message": message, "finish_reason": reason, "logprobs": lp})
            }
            Kind::Completion { .. } => {
                json!({"index": 0, "text": text, "finish_reason": reason, "logprobs": lp})
            }
        };
        let body = json!({"id": id, "object": object, "created": created, "model": model,
            "choices": [choice], "usage": usage(completion_tokens, cached)});
        rec.with(|r| {
            r.completion_tokens = completion_tokens;
            r.outcome = Some(reason);
        });
        return Ok(Json(body).into_response());
    }
    // Streamed: a forwarder turns the batch loop's events into SSE events; a client
    // that hangs up drops the stream, so the forwarder and then the job stop.
    let (tx, rx) = mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        // Until the stream ends, its record says the client left.
        rec.with(|r| r.outcome = Some("disconnected"));
        let chunk = |choice: Value| json!({"id": id, "object": chunk_object, "created": created, "model": model, "choices": [choice]});
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(SseEvent::default().data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        if kind == Kind::Chat && !send(chunk(json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}))).await {
            return;
        }
        // Logprobs wait for the text their tokens add (a stop string's or a
        // partial character's are held back with it).
        let mut pending: Vec<TokenLogprob> = Vec::new();
        loop {
            let ok = match events.recv().await {
                Some(Event::Started { cached_tokens }) => {
                    cached = cached_tokens;
                    rec.with(|r| r.cached_tokens = cached);
                    true
                }
                Some(Event::Logprobs(l)) => {
                    pending.extend(l);
                    true
                }
                Some(Event::Text(t)) => {
                    let lp = logprobs_json(&std::mem::take(&mut pending), &mut offset);
                    match kind {
                        Kind::Chat => {
                            send(chunk(
                                json!({"index": 0, "delta": {"content": t}, "finish_reason": null, "logprobs": lp}),
                            ))
                            .await
                        }
                        Kind::Completion { .. } => send(chunk(
                            json!({"index": 0, "text": t, "finish_reason": null, "logprobs": lp}),
                        ))
                        .await,
                    }
                }
                Some(Event::Done(out)) => {
                    let (reason, completion_tokens) = (out.finish_reason(), out.tokens);
                    let (text, tool_calls) = (out.text, out.tool_calls);
                    rec.with(|r| {
                        r.completion_tokens = completion_tokens;
                        r.outcome = Some(reason);
                    });
                    if kind == Kind::Chat {
                        // Held-back output: the calls, or (auto, no call) the text.
                        let calls = tool_calls_json(&tool_calls, &id);
                        let delta = if !calls.is_empty() {
                            Some(json!({"tool_calls": calls}))
                        } else if !streamed_text && !text.is_empty() {
                            Some(json!({"content": text}))
                        } else {
                            None
                        };
                        if let Some(delta) = delta {
                            let c =
                                chunk(json!({"index": 0, "delta": delta, "finish_reason": null}));
                            if !send(c).await {
                                return;
                            }
                        }
                    }
                    // The logprobs of tokens whose text never came (held back).
                    let lp = if pending.is_empty() {
                        Value::Null
                    } else {
                        logprobs_json(&std::mem::take(&mut pending), &mut offset)
                    };
                    let last = match kind {
                        Kind::Chat => {
                            json!({"index": 0, "delta": {}, "finish_reason": reason, "logprobs": lp})
                        }
                        Kind::Completion { .. } => {
                            json!({"index": 0, "text": "", "finish_reason": reason, "logprobs": lp})
                        }
                    };
                    if !send(chunk(last)).await {
                        return;
                    }
                    if include_usage {
                        let mut u = chunk(json!(null));
                        u["choices"] = json!([]);
                        u["usage"] = serde_json::to_value(usage(completion_tokens, cached))
                            .unwrap_or_default();
                        if !send(u).await {
                            return;
                        }
                    }
                    let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
                Some(Event::Failed(e)) => {
                    rec.with(|r| r.outcome = Some("failed"));
                    let err = engine_failed(&e);
                    let _ = send(serde_json::to_value(err.body()).unwrap_or_default()).await;
                    return;
                }
                None => return,
            };
            if !ok {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
