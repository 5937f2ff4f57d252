//! Reading a request: the body parsed with the field at fault named, the
//! sampling settings and limits checked, the constraint compiled, the job queued.

use super::error::ApiError;
use super::job::{Event, Job};
use super::metrics::Tracked;
use super::wire::{ChatRequest, Sampling};
use super::{AppState, MAX_BODY};
use crate::constrain::{Constraint, ConstraintSpec, CustomTool, ToolChoice, ToolSet};
use crate::session::sample::{Sampler, SamplerConfig};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// The body as JSON, or a 400 (413 past [`MAX_BODY`]).
pub(super) fn parse_json(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
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
pub(super) fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
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

/// The body as `T`, whose own fields are `own` (besides
/// [`super::wire::SAMPLING_FIELDS`]): a field of neither is a 400 naming it
/// unless it is `null` or `false` (asking for nothing); the sampling fields
/// are checked first on their own (so an error there names its field, which a
/// flattened struct would not).
pub(super) fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    own: &[&str],
) -> Result<T, ApiError> {
    let v = parse_json(body)?;
    let Some(obj) = v.as_object() else {
        return Err(ApiError::bad(
            "the request body must be a JSON object",
            None,
        ));
    };
    let known = |k: &str| own.contains(&k) || super::wire::SAMPLING_FIELDS.contains(&k);
    if let Some((k, _)) = obj
        .iter()
        .find(|(k, v)| !known(k) && !matches!(v, Value::Null | Value::Bool(false)))
    {
        return Err(ApiError::bad(
            format!("`{k}`: this server does not implement this field"),
            Some(k),
        ));
    }
    typed::<Sampling>(&v)?;
    typed(&v)
}

/// A queued request: where its events come back, and how to answer.
pub(super) struct Prepared {
    /// Where its events come back.
    pub(super) events: mpsc::UnboundedReceiver<Event>,
    /// Tokens of the prompt (for `usage`).
    pub(super) prompt_tokens: usize,
    /// Answer with server-sent events.
    pub(super) stream: bool,
    /// Add the usage chunk to the stream.
    pub(super) include_usage: bool,
    /// Whether its text streams as it comes (not for tool calls, held back
    /// until they are known to be calls or text).
    pub(super) stream_text: bool,
    /// Whether it reports logprobs.
    pub(super) logprobs: bool,
}

/// What a request's output is to be: its constraint, whether its text
/// streams, its logprobs.
#[derive(Default)]
pub(super) struct OutputPlan {
    /// A compiled constraint, if the request has one.
    pub(super) constraint: Option<Constraint>,
    /// Whether its text streams as it comes (not for tool calls).
    pub(super) stream_text: bool,
    /// Report each token's logprob and this many alternatives.
    pub(super) logprobs: Option<usize>,
}

impl OutputPlan {
    /// The plan of `(constraint, stream_text)` ([`chat_constraint`]) without logprobs.
    pub(super) fn of((constraint, stream_text): (Option<Constraint>, bool)) -> OutputPlan {
        OutputPlan {
            constraint,
            stream_text,
            logprobs: None,
        }
    }

    /// The same plan reporting logprobs with `top` alternatives (`None`: none).
    pub(super) fn with_logprobs(mut self, top: Option<usize>) -> OutputPlan {
        self.logprobs = top;
        self
    }
}

/// `top_logprobs` (`param`) checked: at most `limit`, and only with
/// `logprobs`; the alternatives to report, `None` without logprobs.
pub(super) fn top_logprobs(
    logprobs: bool,
    top: Option<u32>,
    limit: usize,
    param: &str,
) -> Result<Option<usize>, ApiError> {
    let top = top.map(|t| t as usize);
    match (logprobs, top) {
        (_, Some(t)) if t > limit => Err(ApiError::bad(
            format!("{param} = {t}: at most {limit}"),
            Some(param),
        )),
        (false, Some(t)) if t > 0 => Err(ApiError::bad(
            format!("{param} needs the logprobs asked for (`logprobs`; on /v1/responses `include: [\"message.output_text.logprobs\"]`)"),
            Some(param),
        )),
        (true, t) => Ok(Some(t.unwrap_or(0))),
        (false, _) => Ok(None),
    }
}

/// Check the sampling settings, limits and model of `s` for the prompt `ids`,
/// then queue the job as `plan` says (a 503 when the server is full).
pub(super) fn prepare(
    st: &AppState,
    s: &Sampling,
    ids: Vec<u32>,
    plan: OutputPlan,
    prompt_param: &str,
    rec: &Tracked,
) -> Result<Prepared, ApiError> {
    let OutputPlan {
        constraint,
        stream_text,
        logprobs,
    } = plan;
    if let Some(n) = s.n {
        if n != 1 {
            return Err(ApiError::bad(
                format!("n = {n}: only n = 1 is supported"),
                Some("n"),
            ));
        }
    }
    st.check_model(s)?;
    if ids.len() > st.opts.ctx_tokens {
        return Err(ApiError::bad(
            format!(
                "the prompt has {} tokens, over this server's limit of {} (--ctx-tokens)",
                ids.len(),
                st.opts.ctx_tokens
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
        None => st.opts.default_max_tokens,
    }
    .min(st.opts.max_tokens_cap.unwrap_or(usize::MAX));
    let cfg = SamplerConfig {
        temperature: s.temperature.unwrap_or(1.0),
        top_p: s.top_p.unwrap_or(1.0),
        top_k: s.top_k.unwrap_or(0),
        repeat_penalty: s.repeat_penalty.unwrap_or(1.0),
        min_p: s.min_p.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        // No seed: a fresh one, so two requests don't write the same text.
        seed: s
            .seed
            .map_or_else(|| u64::from(rand::random::<u32>()), |v| v as u64),
        ..SamplerConfig::default()
    };
    if let Err(e) = Sampler::new(cfg.clone()) {
        let msg = e.to_string();
        let param = [
            "temperature",
            "top-p",
            "min-p",
            "repeat penalty",
            "frequency penalty",
            "presence penalty",
        ]
        .iter()
        .zip([
            "temperature",
            "top_p",
            "min_p",
            "repeat_penalty",
            "frequency_penalty",
            "presence_penalty",
        ])
        .find(|(k, _)| msg.contains(**k))
        .map(|(_, p)| p);
        return Err(ApiError::bad(msg, param));
    }
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let prompt_tokens = ids.len();
    let job = Job {
        ids,
        sampler: cfg,
        max_tokens,
        stops: s.stop.as_ref().map(|v| v.strings()).unwrap_or_default(),
        constraint,
        logprobs,
        stream_text,
        events: tx,
        arrived: rec.arrived(),
    };
    if !st.queue.submit(job) {
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is busy (every sequence and queue place taken); retry later",
            "server_busy",
        ));
    }
    Ok(Prepared {
        events: rx,
        prompt_tokens,
        stream: s.stream.unwrap_or(false),
        include_usage: s.stream_options.as_ref().is_some_and(|o| o.include_usage),
        stream_text,
        logprobs: logprobs.is_some(),
    })
}

impl AppState {
    /// A 404 when `s` names a model this server does not run.
    pub(super) fn check_model(&self, s: &Sampling) -> Result<(), ApiError> {
        match &s.model {
            Some(m) if m != &self.opts.model_id => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "the model `{m}` does not exist (this server runs `{}`)",
                    self.opts.model_id
                ),
                param: Some("model".into()),
                code: Some("model_not_found"),
            }),
            _ => Ok(()),
        }
    }
}

/// Compile `spec` (a 400 naming `param` when it can't be).
pub(super) fn compile(
    st: &AppState,
    spec: &ConstraintSpec,
    param: &str,
) -> Result<Constraint, ApiError> {
    st.space
        .compile(spec)
        .map_err(|e| ApiError::bad(e.to_string(), Some(param)))
}

/// The constraint of a chat request: `response_format` or the tools; and
/// whether its text streams as it comes (not for tools).
pub(super) fn chat_constraint(
    st: &AppState,
    r: &ChatRequest,
) -> Result<(Option<Constraint>, bool), ApiError> {
    tool_constraint(st, r, &[])
}

/// [`chat_constraint`] with `custom` tools offered beside the request's
/// function tools (the Responses API's).
pub(super) fn tool_constraint(
    st: &AppState,
    r: &ChatRequest,
    custom: &[CustomTool],
) -> Result<(Option<Constraint>, bool), ApiError> {
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
    let offered = r.tools.is_some() || !custom.is_empty();
    let tools = if offered && choice != ToolChoice::None {
        Some(
            ToolSet::from_parts(r.tools.as_ref(), custom.to_vec())
                .map_err(|e| ApiError::bad(e.to_string(), Some("tools")))?
                .with_markers(st.markers.clone()),
        )
    } else {
        None
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
            Ok((Some(compile(st, &spec, "tools")?), false))
        }
        (None, Some(schema)) => Ok((
            Some(compile(
                st,
                &ConstraintSpec::json_schema(schema),
                "response_format",
            )?),
            true,
        )),
        (None, None) => Ok((None, true)),
    }
}
