//! JSON-RPC shape of POST bodies: invalid JSON gets -32700 and a body that is not one
//! JSON-RPC 2.0 object gets -32600, as JSON-RPC errors (the transport alone would answer
//! 415 with plain text). Nothing behind it runs.

use axum::Json;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

/// The part of a message this check reads; other members are skipped unparsed.
#[derive(Deserialize)]
struct Shape {
    jsonrpc: Option<String>,
}

fn error(code: i64, message: &str) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

pub(crate) async fn check(request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // The gate has buffered the body already; this only takes it back.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(_) => return error(-32700, "Parse error: the body could not be read"),
    };
    // Checked without building the document: syntax first, then the one field that matters.
    if serde_json::from_slice::<IgnoredAny>(&bytes).is_err() {
        return error(-32700, "Parse error: the body is not valid JSON");
    }
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(b'[') => return error(-32600, "Invalid Request: batches are not supported"),
        _ => return error(-32600, "Invalid Request: expected a JSON-RPC 2.0 object"),
    }
    match serde_json::from_slice::<Shape>(&bytes) {
        Ok(Shape { jsonrpc: Some(v) }) if v == "2.0" => {}
        _ => return error(-32600, "Invalid Request: expected a JSON-RPC 2.0 object"),
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}
