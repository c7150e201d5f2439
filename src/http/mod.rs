//! HTTP: the router and the tower layers of the request path, health and well-known routes,
//! and the app-wide state they share. Decides nothing about identity; mounts the gate. The
//! gateway is built, run and shut down in `app`.

mod admin;
mod agent_link;
mod console;
mod executors;
mod health;
mod limits;
mod oauth;
mod well_known;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use http::{HeaderName, StatusCode, header};
use tower::{Service, ServiceBuilder};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::audit::AuditWriter;
use crate::auth::assertion::AssertionSigner;
use crate::config::Config;
use crate::identity::{Gate, SessionRegistry, authenticate};
use crate::store::Db;

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
    /// This replica among the others on the database (the published keys, links, forwarding).
    pub cluster: Arc<crate::cluster::Cluster>,
    /// Upstream OAuth credentials, sealed at rest; `None` when `upstream.token_key_file` is unset.
    pub vault: Option<Arc<crate::store::vault::TokenVault>>,
    pub(crate) gate: Arc<Gate>,
    pub(crate) ready: Arc<AtomicBool>,
    /// Cancelled at shutdown: ends MCP sessions and streams so connections can drain.
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
}

/// Installs rustls' ring provider as the process default (see [`crate::tls`]). Idempotent.
pub fn install_tls_provider() {
    crate::tls::install_provider();
}

/// The whole router of a gateway: `mcp` behind the gate, `protected` beside it, the executor
/// tunnel and the upstream OAuth login routes, with the layers of the request path.
pub(crate) fn gateway_router<M>(
    state: &AppState,
    mcp: M,
    protected: Router,
    agents: &Arc<crate::executor::remote::Agents>,
    upstreams: &Arc<crate::proxy::Upstreams>,
) -> Router
where
    M: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    M::Future: Send + 'static,
{
    let login = oauth::LoginRoute { upstreams: Arc::clone(upstreams) };
    let executors = executors::ExecutorRoute {
        db: state.db.clone(),
        agents: Arc::clone(agents),
        settings: crate::tunnel::Settings::configured(&state.config.upstream),
    };
    let link = agent_link::LinkRoute {
        cluster: Arc::clone(&state.cluster),
        agents: Arc::clone(agents),
        settings: crate::tunnel::Settings::configured(&state.config.upstream),
    };
    router(state, mcp, protected, executors, link, login)
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
    link: agent_link::LinkRoute,
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
        .layer(middleware::from_fn_with_state(Arc::clone(&limiter), limits::limit));
    let gated = Router::new().route_service("/mcp", gate.clone().service(mcp)).merge(protected.layer(gate));
    let native = crate::tools::TOOLS.iter().map(|t| t.name.to_owned()).collect();
    let mut service = crate::admin::Admin::new(state.db.clone(), native)
        .with_audit(state.config.audit.clone())
        .with_auth(&state.config.auth)
        .with_native_facts(login.upstreams.policies().native().to_vec());
    if state.vault.is_some() {
        service = service.with_oauth(&state.config.public_url());
    }
    let api = admin::AdminApi {
        admin: service,
        authenticator: Arc::clone(&state.gate.authenticator),
        trusted: Arc::clone(&state.gate.trusted),
        platform: state.config.admin.platform_subjects.clone().into(),
        limiter: Arc::clone(&limiter),
        resource_metadata_url: state.gate.resource_metadata_url.clone(),
        runtime: admin::status::Runtime {
            agents: Arc::clone(&executors.agents),
            upstreams: Arc::clone(&login.upstreams),
            sessions: Arc::clone(&state.sessions),
            cluster: Arc::clone(&state.cluster),
        },
    };
    let console_routes = console::router(api.clone(), &state.config);
    let (admin_routes, _) = admin::router(api);
    let public = Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/.well-known/oauth-protected-resource", get(well_known::protected_resource))
        .route("/.well-known/oauth-protected-resource/mcp", get(well_known::protected_resource))
        .route("/.well-known/jwks.json", get(well_known::jwks))
        .with_state(state.clone())
        .route(crate::tunnel::CONNECT_PATH, get(executors::connect).with_state(executors))
        .route(crate::vocab::routes::AGENT_LINK_PATH, get(agent_link::agent_link).with_state(link))
        .merge(
            Router::new()
                .route(&format!("{}/{{secret}}", crate::oauth::START_PATH), get(oauth::start))
                .route(crate::oauth::CALLBACK_PATH, get(oauth::callback))
                .with_state(login),
        );
    let routes = public.merge(gated).merge(admin_routes).merge(console_routes).fallback(console::not_found);

    let origins =
        Arc::new(OriginPolicy { own: state.config.public_url(), allowed: state.config.server.allowed_origins.clone() });
    let layered = ServiceBuilder::new()
        .layer(middleware::from_fn(close_unread))
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
        .layer(middleware::from_fn_with_state(server.body_limit_bytes, limit_body))
        .layer(middleware::from_fn_with_state(origins, check_origin))
        .layer(middleware::from_fn(count_status))
        .service(routes);
    Router::new().fallback_service(layered)
}

/// The metrics listener's router: `/metrics` alone. It is never merged into the gateway's
/// router: what reaches the gateway's port (clients, a public load balancer) can't read the
/// metrics, which name tools, servers and executors of every tenant.
pub(crate) fn metrics_router(state: &AppState) -> Router {
    let db = state.db.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let db = db.clone();
                async move { crate::telemetry::metrics::render(db.pool_usage()) }
            }),
        )
        .fallback(crate::error_body::not_found)
}

/// A body over `server.body_limit_bytes` gets 413 in our error body: at once when its declared
/// length is over the limit, else (a chunked body) where reading it passes the limit, which the
/// reader (the gate) tells by [`crate::error_body::is_over_limit`].
async fn limit_body(State(limit): State<usize>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        // The admin API answers every refusal as a problem body.
        if request.uri().path().starts_with(admin::PREFIX) {
            return admin::too_large();
        }
        return crate::error_body::payload_too_large();
    }
    next.run(request.map(|body| Body::new(http_body_util::Limited::new(body, limit)))).await
}

/// An HTTP/1 answer given before its request's body was read to the end (a refusal: no
/// token, a foreign Origin, a body over the limit) says `Connection: close`. The server can't
/// tell where the next request on the connection starts, so it closes it after the answer; a
/// client's pool must hear that from the answer, never find a silently closed connection.
async fn close_unread(request: Request, next: Next) -> Response {
    let http1 = request.version() <= http::Version::HTTP_11;
    let read = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        if http_body::Body::is_end_stream(&body) {
            read.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Body::new(ReadToEnd { body, read: Arc::clone(&read) })
    });
    let mut response = next.run(request).await;
    if http1 && !read.load(std::sync::atomic::Ordering::Relaxed) {
        response.headers_mut().insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records when it has been read to its end.
struct ReadToEnd {
    body: Body,
    read: Arc<AtomicBool>,
}

impl http_body::Body for ReadToEnd {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        let ended = match &polled {
            std::task::Poll::Ready(None) => true,
            std::task::Poll::Ready(Some(Ok(_))) => http_body::Body::is_end_stream(&self.body),
            _ => false,
        };
        if ended {
            self.read.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
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
