//! The HTTP client for Streamable HTTP upstreams: rmcp's reqwest client, plus one thing it
//! can't do: a header whose value changes per call. The proxy puts each call's identity
//! assertion in the request's `_meta` under [`ASSERTION_META_KEY`]; this client moves it into
//! the configured header (so it never travels in the body of an HTTP call) and sends nothing
//! else of the caller's. The client's own bearer token never reaches here.

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, GetMeta};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};

/// Where a proxied request carries its identity assertion (stdio upstreams read it there).
pub const ASSERTION_META_KEY: &str = "io.scopegate/identity";

/// rmcp's reqwest client, with each call's assertion moved from `_meta` to a header.
#[derive(Clone)]
pub struct AssertingClient {
    inner: reqwest::Client,
    header: HeaderName,
}

impl AssertingClient {
    pub fn new(inner: reqwest::Client, header: HeaderName) -> Self {
        Self { inner, header }
    }

    /// Takes the assertion out of a call's `_meta` and into `headers`.
    fn lift(&self, message: &mut ClientJsonRpcMessage, headers: &mut HashMap<HeaderName, HeaderValue>) {
        let ClientJsonRpcMessage::Request(request) = message else {
            return;
        };
        if !matches!(request.request, ClientRequest::CallToolRequest(_)) {
            return;
        }
        let meta = request.request.get_meta_mut();
        if let Some(serde_json::Value::String(token)) = meta.0.0.remove(ASSERTION_META_KEY)
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
        self.inner.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        self.inner.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await
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
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
