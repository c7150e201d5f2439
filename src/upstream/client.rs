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
        self.inner.post_message(uri, message, session_id, auth_header, custom_headers).await
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
        self.inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
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
        self.inner
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
            .await
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
        self.inner.get_stream(uri, session_id, last_event_id, self.last_bearer(auth_header), custom_headers).await
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
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                self.last_bearer(auth_header),
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
