//! The authentication and identity layer in front of every protected route: bearer token
//! -> claims -> ResolvedIdentity in the request's extensions, or 401/403/503 and no handler.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use http::{HeaderValue, StatusCode, header};
use tracing::Instrument;

use super::{MessageBinding, resolver};
use crate::auth::{AuthError, Authenticator};
use crate::error_body::json_error;
use crate::jsonrpc::Inspection;
use crate::store::Db;
use crate::telemetry::trace;

/// The header MCP uses for its session id.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// What the layer needs: set up once, shared by every request.
pub(crate) struct Gate {
    pub authenticator: Arc<Authenticator>,
    /// The issuers tenants trust besides the gateway's own.
    pub trusted: Arc<super::TrustedIssuers>,
    pub db: Db,
    pub service_subjects: Vec<String>,
    /// The token claims policies read (`auth.policy_claims`).
    pub policy_claims: Vec<String>,
    pub resource_metadata_url: String,
    /// Scopes every token must carry (`auth.required_scopes`).
    pub required_scopes: Vec<String>,
    /// The `scope` of the 401 challenge: the required scopes, else the supported ones.
    pub challenge_scope: Option<String>,
    /// `auth.tool_scopes`.
    pub tool_scopes: std::collections::BTreeMap<String, Vec<String>>,
    pub body_limit: usize,
    pub cache: Option<Arc<super::IdentityCache>>,
}

pub(crate) async fn authenticate(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    let token = match bearer_token(request.headers()) {
        Ok(token) => token,
        Err(e) => return unauthorized(&gate, e),
    };
    let traced = trace::parent_in(request.extensions()).cloned();
    let verified = super::verify_bearer(&gate.authenticator, &gate.trusted, token);
    let claims = match verified.instrument(trace::auth_span(traced.as_ref())).await {
        Ok((claims, Some(tenant))) => crate::auth::Claims { tenant, ..claims },
        Ok((_, None)) => return unauthorized(&gate, AuthError::MissingTenant),
        Err(e) => return unauthorized(&gate, e),
    };
    if !claims.has_scopes(&gate.required_scopes) {
        return insufficient_scope(&gate, &claims, &[]);
    }

    // Buffer the body to learn which JSON-RPC message this identity is for. A body that
    // is not JSON-RPC binds no id, so no tool call can use this identity.
    let (parts, body) = request.into_parts();
    let bytes = match buffer(&parts.headers, body, gate.body_limit).await {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge) => return crate::error_body::payload_too_large(),
        Err(BodyError::Read) => {
            return json_error(StatusCode::BAD_REQUEST, "bad_request", "the request body could not be read");
        }
    };
    // The one parse of the body; the JSON-RPC check behind the gate reuses it.
    let inspection = Inspection::of(bytes.clone());
    // A tool that needs more than the token holds: the step-up challenge, before anything runs.
    if inspection.method() == Some("tools/call")
        && let Some(tool) = inspection.name()
    {
        let needed = crate::config::scopes_of_tool(&gate.tool_scopes, tool);
        if !claims.has_scopes(&needed) {
            return insufficient_scope(&gate, &claims, &needed);
        }
    }
    let request_id = inspection.request_id().cloned();
    let session_id = parts.headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let message = MessageBinding { request_id, session_id };

    let resolving = resolver::resolve(&gate.db, gate.cache.as_deref(), &claims, &gate.service_subjects, message);
    let mut identity = match resolving.instrument(trace::identity_span(traced.as_ref())).await {
        Ok(identity) => identity,
        Err(resolver::IdentityError::Store(e)) => {
            tracing::error!(error = %e, "identity resolution failed; refusing the request");
            return json_error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "identity could not be resolved");
        }
        Err(e) => {
            tracing::info!(reason = e.reason(), tenant = %claims.tenant, "identity refused");
            return json_error(StatusCode::FORBIDDEN, "forbidden", "access denied");
        }
    };

    let span = tracing::Span::current();
    span.record("tenant", claims.tenant.as_str());
    if let Some(user) = identity.user.get() {
        span.record("user", tracing::field::display(user.id));
    }
    tracing::debug!(tenant_wide_flocks = identity.flocks.is_unrestricted(), "identity resolved");

    identity.policy_claims = gate
        .policy_claims
        .iter()
        .filter_map(|name| {
            let value = match claims.rest.get(name)? {
                serde_json::Value::String(text) => text.clone(),
                serde_json::Value::Null => return None,
                other => crate::vocab::digest::canonical_json(other),
            };
            Some((name.clone(), value))
        })
        .collect();
    let mut request = Request::from_parts(parts, Body::from(bytes));
    request.extensions_mut().insert(Arc::new(identity));
    request.extensions_mut().insert(inspection);
    next.run(request).await
}

enum BodyError {
    TooLarge,
    Read,
}

/// The whole body in one buffer, sized from `Content-Length` (capped at `limit`) and filled
/// frame by frame, each frame dropped once copied: one copy of the body at a time, where
/// collecting the frames first and joining them after held two.
async fn buffer(headers: &http::HeaderMap, body: Body, limit: usize) -> Result<Bytes, BodyError> {
    use http_body_util::BodyExt;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    if declared > limit {
        return Err(BodyError::TooLarge);
    }
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        // A body without a declared length (chunked) ends in an error where it passes the
        // limit: it is too large, not unreadable.
        let frame =
            frame.map_err(|e| if crate::error_body::is_over_limit(e) { BodyError::TooLarge } else { BodyError::Read });
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let held = first.as_ref().map_or(0, Bytes::len) + joined.as_ref().map_or(0, BytesMut::len);
        if held + data.len() > limit {
            return Err(BodyError::TooLarge);
        }
        match (&mut first, &mut joined) {
            // The usual case, one frame: kept as it is, no copy at all.
            (None, None) => first = Some(data),
            (Some(_), None) => {
                let mut buf = BytesMut::with_capacity(declared.max(held + data.len()));
                buf.extend_from_slice(&first.take().unwrap_or_default());
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
            (_, Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    Ok(joined.map(BytesMut::freeze).or(first).unwrap_or_default())
}

/// The token from exactly one `Authorization: Bearer <token>` header.
pub(crate) fn bearer_token(headers: &http::HeaderMap) -> Result<&str, AuthError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(AuthError::Missing);
    };
    if values.next().is_some() {
        return Err(AuthError::Malformed);
    }
    let value = value.to_str().map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Missing);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}

/// 401 with an RFC 6750 / RFC 9728 challenge naming the scopes to ask for.
/// `error="invalid_token"` only when a token was sent. A token that cannot be verified because
/// the identity provider's keys are not held yet is answered 503 instead: nothing is wrong with
/// it, and a 401 would make the client throw it away and authorise again.
fn unauthorized(gate: &Gate, error: AuthError) -> Response {
    tracing::info!(reason = error.reason(), "bearer token refused");
    if error == AuthError::KeysUnavailable {
        let mut response = json_error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", error.description());
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    let scope = gate.challenge_scope.as_deref().map(|s| format!(", scope=\"{s}\"")).unwrap_or_default();
    let challenge = match error {
        AuthError::Missing => format!("Bearer resource_metadata=\"{}\"{scope}", gate.resource_metadata_url),
        other => format!(
            "Bearer error=\"invalid_token\", error_description=\"{}\", resource_metadata=\"{}\"{scope}",
            other.description(),
            gate.resource_metadata_url
        ),
    };
    let code = if error == AuthError::Missing { "unauthorized" } else { "invalid_token" };
    let mut response = json_error(StatusCode::UNAUTHORIZED, code, error.description());
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response.into_response()
}

/// 403 with the step-up challenge of RFC 6750 section 3.1: the scopes the token lacks, with
/// the ones it has (a client asks for them all at once, so it does not lose what it had).
fn insufficient_scope(gate: &Gate, claims: &crate::auth::Claims, needed: &[String]) -> Response {
    tracing::info!(tenant = %claims.tenant, held = ?claims.scopes, "token lacks a required scope");
    crate::telemetry::metrics::insufficient_scope();
    let mut wanted: Vec<&str> = claims.scopes.iter().map(String::as_str).collect();
    for scope in gate.required_scopes.iter().chain(needed) {
        if !wanted.contains(&scope.as_str()) {
            wanted.push(scope);
        }
    }
    let challenge = format!(
        "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{}\", \
         error_description=\"the access token lacks a required scope\"",
        wanted.join(" "),
        gate.resource_metadata_url
    );
    let mut response =
        json_error(StatusCode::FORBIDDEN, "insufficient_scope", "the access token lacks a required scope");
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}
