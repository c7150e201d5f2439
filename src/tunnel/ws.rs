//! The WebSocket handshake of the tunnel, both ends: the gateway's upgrade answer and the agent's
//! dial. Never authenticates anyone (the gateway's route does, before it accepts).

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use super::{CONNECT_PATH, DialError, Settings, Upgrading, frame};

/// The most of a refusal's body kept for the error.
const MAX_REFUSAL_BODY: usize = 1024;

/// The WebSocket limits of a tunnel: no message or frame over `max_frame` plus the header.
pub fn ws_config(settings: &Settings) -> WebSocketConfig {
    let max = settings.max_frame.saturating_add(frame::HEADER);
    WebSocketConfig::default().max_message_size(Some(max)).max_frame_size(Some(max))
}

/// Whether one of `name`'s comma-separated values is `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|item| item.trim().eq_ignore_ascii_case(token))
}

pub(super) fn accept_upgrade(
    request: &mut http::Request<axum::body::Body>,
    settings: &Settings,
) -> Result<(http::Response<axum::body::Body>, Upgrading), String> {
    if request.method() != Method::GET {
        return Err(format!("a WebSocket upgrade is a GET, not a {}", request.method()));
    }
    let headers = request.headers();
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Err("the request does not ask to upgrade to websocket (Upgrade header)".to_owned());
    }
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err("the request's Connection header does not name upgrade".to_owned());
    }
    if headers.get(header::SEC_WEBSOCKET_VERSION).map(HeaderValue::as_bytes) != Some(b"13") {
        return Err("the request's Sec-WebSocket-Version is not 13".to_owned());
    }
    let key =
        headers.get(header::SEC_WEBSOCKET_KEY).ok_or_else(|| "the request has no Sec-WebSocket-Key".to_owned())?;
    // RFC 6455: the key is 16 random bytes in base64.
    match base64::engine::general_purpose::STANDARD.decode(key.as_bytes()) {
        Ok(bytes) if bytes.len() == 16 => {}
        _ => return Err("the request's Sec-WebSocket-Key is not 16 bytes in base64".to_owned()),
    }
    let accept = derive_accept_key(key.as_bytes());
    if request.extensions().get::<hyper::upgrade::OnUpgrade>().is_none() {
        return Err("this connection cannot be upgraded (it is not HTTP/1.1)".to_owned());
    }
    let on_upgrade = hyper::upgrade::on(request);
    let response = http::Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(axum::body::Body::empty())
        .map_err(|e| format!("the upgrade answer cannot be built: {e}"))?;
    Ok((response, Upgrading { on_upgrade, config: ws_config(settings) }))
}

pub(super) async fn ready(
    upgrading: Upgrading,
) -> Result<WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>, String> {
    let upgraded = upgrading.on_upgrade.await.map_err(|e| format!("the connection was not handed over: {e}"))?;
    let io = hyper_util::rt::TokioIo::new(upgraded);
    Ok(WebSocketStream::from_raw_socket(io, Role::Server, Some(upgrading.config)).await)
}

pub(super) async fn dial(
    client: &reqwest::Client,
    base: &str,
    headers: HeaderMap,
    settings: &Settings,
) -> Result<WebSocketStream<reqwest::Upgraded>, DialError> {
    dial_at(client, base, CONNECT_PATH, headers, settings).await
}

pub(super) async fn dial_at(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    mut headers: HeaderMap,
    settings: &Settings,
) -> Result<WebSocketStream<reqwest::Upgraded>, DialError> {
    let lower = base.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(DialError::Network(format!("the gateway URL {base:?} is not an http: or https: URL")));
    }
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let key = generate_key();
    // Ours replace any the caller set: the handshake is not the caller's to change.
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    let key_value = HeaderValue::from_str(&key)
        .map_err(|e| DialError::Network(format!("the WebSocket key is not a header: {e}")))?;
    headers.insert(header::SEC_WEBSOCKET_KEY, key_value);
    let mut response = client
        .get(&url)
        .headers(headers)
        .send()
        .await
        .map_err(|e| DialError::Network(format!("{url}: {}", crate::telemetry::error_chain(&e))))?;
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let mut body = Vec::new();
        // A failed read leaves what was read: the status is the answer that matters.
        while body.len() < MAX_REFUSAL_BODY {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(MAX_REFUSAL_BODY - body.len())]),
                Ok(None) | Err(_) => break,
            }
        }
        let body = String::from_utf8_lossy(&body).trim().to_owned();
        return Err(DialError::Refused { status: status.as_u16(), body });
    }
    let expected = derive_accept_key(key.as_bytes());
    let accept = response.headers().get(header::SEC_WEBSOCKET_ACCEPT);
    if accept.map(HeaderValue::as_bytes) != Some(expected.as_bytes()) {
        return Err(DialError::Network(format!(
            "{url} answered 101 without the right Sec-WebSocket-Accept (got {accept:?}): not a WebSocket"
        )));
    }
    let upgraded = response
        .upgrade()
        .await
        .map_err(|e| DialError::Network(format!("{url}: the upgrade failed: {}", crate::telemetry::error_chain(&e))))?;
    Ok(WebSocketStream::from_raw_socket(upgraded, Role::Client, Some(ws_config(settings))).await)
}
