//! OpenAI's Responses API, stateless: `POST /v1/responses` over the chat path
//! (`wire.rs` reads a request into a [`crate::serve::wire::ChatRequest`]),
//! answered as a response object (`output` items: a `message`, `function_call`s
//! or a `custom_tool_call`; `usage` with cached tokens) or as its documented
//! stream of events, each with its `sequence_number`. Errors in the OpenAI shape.

mod wire;

use super::error::ApiError;
use super::job::Event;
use super::logprobs;
use super::metrics::Tracked;
use super::request::{
    compile, parse_json, prepare, tool_constraint, top_logprobs, OutputPlan, Prepared,
};
use super::respond::{engine_failed, whole, Whole};
use super::{now, AppState};
use crate::session::logprobs::{TokenLogprob, MAX_TOP_LOGPROBS};
use crate::session::tokenizer::TextTokenizer;
use crate::session::{Finish, Output};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What the output items are: text, function calls (held back until known),
/// or a named custom tool's input (streamed as it comes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Text,
    Calls,
    Custom,
}

/// The response object's fixed part, and the names of its output items.
struct Frame {
    id: String,
    head: Value,
    custom: Option<String>,
    input_tokens: usize,
    /// The tokenizer that names the tokens of the logprobs, when asked for.
    logprobs: Option<Arc<TextTokenizer>>,
}

impl Frame {
    /// The response object with `status`, `output` and (once known) usage.
    fn response(&self, status: &str, output: Vec<Value>, done: Option<(&Output, usize)>) -> Value {
        let mut r = self.head.clone();
        r["status"] = json!(status);
        r["output"] = Value::Array(output);
        if let Some((out, cached)) = done {
            let incomplete = matches!(out.finish, Finish::Length | Finish::Cancelled)
                && out.tool_calls.is_empty();
            if incomplete {
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
            r["usage"] = json!({
                "input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                "output_tokens": out.tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input_tokens + out.tokens,
            });
        }
        r
    }

    /// `completed`, or `incomplete` at the token limit.
    fn status(out: &Output) -> &'static str {
        if matches!(out.finish, Finish::Length | Finish::Cancelled) && out.tool_calls.is_empty() {
            "incomplete"
        } else {
            "completed"
        }
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.id)
    }

    /// The `logprobs` of an output text (empty unless asked for).
    fn logprobs(&self, lps: &[TokenLogprob]) -> Vec<Value> {
        self.logprobs
            .as_ref()
            .map(|tok| logprobs::entries(tok, lps))
            .unwrap_or_default()
    }

    /// The finished output items of `out`, whose tokens' logprobs are `lps`.
    fn items(&self, out: &Output, lps: &[TokenLogprob]) -> Vec<Value> {
        let status = Self::status(out);
        if let Some(name) = &self.custom {
            return vec![
                json!({"type": "custom_tool_call", "id": format!("ctc_{}", self.id),
                "call_id": format!("call_{}_0", self.id), "name": name, "input": out.text, "status": status}),
            ];
        }
        if !out.tool_calls.is_empty() {
            return out
                .tool_calls
                .iter()
                .enumerate()
                .map(|(i, c)| match &c.input {
                    Some(input) => {
                        json!({"type": "custom_tool_call", "id": format!("ctc_{}_{i}", self.id),
                        "call_id": format!("call_{}_{i}", self.id), "name": c.name,
                        "input": input, "status": "completed"})
                    }
                    None => json!({"type": "function_call", "id": format!("fc_{}_{i}", self.id),
                        "call_id": format!("call_{}_{i}", self.id), "name": c.name,
                        "arguments": c.arguments.to_string(), "status": "completed"}),
                })
                .collect();
        }
        vec![
            json!({"type": "message", "id": self.message_id(), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": out.text, "annotations": [], "logprobs": self.logprobs(lps)}]}),
        ]
    }
}

/// Note the end of a request in its record.
fn done(rec: &Tracked, out: &Output) {
    rec.with(|r| {
        r.completion_tokens = out.tokens;
        r.outcome = Some(if out.tool_calls.is_empty() {
            Frame::status(out)
        } else {
            "tool_calls"
        });
    });
}

/// `POST /v1/responses`.
pub(super) async fn responses(
    State(st): State<Arc<AppState>>,
    Extension(rec): Extension<Tracked>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let v = parse_json(body)?;
    let t = wire::translate(&v, &st.markers)?;
    if !t.skipped_tools.is_empty() {
        log::info!(
            "responses: tools of types {} left out (the engine cannot run them)",
            t.skipped_tools.join(", ")
        );
    }
    let ids = st.prompt_of(&t.chat.messages, t.prompt_tools.as_ref())?;
    let (constraint, stream_text) = match &t.custom {
        Some(c) => (
            c.spec
                .as_ref()
                .map(|s| compile(&st, s, "tools"))
                .transpose()?,
            true,
        ),
        None => tool_constraint(&st, &t.chat, &t.custom_tools)?,
    };
    let top = top_logprobs(
        t.chat.logprobs.unwrap_or(false),
        t.chat.top_logprobs,
        MAX_TOP_LOGPROBS,
        "top_logprobs",
    )?;
    let plan = OutputPlan {
        constraint,
        stream_text,
        logprobs: top,
    };
    let p = prepare(&st, &t.chat.sampling, ids, plan, "input", &rec)?;
    let shape = match (&t.custom, stream_text) {
        (Some(_), _) => Shape::Custom,
        (None, true) => Shape::Text,
        (None, false) => Shape::Calls,
    };
    let id = st.next_id("resp");
    let tag = id.trim_start_matches("resp-").to_string();
    rec.with(|r| {
        r.id = Some(id.clone());
        r.prompt_tokens = p.prompt_tokens;
    });
    let mut metadata = v
        .get("metadata")
        .filter(|m| m.is_object())
        .cloned()
        .unwrap_or(json!({}));
    if !t.skipped_tools.is_empty() {
        metadata["cqlm_skipped_tools"] = json!(t.skipped_tools.join(","));
    }
    let s = &t.chat.sampling;
    let head = json!({
        "id": id, "object": "response", "created_at": now(), "model": st.opts.model_id,
        "status": "in_progress", "error": null, "incomplete_details": null,
        "instructions": v.get("instructions").cloned().unwrap_or(Value::Null),
        "max_output_tokens": s.max_tokens, "temperature": s.temperature.unwrap_or(1.0),
        "top_p": s.top_p.unwrap_or(1.0), "tools": t.tools, "tool_choice": t.tool_choice,
        "parallel_tool_calls": t.chat.parallel_tool_calls.unwrap_or(true),
        "text": v.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
        "store": v.get("store").cloned().unwrap_or(json!(false)), "metadata": metadata,
        "previous_response_id": null, "reasoning": null, "usage": null, "output": [],
    });
    let frame = Frame {
        id: tag,
        head,
        custom: t.custom.map(|c| c.name),
        input_tokens: p.prompt_tokens,
        logprobs: top.map(|_| Arc::clone(&st.tok)),
    };
    if p.stream {
        return Ok(stream(frame, p, shape, rec));
    }
    let mut p = p;
    let Whole {
        out,
        cached,
        logprobs: lps,
    } = whole(&mut p.events, &rec).await?;
    done(&rec, &out);
    let items = frame.items(&out, &lps);
    let body = frame.response(Frame::status(&out), items, Some((&out, cached)));
    Ok(Json(body).into_response())
}

/// The response as its stream of events.
fn stream(frame: Frame, mut p: Prepared, shape: Shape, rec: Tracked) -> Response {
    let (tx, rx) = mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(64);
    tokio::spawn(async move {
        rec.with(|r| r.outcome = Some("disconnected"));
        let mut seq = 0u64;
        let mut send = |kind: &'static str, mut v: Value| {
            v["type"] = json!(kind);
            v["sequence_number"] = json!(seq);
            seq += 1;
            let tx = tx.clone();
            async move {
                tx.send(Ok(SseEvent::default().event(kind).data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        let progress = frame.response("in_progress", Vec::new(), None);
        if !send("response.created", json!({"response": progress})).await
            || !send("response.in_progress", json!({"response": progress})).await
        {
            return;
        }
        let item_id = match shape {
            Shape::Custom => format!("ctc_{}", frame.id),
            _ => frame.message_id(),
        };
        // Streamed items open now: the message and its text part, or the custom call.
        let opened = match shape {
            Shape::Text => {
                send("response.output_item.added", json!({"output_index": 0, "item":
                    {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}}))
                .await
                    && send("response.content_part.added", json!({"item_id": item_id, "output_index": 0,
                        "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}))
                    .await
            }
            Shape::Custom => {
                send("response.output_item.added", json!({"output_index": 0, "item": {"type": "custom_tool_call",
                    "id": item_id, "call_id": format!("call_{}_0", frame.id), "name": frame.custom, "input": "", "status": "in_progress"}}))
                .await
            }
            Shape::Calls => true,
        };
        if !opened {
            return;
        }
        let mut cached = 0;
        // Each delta carries the logprobs of the tokens whose text it adds.
        let (mut all, mut pending) = (Vec::new(), Vec::new());
        let out = loop {
            match p.events.recv().await {
                Some(Event::Started { cached_tokens }) => {
                    cached = cached_tokens;
                    rec.with(|r| r.cached_tokens = cached);
                }
                Some(Event::Logprobs(l)) => pending.extend(l),
                Some(Event::Text(t)) => {
                    let lps = frame.logprobs(&pending);
                    all.append(&mut pending);
                    let ok = match shape {
                        Shape::Text => {
                            send(
                                "response.output_text.delta",
                                json!({"item_id": item_id, "output_index": 0,
                                "content_index": 0, "delta": t, "logprobs": lps}),
                            )
                            .await
                        }
                        Shape::Custom => {
                            send(
                                "response.custom_tool_call_input.delta",
                                json!({"item_id": item_id,
                                "output_index": 0, "delta": t}),
                            )
                            .await
                        }
                        Shape::Calls => true,
                    };
                    if !ok {
                        return;
                    }
                }
                Some(Event::Done(out)) => break out,
                Some(Event::Failed(e)) => {
                    rec.with(|r| r.outcome = Some("failed"));
                    let mut r = frame.response("failed", Vec::new(), None);
                    r["error"] =
                        json!({"code": "server_error", "message": engine_failed(&e).message});
                    let _ = send("response.failed", json!({"response": r})).await;
                    return;
                }
                None => return,
            }
        };
        done(&rec, &out);
        all.append(&mut pending);
        let items = frame.items(&out, &all);
        let mut events: Vec<(&'static str, Value)> = Vec::new();
        match shape {
            Shape::Text => {
                let part = &items[0]["content"][0];
                events.push((
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": 0,
                    "content_index": 0, "text": out.text, "logprobs": part["logprobs"]}),
                ));
                events.push((
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": 0,
                    "content_index": 0, "part": part}),
                ));
                events.push((
                    "response.output_item.done",
                    json!({"output_index": 0, "item": items[0]}),
                ));
            }
            Shape::Custom => {
                events.push((
                    "response.custom_tool_call_input.done",
                    json!({"item_id": item_id,
                    "output_index": 0, "input": out.text}),
                ));
                events.push((
                    "response.output_item.done",
                    json!({"output_index": 0, "item": items[0]}),
                ));
            }
            Shape::Calls => {
                for (i, item) in items.iter().enumerate() {
                    let id = item["id"].clone();
                    if item["type"] == "function_call" {
                        let mut open = item.clone();
                        open["arguments"] = json!("");
                        open["status"] = json!("in_progress");
                        events.push((
                            "response.output_item.added",
                            json!({"output_index": i, "item": open}),
                        ));
                        events.push((
                            "response.function_call_arguments.delta",
                            json!({"item_id": id,
                            "output_index": i, "delta": item["arguments"]}),
                        ));
                        events.push(("response.function_call_arguments.done", json!({"item_id": id,
                            "output_index": i, "name": item["name"], "arguments": item["arguments"]})));
                    } else if item["type"] == "custom_tool_call" {
                        let mut open = item.clone();
                        open["input"] = json!("");
                        open["status"] = json!("in_progress");
                        events.push((
                            "response.output_item.added",
                            json!({"output_index": i, "item": open}),
                        ));
                        events.push((
                            "response.custom_tool_call_input.delta",
                            json!({"item_id": id, "output_index": i, "delta": item["input"]}),
                        ));
                        events.push((
                            "response.custom_tool_call_input.done",
                            json!({"item_id": id, "output_index": i, "input": item["input"]}),
                        ));
                    } else {
                        // Text of a tool request that called no tool.
                        let mut open = item.clone();
                        open["content"] = json!([]);
                        open["status"] = json!("in_progress");
                        let part = &item["content"][0];
                        let empty = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
                        events.push((
                            "response.output_item.added",
                            json!({"output_index": i, "item": open}),
                        ));
                        events.push(("response.content_part.added", json!({"item_id": id, "output_index": i, "content_index": 0, "part": empty})));
                        events.push((
                            "response.output_text.delta",
                            json!({"item_id": id, "output_index": i,
                            "content_index": 0, "delta": part["text"], "logprobs": part["logprobs"]}),
                        ));
                        events.push((
                            "response.output_text.done",
                            json!({"item_id": id, "output_index": i,
                            "content_index": 0, "text": part["text"], "logprobs": part["logprobs"]}),
                        ));
                        events.push(("response.content_part.done", json!({"item_id": id, "output_index": i, "content_index": 0, "part": part})));
                    }
                    events.push((
                        "response.output_item.done",
                        json!({"output_index": i, "item": item}),
                    ));
                }
            }
        }
        let status = Frame::status(&out);
        let last = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        events.push((
            last,
            json!({"response": frame.response(status, items, Some((&out, cached)))}),
        ));
        for (kind, v) in events {
            if !send(kind, v).await {
                return;
            }
        }
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
