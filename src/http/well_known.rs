//! RFC 9728 OAuth 2.0 Protected Resource Metadata for the MCP endpoint, and the public
//! keys of the gateway's identity assertions.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::AppState;

pub(crate) async fn protected_resource(State(state): State<AppState>) -> Json<Value> {
    let c = &state.config;
    // The gateway's own authorization servers, then (when advertised) every issuer a tenant
    // trusts.
    let mut servers = c.authorization_servers();
    if c.auth.advertise_tenant_issuers {
        match state.gate.trusted.issuers().await {
            Ok(issuers) => servers.extend(issuers.into_iter().filter(|i| !servers.contains(i)).collect::<Vec<_>>()),
            Err(e) => tracing::warn!(error = %e, "the tenants' issuers could not be read for the metadata"),
        }
    }
    let mut metadata = json!({
        "resource": c.resource_uri(),
        "authorization_servers": servers,
        "bearer_methods_supported": ["header"],
        "resource_name": c.auth.resource_name,
    });
    if !c.scopes_supported().is_empty() {
        metadata["scopes_supported"] = json!(c.scopes_supported());
    }
    Json(metadata)
}

/// The keys upstream servers verify identity assertions with: every replica's (see
/// `cluster::keys`).
pub(crate) async fn jwks(State(state): State<AppState>) -> Json<Value> {
    Json(state.cluster.jwks().await)
}
