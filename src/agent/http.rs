//! Streamable HTTP servers reached over the agent's network: JSON-RPC messages of the channel
//! bridged to rmcp's HTTP client, the call's identity assertion moved into its header. It
//! never sends the gateway anything but the server's own messages.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError};
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Host;

/// The longest one handshake message may take to reach the HTTP server (the gateway gives up
/// on the whole handshake sooner, at its connect timeout).
const HANDSHAKE_SEND: std::time::Duration = std::time::Duration::from_secs(30);
use super::io::{MessageSink, MessageSource};
use crate::wire::UNAUTHORIZED_DATA_KEY;
use crate::wire::client::AssertingClient;

pub struct HttpServer {
    server: String,
    transport: StreamableHttpClientTransport<AssertingClient>,
    max_frame: usize,
}

impl HttpServer {
    pub(super) fn new(
        host: &Host,
        server: &str,
        url: &str,
        headers: &BTreeMap<String, String>,
        assertion_header: &str,
    ) -> Result<Self, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("url {url:?}: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("url {url:?}: not an http: or https: URL"));
        }
        let mut custom = HashMap::new();
        for (name, value) in headers {
            let bad = || format!("bad header {name:?} in the declaration");
            let name = HeaderName::try_from(name.as_str()).map_err(|_| bad())?;
            let value = HeaderValue::try_from(value.as_str()).map_err(|_| bad())?;
            custom.insert(name, value);
        }
        let assertion = HeaderName::try_from(assertion_header)
            .map_err(|_| format!("bad assertion header name {assertion_header:?}"))?;
        let mut config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom);
        config.max_concurrent_requests = 256;
        let client = AssertingClient::new(host.http.clone(), assertion);
        let transport = StreamableHttpClientTransport::with_client(client, config);
        Ok(Self { server: server.to_owned(), transport, max_frame: host.max_frame })
    }

    pub(super) async fn run(self, sink: impl MessageSink, mut source: impl MessageSource, stop: CancellationToken) {
        let Self { server, mut transport, max_frame } = self;
        // Requests go out concurrently (a slow call must not hold up the others); one that
        // could not be delivered is answered with an error so the gateway's caller is not left
        // waiting. Until the handshake is over, one at a time and in order, as rmcp's own
        // client does: a message enters rmcp's HTTP worker only when its send is first polled,
        // and the worker takes the message after `initialize` to be `initialized`.
        let (failed_tx, mut failed_rx) = mpsc::unbounded_channel::<(RequestId, String, bool)>();
        let mut sends = tokio::task::JoinSet::new();
        let mut handshaking = true;
        let reason = loop {
            tokio::select! {
                message = source.recv() => {
                    let Some(message) = message else { break String::new() };
                    let message = match serde_json::from_slice::<ClientJsonRpcMessage>(&message) {
                        Ok(message) => message,
                        Err(e) => break format!("a message from the gateway is not a JSON-RPC client message: {e}"),
                    };
                    let id = match &message {
                        ClientJsonRpcMessage::Request(request) => Some(request.id.clone()),
                        _ => None,
                    };
                    let initialized = matches!(
                        &message,
                        ClientJsonRpcMessage::Notification(n)
                            if matches!(n.notification, ClientNotification::InitializedNotification(_))
                    );
                    let send = transport.send(message);
                    let failed = failed_tx.clone();
                    let delivered = async move {
                        if let Err(e) = send.await
                            && let Some(id) = id
                        {
                            let _ = failed.send((id, e.to_string(), refused_credential(&e)));
                        }
                    };
                    if handshaking {
                        tokio::select! {
                            done = tokio::time::timeout(HANDSHAKE_SEND, delivered) => if done.is_err() {
                                break "the HTTP server did not take the handshake in time".to_owned();
                            },
                            () = stop.cancelled() => break "the executor is stopping".to_owned(),
                        }
                        handshaking = !initialized;
                    } else {
                        sends.spawn(delivered);
                    }
                }
                received = transport.receive() => {
                    let Some(received) = received else { break "the HTTP server's connection ended".to_owned() };
                    match forward(&sink, &received, max_frame).await {
                        Ok(()) => {}
                        Err(Some(reason)) => break reason,
                        Err(None) => break String::new(),
                    }
                }
                Some((id, error, unauthorized)) = failed_rx.recv() => {
                    // A 401 is marked so the gateway refreshes the token and sends the request
                    // again; the message names no token either way.
                    let answer = if unauthorized {
                        let data = serde_json::json!({ UNAUTHORIZED_DATA_KEY: true });
                        ErrorData::internal_error("the server refused the executor's credential (HTTP 401)", Some(data))
                    } else {
                        ErrorData::internal_error(format!("the executor could not reach the server: {error}"), None)
                    };
                    let answer = ServerJsonRpcMessage::error(answer, Some(id));
                    if let Err(reason) = forward(&sink, &answer, max_frame).await {
                        break reason.unwrap_or_default();
                    }
                }
                () = stop.cancelled() => break "the executor is stopping".to_owned(),
            }
        };
        sends.abort_all();
        let _ = transport.close().await;
        tracing::info!(%server, "HTTP server channel ended: {}", if reason.is_empty() { "closed" } else { &reason });
        sink.close(&reason);
    }
}

/// Whether a failed send was the server refusing the credential (HTTP 401), anywhere in the
/// error's chain of causes.
fn refused_credential(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(StreamableHttpError::AuthRequired(_)) = e.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Sends one of the server's messages; `Err(Some(reason))` closes the channel with a reason,
/// `Err(None)` means the channel is already gone.
async fn forward(sink: &impl MessageSink, message: &ServerJsonRpcMessage, max: usize) -> Result<(), Option<String>> {
    let bytes = serde_json::to_vec(message).map_err(|e| Some(format!("encoding a server message: {e}")))?;
    if bytes.len() > max {
        return Err(Some(format!("the server sent a message of {} bytes, over the frame limit of {max}", bytes.len())));
    }
    sink.send(Bytes::from(bytes)).await.map_err(|_| None)
}
