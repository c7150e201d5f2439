//! The admin API, `/admin/v1/`: the administrative service ([`crate::admin`]) over HTTP, as
//! JSON resources. The same bearer tokens as `/mcp` (the same validation); the caller's
//! authority is resolved on every request from the database (no cache: a removed owner loses
//! the API at once), rate-limited with the `/mcp` budgets, and every refusal is a problem
//! body (RFC 9457) naming the field at fault where there is one.
//!
//! Conventions: collections are paged (`limit`, `after`; the next page's cursor in `next` and
//! in a `Link: <...>; rel="next"` header); every representation carries an `ETag` (the digest
//! of its canonical JSON) and every change takes `If-Match` (412 when the resource changed);
//! a creation takes an `Idempotency-Key` (a retry answers what the first request did, with
//! `Idempotent-Replayed: true`). The OpenAPI 3.1 description at `/admin/v1/openapi.json` is
//! generated from the handlers below (utoipa-axum registers each route with its description).

mod routes;
pub(crate) mod status;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

use super::limits::RateLimiter;
use crate::admin::{Admin, AdminError, Authority, Caller, Done, Idempotency, Member, Page, Tagged};
use crate::auth::{AuthError, Authenticator};
use crate::model::Role;
use crate::store::{Db, TenantId, UserId};

/// Where the admin API lives.
pub(crate) const PREFIX: &str = "/admin/v1";

/// What the admin routes share.
#[derive(Clone)]
pub(crate) struct AdminApi {
    pub admin: Admin,
    pub authenticator: Arc<Authenticator>,
    pub trusted: Arc<crate::identity::TrustedIssuers>,
    pub platform: Arc<[String]>,
    pub limiter: Arc<RateLimiter>,
    pub resource_metadata_url: String,
    pub runtime: status::Runtime,
}

/// The admin router (its routes behind [`authority`]) and the OpenAPI description of it.
pub(crate) fn router(api: AdminApi) -> (axum::Router, utoipa::openapi::OpenApi) {
    let (routes, openapi) = routes::api().split_for_parts();
    let document = Arc::new(openapi.clone());
    // The body limit is the gateway's (`server.body_limit_bytes`, in the request path's own
    // layer), not axum's default of 2 MiB.
    let routes = routes
        .layer(axum::middleware::from_fn_with_state(api.clone(), authority))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(api)
        .route(
            &format!("{PREFIX}/openapi.json"),
            axum::routing::get(move || {
                let document = Arc::clone(&document);
                async move { axum::Json(document.as_ref().clone()).into_response() }
            }),
        );
    (routes, openapi)
}

/// 413 as a problem body: a body over `server.body_limit_bytes` (the one limit of every route;
/// axum's own default is off for the admin routes).
pub(crate) fn too_large() -> Response {
    problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "the body is larger than this gateway accepts (server.body_limit_bytes)",
        Some("body".into()),
    )
}

/// A refusal, as RFC 9457 describes it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct Problem {
    /// `urn:scopegate:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The request field at fault (a body member's path, a query parameter or a header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// A policy that does not validate: each problem, with its line and column in the text.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub errors: Option<Vec<crate::policy::Problem>>,
}

pub(crate) fn problem(status: StatusCode, code: &str, detail: impl Into<String>, field: Option<String>) -> Response {
    let body = Problem {
        kind: format!("urn:scopegate:problem:{code}"),
        title: status.canonical_reason().unwrap_or("error").to_owned(),
        status: status.as_u16(),
        detail: detail.into(),
        field,
        errors: None,
    };
    let mut response = (status, axum::Json(body)).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self.0 {
            AdminError::Forbidden => problem(StatusCode::FORBIDDEN, "forbidden", "this act needs another role", None),
            AdminError::Denied(m) => problem(StatusCode::FORBIDDEN, "forbidden", m, None),
            AdminError::NotFound(m) => problem(StatusCode::NOT_FOUND, "not_found", m, None),
            AdminError::Invalid { field, message } => {
                problem(StatusCode::UNPROCESSABLE_ENTITY, "invalid", format!("{field}: {message}"), Some(field.into()))
            }
            AdminError::Conflict(m) => problem(StatusCode::CONFLICT, "conflict", m, None),
            AdminError::InvalidPolicy(errors) => {
                let status = StatusCode::UNPROCESSABLE_ENTITY;
                let detail = match errors.first() {
                    Some(first) => format!("the policy does not validate: {first}"),
                    None => "the policy does not validate".to_owned(),
                };
                let body = Problem {
                    kind: "urn:scopegate:problem:invalid_policy".into(),
                    title: status.canonical_reason().unwrap_or("error").to_owned(),
                    status: status.as_u16(),
                    detail,
                    field: Some("text".into()),
                    errors: Some(errors),
                };
                let mut response = (status, axum::Json(body)).into_response();
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
                response
            }
            AdminError::PreconditionFailed => problem(
                StatusCode::PRECONDITION_FAILED,
                "precondition_failed",
                "the resource is not the version If-Match names: read it again",
                Some("If-Match".into()),
            ),
            AdminError::KeyReused => problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was sent with another request",
                Some("Idempotency-Key".into()),
            ),
            AdminError::Store(e) => {
                tracing::error!(error = %e, "admin request failed");
                problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the request could not be served", None)
            }
        }
    }
}

/// An [`AdminError`] as an HTTP answer.
pub(crate) struct Refusal(pub AdminError);

impl From<AdminError> for Refusal {
    fn from(e: AdminError) -> Self {
        Refusal(e)
    }
}

/// Why a bearer token gets no authority.
pub(crate) enum Denied {
    /// No token, or one that does not verify: 401.
    Token(AuthError),
    /// A good token naming no active user of an active tenant: 403.
    Nobody,
    /// Over the rate limit: 429, retry after this many seconds.
    Limited(u64),
    Failed(AdminError),
}

/// The [`Authority`] of a bearer token: the same validation as `/mcp`, then a configured
/// platform subject, or an active user of the active tenant the token names (read from the
/// database on every request); admitted by the rate limiter.
pub(crate) async fn resolve(api: &AdminApi, token: &str) -> Result<Authority, Denied> {
    let (claims, tenant) =
        crate::identity::verify_bearer(&api.authenticator, &api.trusted, token).await.map_err(Denied::Token)?;
    // Platform administrators are named by the gateway's own identity provider only: a
    // tenant's provider can name nobody but that tenant's users.
    let who = if !claims.tenant_issuer && api.platform.contains(&claims.subject) {
        Authority::Platform { subject: claims.subject }
    } else {
        let tenant = tenant.ok_or(Denied::Token(AuthError::MissingTenant))?;
        let claims = crate::auth::Claims { tenant, ..claims };
        match member(api.admin.db(), claims.tenant_key(), &claims.subject).await {
            Ok(Some(member)) => Authority::Member(member),
            Ok(None) => {
                tracing::info!(tenant = %claims.tenant, "admin: no active user for the token");
                return Err(Denied::Nobody);
            }
            Err(e) => return Err(Denied::Failed(e)),
        }
    };
    let (tenant, user) = match &who {
        Authority::Member(m) => (m.tenant, m.user),
        _ => (TenantId::nil(), UserId::nil()),
    };
    if let Err((_, wait)) = api.limiter.admit(tenant, user) {
        crate::telemetry::metrics::denial("rate_limited_admin");
        return Err(Denied::Limited(wait.ceil().max(1.0) as u64));
    }
    Ok(who)
}

/// Resolves the caller's [`Authority`] (or refuses: 401 without a good token, 403 for a
/// token naming no active user of an active tenant, 429 over the rate limit) and puts it in
/// the request's extensions.
async fn authority(State(api): State<AdminApi>, mut request: Request, next: Next) -> Response {
    let who = match crate::identity::bearer_token(request.headers()) {
        Ok(token) => resolve(&api, token).await,
        Err(e) => Err(Denied::Token(e)),
    };
    let who = match who {
        Ok(who) => who,
        Err(Denied::Token(e)) => return unauthorized(&api, e),
        Err(Denied::Nobody) => return problem(StatusCode::FORBIDDEN, "forbidden", "access denied", None),
        Err(Denied::Limited(secs)) => {
            let mut response =
                problem(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "too many requests; retry later", None);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
            return response;
        }
        Err(Denied::Failed(e)) => return Refusal(e).into_response(),
    };
    request.extensions_mut().insert(Arc::new(who));
    let mut response = next.run(request).await;
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The active user `subject` of the active tenant `key` names, with its roles.
async fn member(
    db: &Db,
    key: crate::store::principal::TenantKey<'_>,
    subject: &str,
) -> Result<Option<Member>, AdminError> {
    let rows = db.load_principal(key, Some(subject)).await?;
    let (Some(tenant), Some(user)) = (rows.tenant, rows.user) else { return Ok(None) };
    if tenant.status != "active" || user.status != "active" {
        return Ok(None);
    }
    // A role the code does not know is a broken database: no authority at all.
    let roles: Option<Vec<Role>> = rows.roles.iter().map(|r| r.parse().ok()).collect();
    let Some(roles) = roles else { return Ok(None) };
    Ok(Some(Member { tenant: tenant.id, slug: tenant.slug, user: user.id, subject: subject.to_owned(), roles }))
}

fn unauthorized(api: &AdminApi, error: AuthError) -> Response {
    tracing::info!(reason = error.reason(), "admin API: bearer token refused");
    if error == AuthError::KeysUnavailable {
        let mut response = problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable", error.description(), None);
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    let challenge = match error {
        AuthError::Missing => format!("Bearer resource_metadata=\"{}\"", api.resource_metadata_url),
        other => format!(
            "Bearer error=\"invalid_token\", error_description=\"{}\", resource_metadata=\"{}\"",
            other.description(),
            api.resource_metadata_url
        ),
    };
    let mut response = problem(StatusCode::UNAUTHORIZED, "unauthorized", error.description(), None);
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// A JSON request body, parsed with the path of the member at fault named on failure; with the
/// digest of the request it came in (method, path, body) for idempotency keys.
pub(crate) struct JsonBody<T> {
    pub value: T,
    pub fingerprint: String,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
            .is_some_and(|essence| essence == "application/json" || essence.ends_with("+json"));
        if !json {
            return Err(problem(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON (Content-Type: application/json)",
                Some("Content-Type".into()),
            ));
        }
        let head = format!("{} {}\n", request.method(), request.uri().path());
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else {
                problem(StatusCode::BAD_REQUEST, "bad_request", "the body could not be read", None)
            }
        })?;
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let path = e.path().to_string();
            // Text that is not JSON at all is the body's fault, wherever it broke off.
            let malformed =
                matches!(e.inner().classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof);
            let field = if path == "." || malformed { "body".to_owned() } else { path };
            problem(StatusCode::UNPROCESSABLE_ENTITY, "invalid", format!("{field}: {}", e.inner()), Some(field))
        })?;
        deserializer.end().map_err(|e| {
            problem(StatusCode::UNPROCESSABLE_ENTITY, "invalid", format!("body: {e}"), Some("body".into()))
        })?;
        let mut whole = head.into_bytes();
        whole.extend_from_slice(&bytes);
        Ok(JsonBody { value, fingerprint: crate::vocab::digest::sha256_hex(&whole) })
    }
}

/// A request's query parameters, parsed with the parameter at fault named on failure (400, a
/// problem body), where axum's `Query` would answer in plain text.
pub(crate) struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer).map(Params).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "query".to_owned() } else { path };
            problem(StatusCode::BAD_REQUEST, "invalid_parameter", format!("{field}: {}", e.inner()), Some(field))
        })
    }
}

/// A request's caller, `If-Match`, `Idempotency-Key` and request id, for a write.
pub(crate) fn caller<'a>(
    who: &'a Authority,
    headers: &HeaderMap,
    fingerprint: Option<&str>,
) -> Result<Caller<'a>, Refusal> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let idempotency = match (headers.get("idempotency-key"), fingerprint) {
        (Some(key), Some(fingerprint)) => {
            let key = key.to_str().map_err(|_| AdminError::Invalid {
                field: "Idempotency-Key",
                message: "must be visible ASCII".into(),
            })?;
            Some(Idempotency::new(key, fingerprint.to_owned())?)
        }
        _ => None,
    };
    Ok(Caller {
        who,
        via: "api",
        request_id: text("x-request-id"),
        idempotency,
        if_match: text(header::IF_MATCH.as_str()),
    })
}

fn etag_value(tag: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("\"{tag}\"")).ok()
}

/// 200 with a representation and its ETag.
pub(crate) fn tagged(found: Tagged) -> Response {
    let mut response = axum::Json(found.view).into_response();
    if let Some(v) = etag_value(&found.etag) {
        response.headers_mut().insert(header::ETAG, v);
    }
    response
}

/// 200 with a page, and a `Link` to the next one.
pub(crate) fn paged(page: Page, uri: &http::Uri) -> Response {
    let next = page.next.clone();
    let mut response = axum::Json(page).into_response();
    if let Some(next) = next {
        let mut query: Vec<String> = uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("after="))
            .map(str::to_owned)
            .collect();
        query.push(format!("after={next}"));
        if let Ok(v) = HeaderValue::from_str(&format!("<{}?{}>; rel=\"next\"", uri.path(), query.join("&"))) {
            response.headers_mut().insert(header::LINK, v);
        }
    }
    response
}

/// A write's answer: its status, the resource as it is now with its ETag, `Location` for a
/// creation, `Idempotent-Replayed` for an answer given again, and a new secret (this once).
pub(crate) fn done(done: Done) -> Response {
    let status = StatusCode::from_u16(done.status).unwrap_or(StatusCode::OK);
    let mut body = done.body;
    if let (Some(secret), Some(serde_json::Value::Object(map))) = (done.secret, body.as_mut()) {
        map.insert(done.secret_name.into(), serde_json::Value::String(secret));
    }
    let mut response = match body {
        Some(body) if status != StatusCode::NO_CONTENT => (status, axum::Json(body)).into_response(),
        _ => status.into_response(),
    };
    let headers = response.headers_mut();
    if let Some(v) = done.etag.as_deref().and_then(etag_value) {
        headers.insert(header::ETAG, v);
    }
    if let Some(v) = done.location.and_then(|l| HeaderValue::from_str(&format!("{PREFIX}/{l}")).ok()) {
        headers.insert(header::LOCATION, v);
    }
    if done.replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}
