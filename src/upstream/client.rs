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

pub use super::oauth::AUTHORIZATION_META_KEY;

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
/// with that request's id.
fn related_to(response: StreamableHttpPostResponse, id: Option<Value>) -> StreamableHttpPostResponse {
    match response {
        StreamableHttpPostResponse::Sse(stream, session) => {
            let marked = stream.map(move |event| {
                event.map(|mut sse| {
                    mark_related(&mut sse.data, id.as_ref());
                    sse
                })
            });
            StreamableHttpPostResponse::Sse(Box::pin(marked), session)
        }
        other => other,
    }
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

/// rmcp's reqwest client, with each call's assertion moved from `_meta` to a header.
#[derive(Clone)]
pub struct AssertingClient {
    inner: reqwest::Client,
    header: HeaderName,
    /// The access token the gateway last sent with a message (executor side only).
    token: Arc<Mutex<Option<String>>>,
}

impl AssertingClient {
    pub fn new(inner: reqwest::Client, header: HeaderName) -> Self {
        Self { inner, header, token: Arc::default() }
    }

    /// The bearer token for a request: the one the gateway put in this message's `_meta`
    /// (taken out of it), else the last one it sent, else what rmcp passed.
    fn bearer(&self, message: &mut ClientJsonRpcMessage, passed: Option<String>) -> Option<String> {
        let meta = match message {
            ClientJsonRpcMessage::Request(r) => Some(&mut r.request.get_meta_mut().0.0),
            ClientJsonRpcMessage::Notification(n) => Some(&mut n.notification.get_meta_mut().0.0),
            _ => None,
        };
        let mut last = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Value::String(token)) = meta.and_then(|m| m.remove(AUTHORIZATION_META_KEY)) {
            *last = Some(token);
        }
        last.clone().or(passed)
    }

    fn last_bearer(&self, passed: Option<String>) -> Option<String> {
        self.token.lock().unwrap_or_else(|p| p.into_inner()).clone().or(passed)
    }

    /// Takes the assertion out of a request's `_meta` (calls, prompts, resources, completions)
    /// and into `headers`.
    fn lift(&self, message: &mut ClientJsonRpcMessage, headers: &mut HashMap<HeaderName, HeaderValue>) {
        let ClientJsonRpcMessage::Request(request) = message else {
            return;
        };
        let meta = request.request.get_meta_mut();
        if let Some(Value::String(token)) = meta.0.0.remove(ASSERTION_META_KEY)
            && let Ok(value) = HeaderValue::from_str(&token)
        {
            headers.insert(self.header.clone(), value);
        }
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
        self.lift(&mut message, &mut custom_headers);
        let auth_header = self.bearer(&mut message, auth_header);
        let id = request_id(&message);
        let response = self.inner.post_message(uri, message, session_id, auth_header, custom_headers).await?;
        Ok(related_to(response, id))
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
        self.lift(&mut message, &mut custom_headers);
        let auth_header = self.bearer(&mut message, auth_header);
        let id = request_id(&message);
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
        Ok(related_to(response, id))
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
        self.lift(&mut message, &mut custom_headers);
        let auth_header = self.bearer(&mut message, auth_header);
        let id = request_id(&message);
        let response = self
            .inner
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
            .await?;
        Ok(related_to(response, id))
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
