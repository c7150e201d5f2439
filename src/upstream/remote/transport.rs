//! An rmcp client transport over one tunnel channel: one JSON-RPC message per Data frame.
//! Carries what rmcp hands it and nothing else; never looks inside a message.

use bytes::Bytes;
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

use crate::tunnel::{Channel, ChannelReceiver, ChannelSender, TunnelError};

/// The gateway's end of a channel to a server running on an executor.
pub struct ChannelTransport {
    server: String,
    tx: ChannelSender,
    rx: ChannelReceiver,
}

impl ChannelTransport {
    pub fn new(server: &str, channel: Channel) -> Self {
        let (tx, rx) = channel.split();
        Self { server: server.to_owned(), tx, rx }
    }
}

impl Transport<RoleClient> for ChannelTransport {
    type Error = TunnelError;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let tx = self.tx.clone();
        let encoded = serde_json::to_vec(&item);
        async move {
            // Serializing rmcp's own message types does not fail; if it ever did, the
            // message is not sent rather than sent mangled.
            let encoded = encoded.map_err(|e| TunnelError::Closed(format!("encoding a message: {e}")))?;
            tx.send(Bytes::from(encoded)).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.rx.recv().await?;
            match serde_json::from_slice(&message) {
                Ok(message) => return Some(message),
                // A server's stdout line that is not JSON-RPC (a stray print): skipped, as the
                // local stdio transport would not deliver it either.
                Err(e) => {
                    tracing::debug!(server = %self.server, error = %e, "non-JSON-RPC message from the executor; skipped")
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.tx.close("");
        Ok(())
    }
}
