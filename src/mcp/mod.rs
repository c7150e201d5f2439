//! MCP over Streamable HTTP: the rmcp service mounted at `/mcp` behind the gate, session
//! binding, and the native tool registry. Never learns the caller except through
//! `McpCallContext`.

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
        record_raw_arguments: config.audit.record_raw_arguments,
        label_tenant: config.metrics.label_tenant,
        cursors: cursor::CursorKey::from_secret(&state.cursor_secret),
        tasks_key: cursor::CursorKey::from_secret(&state.task_secret),
        rounds_key: cursor::CursorKey::random(),
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
    let endpoint = tower::service_fn(move |request: Request| {
        let (service, relay) = (Arc::clone(&service), relay.clone());
        async move {
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
