//! Our error body for every refusal made over HTTP (by the layers, the gate, the session
//! binding, and in place of the MCP transport's plain-text ones): `{"error": code, "message":
//! text}`.
//! Internal causes are logged, never sent.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use serde::Serialize;

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
}

pub(crate) fn json_error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(ErrorBody { error: code, message })).into_response()
}

pub(crate) async fn not_found() -> Response {
    json_error(StatusCode::NOT_FOUND, "not_found", "no such resource")
}

pub(crate) fn payload_too_large() -> Response {
    json_error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "request body too large")
}

/// Whether reading a body failed because it passed the body limit (see `http::limit_body`).
pub(crate) fn is_over_limit(error: axum::Error) -> bool {
    let inner = error.into_inner();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
    while let Some(error) = cause {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// A plain-text refusal made by a layer the gateway does not own (rmcp's transport: 406 without
/// the `Accept` it needs, 415 for a body not declared JSON, 405, ...) in our error body, with
/// its status and its other headers (`Allow`). The code is the status's reason in snake case
/// (`not_acceptable`, `unsupported_media_type`); the message is the layer's text. Any other
/// response passes unchanged.
pub(crate) async fn ours(response: Response) -> Response {
    let status = response.status();
    let typed = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        let essence = v.split(';').next().unwrap_or_default().trim();
        essence.eq_ignore_ascii_case("application/json") || essence.eq_ignore_ascii_case("text/event-stream")
    });
    if !status.is_client_error() || typed {
        return response;
    }
    let (parts, body) = response.into_parts();
    let reason = status.canonical_reason().unwrap_or("refused");
    // The transport's refusals are one short line; anything longer is cut rather than read.
    let text = axum::body::to_bytes(body, 1024).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let message = if text.trim().is_empty() { reason } else { text.trim() };
    let code: String =
        reason.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    let mut answer = json_error(status, &code, message);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            answer.headers_mut().append(name.clone(), value.clone());
        }
    }
    answer
}
