//! JSON-RPC shape of POST bodies: invalid JSON gets -32700 and a body that is not one
//! JSON-RPC 2.0 object gets -32600, as JSON-RPC errors (the transport alone would answer
//! 415 with plain text). Nothing behind it runs.
//!
//! The body is parsed once per request: the gate, which must learn the message's id to bind
//! the identity to it, inspects the body with [`Inspection::of`] and leaves the inspection in
//! the request's extensions; this check reuses it when it is of the very body it sees.

use std::borrow::Cow;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use rmcp::model::RequestId;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

/// The members of a message that matter here; the others are skipped unparsed (but their
/// syntax is checked).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<Cow<'a, str>>,
    id: Option<RequestId>,
}

/// Why a body is not a JSON-RPC 2.0 request: the error code and message it is answered with.
type Malformed = (i64, &'static str);

const NOT_JSON: Malformed = (-32700, "Parse error: the body is not valid JSON");
const BATCH: Malformed = (-32600, "Invalid Request: batches are not supported");
const NOT_JSON_RPC: Malformed = (-32600, "Invalid Request: expected a JSON-RPC 2.0 object");

/// One parse of a POST body: whether it is a JSON-RPC 2.0 object, and its id.
#[derive(Clone)]
pub(crate) struct Inspection {
    body: Bytes,
    shape: Result<(), Malformed>,
    id: Option<RequestId>,
}

impl Inspection {
    pub(crate) fn of(body: Bytes) -> Self {
        let (shape, id) = inspect(&body);
        Self { body, shape, id }
    }

    /// The JSON-RPC id of the message (`None` for a notification or a malformed body).
    pub(crate) fn request_id(&self) -> Option<&RequestId> {
        self.id.as_ref()
    }
}

fn inspect(bytes: &[u8]) -> (Result<(), Malformed>, Option<RequestId>) {
    let is_json = || serde_json::from_slice::<IgnoredAny>(bytes).is_ok();
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        // Parsing the envelope checks the syntax of the whole body too.
        Some(b'{') => match serde_json::from_slice::<Envelope>(bytes) {
            Ok(Envelope { jsonrpc: Some(v), id }) if v == "2.0" => (Ok(()), id),
            Ok(_) => (Err(NOT_JSON_RPC), None),
            Err(_) if is_json() => (Err(NOT_JSON_RPC), None),
            Err(_) => (Err(NOT_JSON), None),
        },
        Some(b'[') if is_json() => (Err(BATCH), None),
        _ if is_json() => (Err(NOT_JSON_RPC), None),
        _ => (Err(NOT_JSON), None),
    }
}

fn error((code, message): Malformed) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

pub(crate) async fn check(request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    // The gate has buffered the body already; this only takes it back.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(_) => return error((-32700, "Parse error: the body could not be read")),
    };
    let inspection = match parts.extensions.remove::<Inspection>() {
        Some(inspection) if inspection.body == bytes => inspection,
        _ => Inspection::of(bytes.clone()),
    };
    if let Err(malformed) = inspection.shape {
        return error(malformed);
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body, what the check answers, the request id it reads, and what the case is.
    type Case = (&'static str, Result<(), Malformed>, Option<RequestId>, &'static str);

    #[test]
    fn inspection_answers_like_the_json_rpc_rules() {
        let cases: &[Case] = &[
            (r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#, Ok(()), Some(RequestId::Number(7)), "a request"),
            (
                r#" {"jsonrpc":"2.0","id":"a","method":"ping"}"#,
                Ok(()),
                Some(RequestId::String("a".into())),
                "string id",
            ),
            (r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#, Ok(()), None, "a notification"),
            (r#"{"jsonrpc":"2.0","id":2,"meth"#, Err(NOT_JSON), None, "truncated"),
            (r#"{"jsonrpc":"2.0","id":2} trailing"#, Err(NOT_JSON), None, "trailing garbage"),
            (r#"[{"jsonrpc":"2.0","id":2,"method":"ping"}]"#, Err(BATCH), None, "a batch"),
            (r#"[1, 2"#, Err(NOT_JSON), None, "a broken batch"),
            (r#""2.0""#, Err(NOT_JSON_RPC), None, "a string"),
            (r#"{"id":2,"method":"ping"}"#, Err(NOT_JSON_RPC), None, "no jsonrpc member"),
            (r#"{"jsonrpc":"1.0","id":2,"method":"ping"}"#, Err(NOT_JSON_RPC), None, "another version"),
            (r#"{"jsonrpc":2.0,"id":2,"method":"ping"}"#, Err(NOT_JSON_RPC), None, "a number for a version"),
            (r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, Err(NOT_JSON_RPC), None, "an object for an id"),
        ];
        for (body, shape, id, why) in cases {
            let inspection = Inspection::of(Bytes::from_static(body.as_bytes()));
            assert_eq!((&inspection.shape, inspection.request_id()), (shape, id.as_ref()), "{why}: {body}");
        }
    }
}
