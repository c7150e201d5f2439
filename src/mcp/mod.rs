//! MCP over Streamable HTTP: the rmcp service mounted at `/mcp` behind the gate, session
//! binding, and the native tool registry. Never learns the caller except through
//! `McpCallContext`.

mod confirm;
mod cursor;
use crate::jsonrpc;
mod lean;
mod pipeline;
mod registry;
mod rounds;
mod server;
mod session;
mod shared;
mod tasks;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use tower::{Service, ServiceBuilder};

use crate::audit::AuditWriter;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::identity::SessionRegistry;
use crate::proxy::Upstreams;
use crate::store::Db;
pub(crate) use jsonrpc::{Inspection, id_text};
pub use registry::{RegistryError, ToolSet};
pub use server::GatewayServer;

/// What the endpoint shares with the rest of the gateway (handed down by the HTTP layer, which
/// owns it: this module never reaches up for it).
pub(crate) struct Shares<'a> {
    pub config: &'a Config,
    pub db: &'a Db,
    pub sessions: &'a Arc<SessionRegistry>,
    pub audit: &'a AuditWriter,
    /// The replicas' shared secret for pagination cursors.
    pub cursor_secret: [u8; 32],
    /// The replicas' shared secret for task handles.
    pub task_secret: [u8; 32],
    /// The replicas' shared secret for multi round-trip states.
    pub rounds_secret: [u8; 32],
    /// This replica among the others (where a continuation is forwarded).
    pub cluster: &'a Arc<Cluster>,
}

/// The `/mcp` endpoint: the JSON-RPC check, session binding and rmcp's Streamable HTTP
/// service, as one service for the gate to wrap. `shutdown` ends every session and stream
/// when cancelled.
pub(crate) fn service(
    state: Shares<'_>,
    tools: ToolSet,
    upstreams: Arc<Upstreams>,
    shutdown: tokio_util::sync::CancellationToken,
) -> impl Service<Request, Response = Response, Error = Infallible, Future: Send + 'static> + Clone + Send + Sync + 'static
{
    let config = state.config;
    let shared = Arc::new(shared::Shared {
        db: state.db.clone(),
        audit: state.audit.clone(),
        sessions: Arc::clone(state.sessions),
        tools,
        upstreams,
        call_timeout: Duration::from_secs(config.mcp.call_timeout_secs),
        task_ttl: Duration::from_secs(config.mcp.task_ttl_secs),
        task_max_result_bytes: config.mcp.task_max_result_bytes,
        confirm_timeout: Duration::from_secs(config.mcp.confirm_timeout_secs),
        approval_wait: Duration::from_secs(config.mcp.approval_wait_secs),
        approval_wait_plain: Duration::from_secs(config.server.request_timeout_secs.saturating_sub(2).max(1)),
        session_wait: Duration::from_secs(config.mcp.session_idle_secs.saturating_sub(5).max(1)),
        record_raw_arguments: config.audit.record_raw_arguments,
        label_tenant: config.metrics.label_tenant,
        cursors: cursor::CursorKey::from_secret(&state.cursor_secret),
        tasks_key: cursor::CursorKey::from_secret(&state.task_secret),
        rounds_key: cursor::CursorKey::from_secret(&state.rounds_secret),
        replica: state.cluster.id().to_owned(),
        rounds: rounds::Exchanges::default(),
        lean: lean::Sessions::default(),
    });
    let mut manager = LocalSessionManager::default();
    manager.session_config.keep_alive = Some(Duration::from_secs(config.mcp.session_idle_secs));
    let manager = Arc::new(manager);
    let mut hosts = config.server.allowed_hosts.clone();
    if let Some(host) = public_host(&config.public_url()) {
        hosts.push(host);
    }
    let relay = config
        .mcp
        .lean_relay
        .then(|| Arc::new(lean::Relay::new(Arc::clone(&shared), Arc::clone(&manager), hosts.clone())));
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(!config.mcp.stateless)
        // Stateless requests (and every 2026-07-28 request) get a plain JSON answer when the
        // call sends nothing before it: one write instead of an SSE stream. A call that sends
        // progress or a log message first still answers over SSE, so nothing is lost.
        .with_json_response(true)
        .with_allowed_hosts(hosts)
        .with_sse_keep_alive(Some(Duration::from_secs(config.mcp.sse_keep_alive_secs)))
        .with_max_request_body_bytes(config.server.body_limit_bytes)
        .with_cancellation_token(shutdown.clone());
    let factory_shared = Arc::clone(&shared);
    let service = Arc::new(StreamableHttpService::new(
        move || Ok(GatewayServer::new(Arc::clone(&factory_shared))),
        Arc::clone(&manager),
        mcp_config,
    ));
    let binding = Arc::new(session::Binding {
        sessions: Arc::clone(state.sessions),
        audit: state.audit.clone(),
        leeway_secs: i64::try_from(config.auth.leeway_secs).unwrap_or(i64::MAX),
        max_sessions_per_user: config.mcp.max_sessions_per_user,
    });
    session::spawn_sweeper(Arc::clone(state.sessions), manager, Arc::clone(&shared), shutdown);
    // Served through `handle(&self)` behind an `Arc`: as a tower service it would be cloned
    // (configuration and all) by every layer, on every request.
    let continuations = Arc::new(Continuations { shared: Arc::clone(&shared), cluster: Arc::clone(state.cluster) });
    let endpoint = tower::service_fn(move |request: Request| {
        let (service, relay, continuations) = (Arc::clone(&service), relay.clone(), Arc::clone(&continuations));
        async move {
            // A stateless retry of an exchange waiting in another replica goes on to that one.
            let request = match continuations.forward(request).await {
                Ok(response) => return Ok(response),
                Err(request) => request,
            };
            // A proxied call the lean relay takes is answered there; everything else by rmcp.
            let request = match &relay {
                Some(relay) => match relay.serve(request).await {
                    Ok(response) => return Ok(response),
                    Err(request) => request,
                },
                None => request,
            };
            let terminating = request.method() == http::Method::DELETE;
            let response = crate::error_body::ours(service.handle(request).await.into_response()).await;
            Ok::<_, Infallible>(if terminating { terminated(response) } else { response })
        }
    });
    ServiceBuilder::new()
        .layer(middleware::from_fn(jsonrpc::check))
        .layer(middleware::from_fn_with_state(binding, session::bind))
        .service(endpoint)
}

/// Sends a stateless request on to the replica where what it continues waits.
struct Continuations {
    shared: Arc<shared::Shared>,
    cluster: Arc<Cluster>,
}

impl Continuations {
    /// The replica `request` must be served by, when it is another one: a session-less POST,
    /// not already forwarded, whose `requestState` names an exchange waiting elsewhere, or a
    /// `tasks/*` request for a task pinned elsewhere.
    fn elsewhere(&self, request: &Request) -> Option<String> {
        if request.method() != http::Method::POST
            || request.headers().contains_key(crate::identity::SESSION_HEADER)
            || request.headers().contains_key(crate::cluster::FORWARDED_HEADER)
        {
            return None;
        }
        let inspection = request.extensions().get::<crate::jsonrpc::Inspection>()?;
        let replica = match (inspection.method()?, inspection.request_state(), inspection.task_id()) {
            ("tasks/get" | "tasks/update" | "tasks/cancel", _, Some(handle)) => {
                tasks::pinned_to(&self.shared.tasks_key, handle, crate::store::now_millis())
            }
            (_, Some(state), _) => rounds::waits_in(&self.shared.rounds_key, state),
            _ => None,
        }?;
        (replica != self.shared.replica).then_some(replica)
    }

    /// The other replica's answer to `request`, or `request` back to be served here (it waits
    /// here, or nowhere, or its replica is gone: then it is refused here as unknown).
    async fn forward(&self, request: Request) -> Result<Response, Request> {
        let Some(to) = self.elsewhere(&request) else { return Err(request) };
        let body = match request.extensions().get::<crate::jsonrpc::Inspection>() {
            Some(inspection) => inspection.body().clone(),
            None => return Err(request),
        };
        let (head, rest) = request.into_parts();
        match self.cluster.forward(&to, &head, body).await {
            Ok(response) => {
                crate::telemetry::metrics::forwarded("ok");
                tracing::debug!(replica = %to, "a continuation forwarded to the replica it waits in");
                Ok(response.map(axum::body::Body::new))
            }
            Err(e) => {
                let outcome = if matches!(e, crate::cluster::ForwardError::Gone(_)) { "gone" } else { "failed" };
                crate::telemetry::metrics::forwarded(outcome);
                tracing::warn!(replica = %to, error = %e, "a continuation could not be forwarded; answered here");
                Err(Request::from_parts(head, rest))
            }
        }
    }
}

/// A session `DELETE` that succeeded answers 200. rmcp answers 202 Accepted, which the official
/// Python SDK reports as "Session termination failed" (it accepts 200 and 204; the TypeScript
/// SDK any 2xx): the session is gone by then, nothing is left pending.
fn terminated(mut response: Response) -> Response {
    if response.status() == http::StatusCode::ACCEPTED {
        *response.status_mut() = http::StatusCode::OK;
    }
    response
}

/// The host (with port, when it has one) of the public URL, so the public name is an
/// allowed `Host` too.
fn public_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    (!authority.is_empty()).then(|| authority.to_owned())
}
