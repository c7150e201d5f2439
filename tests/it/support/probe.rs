//! A gateway whose only gated route is `/probe`, driven through its whole router without a
//! socket: what the gate and the `McpCallContext` factory make of a request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use http::StatusCode;
use rmcp::model::RequestId;
use scopegate::Gateway;
use scopegate::config::Config;
use scopegate::context::{CallSite, FlockAccess, McpCallContext};
use scopegate::identity::SessionRegistry;
use scopegate::model::Role;
use serde_json::{Value, json};

/// A gateway on port 0 whose only gated route is `/probe`: it counts the requests that
/// reach it and answers with what `McpCallContext` says about the caller (the JSON-RPC id
/// of the call is the `id` of the body; the session is the `mcp-session-id` header).
pub struct Probe {
    pub gateway: Gateway,
    pub reached: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct ProbeState {
    reached: Arc<AtomicUsize>,
    sessions: Arc<SessionRegistry>,
}

async fn probe_handler(State(state): State<ProbeState>, request: axum::extract::Request) -> Response {
    state.reached.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let id: RequestId = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("id")?.clone()).ok())
        .unwrap_or(RequestId::Number(1));
    let session = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok());
    let site = CallSite { parts: Some(&parts), request_id: &id, session_id: session };
    match McpCallContext::for_call(site, &state.sessions) {
        Ok(ctx) => {
            let flocks = match ctx.flocks() {
                FlockAccess::AllOfTenant => json!("all"),
                FlockAccess::Only(ids) => {
                    json!(ids.iter().map(|f| f.to_string()).collect::<Vec<_>>())
                }
            };
            let roles: Vec<&str> = ctx.roles().iter().map(|r: &Role| r.as_str()).collect();
            axum::Json(json!({
                "tenant": ctx.tenant_slug(),
                "tenant_id": ctx.tenant_id().to_string(),
                "user": ctx.subject(),
                "user_id": ctx.user_id().to_string(),
                "roles": roles,
                "flocks": flocks,
            }))
            .into_response()
        }
        Err(e) => (StatusCode::FORBIDDEN, axum::Json(json!({ "context_error": e.reason() }))).into_response(),
    }
}

impl Probe {
    pub async fn start(config: Config) -> Self {
        let reached = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&reached);
        let gateway = Gateway::build_with(config, move |state| {
            Router::new()
                .route("/probe", any(probe_handler))
                .with_state(ProbeState { reached: counter, sessions: Arc::clone(&state.sessions) })
        })
        .await
        .expect("gateway builds");
        Self { gateway, reached }
    }

    pub fn reached(&self) -> usize {
        self.reached.load(Ordering::SeqCst)
    }

    /// POSTs a JSON-RPC-shaped body with `id` 1 to `/probe` through the whole router.
    pub async fn call(&self, token: Option<&str>) -> (StatusCode, http::HeaderMap, Value) {
        self.request(token, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}), &[]).await
    }

    pub async fn request(
        &self,
        token: Option<&str>,
        body: Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, http::HeaderMap, Value) {
        use tower::ServiceExt;
        let mut builder = http::Request::post("/probe").header("content-type", "application/json");
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let request = builder.body(axum::body::Body::from(body.to_string())).unwrap();
        let response = self.gateway.router().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, headers, json)
    }
}

impl Probe {
    /// GETs `path` through the whole router: status, headers, JSON body (Null when not JSON).
    pub async fn get(&self, path: &str) -> (StatusCode, http::HeaderMap, Value) {
        use tower::ServiceExt;
        let request = http::Request::get(path).body(axum::body::Body::empty()).unwrap();
        let response = self.gateway.router().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, headers, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

impl Probe {
    /// Sends `method path` with `token` and a JSON `body` through the whole router.
    pub async fn send(
        &self,
        method: http::Method,
        path: &str,
        token: &str,
        body: Value,
    ) -> (StatusCode, http::HeaderMap, Value) {
        use tower::ServiceExt;
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        let response = self.gateway.router().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, headers, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}
