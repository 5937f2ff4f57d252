//! The web page at `/` and the routes only it needs: the page's files (built
//! into the binary from `src/serve/web/`), the demo tools the built-in model
//! was trained on (`GET /v1/cqlm/demo-tools`, `POST /v1/cqlm/demo-tools/call`,
//! run by [`crate::demo_tools`]) and the serving engine's per-kernel timings
//! (`GET /v1/cqlm/profile`, a few profiled passes on a free slot of the batch
//! engine, between its passes; 503 when every slot is busy).

use super::error::ApiError;
use super::job::{ProfileJob, ProfileOutcome};
use super::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The page's files: (route path, content type, contents).
pub const ASSETS: [(&str, &str, &str); 3] = [
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("web/index.html"),
    ),
    (
        "/app.css",
        "text/css; charset=utf-8",
        include_str!("web/app.css"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("web/app.js"),
    ),
];

/// One of [`ASSETS`], with its content type and a short cache lifetime (the
/// files change only with the binary; a minute keeps reloads cheap and
/// upgrades visible).
pub fn asset(path: &'static str) -> Response {
    let Some((_, kind, body)) = ASSETS.iter().find(|(p, _, _)| *p == path) else {
        return ApiError::status(StatusCode::NOT_FOUND, "no such file", "not_found")
            .into_response();
    };
    (
        [
            (header::CONTENT_TYPE, *kind),
            (header::CACHE_CONTROL, "public, max-age=60"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // Nothing but the page's own files runs or loads (the page builds
            // model text with DOM APIs; this is the second fence).
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
            ),
        ],
        *body,
    )
        .into_response()
}

/// `GET /v1/cqlm/demo-tools`: the OpenAI `tools` array of the demo tools.
pub async fn demo_tools(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    Ok(Json(crate::demo_tools::tools()))
}

/// The body of `POST /v1/cqlm/demo-tools/call`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCall {
    name: String,
    /// The arguments: a JSON string (as a tool call carries them) or an object.
    arguments: Value,
}

/// `POST /v1/cqlm/demo-tools/call` `{name, arguments}` → `{content}`: the
/// tool's result JSON as [`crate::demo_tools::call`] gives it. 400 for a body
/// that is not such an object or a tool that is not a demo tool.
pub async fn call_demo_tool(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let body = body.map_err(|e| ApiError::bad(e.body_text(), None))?;
    let c: ToolCall = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad(format!("the body is not {{name, arguments}}: {e}"), None))?;
    if !crate::demo_tools::is_demo_tool(&c.name) {
        return Err(ApiError::bad(
            format!("`{}` is not a demo tool", c.name),
            Some("name"),
        ));
    }
    let content = match &c.arguments {
        Value::String(s) => crate::demo_tools::call(&c.name, s),
        Value::Object(_) => crate::demo_tools::run(&c.name, &c.arguments),
        _ => {
            return Err(ApiError::bad(
                "arguments must be a JSON string or object",
                Some("arguments"),
            ))
        }
    };
    Ok(Json(json!({ "name": c.name, "content": content })))
}

/// The query of `GET /v1/cqlm/profile`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileQuery {
    /// Passes to time (1 ..= 64; default 8).
    passes: Option<usize>,
    /// Prompt tokens fed first, unprofiled (0 ..= 256; default 8).
    prompt_len: Option<usize>,
}

/// `GET /v1/cqlm/profile`: per-kernel timings of a few decode passes of the
/// engine the server serves with, run on a free slot between passes, as
/// `cqlm profile --sequences 1 --json` prints them (keys per pass). 503 when
/// every slot is busy, 400 for a bad query.
pub async fn profile(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    q: Result<Query<ProfileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    st.check_key(&headers)?;
    let Query(q) = q.map_err(|e| ApiError::bad(e.body_text(), None))?;
    let passes = q.passes.unwrap_or(8);
    let prompt_len = q.prompt_len.unwrap_or(8);
    if !(1..=64).contains(&passes) {
        return Err(ApiError::bad("passes must be 1 to 64", Some("passes")));
    }
    if prompt_len > 256 {
        return Err(ApiError::bad(
            "prompt_len must be at most 256",
            Some("prompt_len"),
        ));
    }
    let busy = || {
        ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "every slot is busy: profile again when a generation has finished",
            "server_busy",
        )
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = ProfileJob {
        passes,
        prompt_len,
        reply: tx,
    };
    if !st.queue.submit_profile(job) {
        return Err(busy());
    }
    match rx.await {
        Ok(ProfileOutcome::Done {
            profile,
            backend,
            precision,
        }) => {
            let v = json!({
                "backend": backend,
                "precision": precision,
                "pass": "batch of 1",
                "method": profile.method,
                "prompt_len": prompt_len,
                "tokens": profile.tokens,
                "step_us": profile.step_seconds * 1e6,
                "kernel_sum_us": profile.kernel_seconds() * 1e6,
                "calls_per_token": profile.calls_per_token(),
                "bytes_per_token": profile.bytes_per_token(),
                "rows": profile.rows_json(),
            });
            Ok(Json(crate::engine::profile::per_pass(v)))
        }
        Ok(ProfileOutcome::Failed(m)) => Err(ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            m,
            "engine_error",
        )),
        Err(_) => Err(busy()),
    }
}
