//! Forwarding one `/mcp` request to the replica where what it continues waits (a multi
//! round-trip exchange whose upstream request is open there): the request goes on as it came
//! (method, headers, body; its `Host` kept, so that replica's host check sees the caller's),
//! marked with [`FORWARDED_HEADER`], and its answer comes back as it streams.
//!
//! The mark only stops a second forward: a request that carries it is served where it lands.
//! It grants nothing (a caller who sets it only keeps its own request from being forwarded),
//! and the replica that serves a forwarded request authenticates the caller's own token again.

use axum::body::{Body, Bytes};
use http::{HeaderName, HeaderValue, Response, header};

use super::Cluster;

/// Marks a request one replica forwarded to another (its value: the forwarding replica's id).
pub const FORWARDED_HEADER: &str = "scopegate-forwarded";

/// Why a request could not be forwarded (the caller's request was not sent, or its answer did
/// not come).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("replica {0} is not alive")]
    Gone(String),
    #[error("replica {replica}: {message}")]
    Failed { replica: String, message: String },
}

/// Headers that describe one hop's connection, not the request (RFC 9110 section 7.6.1), and
/// the length, which the client sets again.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "proxy-authorization"
            | "proxy-authenticate"
    )
}

impl Cluster {
    /// Sends `head` and `body` (a `/mcp` POST) to replica `to` and returns its answer.
    pub async fn forward(
        &self,
        to: &str,
        head: &http::request::Parts,
        body: Bytes,
    ) -> Result<Response<Body>, ForwardError> {
        let url = self.peer_url(to).await.ok_or_else(|| ForwardError::Gone(to.to_owned()))?;
        let failed = |message: String| ForwardError::Failed { replica: to.to_owned(), message };
        let path = head.uri.path_and_query().map_or("/mcp", http::uri::PathAndQuery::as_str);
        let mut headers = http::HeaderMap::with_capacity(head.headers.len() + 1);
        for (name, value) in &head.headers {
            if !hop_by_hop(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        let mark = HeaderValue::from_str(&self.id).map_err(|e| failed(e.to_string()))?;
        headers.insert(HeaderName::from_static(FORWARDED_HEADER), mark);
        let response = self
            .http
            .request(head.method.clone(), format!("{url}{path}"))
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut answer = Response::builder().status(response.status());
        for (name, value) in response.headers() {
            if !hop_by_hop(name) || name == header::CONTENT_LENGTH {
                answer = answer.header(name, value);
            }
        }
        answer.body(Body::from_stream(response.bytes_stream())).map_err(|e| failed(e.to_string()))
    }
}
