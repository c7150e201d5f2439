//! The composition root: builds a gateway from its configuration (database, keys, the
//! writers and background tasks, the MCP endpoint, the router), runs it, and shuts it down.
//! Everything it wires lives in the floors below; it decides nothing of its own.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;

use crate::audit::AuditWriter;
use crate::auth::assertion::{AssertionError, AssertionSigner};
use crate::auth::{AuthSetupError, Authenticator};
use crate::config::Config;
use crate::http::AppState;
use crate::identity::{Gate, SessionRegistry};
use crate::store::{Db, IfMissing, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Auth(#[from] AuthSetupError),
    #[error("identity assertions: {0}")]
    Assertions(#[from] AssertionError),
    #[error("upstream servers: {0}")]
    Upstreams(#[from] crate::executor::UpstreamError),
    #[error("audit checkpoints: {0}")]
    Checkpoints(#[from] crate::audit::checkpoint::CheckpointError),
    #[error("upstream OAuth credentials: {0}")]
    Vault(#[from] crate::store::vault::VaultError),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("binding metrics.listen {addr}: {source}")]
    MetricsBind { addr: SocketAddr, source: std::io::Error },
}

/// A built gateway: database connected and migrated, keys loaded, listeners bound.
pub struct Gateway {
    listener: TcpListener,
    router: Router,
    state: AppState,
    local_addr: SocketAddr,
    agents: Arc<crate::executor::remote::Agents>,
    /// The metrics listener (`metrics.listen`) and its router, when metrics are enabled.
    metrics: Option<(TcpListener, Router)>,
    metrics_addr: Option<SocketAddr>,
}

impl Gateway {
    /// Builds the gateway: the MCP endpoint and the native tools behind the gate.
    pub async fn build(config: Config) -> Result<Self, StartError> {
        Self::build_with(config, |_| Router::new()).await
    }

    /// Builds the gateway serving `tools` (start from
    /// [`ToolSet::native`](crate::mcp::ToolSet::native) and add a SaaS's own tool sets with
    /// [`ToolSet::with`](crate::mcp::ToolSet::with)).
    pub async fn build_with_tools(config: Config, tools: crate::mcp::ToolSet) -> Result<Self, StartError> {
        Self::assemble(config, tools, |_| Router::new()).await
    }

    /// Builds the gateway; `protected` makes more routes to sit behind authentication and
    /// identity resolution beside `/mcp` (every request to them carries a resolved identity).
    pub async fn build_with(config: Config, protected: impl FnOnce(&AppState) -> Router) -> Result<Self, StartError> {
        Self::assemble(config, crate::mcp::ToolSet::native(), protected).await
    }

    async fn assemble(
        config: Config,
        tools: crate::mcp::ToolSet,
        protected: impl FnOnce(&AppState) -> Router,
    ) -> Result<Self, StartError> {
        let mut config = config;
        // Before anything is bound or written: a bad checkpoint key stops start-up here.
        let checkpoints = crate::audit::checkpoint::from_config(&config.audit)?;
        let token_key = crate::store::vault::VaultKey::from_config(&config.upstream)?;
        let listener = TcpListener::bind(config.server.listen)
            .await
            .map_err(|source| StartError::Bind { addr: config.server.listen, source })?;
        let local_addr =
            listener.local_addr().map_err(|source| StartError::Bind { addr: config.server.listen, source })?;
        // With port 0 the real port is known only now; the default public URL follows it.
        config.server.listen = local_addr;
        let metrics_listener = if config.metrics.enabled {
            let addr = config.metrics.listen;
            let listener = TcpListener::bind(addr).await.map_err(|source| StartError::MetricsBind { addr, source })?;
            config.metrics.listen = listener.local_addr().map_err(|source| StartError::MetricsBind { addr, source })?;
            Some(listener)
        } else {
            None
        };
        let db = Db::connect(&config.database, IfMissing::Create).await?;
        db.migrate().await?;
        // Stored credentials need the key they were sealed with, or nothing can use them.
        crate::store::vault::check_at_start(&db, token_key.as_ref()).await?;
        // Pagination cursors are sealed with a key every replica of the database shares.
        let cursor_secret = db.shared_key("cursors").await?;
        // So are the handles of tasks: a poll is answered on any replica.
        let task_secret = db.shared_key("tasks").await?;
        // And multi round-trip states: a retry that lands on another replica is sent on to
        // the one where its exchange waits.
        let rounds_secret = db.shared_key("rounds").await?;
        let vault = token_key.map(|key| Arc::new(crate::store::vault::TokenVault::new(db.clone(), key)));
        let checkpointer = match checkpoints {
            Some((key, sink)) => Some(crate::audit::checkpoint::Checkpointer::new(db.clone(), key, sink)?),
            None => None,
        };
        let authenticator = Arc::new(Authenticator::from_config(&config).await?);
        if !config.auth.hs256_secret.is_empty() {
            tracing::warn!(
                shipped_default = config.uses_shipped_dev_secret(),
                "HS256 DEVELOPMENT SECRET IN USE: anyone holding auth.hs256_secret can mint tokens \
                 for any tenant. Configure a JWKS and set auth.hs256_secret = \"\" in production."
            );
        }
        let cache =
            crate::identity::IdentityCache::new(Duration::from_millis(config.auth.identity_cache_ms)).map(Arc::new);
        let gate = Arc::new(Gate {
            authenticator,
            trusted: Arc::new(crate::identity::TrustedIssuers::new(db.clone(), cache.clone())),
            db: db.clone(),
            service_subjects: config.auth.service_subjects.clone(),
            policy_claims: config.auth.policy_claims.clone(),
            resource_metadata_url: config.resource_metadata_url(),
            required_scopes: config.auth.required_scopes.clone(),
            challenge_scope: config.challenge_scope(),
            tool_scopes: config.auth.tool_scopes.clone(),
            body_limit: config.server.body_limit_bytes,
            cache,
        });
        crate::telemetry::metrics::install();
        let audit = AuditWriter::start(
            db.clone(),
            config.audit.max_batch,
            std::time::Duration::from_millis(config.audit.outcome_linger_ms),
        );
        let assertions = Arc::new(
            AssertionSigner::new(config.public_url(), Duration::from_secs(config.upstream.assertion_ttl_secs))?
                .with_reuse(Duration::from_millis(config.upstream.assertion_reuse_ms)),
        );
        // Before anything is served: the signing key is published for every replica's JWKS.
        let cluster = crate::cluster::Cluster::join(&config, &db, Arc::clone(&assertions)).await?;
        let state = AppState {
            config: Arc::new(config),
            db,
            sessions: Arc::new(SessionRegistry::new()),
            audit,
            assertions,
            cluster,
            vault,
            gate,
            ready: Arc::new(AtomicBool::new(false)),
            shutdown: tokio_util::sync::CancellationToken::new(),
        };
        let agents = crate::executor::remote::Agents::clustered(
            Arc::clone(&state.cluster),
            crate::tunnel::Settings::configured(&state.config.upstream),
        );
        let oauth =
            state.vault.as_ref().map(|v| crate::oauth::UpstreamOAuth::new(Arc::clone(v), &state.config.public_url()));
        let native_facts = tools.policy_facts();
        let policies = Arc::new(crate::proxy::Policies::new(
            state.db.clone(),
            state.gate.cache.clone(),
            native_facts,
            state.config.auth.policy_claims.clone(),
        ));
        let upstreams = crate::proxy::Upstreams::from_config(
            &state.config.upstream,
            state.db.clone(),
            Arc::clone(&state.assertions),
            Arc::clone(&state.sessions),
            Arc::clone(&agents),
            oauth,
            policies,
        )?;
        spawn_executor_recheck(
            state.db.clone(),
            Arc::clone(&agents),
            Duration::from_millis(state.config.upstream.executor_recheck_ms),
            state.shutdown.clone(),
        );
        upstreams.spawn_sweeper(state.shutdown.clone());
        upstreams.pins().label_tenants(state.config.metrics.label_tenant);
        state.gate.authenticator.spawn_refresh(state.shutdown.clone());
        spawn_task_purge(state.db.clone(), TASK_PURGE_EVERY, state.shutdown.clone());
        if let Some(cache) = &state.gate.cache {
            cache.spawn_poller(state.db.clone(), state.shutdown.clone());
            upstreams.follow_changes(Arc::clone(cache));
        }
        let shares = crate::mcp::Shares {
            config: &state.config,
            db: &state.db,
            sessions: &state.sessions,
            audit: &state.audit,
            cursor_secret,
            task_secret,
            rounds_secret,
            cluster: &state.cluster,
        };
        let mcp = crate::mcp::service(shares, tools, Arc::clone(&upstreams), state.shutdown.clone());
        let router = crate::http::gateway_router(&state, mcp, protected(&state), &agents, &upstreams);
        state.cluster.spawn(Duration::from_secs(state.config.upstream.key_rotation_secs), state.shutdown.clone());
        if let Some(checkpointer) = checkpointer {
            checkpointer
                .spawn(Duration::from_secs(state.config.audit.checkpoint_interval_secs), state.shutdown.clone());
        }
        let metrics_addr = metrics_listener.as_ref().map(|_| state.config.metrics.listen);
        let metrics = metrics_listener.map(|listener| (listener, crate::http::metrics_router(&state)));
        state.ready.store(true, Ordering::Release);
        Ok(Self { listener, router, state, local_addr, agents, metrics, metrics_addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where `/metrics` is served (`metrics.listen` as bound); `None` with metrics disabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The executor agents connected to this gateway (to read files through them).
    pub fn agents(&self) -> &Arc<crate::executor::remote::Agents> {
        &self.agents
    }

    /// The whole router, for driving with `oneshot` in tests.
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests for at most
    /// `server.shutdown_grace_secs`.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let grace = Duration::from_secs(self.state.config.server.shutdown_grace_secs);
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let streams = self.state.shutdown.clone();
        let signal = async move {
            shutdown.await;
            tracing::info!("shutting down: closing MCP sessions, draining in-flight requests");
            streams.cancel();
            let _ = stopping_tx.send(());
        };
        let listener = self.listener.tap_io(|tcp| {
            // Without it, streamed (SSE) replies stall on Nagle + delayed ACK.
            let _ = tcp.set_nodelay(true);
        });
        let serve = axum::serve(listener, self.router).with_graceful_shutdown(signal);
        // The metrics listener stops with the gateway: at the shutdown signal it takes no new
        // scrape, and the drain deadline below bounds it with the rest.
        let metrics_stop = self.state.shutdown.clone();
        let metrics = async move {
            match self.metrics {
                Some((listener, router)) => {
                    axum::serve(listener, router).with_graceful_shutdown(metrics_stop.cancelled_owned()).await
                }
                None => Ok(()),
            }
        };
        let serve = async move {
            let (served, metrics) = tokio::join!(serve.into_future(), metrics);
            served.and(metrics)
        };
        let deadline = async move {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(grace).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            result = serve => result,
            () = deadline => {
                tracing::warn!(grace_secs = grace.as_secs(), "drain deadline passed; closing remaining connections");
                Ok(())
            }
        };
        // The outcomes of the calls answered last go in before the database closes.
        self.state.audit.flush().await;
        self.state.cluster.leave().await;
        self.state.db.close().await;
        result
    }
}

/// Drops connected agents whose executor was deleted or whose secret was rotated, checking
/// every `every` until `stop`; then ends every agent's tunnel (the agents reconnect).
fn spawn_executor_recheck(
    db: Db,
    agents: Arc<crate::executor::remote::Agents>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            if agents.connected() == 0 {
                continue;
            }
            match db.remote_executor_secrets().await {
                Ok(secrets) => agents.recheck(&secrets),
                Err(e) => tracing::warn!(error = %e, "checking connected executors failed; checking again"),
            }
        }
        agents.close_all("the gateway is shutting down");
    });
}

/// How often expired tasks are deleted (they are unknown to callers from their expiry on).
const TASK_PURGE_EVERY: Duration = Duration::from_secs(60);

/// Deletes the tasks that expired, every `every` until `stop` (any replica may; the delete is
/// the same on each).
fn spawn_task_purge(db: Db, every: Duration, stop: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let purged = async {
                let mut conn = db.pool().acquire().await?;
                crate::store::tasks::purge_expired(&mut conn, crate::store::now_millis()).await
            };
            match purged.await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(purged = n, "expired tasks deleted"),
                Err(e) => tracing::warn!(error = %e, "deleting expired tasks failed; trying again"),
            }
        }
    });
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
