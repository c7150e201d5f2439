//! HTTP: the router, the tower layers of the request path, health and well-known routes,
//! start-up and graceful shutdown. Decides nothing about identity; mounts the gate.

mod executors;
mod health;
mod limits;
mod oauth;
mod well_known;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::serve::ListenerExt;
use http::{HeaderName, StatusCode, header};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder};
use tower_http::body::Limited;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::audit::AuditWriter;
use crate::auth::assertion::{AssertionError, AssertionSigner};
use crate::auth::{AuthSetupError, Authenticator};
use crate::config::Config;
use crate::identity::{Gate, SessionRegistry, authenticate};
use crate::store::{Db, StoreError};

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// App-wide dependencies, shared by every request.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub db: Db,
    pub sessions: Arc<SessionRegistry>,
    pub audit: AuditWriter,
    /// Signs identity assertions for upstream servers.
    pub assertions: Arc<AssertionSigner>,
    /// Upstream OAuth credentials, sealed at rest; `None` when `upstream.token_key_file` is unset.
    pub vault: Option<Arc<crate::store::vault::TokenVault>>,
    pub(crate) gate: Arc<Gate>,
    ready: Arc<AtomicBool>,
    /// Cancelled at shutdown: ends MCP sessions and streams so connections can drain.
    shutdown: tokio_util::sync::CancellationToken,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Auth(#[from] AuthSetupError),
    #[error("identity assertions: {0}")]
    Assertions(#[from] AssertionError),
    #[error("upstream servers: {0}")]
    Upstreams(#[from] crate::upstream::executor::UpstreamError),
    #[error("audit checkpoints: {0}")]
    Checkpoints(#[from] crate::audit::checkpoint::CheckpointError),
    #[error("upstream OAuth credentials: {0}")]
    Vault(#[from] crate::store::vault::VaultError),
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// A built gateway: database connected and migrated, keys loaded, listener bound.
pub struct Gateway {
    listener: TcpListener,
    router: Router,
    state: AppState,
    local_addr: SocketAddr,
    agents: Arc<crate::upstream::remote::Agents>,
}

impl Gateway {
    /// Builds the gateway: the MCP endpoint and the native tools behind the gate.
    pub async fn build(config: Config) -> Result<Self, StartError> {
        Self::build_with(config, |_| Router::new()).await
    }

    /// Builds the gateway serving `tools` (start from [`ToolSet::native`] and add a SaaS's
    /// own tool sets with [`ToolSet::with`]).
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
        let db = Db::connect(&config.database).await?;
        db.migrate().await?;
        // Stored credentials need the key they were sealed with, or nothing can use them.
        crate::store::vault::check_at_start(&db, token_key.as_ref()).await?;
        // Pagination cursors are sealed with a key every replica of the database shares.
        let cursor_secret = db.shared_key("cursors").await?;
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
        let gate = Arc::new(Gate {
            authenticator,
            db: db.clone(),
            service_subjects: config.auth.service_subjects.clone(),
            resource_metadata_url: config.resource_metadata_url(),
            body_limit: config.server.body_limit_bytes,
            cache: crate::identity::IdentityCache::new(Duration::from_millis(config.auth.identity_cache_ms))
                .map(Arc::new),
        });
        crate::telemetry::metrics::install();
        let audit = AuditWriter::start(db.clone(), config.audit.max_batch);
        let assertions = Arc::new(
            AssertionSigner::new(config.public_url(), Duration::from_secs(config.upstream.assertion_ttl_secs))?
                .with_reuse(Duration::from_millis(config.upstream.assertion_reuse_ms)),
        );
        let state = AppState {
            config: Arc::new(config),
            db,
            sessions: Arc::new(SessionRegistry::new()),
            audit,
            assertions,
            vault,
            gate,
            ready: Arc::new(AtomicBool::new(false)),
            shutdown: tokio_util::sync::CancellationToken::new(),
        };
        let agents = crate::upstream::remote::Agents::new();
        let oauth = state
            .vault
            .as_ref()
            .map(|v| crate::upstream::oauth::UpstreamOAuth::new(Arc::clone(v), &state.config.public_url()));
        let upstreams = crate::upstream::runtime::Upstreams::from_config(
            &state.config.upstream,
            state.db.clone(),
            Arc::clone(&state.assertions),
            Arc::clone(&state.sessions),
            Arc::clone(&agents),
            oauth,
        )?;
        let login = oauth::LoginRoute { upstreams: Arc::clone(&upstreams) };
        spawn_executor_recheck(
            state.db.clone(),
            Arc::clone(&agents),
            Duration::from_millis(state.config.upstream.executor_recheck_ms),
            state.shutdown.clone(),
        );
        upstreams.spawn_sweeper(state.shutdown.clone());
        if let Some(cache) = &state.gate.cache {
            cache.spawn_poller(state.db.clone(), state.shutdown.clone());
        }
        let shares = crate::mcp::Shares {
            config: &state.config,
            db: &state.db,
            sessions: &state.sessions,
            audit: &state.audit,
            cursor_secret,
        };
        let mcp = crate::mcp::service(shares, tools, upstreams, state.shutdown.clone());
        let executors = executors::ExecutorRoute {
            db: state.db.clone(),
            agents: Arc::clone(&agents),
            settings: crate::tunnel::Settings {
                max_frame: state.config.upstream.executor_max_frame_bytes,
                heartbeat: Duration::from_secs(state.config.upstream.executor_heartbeat_secs),
                ..crate::tunnel::Settings::default()
            },
        };
        let router = router(&state, mcp, protected(&state), executors, login);
        spawn_key_rotation(
            Arc::clone(&state.assertions),
            Duration::from_secs(state.config.upstream.key_rotation_secs),
            state.shutdown.clone(),
        );
        if let Some(checkpointer) = checkpointer {
            checkpointer
                .spawn(Duration::from_secs(state.config.audit.checkpoint_interval_secs), state.shutdown.clone());
        }
        state.ready.store(true, Ordering::Release);
        Ok(Self { listener, router, state, local_addr, agents })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The executor agents connected to this gateway (to read files through them).
    pub fn agents(&self) -> &Arc<crate::upstream::remote::Agents> {
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
        self.state.db.close().await;
        result
    }
}

/// Installs rustls' ring provider as the process default (see [`crate::tls`]). Idempotent.
pub fn install_tls_provider() {
    crate::tls::install_provider();
}

/// Drops connected agents whose executor was deleted or whose secret was rotated, checking
/// every `every` until `stop`; then ends every agent's tunnel (the agents reconnect).
fn spawn_executor_recheck(
    db: Db,
    agents: Arc<crate::upstream::remote::Agents>,
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

fn spawn_key_rotation(signer: Arc<AssertionSigner>, every: Duration, stop: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(e) = signer.rotate() {
                        tracing::error!(error = %e, "assertion key rotation failed; keeping the current key");
                    }
                }
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

/// The router: public routes, the gated `/mcp` endpoint and `protected` routes, and the
/// layers of the request path around all of them.
///
/// Layers are stacked with `ServiceBuilder` around whole services, not with `Router::layer`:
/// axum clones a route's service for every request, and a route layered level by level is a
/// chain of boxed services (each cloned, and each cloning its inner service again).
fn router<M>(
    state: &AppState,
    mcp: M,
    protected: Router,
    executors: executors::ExecutorRoute,
    login: oauth::LoginRoute,
) -> Router
where
    M: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    M::Future: Send + 'static,
{
    let server = &state.config.server;
    let refusals = crate::audit::refusal::RateLimitAudit::start(state.audit.clone(), state.shutdown.clone());
    let limiter = Arc::new(limits::RateLimiter::new(&state.config.limits, refusals));
    let gate = ServiceBuilder::new()
        .layer(middleware::from_fn_with_state(Arc::clone(&state.gate), authenticate))
        .layer(middleware::from_fn_with_state(limiter, limits::limit));
    let gated = Router::new().route_service("/mcp", gate.clone().service(mcp)).merge(protected.layer(gate));
    let mut public = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/.well-known/oauth-protected-resource", get(well_known::protected_resource))
        .route("/.well-known/oauth-protected-resource/mcp", get(well_known::protected_resource))
        .route("/.well-known/jwks.json", get(well_known::jwks))
        .with_state(state.clone())
        .route(crate::tunnel::CONNECT_PATH, get(executors::connect).with_state(executors))
        .merge(
            Router::new()
                .route(&format!("{}/{{secret}}", crate::upstream::oauth::START_PATH), get(oauth::start))
                .route(crate::upstream::oauth::CALLBACK_PATH, get(oauth::callback))
                .with_state(login),
        );
    if state.config.metrics.enabled {
        let db = state.db.clone();
        public = public.route(
            "/metrics",
            get(move || {
                let db = db.clone();
                async move { crate::telemetry::metrics::render(db.pool_usage()) }
            }),
        );
    }
    let routes = public.merge(gated).fallback(crate::error_body::not_found);

    let origins =
        Arc::new(OriginPolicy { own: state.config.public_url(), allowed: state.config.server.allowed_origins.clone() });
    let layered = ServiceBuilder::new()
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(TraceLayer::new_for_http().make_span_with(|req: &Request| {
            let request_id = req.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
            // Never the headers: the Authorization header carries the token.
            tracing::info_span!(
                "request",
                method = %req.method(),
                // A start link's path is its secret: logged as its route.
                path = crate::telemetry::trace::loggable_path(req.uri().path()),
                request_id,
                tenant = tracing::field::Empty,
                user = tracing::field::Empty,
            )
        }))
        // The request's trace span (traces on), beside the log's span, never in it.
        .layer(crate::telemetry::trace::RequestTraceLayer)
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(server.request_timeout_secs),
        ))
        .layer(RequestBodyLimitLayer::new(server.body_limit_bytes))
        .map_request(|request: http::Request<Limited<Body>>| request.map(Body::new))
        .layer(middleware::from_fn_with_state(origins, check_origin))
        .layer(middleware::from_fn(count_status))
        .service(routes);
    Router::new().fallback_service(layered)
}

async fn count_status(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    crate::telemetry::metrics::http_request(response.status().as_u16());
    response
}

/// The origins a browser may call from: the gateway's own, and the configured ones.
struct OriginPolicy {
    own: String,
    allowed: Vec<String>,
}

/// A request whose `Origin` is neither the gateway's own nor configured gets 403
/// (DNS rebinding and cross-site protection). Requests without `Origin` pass.
async fn check_origin(State(origins): State<Arc<OriginPolicy>>, request: Request, next: Next) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin.to_str().is_ok_and(|o| o == origins.own || origins.allowed.iter().any(|a| a == o));
        if !allowed {
            tracing::info!(origin = ?origin, "foreign Origin refused");
            return crate::error_body::json_error(StatusCode::FORBIDDEN, "forbidden_origin", "Origin not allowed");
        }
    }
    next.run(request).await
}
