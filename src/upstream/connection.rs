//! One upstream server for one tenant and one resolved declaration: started lazily on its
//! executor, restarted on the next use after a crash, closed when idle. Never decides who may
//! call it (the snapshot's grants do).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::model::Tool;
use rmcp::service::{Peer, RoleClient, RunningService};

use super::executor::{Executor, UpstreamError};
use super::oauth::{TokenOwner, UpstreamOAuth};
use super::routing::{ProxyClient, Routes};
use super::runtime::NAME_SEPARATOR;
use super::{ResolvedServer, ServerName};
use crate::store::now_millis;
use crate::telemetry::metrics;

/// A started upstream connection, found to have the tool about to be called.
pub struct Upstream(pub(super) Peer<RoleClient>);

pub(super) struct Live {
    service: RunningService<RoleClient, ProxyClient>,
    /// The upstream's tools, as it named them (valid, unique names only).
    tools: Arc<Vec<Tool>>,
}

/// How an OAuth-protected server's connection is authorized: whose credential it carries.
pub struct ConnectionAuth {
    pub oauth: Arc<UpstreamOAuth>,
    pub owner: TokenOwner,
}

/// One upstream server for one tenant and one resolved declaration (and, for a server whose
/// OAuth tokens are per user, one user).
pub struct Connection {
    server: ResolvedServer,
    executor: Executor,
    pub(super) auth: Option<ConnectionAuth>,
    pub(super) routes: Arc<Routes>,
    pub(super) live: tokio::sync::Mutex<Option<Live>>,
    pub(super) last_used_ms: AtomicI64,
    pub(super) in_flight: AtomicUsize,
}

impl Connection {
    pub(super) fn new(server: ResolvedServer, executor: Executor, auth: Option<ConnectionAuth>) -> Self {
        Self {
            server,
            executor,
            auth,
            routes: Arc::default(),
            live: tokio::sync::Mutex::new(None),
            last_used_ms: AtomicI64::new(now_millis()),
            in_flight: AtomicUsize::new(0),
        }
    }

    pub fn server(&self) -> &ServerName {
        &self.server.name
    }

    /// The running connection, started (or restarted after a crash) if need be.
    pub(super) async fn ready(&self, timeout: Duration) -> Result<(Peer<RoleClient>, Arc<Vec<Tool>>), UpstreamError> {
        self.last_used_ms.store(now_millis(), Ordering::Relaxed);
        let mut live = self.live.lock().await;
        if let Some(current) = live.as_ref() {
            if !current.service.peer().is_transport_closed() {
                return Ok((current.service.peer().clone(), Arc::clone(&current.tools)));
            }
            tracing::warn!(server = %self.server.name, "upstream connection closed; restarting it");
            metrics::upstream_restart(self.server.name.as_str());
        }
        // Dropping the old service kills its child process.
        *live = None;
        let handler = ProxyClient { routes: Arc::clone(&self.routes), server: self.server.name.to_string() };
        let service = match &self.auth {
            None => self.executor.connect(&self.server, handler, timeout, None).await?,
            Some(auth) => {
                let manager = auth.oauth.manager(&auth.owner, &self.server, &self.executor).await?;
                match self.executor.connect(&self.server, handler.clone(), timeout, Some(manager)).await {
                    // Refused during the handshake (a revoked token that has not expired):
                    // once more with a refreshed one.
                    Err(UpstreamError::Unauthorized { .. }) => {
                        let manager = auth.oauth.refreshed(&auth.owner, &self.server, &self.executor).await?;
                        self.executor.connect(&self.server, handler, timeout, Some(manager)).await?
                    }
                    other => other?,
                }
            }
        };
        let listed = tokio::time::timeout(timeout, service.peer().list_all_tools()).await;
        let tools = match listed {
            Ok(Ok(tools)) => usable_tools(self.server.name.as_str(), tools),
            Ok(Err(e)) => return Err(UpstreamError::Connect(format!("listing tools: {e}"))),
            Err(_) => return Err(UpstreamError::ConnectTimeout(timeout)),
        };
        let tools = Arc::new(tools);
        let peer = service.peer().clone();
        *live = Some(Live { service, tools: Arc::clone(&tools) });
        Ok((peer, tools))
    }

    /// Closes the connection if it has been idle for `idle`; the next use starts it again.
    pub(super) async fn close_if_idle(&self, idle: Duration) {
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        if self.in_flight.load(Ordering::Acquire) > 0
            || now_millis() - self.last_used_ms.load(Ordering::Relaxed) < idle_ms
        {
            return;
        }
        if let Ok(mut live) = self.live.try_lock()
            && let Some(old) = live.take()
        {
            tracing::debug!(server = %self.server.name, "closing an idle upstream connection");
            let _ = old.service.cancel().await;
        }
    }

    pub(super) async fn close(&self) {
        if let Some(old) = self.live.lock().await.take() {
            let _ = old.service.cancel().await;
        }
    }
}

/// Tool names the gateway can serve as `server__tool`: MCP's tool-name characters, within
/// 128 characters once prefixed, each name once (the first wins).
fn usable_tools(server: &str, tools: Vec<Tool>) -> Vec<Tool> {
    let mut seen = std::collections::HashSet::new();
    tools
        .into_iter()
        .filter(|tool| {
            let name = tool.name.as_ref();
            let valid = !name.is_empty()
                && server.len() + NAME_SEPARATOR.len() + name.len() <= 128
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !valid {
                tracing::warn!(%server, tool = %name, "upstream tool name unusable; not served");
                return false;
            }
            if !seen.insert(name.to_owned()) {
                tracing::warn!(%server, tool = %name, "upstream lists a tool twice; the first is served");
                return false;
            }
            true
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        Tool::new(name.to_owned(), "t", Arc::new(rmcp::model::JsonObject::new()))
    }

    #[test]
    fn unusable_and_repeated_upstream_tools_are_not_served() {
        let long = "x".repeat(126);
        let kept = usable_tools(
            "fx",
            vec![tool("echo"), tool("echo"), tool("bad name"), tool("ok.v2-x_y"), tool(""), tool(&long)],
        );
        let names: Vec<_> = kept.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(names, ["echo", "ok.v2-x_y"]);
        let fits = "x".repeat(124);
        assert_eq!(usable_tools("fx", vec![tool(&fits)]).len(), 1, "fx__ + 124 = 128 characters");
    }
}
