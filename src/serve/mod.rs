//! `cqlm serve`: an OpenAI-compatible HTTP server (axum on tokio) over the
//! engine. `GET /health`, `GET /v1/models`, `POST /v1/chat/completions` and
//! `POST /v1/completions`, non-streamed or as server-sent events; structured
//! output (`response_format`) and tool calls through [`crate::constrain`]; errors
//! in the OpenAI shape. Requests run on `--parallel` worker threads
//! ([`worker::Workers`]), each with its own session over the shared weights;
//! beyond them a bounded queue, beyond that 503.

pub mod batcher;
pub mod chat;
pub mod error;
pub mod wire;
pub mod worker;

use crate::constrain::{ConstraintSpec, TokenSpace, ToolChoice, ToolSet};
use crate::sample::{Sampler, SamplerConfig};
use crate::tokenizer::TextTokenizer;
use crate::weights::Model;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chat::ChatTemplate;
use error::ApiError;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use wire::{ChatRequest, CompletionRequest, Prompt, Sampling, Usage};
use worker::{Engines, Event, Job, Workers};

/// The largest request body (4 MiB; larger is a 413).
pub const MAX_BODY: usize = 4 << 20;

/// `cqlm serve`'s settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to bind (loopback by default).
    pub host: String,
    /// Port (0: any free one).
    pub port: u16,
    /// Sequences that generate at once (one worker and session each).
    pub parallel: usize,
    /// Requests that may wait beyond those (then 503 with `Retry-After`).
    pub max_queue: usize,
    /// Bearer token the `/v1` endpoints require, if any.
    pub api_key: Option<String>,
    /// Longest prompt in tokens (longer is a 400).
    pub ctx_tokens: usize,
    /// Tokens generated when a request names no limit.
    pub default_max_tokens: usize,
    /// The model id `/v1/models` lists and requests must name (or omit).
    pub model_id: String,
}

struct AppState {
    workers: Workers,
    tok: Arc<TextTokenizer>,
    space: Arc<TokenSpace>,
    template: ChatTemplate,
    opts: ServeOptions,
    vocab: usize,
    counter: AtomicU64,
    created: u64,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Run the server until Ctrl-C or SIGTERM: bind, call `ready` with the address,
/// serve; at shutdown, running generations stop at their next token and their
/// responses end.
///
/// # Errors
/// [`crate::Error::InvalidArgument`] when the model has no tokenizer, the chat
/// template does not compile, a session cannot be built or the address cannot be
/// bound.
pub fn serve(
    model: Arc<Model>,
    engines: Engines,
    opts: ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> crate::Result<()> {
    let bad = |m: String| crate::Error::InvalidArgument(m);
    let tok = Arc::new(TextTokenizer::for_model(&model)?);
    let space = TokenSpace::for_model(&model)?;
    let bos = tok.decode_special(model.config.bos);
    let eos = tok.decode_special(model.config.eos);
    let template = ChatTemplate::new(model.chat_template.as_deref(), &bos, &eos).map_err(bad)?;
    let workers = Workers::start(opts.parallel, opts.max_queue, engines, Arc::clone(&tok))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| bad(format!("cannot start the runtime: {e}")))?;
    let state = Arc::new(AppState {
        workers,
        tok,
        space,
        template,
        vocab: model.config.vocab,
        opts: opts.clone(),
        counter: AtomicU64::new(1),
        created: now(),
    });
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((opts.host.as_str(), opts.port))
            .await
            .map_err(|e| bad(format!("cannot bind {}:{}: {e}", opts.host, opts.port)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| bad(format!("no local address: {e}")))?;
        ready(addr);
        let app = router(Arc::clone(&state));
        let shutdown_state = Arc::clone(&state);
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                shutdown_state.workers.stop_all();
            })
            .await
            .map_err(|e| bad(format!("server: {e}")))
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .fallback(|| async {
            ApiError::status(StatusCode::NOT_FOUND, "no such endpoint", "not_found")
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

impl AppState {
    /// 401 unless the request carries the key (when one is set).
    fn check_key(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.opts.api_key else {
            return Ok(());
        };
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given == Some(key.as_str()) {
            Ok(())
        } else {
            Err(ApiError::status(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key (Authorization: Bearer ...)",
                "invalid_api_key",
            ))
        }
    }

    fn next_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{:x}",
            self.counter.fetch_add(1, Ordering::Relaxed)
        )
    }
}

async fn models(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{"id": st.opts.model_id, "object": "model", "created": st.created, "owned_by": "cqlm"}]
    })))
}

/// The body as JSON, or a 400 (413 past [`MAX_BODY`]).
fn parse_json(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let bytes = body.map_err(|r| {
        let status = r.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the request body is over {MAX_BODY} bytes")
        } else {
            r.body_text()
        };
        ApiError {
            status,
            message,
            param: None,
            code: None,
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad(format!("the request body is not JSON: {e}"), None))
}

/// `v` as `T`, or a 400 naming the field at fault.
fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let at = param
            .as_deref()
            .map(|p| format!(" at `{p}`"))
            .unwrap_or_default();
        ApiError::bad(
            format!("malformed request{at}: {}", e.inner()),
            param.as_deref(),
        )
    })
}

/// The body as `T`: its sampling fields checked first on their own (so an error
/// there names its field, which a flattened struct would not).
fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let v = parse_json(body)?;
    if !v.is_object() {
        return Err(ApiError::bad(
            "the request body must be a JSON object",
            None,
        ));
    }
    typed::<Sampling>(&v)?;
    typed(&v)
}

/// A prepared request: the job's settings and where its events come back.
struct Prepared {
    job: Job,
    events: mpsc::UnboundedReceiver<Event>,
    prompt_tokens: usize,
    stream: bool,
    include_usage: bool,
}

impl AppState {
    /// The sampling settings, limits and model check of `s`, for `ids`.
    fn prepare(
        &self,
        s: &Sampling,
        ids: Vec<u32>,
        constraint: Option<crate::constrain::Constraint>,
        stream_text: bool,
        prompt_param: &str,
    ) -> Result<Prepared, ApiError> {
        if let Some(n) = s.n {
            if n != 1 {
                return Err(ApiError::bad(
                    format!("n = {n}: only n = 1 is supported"),
                    Some("n"),
                ));
            }
        }
        if let Some(m) = &s.model {
            if m != &self.opts.model_id {
                return Err(ApiError {
                    status: StatusCode::NOT_FOUND,
                    message: format!(
                        "the model `{m}` does not exist (this server runs `{}`)",
                        self.opts.model_id
                    ),
                    param: Some("model".into()),
                    code: Some("model_not_found"),
                });
            }
        }
        if ids.len() > self.opts.ctx_tokens {
            return Err(ApiError::bad(
                format!(
                    "the prompt has {} tokens, over this server's limit of {} (--ctx-tokens)",
                    ids.len(),
                    self.opts.ctx_tokens
                ),
                Some(prompt_param),
            ));
        }
        let max_tokens = match s.max_completion_tokens.or(s.max_tokens) {
            Some(0) => {
                return Err(ApiError::bad(
                    "max_tokens must be at least 1",
                    Some("max_tokens"),
                ))
            }
            Some(n) => n as usize,
            None => self.opts.default_max_tokens,
        };
        let cfg = SamplerConfig {
            temperature: s.temperature.unwrap_or(1.0),
            top_p: s.top_p.unwrap_or(1.0),
            top_k: s.top_k.unwrap_or(0),
            repeat_penalty: s.repeat_penalty.unwrap_or(1.0),
            seed: s.seed.map_or(0, |v| v as u64),
            ..SamplerConfig::default()
        };
        if let Err(e) = Sampler::new(cfg.clone()) {
            let msg = e.to_string();
            let param = ["temperature", "top-p", "repeat penalty"]
                .iter()
                .zip(["temperature", "top_p", "repeat_penalty"])
                .find(|(k, _)| msg.contains(**k))
                .map(|(_, p)| p);
            return Err(ApiError::bad(msg, param));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let prompt_tokens = ids.len();
        Ok(Prepared {
            job: Job {
                ids,
                sampler: cfg,
                max_tokens,
                stops: s.stop.as_ref().map(|v| v.strings()).unwrap_or_default(),
                constraint,
                stream_text,
                events: tx,
            },
            events: rx,
            prompt_tokens,
            stream: s.stream.unwrap_or(false),
            include_usage: s.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }

    /// Compile `spec` (a 400 naming `param` when it can't be).
    fn compile(
        &self,
        spec: &ConstraintSpec,
        param: &str,
    ) -> Result<crate::constrain::Constraint, ApiError> {
        self.space
            .compile(spec)
            .map_err(|e| ApiError::bad(e.to_string(), Some(param)))
    }

    fn submit(&self, job: Job) -> Result<(), ApiError> {
        if self.workers.submit(job) {
            return Ok(());
        }
        Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is busy (every sequence and queue place taken); retry later",
            "server_busy",
        ))
    }
}

/// The constraint of a chat request: `response_format` or the tools.
fn chat_constraint(
    st: &AppState,
    r: &ChatRequest,
) -> Result<(Option<crate::constrain::Constraint>, bool), ApiError> {
    let choice =
        match &r.tool_choice {
            None => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" | "required" | "none" => s
                    .parse()
                    .map_err(|e: crate::Error| ApiError::bad(e.to_string(), Some("tool_choice")))?,
                other => {
                    return Err(ApiError::bad(
                        format!(
                    "tool_choice `{other}`: auto, required, none or an object naming a function"
                ),
                        Some("tool_choice"),
                    ))
                }
            },
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(n) if v.get("type").and_then(Value::as_str) == Some("function") => {
                    ToolChoice::Function(n.to_string())
                }
                _ => return Err(ApiError::bad(
                    "tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    Some("tool_choice"),
                )),
            },
        };
    let tools = match &r.tools {
        Some(t) if choice != ToolChoice::None => {
            Some(ToolSet::from_openai(t).map_err(|e| ApiError::bad(e.to_string(), Some("tools")))?)
        }
        _ => None,
    };
    let format = match &r.response_format {
        None => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(json!({"type": "object"})),
            Some("json_schema") => {
                let s = f
                    .pointer("/json_schema/schema")
                    .or_else(|| f.get("schema"))
                    .cloned();
                Some(s.ok_or_else(|| {
                    ApiError::bad(
                        "response_format json_schema needs json_schema.schema",
                        Some("response_format.json_schema.schema"),
                    )
                })?)
            }
            _ => {
                return Err(ApiError::bad(
                    "response_format.type: text, json_object or json_schema",
                    Some("response_format.type"),
                ))
            }
        },
    };
    match (tools, format) {
        (Some(_), Some(_)) => Err(ApiError::bad(
            "response_format and tools cannot both shape the output (set tool_choice to none)",
            Some("response_format"),
        )),
        (Some(tools), None) => {
            let spec = ConstraintSpec::Tools {
                tools,
                choice,
                parallel: r.parallel_tool_calls.unwrap_or(false),
            };
            Ok((Some(st.compile(&spec, "tools")?), false))
        }
        (None, Some(schema)) => Ok((
            Some(st.compile(&ConstraintSpec::json_schema(schema), "response_format")?),
            true,
        )),
        (None, None) => Ok((None, true)),
    }
}

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let r: ChatRequest = parse(body)?;
    if r.messages.is_empty() {
        return Err(ApiError::bad(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let text = st.template.render(&r.messages, r.tools.as_ref())?;
    let ids = st
        .tok
        .encode(&text)
        .map_err(|e| ApiError::bad(e.to_string(), Some("messages")))?;
    let (constraint, stream_text) = chat_constraint(&st, &r)?;
    let p = st.prepare(&r.sampling, ids, constraint, stream_text, "messages")?;
    respond(st, p, Kind::Chat).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let r: CompletionRequest = parse(body)?;
    let ids = match &r.prompt {
        Prompt::Text(t) => st.tok.encode(t),
        Prompt::Texts(v) if v.len() == 1 => st.tok.encode(&v[0]),
        Prompt::Texts(_) => return Err(ApiError::bad("one prompt per request", Some("prompt"))),
        Prompt::Ids(ids) => {
            if let Some(t) = ids.iter().find(|&&t| t as usize >= st.vocab) {
                return Err(ApiError::bad(
                    format!("token {t} is not < the vocabulary size {}", st.vocab),
                    Some("prompt"),
                ));
            }
            if ids.is_empty() {
                return Err(ApiError::bad("the prompt is empty", Some("prompt")));
            }
            Ok(ids.clone())
        }
    }
    .map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))?;
    let p = st.prepare(&r.sampling, ids, None, true, "prompt")?;
    respond(st, p, Kind::Completion).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

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

async fn respond(st: Arc<AppState>, p: Prepared, kind: Kind) -> Result<Response, ApiError> {
    let Prepared {
        job,
        mut events,
        prompt_tokens,
        stream,
        include_usage,
    } = p;
    // Tool-constrained output is held back until it is known to be calls or text.
    let streamed_text = job.stream_text;
    st.submit(job)?;
    let (prefix, object, chunk_object) = match kind {
        Kind::Chat => ("chatcmpl", "chat.completion", "chat.completion.chunk"),
        Kind::Completion => ("cmpl", "text_completion", "text_completion"),
    };
    let id = st.next_id(prefix);
    let created = now();
    let model = st.opts.model_id.clone();
    let usage = move |n: usize| Usage {
        prompt_tokens,
        completion_tokens: n,
        total_tokens: prompt_tokens + n,
    };
    if !stream {
        loop {
            match events.recv().await {
                Some(Event::Text(_)) => {}
                Some(Event::Done {
                    finish,
                    completion_tokens,
                    text,
                    tool_calls,
                }) => {
                    let choice = match kind {
                        Kind::Chat => {
                            let calls = tool_calls_json(&tool_calls, &id);
                            let mut message = json!({"role": "assistant", "content": if calls.is_empty() { Value::String(text) } else { Value::Null }});
                            if !calls.is_empty() {
                                message["tool_calls"] = Value::Array(calls);
                            }
                            json!({"index": 0, "message": message, "finish_reason": finish.reason(), "logprobs": null})
                        }
                        Kind::Completion => {
                            json!({"index": 0, "text": text, "finish_reason": finish.reason(), "logprobs": null})
                        }
                    };
                    let body = json!({"id": id, "object": object, "created": created, "model": model,
                        "choices": [choice], "usage": usage(completion_tokens)});
                    return Ok(Json(body).into_response());
                }
                Some(Event::Failed(e)) => {
                    return Err(ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("the engine failed on this request: {e}"),
                        "engine_error",
                    ))
                }
                None => {
                    return Err(ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the request was dropped by its worker",
                        "engine_error",
                    ))
                }
            }
        }
    }
    // Streamed: a forwarder turns the worker's events into SSE events; a client
    // that hangs up drops the stream, so the forwarder and then the job stop.
    let (tx, rx) = mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(64);
    tokio::spawn(async move {
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
        loop {
            let ok = match events.recv().await {
                Some(Event::Text(t)) => {
                    match kind {
                        Kind::Chat => {
                            send(chunk(
                                json!({"index": 0, "delta": {"content": t}, "finish_reason": null}),
                            ))
                            .await
                        }
                        Kind::Completion => send(chunk(
                            json!({"index": 0, "text": t, "finish_reason": null, "logprobs": null}),
                        ))
                        .await,
                    }
                }
                Some(Event::Done {
                    finish,
                    completion_tokens,
                    tool_calls,
                    text,
                }) => {
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
                    let last = match kind {
                        Kind::Chat => {
                            json!({"index": 0, "delta": {}, "finish_reason": finish.reason()})
                        }
                        Kind::Completion => {
                            json!({"index": 0, "text": "", "finish_reason": finish.reason(), "logprobs": null})
                        }
                    };
                    if !send(chunk(last)).await {
                        return;
                    }
                    if include_usage {
                        let mut u = chunk(json!(null));
                        u["choices"] = json!([]);
                        u["usage"] =
                            serde_json::to_value(usage(completion_tokens)).unwrap_or_default();
                        if !send(u).await {
                            return;
                        }
                    }
                    let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
                    return;
                }
                Some(Event::Failed(e)) => {
                    let err = ApiError::status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("the engine failed on this request: {e}"),
                        "engine_error",
                    );
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
