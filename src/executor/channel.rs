//! An rmcp client transport over one tunnel channel: one JSON-RPC message per Data frame.
//! Carries what rmcp hands it and nothing else; looks inside a message only to give an
//! OAuth-protected server's messages their access token (see [`ChannelTransport::authorized`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rmcp::model::{ClientJsonRpcMessage, GetMeta, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::auth::AuthorizationManager;
use serde_json::Value;

use crate::tunnel::{Channel, ChannelReceiver, ChannelSender, TunnelError};
use crate::wire::{AUTHORIZATION_META_KEY, UNAUTHORIZED_DATA_KEY};

/// The gateway's end of a channel to a server running on an executor.
pub struct ChannelTransport {
    server: String,
    tx: ChannelSender,
    rx: ChannelReceiver,
    auth: Option<ChannelAuth>,
    /// The 401 answers whose request could not be sent again (the refresh failed): handed to
    /// rmcp as the request's answer. The refresh runs beside `receive`, which rmcp races
    /// against its other work and drops mid-way: nothing may be half-done inside it.
    unsent: (tokio::sync::mpsc::Sender<ServerJsonRpcMessage>, tokio::sync::mpsc::Receiver<ServerJsonRpcMessage>),
}

/// The access token side of a channel to an OAuth-protected server.
#[derive(Clone)]
struct ChannelAuth {
    manager: Arc<tokio::sync::Mutex<AuthorizationManager>>,
    /// Requests sent and not yet answered, as rmcp handed them (no token), and whether they
    /// were sent again already: a request the server refuses with a 401 is sent once more
    /// with a refreshed token.
    sent: Arc<Mutex<HashMap<RequestId, (ClientJsonRpcMessage, bool)>>>,
    /// Set when the server refused the executor's token (a 401) during this channel.
    refused: Arc<AtomicBool>,
}

impl ChannelTransport {
    pub fn new(server: &str, channel: Channel) -> Self {
        let (tx, rx) = channel.split();
        Self { server: server.to_owned(), tx, rx, auth: None, unsent: tokio::sync::mpsc::channel(16) }
    }

    /// Every message carries `manager`'s access token in `_meta` (under
    /// [`AUTHORIZATION_META_KEY`]; the agent moves it into the `Authorization` header),
    /// refreshed before it expires. A request the server answers with a 401 (the agent marks
    /// the error) is sent once more after a refresh, and the caller sees only the second answer.
    pub fn authorized(mut self, manager: AuthorizationManager) -> Self {
        self.auth = Some(ChannelAuth {
            manager: Arc::new(tokio::sync::Mutex::new(manager)),
            sent: Arc::default(),
            refused: Arc::default(),
        });
        self
    }

    /// Whether the server refused the executor's token on this channel (so a handshake that
    /// failed is worth one more try after a refresh).
    pub fn refused_flag(&self) -> Option<Arc<AtomicBool>> {
        self.auth.as_ref().map(|a| Arc::clone(&a.refused))
    }
}

impl ChannelAuth {
    fn remember(&self, message: &ClientJsonRpcMessage, again: bool) {
        if let ClientJsonRpcMessage::Request(request) = message {
            lock(&self.sent).insert(request.id.clone(), (message.clone(), again));
        }
    }

    /// The message with the current access token in its `_meta`.
    async fn with_token(&self, mut message: ClientJsonRpcMessage, refresh: bool) -> Result<Vec<u8>, TunnelError> {
        let token = {
            let manager = self.manager.lock().await;
            let unusable =
                |_| TunnelError::Closed("the upstream credential can't be used: a login is needed".to_owned());
            if refresh {
                manager.refresh_token().await.map_err(unusable)?;
            }
            manager.get_access_token().await.map_err(unusable)?
        };
        let token = Value::String(token);
        match &mut message {
            ClientJsonRpcMessage::Request(r) => {
                r.request.get_meta_mut().0.0.insert(AUTHORIZATION_META_KEY.to_owned(), token);
            }
            ClientJsonRpcMessage::Notification(n) => {
                n.notification.get_meta_mut().0.0.insert(AUTHORIZATION_META_KEY.to_owned(), token);
            }
            // An answer to the server's own request: the agent uses the token it last saw.
            _ => {}
        }
        serde_json::to_vec(&message).map_err(|e| TunnelError::Closed(format!("encoding a message: {e}")))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether an answer is the agent's mark of a 401 from the server.
fn unauthorized(message: &ServerJsonRpcMessage) -> Option<&RequestId> {
    match message {
        ServerJsonRpcMessage::Error(e)
            if e.error.data.as_ref().and_then(|d| d.get(UNAUTHORIZED_DATA_KEY)) == Some(&Value::Bool(true)) =>
        {
            e.id.as_ref()
        }
        _ => None,
    }
}

fn answered(message: &ServerJsonRpcMessage) -> Option<&RequestId> {
    match message {
        ServerJsonRpcMessage::Response(r) => Some(&r.id),
        ServerJsonRpcMessage::Error(e) => e.id.as_ref(),
        _ => None,
    }
}

impl Transport<RoleClient> for ChannelTransport {
    type Error = TunnelError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let tx = self.tx.clone();
        let auth = self.auth.clone();
        let plain = if auth.is_none() { Some(serde_json::to_vec(&item)) } else { None };
        async move {
            let encoded = match (auth, plain) {
                (Some(auth), _) => {
                    auth.remember(&item, false);
                    auth.with_token(item, false).await?
                }
                // Serializing rmcp's own message types does not fail; if it ever did, the
                // message is not sent rather than sent mangled.
                (None, Some(encoded)) => {
                    encoded.map_err(|e| TunnelError::Closed(format!("encoding a message: {e}")))?
                }
                (None, None) => return Err(TunnelError::Closed("nothing to send".to_owned())),
            };
            tx.send(Bytes::from(encoded)).await
        }
    }

    /// Cancel-safe (rmcp drops it when another of its events comes first): it only reads, from
    /// the channel and from the failed refreshes; a refresh and the request sent again run in
    /// a task of their own.
    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = tokio::select! {
                message = self.rx.recv() => message?,
                Some(refused) = self.unsent.1.recv() => return Some(refused),
            };
            let message: ServerJsonRpcMessage = match serde_json::from_slice(&message) {
                Ok(message) => message,
                // A server's stdout line that is not JSON-RPC (a stray print): skipped, as the
                // local stdio transport would not deliver it either.
                Err(e) => {
                    tracing::debug!(server = %self.server, error = %e, "non-JSON-RPC message from the executor; skipped");
                    continue;
                }
            };
            let Some(auth) = &self.auth else { return Some(message) };
            if let Some(id) = unauthorized(&message) {
                auth.refused.store(true, Ordering::Release);
                let first = lock(&auth.sent).remove(id).filter(|(_, again)| !again).map(|(m, _)| m);
                if let Some(request) = first {
                    tracing::info!(server = %self.server, "the upstream refused the token (401); refreshing it once");
                    auth.remember(&request, true);
                    let (auth, tx, unsent) = (auth.clone(), self.tx.clone(), self.unsent.0.clone());
                    tokio::spawn(async move {
                        let sent = match auth.with_token(request, true).await {
                            Ok(encoded) => tx.send(Bytes::from(encoded)).await.is_ok(),
                            Err(_) => false,
                        };
                        if !sent {
                            // The caller gets the 401 rather than waiting for its timeout.
                            let _ = unsent.send(message).await;
                        }
                    });
                    continue;
                }
            } else if let Some(id) = answered(&message) {
                lock(&auth.sent).remove(id);
            }
            return Some(message);
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.tx.close("");
        Ok(())
    }
}
