//! The HTTP client for Streamable HTTP upstreams: rmcp's reqwest client, plus one thing it
//! can't do: a header whose value changes per call. The proxy puts each call's identity
//! assertion in the request's `_meta` under [`ASSERTION_META_KEY`]; this client moves it into
//! the configured header (so it never travels in the body of an HTTP call) and sends nothing
//! else of the caller's. The client's own bearer token never reaches here.
//!
//! On an executor, the gateway's messages to an OAuth-protected server carry the server's
//! access token in `_meta` under [`AUTHORIZATION_META_KEY`]: this client moves it into the
//! `Authorization` header of that request, and of the requests that carry none (answers to the
//! server, the event stream, the session's end) it sends the last one it was given.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, GetMeta};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde_json::Value;

pub use super::AUTHORIZATION_META_KEY;
use super::resume::Resumption;
use crate::telemetry::trace::CONTEXT_FIELDS as TRACE_CONTEXT_FIELDS;

/// Where a proxied request carries its identity assertion (stdio upstreams read it there).
pub const ASSERTION_META_KEY: &str = "io.scopegate/identity";

/// Where a message the upstream sent on the event stream of one of the gateway's requests
/// (a log line, progress, a request of the client) names that request: set here, on the
/// stream the message came on, never taken from the upstream (messages on the session's own
/// event stream have it removed). It lets the gateway route them to the call that caused them
/// exactly, instead of only when one session has calls in flight.
pub const RELATED_META_KEY: &str = "io.scopegate/relatedRequest";

/// Sets (`Some`) or removes (`None`) the related-request mark of a message the upstream sent
/// in one SSE event. Events that are no request or notification are left as they are.
fn mark_related(data: &mut Option<String>, related: Option<&Value>) {
    let Some(text) = data.as_deref() else { return };
    if related.is_none() && !text.contains(RELATED_META_KEY) {
        return;
    }
    if !text.contains("\"method\"") {
        return;
    }
    let Ok(Value::Object(mut message)) = serde_json::from_str::<Value>(text) else { return };
    if !message.contains_key("method") {
        return;
    }
    let params = message.entry("params").or_insert_with(|| Value::Object(Default::default()));
    let Value::Object(params) = params else { return };
    let meta = params.entry("_meta").or_insert_with(|| Value::Object(Default::default()));
    let Value::Object(meta) = meta else { return };
    match related {
        Some(id) => meta.insert(RELATED_META_KEY.to_owned(), id.clone()),
        None => meta.remove(RELATED_META_KEY),
    };
    if let Ok(text) = serde_json::to_string(&message) {
        *data = Some(text);
    }
}

/// The event stream of one POSTed request: every request or notification on it is marked
/// with that request's id (the stream of a POST that is no request is [`unrelated`]). A server
/// may end the stream before it answers (SEP-1699 polling: an event id first, the stream
/// closed mid-call), or the connection may break: the stream is then resumed with a `GET` and
/// `Last-Event-ID` as [`Resumption`] says, and goes on as the same stream, still that
/// request's.
fn related_to(response: StreamableHttpPostResponse, request: Option<(Value, Resume)>) -> StreamableHttpPostResponse {
    let StreamableHttpPostResponse::Sse(stream, session) = response else { return response };
    let Some((request, resume)) = request else {
        return StreamableHttpPostResponse::Sse(unrelated(stream), session);
    };
    let resumption = if resume.modern { Resumption::none() } else { Resumption::default() };
    let state = Resuming { resume, request, resumption };
    let continued = futures_util::stream::unfold((stream, state), |(mut stream, mut state)| async move {
        loop {
            let ended = match stream.next().await {
                Some(Ok(mut sse)) => {
                    state.resumption.saw(sse.id.as_deref(), sse.retry);
                    if answers(sse.data.as_deref(), &state.request) {
                        state.resumption.answered();
                    }
                    mark_related(&mut sse.data, Some(&state.request));
                    return Some((Ok(sse), (stream, state)));
                }
                Some(Err(e)) => Some(e),
                None => None,
            };
            let Some(last) = state.resumption.next().await else {
                // Nothing to resume: the stream ends as it ended.
                return ended.map(|e| (Err(e), (stream, state)));
            };
            let Resume { client, uri, session, auth, headers, .. } = &state.resume;
            match client.get_stream(uri.clone(), session.clone(), Some(last), auth.clone(), headers.clone()).await {
                Ok(next) => stream = next,
                Err(e) => {
                    tracing::debug!(error = %e, "resuming a request's event stream failed");
                    return ended.map(|e| (Err(e), (stream, state)));
                }
            }
        }
    });
    StreamableHttpPostResponse::Sse(Box::pin(continued), session)
}

/// What resuming a request's event stream needs: the request's own endpoint, session and
/// headers.
pub(crate) struct Resume {
    client: reqwest::Client,
    uri: Arc<str>,
    session: Option<Arc<str>>,
    auth: Option<String>,
    headers: HashMap<HeaderName, HeaderValue>,
    /// The request is on protocol 2026-07-28, which has no resumption.
    modern: bool,
}

struct Resuming {
    resume: Resume,
    request: Value,
    resumption: Resumption,
}

/// Whether an SSE event's data is the answer (result or error) to `request`.
fn answers(data: Option<&str>, request: &Value) -> bool {
    let Some(text) = data.filter(|t| t.contains("\"id\"")) else { return false };
    let Ok(Value::Object(message)) = serde_json::from_str::<Value>(text) else { return false };
    message.get("id") == Some(request) && (message.contains_key("result") || message.contains_key("error"))
}

/// The session's own event stream: no message on it may claim a request.
fn unrelated(stream: BoxedSseResponse) -> BoxedSseResponse {
    Box::pin(stream.map(|event| {
        event.map(|mut sse| {
            mark_related(&mut sse.data, None);
            sse
        })
    }))
}

/// The JSON-RPC id of a request being POSTed (`None` for anything else).
fn request_id(message: &ClientJsonRpcMessage) -> Option<Value> {
    match message {
        ClientJsonRpcMessage::Request(r) => serde_json::to_value(&r.id).ok(),
        _ => None,
    }
}

/// How the gateway reaches a Streamable HTTP upstream's session, as rmcp's client last sent
/// a request there: what the lean relay (`proxy::lean`) needs to send a call itself on
/// the same session, with the same headers and the same per-request `_meta`.
pub struct Wire {
    /// The upstream's endpoint (parsed once: a URL parse per call is measurable).
    pub url: reqwest::Url,
    pub session: Option<Arc<str>>,
    /// The declaration's headers and the negotiated `MCP-Protocol-Version`; none that belongs
    /// to one request (the assertion, the standard `Mcp-Method`/`Mcp-Name`/`Mcp-Param-*`).
    pub headers: http::HeaderMap,
    /// What the protocol puts in every request's `_meta` (on 2026-07-28: the version, the
    /// client's info and capabilities); no progress token, assertion or credential.
    pub meta: serde_json::Map<String, Value>,
    /// The negotiated version asks for the standard request headers (2026-07-28 and later).
    pub standard_headers: bool,
}

impl Wire {
    /// Whether a call's event stream that ends before its answer is resumed (`GET` with
    /// `Last-Event-ID`): on the session revisions; 2026-07-28, the revision that brought the
    /// standard headers, has no resumption (an ended stream is the request's end).
    pub fn resumable(&self) -> bool {
        !self.standard_headers
    }
}

/// The latest [`Wire`] of one connection (none before its first request, and none for an
/// upstream whose requests carry a credential: the lean relay leaves those to rmcp).
#[derive(Default)]
pub struct WireSlot(Mutex<Option<Arc<Wire>>>);

impl WireSlot {
    pub fn current(&self) -> Option<Arc<Wire>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Forgets the session (its connection is being replaced).
    pub fn clear(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Records how `message` is being sent, if it is an ordinary request and anything changed.
    fn record(
        &self,
        uri: &Arc<str>,
        session: Option<&Arc<str>>,
        headers: &Headers,
        message: &ClientJsonRpcMessage,
        assertion: &HeaderName,
    ) {
        let ClientJsonRpcMessage::Request(request) = message else { return };
        if matches!(
            request.request,
            rmcp::model::ClientRequest::InitializeRequest(_) | rmcp::model::ClientRequest::DiscoverRequest(_)
        ) {
            return;
        }
        let version = headers.get(&HeaderName::from_static(PROTOCOL_VERSION_HEADER));
        let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(wire) = slot.as_ref()
            && wire.session.as_deref() == session.map(|s| &**s)
            && wire.headers.get(PROTOCOL_VERSION_HEADER) == version
        {
            return;
        }
        let per_request = |name: &HeaderName| {
            if name == assertion {
                return true;
            }
            let name = name.as_str();
            name == "mcp-method"
                || name == "mcp-name"
                || name.starts_with("mcp-param-")
                || TRACE_CONTEXT_FIELDS.contains(&name)
        };
        let mut kept = http::HeaderMap::new();
        for (name, value) in headers.iter().filter(|(name, _)| !per_request(name)) {
            kept.insert(name.clone(), value.clone());
        }
        let mut meta = request.request.get_meta().0.0.clone();
        for key in ["progressToken", ASSERTION_META_KEY, AUTHORIZATION_META_KEY, RELATED_META_KEY] {
            meta.remove(key);
        }
        for key in TRACE_CONTEXT_FIELDS {
            meta.remove(key);
        }
        let Ok(url) = reqwest::Url::parse(uri) else { return };
        let standard_headers = standard_headers(headers);
        *slot = Some(Arc::new(Wire { url, session: session.cloned(), headers: kept, meta, standard_headers }));
    }
}

const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";

/// Whether the protocol version a message is sent with asks for the standard request headers
/// (2026-07-28 and later).
fn standard_headers(headers: &Headers) -> bool {
    headers
        .get(&HeaderName::from_static(PROTOCOL_VERSION_HEADER))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::STANDARD_HEADERS.as_str())
}

/// The headers rmcp hands its HTTP client with each message.
type Headers = HashMap<HeaderName, HeaderValue>;

/// Takes an empty `_meta` off a message (what was in it moved to headers): an empty `_meta` is
/// never sent, as a 2026-07-28 server reads a message that has one as a modern request.
fn drop_empty_meta(message: &mut ClientJsonRpcMessage) {
    use rmcp::model::{GetExtensions, NotificationMetaObject, RequestMetaObject};
    match message {
        ClientJsonRpcMessage::Request(r) if r.request.get_meta().0.is_empty() => {
            r.request.extensions_mut().remove::<RequestMetaObject>();
        }
        ClientJsonRpcMessage::Notification(n) if n.notification.get_meta().0.is_empty() => {
            n.notification.extensions_mut().remove::<NotificationMetaObject>();
        }
        _ => {}
    }
}

/// rmcp's reqwest client, with each call's assertion moved from `_meta` to a header.
#[derive(Clone)]
pub struct AssertingClient {
    inner: reqwest::Client,
    header: HeaderName,
    /// The access token the gateway last sent with a message (executor side only).
    token: Arc<Mutex<Option<String>>>,
    /// Where how requests are sent is recorded, for the lean relay (gateway side only).
    wire: Option<Arc<WireSlot>>,
}

impl AssertingClient {
    pub fn new(inner: reqwest::Client, header: HeaderName) -> Self {
        Self { inner, header, token: Arc::default(), wire: None }
    }

    /// Records how each request is sent in `wire` (for a connection without credentials).
    pub fn recording(mut self, wire: Arc<WireSlot>) -> Self {
        self.wire = Some(wire);
        self
    }

    /// Only a connection without credentials records (see `executor`): a credential is per
    /// request and refreshed by rmcp, so such a session is never reached around it.
    fn record(&self, uri: &Arc<str>, session: Option<&Arc<str>>, headers: &Headers, message: &ClientJsonRpcMessage) {
        if let Some(wire) = &self.wire {
            wire.record(uri, session, headers, message, &self.header);
        }
    }

    /// The bearer token for a request: the one the gateway put in this message's `_meta`
    /// (taken out of it), else the last one it sent, else what rmcp passed.
    fn bearer(&self, message: &mut ClientJsonRpcMessage, passed: Option<String>) -> Option<String> {
        // `get_meta_mut` adds an empty `_meta` to a message that had none (and an empty
        // `_meta` makes a 2026-07-28 server read the message as a modern one): only a message
        // that carries the key is touched.
        let meta = match message {
            ClientJsonRpcMessage::Request(r) if r.request.get_meta().0.contains_key(AUTHORIZATION_META_KEY) => {
                Some(&mut r.request.get_meta_mut().0.0)
            }
            ClientJsonRpcMessage::Notification(n)
                if n.notification.get_meta().0.contains_key(AUTHORIZATION_META_KEY) =>
            {
                Some(&mut n.notification.get_meta_mut().0.0)
            }
            _ => None,
        };
        let mut last = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Value::String(token)) = meta.and_then(|m| m.remove(AUTHORIZATION_META_KEY)) {
            *last = Some(token);
        }
        drop_empty_meta(message);
        last.clone().or(passed)
    }

    fn last_bearer(&self, passed: Option<String>) -> Option<String> {
        self.token.lock().unwrap_or_else(|p| p.into_inner()).clone().or(passed)
    }

    /// Prepares a message for the upstream (the assertion and trace context into headers, the
    /// credential out of `_meta`, the wire recorded): the bearer token to send, and for a
    /// request its id and what resuming its event stream would need (the headers that belong to
    /// that one request, its assertion and trace context, are not sent again).
    fn outgoing(
        &self,
        uri: &Arc<str>,
        message: &mut ClientJsonRpcMessage,
        session: &Option<Arc<str>>,
        auth: Option<String>,
        headers: &mut HashMap<HeaderName, HeaderValue>,
    ) -> (Option<String>, Option<(Value, Resume)>) {
        self.lift(message, headers);
        let auth = self.bearer(message, auth);
        self.record(uri, session.as_ref(), headers, message);
        let request = request_id(message).map(|id| {
            let modern = standard_headers(headers);
            let headers = headers
                .iter()
                .filter(|(name, _)| **name != self.header && !TRACE_CONTEXT_FIELDS.contains(&name.as_str()))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            let resume = Resume {
                client: self.inner.clone(),
                uri: Arc::clone(uri),
                session: session.clone(),
                auth: auth.clone(),
                headers,
                modern,
            };
            (id, resume)
        });
        (auth, request)
    }

    /// Takes the assertion and the trace context out of a request's `_meta` (calls, prompts,
    /// resources, completions) and into `headers`.
    fn lift(&self, message: &mut ClientJsonRpcMessage, headers: &mut HashMap<HeaderName, HeaderValue>) {
        let ClientJsonRpcMessage::Request(request) = message else {
            return;
        };
        let carried = request.request.get_meta();
        if !carried.0.contains_key(ASSERTION_META_KEY)
            && !TRACE_CONTEXT_FIELDS.iter().any(|f| carried.0.contains_key(*f))
        {
            return;
        }
        let meta = request.request.get_meta_mut();
        if let Some(Value::String(token)) = meta.0.0.remove(ASSERTION_META_KEY)
            && let Ok(value) = HeaderValue::from_str(&token)
        {
            headers.insert(self.header.clone(), value);
        }
        for field in TRACE_CONTEXT_FIELDS {
            if let Some(Value::String(text)) = meta.0.0.remove(field)
                && let Ok(value) = HeaderValue::from_str(&text)
            {
                headers.insert(HeaderName::from_static(field), value);
            }
        }
        drop_empty_meta(message);
    }
}

impl StreamableHttpClient for AssertingClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let (auth_header, request) = self.outgoing(&uri, &mut message, &session_id, auth_header, &mut custom_headers);
        let response = self.inner.post_message(uri, message, session_id, auth_header, custom_headers).await?;
        Ok(related_to(response, request))
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let (auth_header, request) = self.outgoing(&uri, &mut message, &session_id, auth_header, &mut custom_headers);
        let response = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(related_to(response, request))
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let (auth_header, request) = self.outgoing(&uri, &mut message, &session_id, auth_header, &mut custom_headers);
        let response = self
            .inner
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
            .await?;
        Ok(related_to(response, request))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner.delete_session(uri, session_id, self.last_bearer(auth_header), custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        let stream = self
            .inner
            .get_stream(uri, session_id, last_event_id, self.last_bearer(auth_header), custom_headers)
            .await?;
        Ok(unrelated(stream))
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        let stream = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                self.last_bearer(auth_header),
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(unrelated(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_keeps_the_sessions_headers_and_meta_and_nothing_of_one_request() {
        use rmcp::model::{ClientRequest, ListToolsRequest, RequestId};
        let mut request = ClientRequest::ListToolsRequest(ListToolsRequest::default());
        let meta = request.get_meta_mut();
        meta.0.0.insert("progressToken".to_owned(), serde_json::json!(3));
        meta.0.0.insert(ASSERTION_META_KEY.to_owned(), serde_json::json!("jws"));
        meta.0.0.insert("io.modelcontextprotocol/protocolVersion".to_owned(), serde_json::json!("2026-07-28"));
        // One call's trace context: never replayed on another call.
        meta.0.0.insert(
            "traceparent".to_owned(),
            serde_json::json!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        meta.0.0.insert("tracestate".to_owned(), serde_json::json!("v=1"));
        let message = ClientJsonRpcMessage::request(request, RequestId::Number(1));
        let assertion = HeaderName::from_static("x-scopegate-identity");
        let headers: HashMap<HeaderName, HeaderValue> = [
            ("mcp-protocol-version", "2026-07-28"),
            ("x-declared", "kept"),
            ("mcp-method", "tools/list"),
            ("mcp-name", "x"),
            ("mcp-param-region", "eu"),
            ("x-scopegate-identity", "jws"),
            ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ("tracestate", "v=1"),
        ]
        .into_iter()
        .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
        .collect();
        let slot = WireSlot::default();
        let uri: Arc<str> = "http://upstream/mcp".into();
        slot.record(&uri, None, &headers, &message, &assertion);
        let wire = slot.current().expect("recorded");
        let mut kept: Vec<&str> = wire.headers.keys().map(HeaderName::as_str).collect();
        kept.sort();
        assert_eq!(kept, ["mcp-protocol-version", "x-declared"]);
        assert!(wire.standard_headers);
        assert_eq!(wire.meta.keys().collect::<Vec<_>>(), ["io.modelcontextprotocol/protocolVersion"]);

        // The handshake is never the template; a new session replaces the old one.
        let session: Arc<str> = "s-2".into();
        let init = ClientJsonRpcMessage::request(
            ClientRequest::InitializeRequest(rmcp::model::InitializeRequest::new(Default::default())),
            RequestId::Number(2),
        );
        slot.record(&uri, Some(&session), &headers, &init, &assertion);
        assert_eq!(slot.current().unwrap().session, None);
        slot.record(&uri, Some(&session), &headers, &message, &assertion);
        assert_eq!(slot.current().unwrap().session.as_deref(), Some("s-2"));
        slot.clear();
        assert!(slot.current().is_none());
    }

    #[test]
    fn messages_on_a_request_stream_are_marked_and_claims_elsewhere_removed() {
        let id = serde_json::json!(7);
        let mut log = Some(
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#.to_owned(),
        );
        mark_related(&mut log, Some(&id));
        let marked: Value = serde_json::from_str(log.as_deref().unwrap()).unwrap();
        assert_eq!(marked["params"]["_meta"][RELATED_META_KEY], 7);

        // An upstream's own claim is overwritten on a request's stream...
        let mut forged = Some(format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{{"_meta":{{"{RELATED_META_KEY}":99}}}}}}"#
        ));
        mark_related(&mut forged, Some(&id));
        let marked: Value = serde_json::from_str(forged.as_deref().unwrap()).unwrap();
        assert_eq!(marked["params"]["_meta"][RELATED_META_KEY], 7);
        // ...and removed on the session's own stream.
        let mut forged = Some(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"_meta":{{"{RELATED_META_KEY}":99}}}}}}"#
        ));
        mark_related(&mut forged, None);
        let cleaned: Value = serde_json::from_str(forged.as_deref().unwrap()).unwrap();
        assert!(cleaned["params"]["_meta"].get(RELATED_META_KEY).is_none());

        // An answer is left as it is.
        let answer = r#"{"jsonrpc":"2.0","id":7,"result":{}}"#;
        let mut data = Some(answer.to_owned());
        mark_related(&mut data, Some(&id));
        assert_eq!(data.as_deref(), Some(answer));
    }
}
