//! Executor agents through another replica. An agent keeps one tunnel, to the replica a load
//! balancer picked for it; every other replica reaches it through that one, over a link: a
//! WebSocket from the asking replica to the holding replica's [`AGENT_LINK_PATH`], authorized
//! as one of the database's replicas (see `cluster::link`), that speaks the tunnel protocol
//! itself. The asking replica opens channels on the link exactly as on an agent's tunnel; the
//! holding replica opens each one on the agent's tunnel and splices the two, frame for frame.
//! Both hops are flow-controlled channels, so a slow reader at either end stops the writer at
//! the other, and nothing queues without bound in between.
//!
//! The link asks nothing of the holding replica's policy: the asking replica already resolved,
//! placed and checked what it opens (the agent checks paths against its root again). The
//! holding replica only checks that the asker is a replica and that it holds the agent, and
//! ends the link when the agent's tunnel ends (the asker then looks for the agent again).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::agents::Agents;
use crate::cluster::{Cluster, REPLICA_HEADER};
use crate::store::cluster::AgentHolder;
use crate::telemetry::metrics;
use crate::tunnel::{self, Channel, EXECUTOR_HEADER, PendingOpen, Settings, Side, TunnelError, TunnelHandle};
pub use crate::vocab::routes::AGENT_LINK_PATH;

/// How long the holding replica waits for the agent to open a channel asked over a link (the
/// asking replica's own timeout ends it sooner when shorter).
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);

/// How long dialing a link may take, the WebSocket handshake included.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// What a link is authorized for: one executor's agent.
pub fn purpose(executor: &str) -> String {
    format!("agent:{executor}")
}

/// Dials `holder`'s link to `executor`'s agent.
pub(super) async fn dial(
    cluster: &Cluster,
    holder: &AgentHolder,
    executor: &str,
    settings: &Settings,
) -> Result<TunnelHandle, String> {
    let mut headers = HeaderMap::new();
    let name = HeaderValue::from_str(executor).map_err(|e| e.to_string())?;
    headers.insert(HeaderName::from_static(EXECUTOR_HEADER), name);
    let auth =
        HeaderValue::from_str(&cluster.authorize(&holder.replica_id, &purpose(executor))).map_err(|e| e.to_string())?;
    headers.insert(HeaderName::from_static(REPLICA_HEADER), auth);
    let dialing = tunnel::dial_at(cluster.http(), &holder.internal_url, AGENT_LINK_PATH, headers, settings);
    let ws = tokio::time::timeout(DIAL_TIMEOUT, dialing)
        .await
        .map_err(|_| format!("no answer from {} within {DIAL_TIMEOUT:?}", holder.internal_url))?
        .map_err(|e| e.to_string())?;
    let (handle, _incoming) = tunnel::start(ws, Side::Gateway, settings.clone());
    Ok(handle)
}

/// Serves one link (the holding replica's side) until the agent's tunnel or the link ends:
/// every channel the asking replica opens is opened on the agent and spliced to it.
pub async fn serve<S>(
    agents: Arc<Agents>,
    executor: String,
    ws: tokio_tungstenite::WebSocketStream<S>,
    settings: Settings,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (link, mut incoming) = tunnel::start(ws, Side::Agent, settings);
    let Some(agent) = agents.link(&executor) else {
        link.close("the agent is not connected here");
        return;
    };
    loop {
        tokio::select! {
            why = agent.tunnel().closed() => {
                link.close(&format!("the agent left this replica: {why}"));
                return;
            }
            pending = incoming.next() => {
                let Some(pending) = pending else { return };
                tokio::spawn(carry(agent.tunnel().clone(), pending));
            }
        }
    }
}

/// Opens what the asking replica asked on the agent, and answers the asker as the agent did.
async fn carry(agent: TunnelHandle, pending: PendingOpen) {
    match agent.open(&pending.open, OPEN_TIMEOUT).await {
        Ok(channel) => {
            metrics::executor_channel("served");
            splice(pending.accept(), channel).await;
        }
        // The agent's reason as it gave it, class and all.
        Err(TunnelError::Refused(reason)) => pending.refuse(&reason),
        Err(other) => pending.refuse(&other.to_string()),
    }
}

/// Moves every message of `a` to `b` and back until either ends; the end (and its reason)
/// goes on to the other side. A direction whose destination ended just stops: the other
/// direction sees that end and carries it back.
async fn splice(a: Channel, b: Channel) {
    let (a_tx, a_rx) = a.split();
    let (b_tx, b_rx) = b.split();
    tokio::join!(pump(a_rx, &b_tx), pump(b_rx, &a_tx));
}

async fn pump(mut from: tunnel::ChannelReceiver, to: &tunnel::ChannelSender) {
    loop {
        let Some(message) = from.recv().await else {
            to.close(&from.close_reason().unwrap_or_default());
            return;
        };
        if to.send(message).await.is_err() {
            return;
        }
    }
}
