//! [`ApiError`]: a failed request as an HTTP status and the OpenAI error body.

use super::wire::{ErrorBody, ErrorDetail};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The message of a refused request, set on its response so that the request
/// log can say why (`error="…"`) whatever API shape the body takes.
#[derive(Debug, Clone)]
pub struct Refusal(pub String);

/// A request that failed: the status, the message, the field at fault.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
    /// The field at fault.
    pub param: Option<String>,
    /// A short code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn bad(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// Any status.
    pub fn status(status: StatusCode, message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: Some(code),
        }
    }

    /// The OpenAI `type` of the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::SERVICE_UNAVAILABLE => "server_busy",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind().to_string(),
                param: self.param.clone(),
                code: self.code.map(str::to_string),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        r.extensions_mut().insert(Refusal(self.message.clone()));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
