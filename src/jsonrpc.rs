//! JSON-RPC shape of POST bodies: invalid JSON gets -32700 and a body that is not one
//! JSON-RPC 2.0 object gets -32600, as JSON-RPC errors (the transport alone would answer
//! 415 with plain text). Nothing behind it runs. A request on a revision without `initialize`
//! (2026-07-28) for a method that revision does not serve gets 404 / -32601 before rmcp sees
//! it.
//!
//! The body is parsed once per request: the gate, which must learn the message's id to bind
//! the identity to it, inspects the body with [`Inspection::of`] and leaves the inspection in
//! the request's extensions; this check and the layers behind the gate reuse it.
//!
//! A body can pass this check and still fail the transport's own parse into an MCP message
//! (invalid UTF-8 inside a string, an unpaired surrogate escape, nesting deeper than the
//! parser allows, a member of the wrong type). The transport answers those with a plain-text
//! 415 and runs nothing; this check turns that answer into the JSON-RPC error it should be,
//! classifying the body only then (never on the way in).

use std::borrow::Cow;
use std::fmt;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode, header};
use rmcp::model::RequestId;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// The members of a message that matter here; the others are skipped unparsed (but their
/// syntax is checked).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<Cow<'a, str>>,
    id: Option<RequestId>,
    #[serde(borrow)]
    method: Option<Cow<'a, str>>,
    params: Option<ParamsProbe>,
}

/// Why a body is not a JSON-RPC 2.0 request: the error code and message it is answered with.
type Malformed = (i64, Cow<'static, str>);

const fn malformed(code: i64, message: &'static str) -> Malformed {
    (code, Cow::Borrowed(message))
}

const NOT_JSON: Malformed = malformed(-32700, "Parse error: the body is not valid JSON");
const BATCH: Malformed = malformed(-32600, "Invalid Request: batches are not supported");
const NOT_JSON_RPC: Malformed = malformed(-32600, "Invalid Request: expected a JSON-RPC 2.0 object");

/// One parse of a POST body: whether it is a JSON-RPC 2.0 object, its id, its method and,
/// when `params` names something (a tool), that name.
#[derive(Clone)]
pub(crate) struct Inspection {
    body: Bytes,
    shape: Result<(), Malformed>,
    id: Option<RequestId>,
    method: Option<Box<str>>,
    name: Option<Box<str>>,
    /// `params.requestState` and `params.taskId`, when strings (what a stateless request
    /// continues: see `mcp`).
    state: Option<Box<str>>,
    task: Option<Box<str>>,
}

impl Inspection {
    pub(crate) fn of(body: Bytes) -> Self {
        let (shape, id, method, params) = match inspect(&body) {
            Ok(Envelope { id, method, params, .. }) => (Ok(()), id, method.map(|m| m.into()), params),
            Err(malformed) => (Err(malformed), None, None, None),
        };
        let ParamsProbe { name, state, task } = params.unwrap_or_default();
        Self { body, shape, id, method, name, state, task }
    }

    /// The JSON-RPC id of the message (`None` for a notification or a malformed body).
    pub(crate) fn request_id(&self) -> Option<&RequestId> {
        self.id.as_ref()
    }

    /// The method of a request or notification (`None` for a response or a malformed body).
    pub(crate) fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    /// A request: a method and an id (the messages that expect an answer).
    pub(crate) fn is_request(&self) -> bool {
        self.method.is_some() && self.id.is_some()
    }

    /// The body inspected.
    pub(crate) fn body(&self) -> &Bytes {
        &self.body
    }

    /// `params.name` when it is a string (the tool of a `tools/call`).
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `params.requestState` when it is a string (a multi round-trip retry).
    pub(crate) fn request_state(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// `params.taskId` when it is a string (a `tasks/*` request).
    pub(crate) fn task_id(&self) -> Option<&str> {
        self.task.as_deref()
    }

    /// Whether this inspection is of exactly `bytes` (the same buffer, not merely equal
    /// contents: comparing four megabytes per request to learn what is almost always true
    /// would cost more than inspecting again).
    fn is_of(&self, bytes: &Bytes) -> bool {
        self.body.as_ptr() == bytes.as_ptr() && self.body.len() == bytes.len()
    }
}

fn inspect(bytes: &[u8]) -> Result<Envelope<'_>, Malformed> {
    let is_json = || serde_json::from_slice::<IgnoredAny>(bytes).is_ok();
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        // Parsing the envelope checks the syntax of the whole body too.
        Some(b'{') => match serde_json::from_slice::<Envelope>(bytes) {
            Ok(envelope) if envelope.jsonrpc.as_deref() == Some("2.0") => Ok(envelope),
            Ok(_) => Err(NOT_JSON_RPC),
            Err(_) if is_json() => Err(NOT_JSON_RPC),
            Err(_) => Err(NOT_JSON),
        },
        Some(b'[') if is_json() => Err(BATCH),
        _ if is_json() => Err(NOT_JSON_RPC),
        _ => Err(NOT_JSON),
    }
}

/// `params`, of which only the string members `name`, `requestState` and `taskId` are kept;
/// any other shape is skipped (its syntax checked) and judged by the transport and the handler.
#[derive(Default)]
struct ParamsProbe {
    name: Option<Box<str>>,
    state: Option<Box<str>>,
    task: Option<Box<str>>,
}

impl<'de> Deserialize<'de> for ParamsProbe {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ParamsVisitor)
    }
}

struct ParamsVisitor;

impl<'de> Visitor<'de> for ParamsVisitor {
    type Value = ParamsProbe;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ParamsProbe, A::Error> {
        let mut probe = ParamsProbe::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Name => probe.name = map.next_value::<NameProbe>()?.0,
                Key::RequestState => probe.state = map.next_value::<NameProbe>()?.0,
                Key::TaskId => probe.task = map.next_value::<NameProbe>()?.0,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(probe)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ParamsProbe, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(ParamsProbe::default())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<ParamsProbe, E> {
        Ok(ParamsProbe::default())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<ParamsProbe, E> {
        Ok(ParamsProbe::default())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<ParamsProbe, E> {
        Ok(ParamsProbe::default())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<ParamsProbe, E> {
        Ok(ParamsProbe::default())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<ParamsProbe, E> {
        Ok(ParamsProbe::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<ParamsProbe, E> {
        Ok(ParamsProbe::default())
    }
}

/// A member name of `params`: one of those kept, or anything else (compared without
/// allocating).
enum Key {
    Name,
    RequestState,
    TaskId,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "name" => Key::Name,
                    "requestState" => Key::RequestState,
                    "taskId" => Key::TaskId,
                    _ => Key::Other,
                })
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// The value of a kept member of `params`: kept when it is a string, skipped otherwise.
struct NameProbe(Option<Box<str>>);

impl<'de> Deserialize<'de> for NameProbe {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(deserializer)? {
            serde_json::Value::String(s) => Ok(NameProbe(Some(s.into()))),
            _ => Ok(NameProbe(None)),
        }
    }
}

/// A request id as the audit stores it.
pub(crate) fn id_text(id: &RequestId) -> String {
    match id {
        RequestId::Number(n) => n.to_string(),
        RequestId::String(s) => s.to_string(),
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    jsonrpc: &'static str,
    id: Option<&'a RequestId>,
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    code: i64,
    message: &'a str,
}

/// A JSON-RPC error answer (HTTP 400) with `id` (null when it could not be read).
pub(crate) fn error_response(id: Option<&RequestId>, code: i64, message: &str) -> Response {
    let body = ErrorBody { jsonrpc: "2.0", id, error: ErrorObject { code, message } };
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

fn error((code, message): Malformed) -> Response {
    error_response(None, code, &message)
}

/// Whether the request says its body is JSON (the transport answers 415 itself otherwise,
/// and rightly so).
fn declares_json(request: &Request) -> bool {
    request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        let essence = v.split_once(';').map_or(v, |(essence, _)| essence);
        essence.trim().eq_ignore_ascii_case("application/json")
    })
}

/// Why a body that passed the envelope check could not be read as an MCP message: a
/// parse error when it is not UTF-8 or not JSON this parser accepts (an unpaired surrogate,
/// nesting beyond its limit), an invalid request otherwise.
fn unparsable(bytes: &[u8]) -> Malformed {
    if std::str::from_utf8(bytes).is_err() {
        return malformed(-32700, "Parse error: the body is not valid UTF-8");
    }
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Err(e) => (-32700, Cow::Owned(format!("Parse error: {e}"))),
        Ok(_) => malformed(-32600, "Invalid Request: the message is not a valid MCP request or notification"),
    }
}

/// The revisions without an `initialize` (SEP-2575): requests are self-contained and served
/// statelessly, with none of the methods the revision removed.
const MODERN_REVISIONS: [&str; 1] = ["2026-07-28"];

/// The methods the gateway serves to a caller on a modern revision. Anything else (the
/// methods the revision removed: `initialize`, `ping`, `logging/setLevel`,
/// `resources/subscribe`, `resources/unsubscribe`; and any unknown method) answers 404 with
/// -32601, as the revision's HTTP binding requires.
const MODERN_METHODS: [&str; 13] = [
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "completion/complete",
    "subscriptions/listen",
    // The tasks extension (`tasks/result` and `tasks/list` are not part of it).
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// Whether the request declares a modern revision in its `MCP-Protocol-Version` header.
fn is_modern(request: &Request) -> bool {
    request
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| MODERN_REVISIONS.contains(&v.trim()))
}

pub(crate) async fn check(request: Request, next: Next) -> Response {
    // (rmcp answers a 2026-07-28 `GET` or `DELETE` 405 itself.)
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let modern = is_modern(&request);
    let json_body = declares_json(&request);
    let (mut parts, body) = request.into_parts();
    // The gate has buffered the body already; this only takes it back.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(_) => return error(malformed(-32700, "Parse error: the body could not be read")),
    };
    let inspection = match parts.extensions.get::<Inspection>() {
        Some(inspection) if inspection.is_of(&bytes) => inspection.clone(),
        _ => {
            let inspection = Inspection::of(bytes.clone());
            parts.extensions.insert(inspection.clone());
            inspection
        }
    };
    if let Err(malformed) = inspection.shape {
        return error(malformed);
    }
    if modern && inspection.is_request() && inspection.method().is_some_and(|m| !MODERN_METHODS.contains(&m)) {
        let method = inspection.method().unwrap_or_default();
        let body = ErrorBody {
            jsonrpc: "2.0",
            id: inspection.request_id(),
            error: ErrorObject { code: -32601, message: &format!("Method not found: {method}") },
        };
        return (StatusCode::NOT_FOUND, Json(body)).into_response();
    }
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE && json_body {
        // The transport could not read the message although it is declared JSON and passed
        // the envelope check; nothing ran. Answer as JSON-RPC says.
        let (code, message) = unparsable(&inspection.body);
        let id = if code == -32700 { None } else { inspection.request_id() };
        return error_response(id, code, &message);
    }
    response
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
            (r#"{"jsonrpc":"2.0","id":3,"method":42}"#, Err(NOT_JSON_RPC), None, "a number for a method"),
            (r#"{"jsonrpc":"2.0","id":3,"method":["ping"]}"#, Err(NOT_JSON_RPC), None, "an array for a method"),
        ];
        for (body, shape, id, why) in cases {
            let inspection = Inspection::of(Bytes::from_static(body.as_bytes()));
            assert_eq!((&inspection.shape, inspection.request_id()), (shape, id.as_ref()), "{why}: {body}");
        }
    }

    /// A body, its method, its tool name, whether it is a request, and what the case is.
    type Read = (&'static str, Option<&'static str>, Option<&'static str>, bool, &'static str);

    #[test]
    fn inspection_reads_method_and_tool_name_whatever_the_params() {
        let cases: &[Read] = &[
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"name":"inner"},"name":"whoami"}}"#,
                Some("tools/call"),
                Some("whoami"),
                true,
                "name after arguments; the arguments' own name is not it",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"na\u006de":"esc"}}"#,
                Some("tools/call"),
                Some("esc"),
                true,
                "an escaped member name",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#,
                Some("tools/call"),
                None,
                true,
                "a numeric name",
            ),
            (r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1,{"name":"n"}]}"#, Some("x"), None, true, "array"),
            (r#"{"jsonrpc":"2.0","id":1,"method":"x","params":"s"}"#, Some("x"), None, true, "a string"),
            (
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#,
                Some("notifications/cancelled"),
                None,
                false,
                "a notification",
            ),
            (r#"{"jsonrpc":"2.0","id":1,"result":{}}"#, None, None, false, "a response"),
        ];
        for (body, method, name, request, why) in cases {
            let inspection = Inspection::of(Bytes::from_static(body.as_bytes()));
            assert_eq!(inspection.shape, Ok(()), "{why}");
            assert_eq!(
                (inspection.method(), inspection.name(), inspection.is_request()),
                (*method, *name, *request),
                "{why}: {body}"
            );
        }
    }

    #[test]
    fn bodies_the_transport_cannot_read_are_classified() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"a":{}{}}}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let cases: Vec<(Vec<u8>, i64, &str)> = vec![
            (
                b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{\"a\":\"\xff\xfe\"}}".to_vec(),
                -32700,
                "invalid UTF-8",
            ),
            (
                br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":"\ud800"}}"#.to_vec(),
                -32700,
                "a lone surrogate",
            ),
            (deep.into_bytes(), -32700, "nesting beyond the parser's limit"),
            (br#"{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}"#.to_vec(), -32600, "a method and a result"),
        ];
        for (body, code, why) in cases {
            assert_eq!(unparsable(&body).0, code, "{why}");
        }
    }
}
