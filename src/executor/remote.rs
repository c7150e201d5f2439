//! The remote host handler: the one place on the gateway where a server bound to a remote
//! executor is resolved, placed and opened. It resolves the server's entity in the bound
//! executor's context (machine prefix first), places the declaration under the executor's
//! agent root, checks the result stays there, sends it over a new tunnel channel and bridges
//! MCP over that channel. It never launches or dials anything itself: what runs, runs on the
//! agent's machine, over the agent's network. Files on an executor (a plugin's `.mcp.json`)
//! are read the same way, through the agent, by [`Agents::read_file`] in `file`, and an HTTP
//! exchange over the executor's network (OAuth) is made by [`Agents::fetch`] in `fetch`.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use rmcp::service::{RoleClient, RunningService};

pub use crate::executor::agents::{AgentLink, Agents, AlreadyConnected, Reservation};
pub use crate::executor::channel::ChannelTransport;
pub use crate::executor::file::ReadFileError;
pub use crate::wire::exchange::FetchError;

use crate::decl::ExecutorEnv;
use crate::decl::ExecutorId;
use crate::decl::ResolvedServer;
use crate::decl::ResolvedTransport;
use crate::executor::{Executor, UpstreamError};
use crate::relay::{Lifecycle, ProxyClient};
use crate::store::entities::Executor as ExecutorRow;
use crate::store::{Db, StoreError, TenantId};
use crate::tunnel::{Open, TunnelError};

/// A remote executor's environment as the gateway sees it: unknown. `${NAME}` references are
/// left for the agent to resolve on its machine; `${env:NAME}` (the gateway's own
/// environment) is refused.
pub(crate) struct RemoteEnv;

impl ExecutorEnv for RemoteEnv {
    fn var(&self, _name: &str) -> Option<String> {
        None
    }
    fn is_local(&self) -> bool {
        false
    }
    fn deferred(&self) -> bool {
        true
    }
}

/// Why a server could not be resolved through the handler.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("server `{0}` is not bound, or has no declaration in its executor's context")]
    NotFound(String),
    #[error(transparent)]
    Executor(#[from] UpstreamError),
    #[error("server `{server}`: {problem}")]
    Declaration { server: String, problem: String },
}

/// Opens servers on remote executors, through their agents' tunnels.
pub struct RemoteHostHandler {
    db: Db,
    agents: Arc<Agents>,
    assertion_header: HeaderName,
}

impl RemoteHostHandler {
    pub fn new(db: Db, agents: Arc<Agents>, assertion_header: HeaderName) -> Arc<Self> {
        Arc::new(Self { db, agents, assertion_header })
    }

    pub fn agents(&self) -> &Arc<Agents> {
        &self.agents
    }

    /// The executor for a remote executor's row: placed under the root its agent reported
    /// (here, or to the replica that holds it). An executor whose agent no replica has heard
    /// from has no root yet: refused.
    pub async fn executor(self: &Arc<Self>, row: &ExecutorRow) -> Result<Executor, UpstreamError> {
        let root = self.agents.root_of(&row.name).await.ok_or_else(|| UpstreamError::Offline(row.name.clone()))?;
        Ok(Executor::Remote { id: ExecutorId::new(&row.name), root, host: Arc::clone(self) })
    }

    /// Resolves `tenant`'s server `server` in its bound executor's context (the one-query
    /// resolver: `machines/{executor machine}/profile/...`, then `users/{executor user}/...`,
    /// then `defaults/...`) and places it for that executor.
    pub async fn resolve(self: &Arc<Self>, tenant: TenantId, server: &str) -> Result<ResolvedServer, ResolveError> {
        let entity =
            self.db.resolve_server(tenant, server).await?.ok_or_else(|| ResolveError::NotFound(server.to_owned()))?;
        let executor = self.executor(&entity.executor).await?;
        executor
            .resolve(server, &entity.declaration)
            .map_err(|e| ResolveError::Declaration { server: server.to_owned(), problem: e.problem })
    }

    /// Opens `server` on its executor's agent and completes the MCP handshake within
    /// `timeout`. The agent must be connected now, and the server's paths must lie inside
    /// the root it reports now (it may have reconnected with another since the placement).
    /// An OAuth-protected server's messages carry `auth`'s access token (see
    /// [`ChannelTransport::authorized`]).
    pub async fn open(
        &self,
        server: &ResolvedServer,
        handler: ProxyClient,
        lifecycle: Lifecycle,
        timeout: Duration,
        auth: Option<rmcp::transport::auth::AuthorizationManager>,
    ) -> Result<RunningService<RoleClient, ProxyClient>, UpstreamError> {
        let name = server.executor.as_str();
        let link = self.agents.reach(name).await.ok_or_else(|| UpstreamError::Offline(name.to_owned()))?;
        let open = match &server.transport {
            ResolvedTransport::Stdio { command, args, env, cwd } => {
                if !link.root.contains(cwd) {
                    return Err(UpstreamError::OutsideRoot { server: server.name.to_string(), path: cwd.to_string() });
                }
                Open::Stdio {
                    server: server.name.to_string(),
                    command: command.clone(),
                    args: args.clone(),
                    env: env.clone(),
                    cwd: cwd.to_string(),
                }
            }
            ResolvedTransport::Http { url, headers, .. } => Open::Http {
                server: server.name.to_string(),
                url: url.clone(),
                headers: headers.clone(),
                assertion_header: self.assertion_header.as_str().to_owned(),
            },
        };
        let started = tokio::time::Instant::now();
        let channel = link.open(&open, timeout).await.map_err(|e| match e {
            TunnelError::Timeout(t) => UpstreamError::ConnectTimeout(t),
            other => UpstreamError::Remote(other.to_string()),
        })?;
        let mut transport = ChannelTransport::new(server.name.as_str(), channel);
        if let Some(manager) = auth {
            transport = transport.authorized(manager);
        }
        let refused = transport.refused_flag();
        let transport = handler.counted(transport);
        let left = timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, handler.start(lifecycle, transport)).await {
            Ok(Ok(service)) => Ok(service),
            Ok(Err(_)) if refused.is_some_and(|r| r.load(std::sync::atomic::Ordering::Acquire)) => {
                Err(UpstreamError::Unauthorized { server: server.name.to_string() })
            }
            Ok(Err(e)) => Err(UpstreamError::Connect(e.to_string())),
            Err(_) => Err(UpstreamError::ConnectTimeout(timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decl::declaration::expand;

    /// The gateway never resolves a remote executor's `${NAME}` (it can't know the value and
    /// must not guess it from its own environment) and never forwards its own `${env:NAME}`.
    #[test]
    fn references_are_left_to_the_executor_and_the_gateways_own_are_refused() {
        let id = ExecutorId::new("build-01");
        // PATH is set in the gateway's environment: still left as written.
        for text in ["${PATH}", "--t=${TOKEN}", "$${LITERAL}", "plain"] {
            assert_eq!(expand(text, &RemoteEnv, &id).unwrap(), text, "{text}");
        }
        let err = expand("${env:PATH}", &RemoteEnv, &id).unwrap_err();
        assert!(err.contains("refused for the remote executor"), "{err}");
        assert!(expand("${1X}", &RemoteEnv, &id).is_err(), "syntax is still checked");
    }
}
