//! `cqlm serve`: an OpenAI- and Anthropic-compatible HTTP server (axum on tokio) over the
//! engine. `GET /health`, `GET /v1/models`, `POST /v1/chat/completions` and
//! `POST /v1/completions`, non-streamed or as server-sent events, OpenAI's
//! `POST /v1/responses` (`responses`), and Anthropic's `POST /v1/messages` and `/v1/messages/count_tokens` (`anthropic`)
//! over the same chat path; structured output (`response_format`) and tool
//! calls through [`crate::constrain`]; llama-server's `POST /tokenize`,
//! `POST /detokenize` and `GET /props` (`introspect`); a chat web page at `/`
//! with its demo-tool and engine-profile routes (`web`); errors in each API's shape; `GET /metrics` for Prometheus ([`metrics`]) and one log
//! line per request. Requests run in one batch engine on either backend
//! (`batcher`: every `--parallel` sequence a slot of each pass); beyond them a
//! bounded queue ([`job::Queue`]), beyond that 503.

mod anthropic;
mod batcher;
pub mod chat;
pub mod error;
mod introspect;
pub mod job;
mod logprobs;
pub mod metrics;
mod responses;
mod web;
pub mod wire;

mod request;
mod respond;

use request::{chat_constraint, parse, prepare, OutputPlan};
use respond::{respond, Kind};

use crate::constrain::{TokenSpace, ToolMarkers};
use crate::model::weights::Model;
use crate::session::builder::BuiltBatch;
use crate::session::tokenizer::TextTokenizer;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Extension, MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chat::ChatTemplate;
use error::{ApiError, Refusal};
use job::Queue;
use metrics::{Metrics, Tracked};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use wire::{ChatRequest, CompletionRequest, Prompt};

/// The largest request body (4 MiB; larger is a 413).
pub const MAX_BODY: usize = 4 << 20;

/// `cqlm serve`'s settings.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to bind (loopback by default).
    pub host: String,
    /// Port (0: any free one).
    pub port: u16,
    /// Requests that may wait beyond those (then 503 with `Retry-After`).
    pub max_queue: usize,
    /// Bearer token the `/v1` endpoints require, if any.
    pub api_key: Option<String>,
    /// Longest prompt in tokens (longer is a 400).
    pub ctx_tokens: usize,
    /// Tokens generated when a request names no limit.
    pub default_max_tokens: usize,
    /// Most tokens one request generates, whatever it asks for (`None`: no cap).
    pub max_tokens_cap: Option<usize>,
    /// The model id `/v1/models` lists and requests must name (or omit).
    pub model_id: String,
    /// MiB of sequence states the prompt cache keeps (0: none).
    pub cache_mb: u64,
    /// Shortest time between two text chunks of a stream (zero: a chunk per
    /// token); a faster stream's tokens go out together.
    pub stream_interval: std::time::Duration,
}

/// What every handler shares.
struct AppState {
    queue: Queue,
    tok: Arc<TextTokenizer>,
    space: Arc<TokenSpace>,
    template: ChatTemplate,
    markers: ToolMarkers,
    metrics: Arc<Metrics>,
    opts: ServeOptions,
    vocab: usize,
    /// The engine, in words (`GET /props`).
    backend: String,
    counter: AtomicU64,
    created: u64,
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Run the server until Ctrl-C or SIGTERM: bind, call `ready` with the address,
/// serve `engine`'s batch (its slots are the sequences that generate at once);
/// at shutdown, running generations stop at their next token and their
/// responses end.
///
/// # Errors
/// [`crate::Error::InvalidArgument`] when the model has no tokenizer, the chat
/// template does not compile, the batch engine cannot be built or the address
/// cannot be bound.
pub fn serve(
    model: Arc<Model>,
    engine: BuiltBatch,
    opts: ServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> crate::Result<()> {
    let bad = |m: String| crate::Error::InvalidArgument(m);
    let tok = Arc::new(TextTokenizer::for_model(&model)?);
    let space = TokenSpace::for_model(&model)?;
    let bos = tok.decode_special(model.config.bos);
    let eos = tok.decode_special(model.config.eos);
    let markers = model.tool_markers.clone();
    let template = ChatTemplate::new(model.chat_template.as_deref(), &bos, &eos)
        .map_err(bad)?
        .with_markers(markers.clone());
    let metrics = Arc::new(Metrics::new());
    let backend = engine.batch.describe();
    let queue = Queue::start(
        engine.batch,
        engine.factory,
        opts.max_queue,
        opts.cache_mb << 20,
        opts.stream_interval,
        Arc::clone(&tok),
        Arc::clone(&metrics),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| bad(format!("cannot start the runtime: {e}")))?;
    let state = Arc::new(AppState {
        queue,
        tok,
        space,
        template,
        markers,
        metrics,
        vocab: model.config.vocab,
        backend,
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
                shutdown_state.queue.stop_all();
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
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/tokenize", post(introspect::tokenize))
        .route("/detokenize", post(introspect::detokenize))
        .route("/apply-template", post(introspect::apply_template))
        .route("/props", get(introspect::props))
        .route("/metrics", get(metrics_text))
        .route("/", get(|| async { web::asset("/") }))
        .route("/app.css", get(|| async { web::asset("/app.css") }))
        .route("/app.js", get(|| async { web::asset("/app.js") }))
        .route("/v1/cqlm/demo-tools", get(web::demo_tools))
        .route("/v1/cqlm/demo-tools/call", post(web::call_demo_tool))
        .route("/v1/cqlm/profile", get(web::profile))
        .fallback(|| async {
            ApiError::status(StatusCode::NOT_FOUND, "no such endpoint", "not_found")
        })
        .layer(from_fn_with_state(Arc::clone(&state), observe))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Every request: a [`Tracked`] record for the handler to fill in, counted and
/// logged when the response (or its stream) ends.
async fn observe(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", MatchedPath::as_str)
        .to_string();
    let rec = Tracked::open(Arc::clone(&st.metrics), endpoint, req.method().to_string());
    req.extensions_mut().insert(rec.clone());
    let resp = next.run(req).await;
    let refusal = resp.extensions().get::<Refusal>().map(|e| e.0.clone());
    rec.with(|r| {
        r.status = resp.status();
        r.error = refusal;
    });
    resp
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /metrics`: the Prometheus text exposition (behind the API key, if one is
/// set: a scraper sends it as a bearer token).
async fn metrics_text(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let text = st.metrics.render(st.queue.in_flight());
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

impl AppState {
    /// 401 unless the request carries the key (when one is set), as
    /// `Authorization: Bearer KEY` or as `x-api-key: KEY` (Anthropic's header).
    fn check_key(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.opts.api_key else {
            return Ok(());
        };
        let header = |name| {
            headers
                .get(name)
                .and_then(|v: &header::HeaderValue| v.to_str().ok())
        };
        let bearer = header(header::AUTHORIZATION).and_then(|v| v.strip_prefix("Bearer "));
        if bearer == Some(key.as_str())
            || header(header::HeaderName::from_static("x-api-key")) == Some(key.as_str())
        {
            Ok(())
        } else {
            Err(ApiError::status(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)",
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

async fn chat_completions(
    State(st): State<Arc<AppState>>,
    Extension(rec): Extension<Tracked>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let r: ChatRequest = parse(body, wire::CHAT_FIELDS)?;
    let p = st.queue_chat(&r, &rec)?;
    respond(st, p, Kind::Chat, rec).await
}

impl AppState {
    /// The prompt ids of a chat request: its messages (and tools) through the
    /// chat template, tokenized.
    ///
    /// # Errors
    /// A 400 for no messages, a message the template can't take, text that
    /// does not tokenize.
    fn chat_prompt(&self, r: &ChatRequest) -> Result<Vec<u32>, ApiError> {
        self.prompt_of(&r.messages, r.tools.as_ref())
    }

    /// The prompt ids of `messages` listing `tools` (an OpenAI array).
    ///
    /// # Errors
    /// As [`AppState::chat_prompt`].
    fn prompt_of(
        &self,
        messages: &[wire::Message],
        tools: Option<&Value>,
    ) -> Result<Vec<u32>, ApiError> {
        if messages.is_empty() {
            return Err(ApiError::bad(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        let text = self.template.render(messages, tools)?;
        self.tok
            .encode(&text)
            .map_err(|e| ApiError::bad(e.to_string(), Some("messages")))
    }

    /// Queue a chat request (its prompt, constraint and sampling checked).
    ///
    /// # Errors
    /// As [`AppState::chat_prompt`], [`chat_constraint`] and [`prepare`].
    fn queue_chat(&self, r: &ChatRequest, rec: &Tracked) -> Result<request::Prepared, ApiError> {
        let ids = self.chat_prompt(r)?;
        let top = request::top_logprobs(
            r.logprobs.unwrap_or(false),
            r.top_logprobs,
            crate::session::logprobs::MAX_TOP_LOGPROBS,
            "top_logprobs",
        )?;
        let plan = OutputPlan::of(chat_constraint(self, r)?).with_logprobs(top);
        prepare(self, &r.sampling, ids, plan, "messages", rec)
    }
}

async fn completions(
    State(st): State<Arc<AppState>>,
    Extension(rec): Extension<Tracked>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.check_key(&headers)?;
    let r: CompletionRequest = parse(body, wire::COMPLETION_FIELDS)?;
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
    let top = request::top_logprobs(r.logprobs.is_some(), r.logprobs, 5, "logprobs")?;
    let prompt_chars = st.tok.decode(&ids).map_or(0, |t| t.chars().count());
    let plan = OutputPlan {
        stream_text: true,
        ..OutputPlan::default()
    }
    .with_logprobs(top);
    let p = prepare(&st, &r.sampling, ids, plan, "prompt", &rec)?;
    respond(st, p, Kind::Completion { prompt_chars }, rec).await
}
