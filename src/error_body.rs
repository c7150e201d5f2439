//! Our error body for every refusal made over HTTP (by the layers, the gate, the session
//! binding): `{"error": code, "message": text}`.
//! Internal causes are logged, never sent.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
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
