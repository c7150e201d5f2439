//! The console, `/console`: a small server-rendered web app for operators, owners and
//! auditors, on the administrative service and the admin API's authentication (a token of
//! the same issuer, resolved to the same [`Authority`] on every request).
//!
//! Sign-in is through the identity provider (authorization code + PKCE, [`signin`]) when
//! `console.oidc_client_id` is set, or by pasting a bearer token (the demo's printed tokens,
//! for development); either way the access token is kept in a cookie that is `HttpOnly`, `Secure`,
//! `SameSite=Strict` and scoped to `/console`. Every form carries a CSRF token (an HMAC of
//! the session under a key the replicas share; the sign-in form's, of a nonce cookie), and
//! every page is sent with a strict Content Security Policy: no scripts at all, styles only
//! from the console's own stylesheet, which ships in the binary. Nothing needs JavaScript.

mod pages;
mod signin;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use ring::hmac;
use serde::Deserialize;
use tokio::sync::OnceCell;

use super::admin::{AdminApi, Denied, resolve};
use crate::admin::definitions::{DefinitionDetail, DefinitionView};
use crate::admin::{AdminError, Authority, Caller, Collection, EventFilter, Need, Target, Write, report::ReportFormat};
use crate::model::{Role, UserStatus};
use crate::store::definitions::{Decision, DefinitionState};
use crate::store::entities::GrantKind;

const SESSION_COOKIE: &str = "scopegate_console";
const LOGIN_COOKIE: &str = "scopegate_console_login";
const CSS: &str = include_str!("console.css");
const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// What the console's routes share.
#[derive(Clone)]
pub(crate) struct Console {
    api: AdminApi,
    /// The CSRF key, shared by the replicas (read from the database once).
    key: Arc<OnceCell<hmac::Key>>,
    /// Sign-in through identity providers (the gateway's own, tenants').
    signin: Option<Arc<signin::SignIn>>,
}

pub(crate) fn router(api: AdminApi, config: &crate::config::Config) -> Router {
    let signin = signin::SignIn::new(config).map(Arc::new);
    let console = Console { api, key: Arc::new(OnceCell::new()), signin };
    Router::new()
        .route("/console", get(home))
        .route("/console/", get(home))
        .route("/console/session", post(sign_in))
        .route(signin::START_PATH, get(signin::start))
        .route(&format!("{}/{{tenant}}", crate::admin::CONSOLE_SIGNIN_TENANTS), get(signin::start_tenant))
        .route(signin::CALLBACK_PATH, get(signin::callback))
        .route("/console/signout", post(sign_out))
        .route("/console/assets/console.css", get(css))
        .route("/console/tenants", get(tenants).post(create_tenant))
        .route("/console/tenants/{tenant}", get(tenant))
        .route("/console/tenants/{tenant}/retire", post(retire_tenant))
        .route("/console/tenants/{tenant}/org-id", post(set_org_id))
        .route("/console/tenants/{tenant}/write-ahead", post(set_write_ahead))
        .route("/console/tenants/{tenant}/purge", post(purge_tenant))
        .route("/console/tenants/{tenant}/users", post(create_user))
        .route("/console/tenants/{tenant}/users/{subject}/status", post(user_status))
        .route("/console/tenants/{tenant}/bindings", post(set_binding))
        .route("/console/tenants/{tenant}/grants", post(create_grant))
        .route("/console/tenants/{tenant}/grants/{grant}/revoke", post(revoke_grant))
        .route("/console/tenants/{tenant}/issuers", post(trust_issuer))
        .route("/console/tenants/{tenant}/issuers/distrust", post(distrust_issuer))
        .route("/console/tenants/{tenant}/audit", get(audit))
        .route("/console/tenants/{tenant}/policies", get(policies).post(put_policy))
        .route("/console/tenants/{tenant}/policies/{id}/delete", post(delete_policy))
        .route("/console/tenants/{tenant}/policy-mode", post(set_policy_mode))
        .route("/console/tenants/{tenant}/definitions", get(definitions))
        .route("/console/tenants/{tenant}/definitions/{id}/approve", post(approve_definition))
        .route("/console/tenants/{tenant}/definitions/{id}/reject", post(reject_definition))
        .route("/console/tenants/{tenant}/approvals", get(approvals))
        .route("/console/tenants/{tenant}/approvals/{id}/approve", post(approve_call))
        .route("/console/tenants/{tenant}/approvals/{id}/reject", post(reject_call))
        .route("/console/tenants/{tenant}/audit/export", get(export))
        .route("/console/executors", get(executors))
        .route("/console/guards", get(guards))
        .layer(axum::middleware::from_fn(headers))
        .with_state(console)
}

/// The headers every console answer carries.
async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    secure(response.headers_mut());
    response
}

/// The answer to a path the gateway does not serve (the router's fallback): a 404 in our error
/// body, with the console's headers, since a browser may well be the one asking.
pub(crate) async fn not_found() -> Response {
    let mut response = crate::error_body::not_found().await;
    secure(response.headers_mut());
    response
}

fn secure(h: &mut http::HeaderMap) {
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: with it a browser sends `Origin: null` on the forms' posts, which the
    // gateway's origin check refuses.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}

impl Console {
    async fn key(&self) -> Result<&hmac::Key, AdminError> {
        self.key
            .get_or_try_init(|| async {
                let bytes = self.api.admin.db().shared_key("console_csrf").await?;
                Ok::<_, AdminError>(hmac::Key::new(hmac::HMAC_SHA256, &bytes))
            })
            .await
    }

    /// The CSRF token of the forms of a session (or of a sign-in nonce).
    async fn csrf(&self, purpose: &str, of: &str) -> Result<String, AdminError> {
        let tag = hmac::sign(self.key().await?, format!("{purpose}\0{of}").as_bytes());
        Ok(URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    async fn csrf_holds(&self, purpose: &str, of: &str, sent: &str) -> bool {
        let Ok(key) = self.key().await else { return false };
        let Ok(sent) = URL_SAFE_NO_PAD.decode(sent) else { return false };
        hmac::verify(key, format!("{purpose}\0{of}").as_bytes(), &sent).is_ok()
    }
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn set_cookie(name: &str, value: &str, max_age: i64) -> HeaderValue {
    let text = format!("{name}={value}; Path=/console; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn see_other(to: &str) -> Response {
    Redirect::to(to).into_response()
}

/// A signed-in request: its authority, and the CSRF token its forms carry.
struct Session {
    who: Authority,
    csrf: String,
}

/// The session of `headers`, or the answer that takes the browser to sign in again.
async fn session(console: &Console, headers: &HeaderMap) -> Result<Session, Response> {
    let Some(token) = cookie(headers, SESSION_COOKIE) else { return Err(see_other("/console")) };
    match resolve(&console.api, token).await {
        Ok(who) => {
            let csrf = console.csrf("session", token).await.map_err(failed)?;
            Ok(Session { who, csrf })
        }
        Err(Denied::Limited(_)) => {
            Err((StatusCode::TOO_MANY_REQUESTS, "too many requests; retry later").into_response())
        }
        Err(Denied::Failed(e)) => Err(failed(e)),
        // The token expired or its user lost access: sign in again.
        Err(Denied::Token(_) | Denied::Nobody) => {
            let mut response = see_other("/console?signed_out=1");
            response.headers_mut().insert(header::SET_COOKIE, set_cookie(SESSION_COOKIE, "", 0));
            Err(response)
        }
    }
}

/// A POST of a signed-in session whose CSRF token holds.
async fn posted(console: &Console, headers: &HeaderMap, csrf: &str) -> Result<Session, Response> {
    let session = session(console, headers).await?;
    let token = cookie(headers, SESSION_COOKIE).unwrap_or_default();
    if !console.csrf_holds("session", token, csrf).await {
        return Err((StatusCode::FORBIDDEN, "the form's CSRF token does not hold: reload the page").into_response());
    }
    Ok(session)
}

fn failed(e: AdminError) -> Response {
    tracing::error!(error = %e, "console request failed");
    (StatusCode::SERVICE_UNAVAILABLE, "the request could not be served").into_response()
}

/// An act's refusal as a page answer: 404 and 403 as pages, others as a notice on `back`.
fn refused(e: AdminError, session: &Session, back: &str) -> Response {
    match e {
        AdminError::NotFound(_) => pages::refusal(&session.who, &session.csrf, StatusCode::NOT_FOUND, "No such page."),
        AdminError::Forbidden => {
            pages::refusal(&session.who, &session.csrf, StatusCode::FORBIDDEN, "Your roles do not open this page.")
        }
        AdminError::Store(_) => failed(e),
        other => see_other(&format!(
            "{back}?error={}",
            percent_encoding::utf8_percent_encode(&other.to_string(), percent_encoding::NON_ALPHANUMERIC)
        )),
    }
}

#[derive(Deserialize, Default)]
struct Notice {
    error: Option<String>,
    done: Option<String>,
    signed_out: Option<String>,
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "public, max-age=3600")], CSS)
        .into_response()
}

/// The sign-in page, or where a signed-in user starts.
async fn home(State(console): State<Console>, headers: HeaderMap, Query(notice): Query<Notice>) -> Response {
    if cookie(&headers, SESSION_COOKIE).is_some() {
        return match session(&console, &headers).await {
            Ok(s) => see_other(&start_page(&s.who)),
            Err(response) => response,
        };
    }
    let nonce = URL_SAFE_NO_PAD.encode(uuid::Uuid::new_v4().as_bytes());
    let csrf = match console.csrf("login", &nonce).await {
        Ok(csrf) => csrf,
        Err(e) => return failed(e),
    };
    let provider = console.signin.as_deref().is_some_and(signin::SignIn::offers_own).then_some(signin::START_PATH);
    let mut response = pages::sign_in(&csrf, notice.error.as_deref(), notice.signed_out.is_some(), provider);
    response.headers_mut().insert(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, &nonce, 600));
    response
}

fn start_page(who: &Authority) -> String {
    match who {
        Authority::Member(m) if m.roles.contains(&Role::Owner) => format!("/console/tenants/{}", m.slug),
        Authority::Member(m) if m.roles.contains(&Role::Auditor) => format!("/console/tenants/{}/audit", m.slug),
        Authority::Member(m) if m.roles.contains(&Role::Approver) => format!("/console/tenants/{}/approvals", m.slug),
        Authority::Member(_) => "/console/guards".into(),
        _ => "/console/tenants".into(),
    }
}

#[derive(Deserialize)]
struct SignIn {
    token: String,
    csrf: String,
}

async fn sign_in(State(console): State<Console>, headers: HeaderMap, Form(form): Form<SignIn>) -> Response {
    let nonce = cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if nonce.is_empty() || !console.csrf_holds("login", nonce, &form.csrf).await {
        return see_other("/console?error=the+sign-in+form+expired%3A+try+again");
    }
    let token = form.token.trim();
    let valid_cookie = !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b',');
    let who = if valid_cookie { resolve(&console.api, token).await } else { Err(Denied::Nobody) };
    match who {
        Ok(who) => {
            let mut response = see_other(&start_page(&who));
            let h = response.headers_mut();
            h.append(header::SET_COOKIE, set_cookie(SESSION_COOKIE, token, 12 * 3600));
            h.append(header::SET_COOKIE, set_cookie(LOGIN_COOKIE, "", 0));
            response
        }
        Err(Denied::Failed(e)) => failed(e),
        Err(_) => see_other("/console?error=that+token+gives+no+access+to+the+console"),
    }
}

#[derive(Deserialize)]
struct CsrfOnly {
    csrf: String,
}

async fn sign_out(State(console): State<Console>, headers: HeaderMap, Form(form): Form<CsrfOnly>) -> Response {
    if let Err(response) = posted(&console, &headers, &form.csrf).await {
        return response;
    }
    let mut response = see_other("/console?signed_out=1");
    response.headers_mut().insert(header::SET_COOKIE, set_cookie(SESSION_COOKIE, "", 0));
    response
}

/// Every item of a collection (the console shows whole lists: a tenant's are small, and the
/// tenants' list is the platform's own).
async fn all(console: &Console, who: &Authority, collection: Collection) -> Result<Vec<serde_json::Value>, AdminError> {
    console.api.admin.list_all(who, &collection).await
}

async fn tenants(State(console): State<Console>, headers: HeaderMap, Query(notice): Query<Notice>) -> Response {
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match all(&console, &s.who, Collection::Tenants).await {
        Ok(list) => pages::tenants(&s.who, &s.csrf, &list, &notice),
        Err(e) => refused(e, &s, "/console/tenants"),
    }
}

/// One change made from a form, and the page to go back to.
async fn act(console: &Console, s: &Session, write: Write, back: &str) -> Response {
    let caller = Caller { who: &s.who, via: "console", request_id: None, idempotency: None, if_match: None };
    match console.api.admin.write(&caller, write).await {
        Ok(_) => see_other(&format!("{back}?done=1")),
        Err(e) => refused(e, s, back),
    }
}

#[derive(Deserialize)]
struct NewTenant {
    csrf: String,
    slug: String,
    name: String,
}

async fn create_tenant(State(console): State<Console>, headers: HeaderMap, Form(f): Form<NewTenant>) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    act(&console, &s, Write::CreateTenant { slug: f.slug, name: f.name }, "/console/tenants").await
}

async fn tenant(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(slug): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{slug}");
    let loaded = async {
        let tenant = console.api.admin.get(&s.who, &Target::Tenant { slug: slug.clone() }).await?.view;
        let users = all(&console, &s.who, Collection::Users { tenant: slug.clone() }).await?;
        let grants = all(&console, &s.who, Collection::Grants { tenant: slug.clone() }).await?;
        let servers = super::admin::status::servers(&console.api, &s.who, &slug).await?;
        let issuers = all(&console, &s.who, Collection::Issuers { tenant: slug.clone() }).await?;
        Ok::<_, AdminError>((tenant, users, servers, grants, issuers))
    };
    match loaded.await {
        Ok((tenant, users, servers, grants, issuers)) => {
            let lists = pages::TenantLists { users: &users, servers: &servers, grants: &grants, issuers: &issuers };
            pages::tenant(&s.who, &s.csrf, &tenant, &lists, &notice)
        }
        Err(e) => refused(e, &s, &back),
    }
}

async fn retire_tenant(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<CsrfOnly>,
) -> Response {
    on_tenant(&console, &headers, &f.csrf, Write::RetireTenant { slug: tenant }).await
}

#[derive(Deserialize)]
struct OrgIdForm {
    csrf: String,
    org_id: String,
}

/// Records (or, empty, clears) the tenant's organization id at the identity provider.
async fn set_org_id(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<OrgIdForm>,
) -> Response {
    let org_id = Some(f.org_id.trim().to_owned());
    let write = Write::UpdateTenant { slug: tenant, name: None, status: None, org_id, audit_write_ahead: None };
    on_tenant(&console, &headers, &f.csrf, write).await
}

#[derive(Deserialize)]
struct WriteAheadForm {
    csrf: String,
    /// `true` or `false` (anything else is refused by the form's parsing).
    audit_write_ahead: bool,
}

/// Turns the tenant's write-ahead audit on or off.
async fn set_write_ahead(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<WriteAheadForm>,
) -> Response {
    let audit_write_ahead = Some(f.audit_write_ahead);
    let write = Write::UpdateTenant { slug: tenant, name: None, status: None, org_id: None, audit_write_ahead };
    on_tenant(&console, &headers, &f.csrf, write).await
}

async fn purge_tenant(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<CsrfOnly>,
) -> Response {
    on_tenant(&console, &headers, &f.csrf, Write::PurgeTenant { slug: tenant }).await
}

/// A form's act on a tenant as a whole, then back to the tenant's page.
async fn on_tenant(console: &Console, headers: &HeaderMap, csrf: &str, write: Write) -> Response {
    let s = match posted(console, headers, csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{}", write.tenant().unwrap_or_default());
    act(console, &s, write, &back).await
}

#[derive(Deserialize)]
struct NewUser {
    csrf: String,
    subject: String,
    display_name: String,
    role: Role,
}

async fn create_user(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<NewUser>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}");
    let write = Write::CreateUser { tenant, subject: f.subject, display_name: f.display_name, roles: vec![f.role] };
    act(&console, &s, write, &back).await
}

#[derive(Deserialize)]
struct StatusForm {
    csrf: String,
    status: UserStatus,
}

async fn user_status(
    State(console): State<Console>,
    headers: HeaderMap,
    Path((tenant, subject)): Path<(String, String)>,
    Form(f): Form<StatusForm>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}");
    let write = Write::UpdateUser { tenant, subject, display_name: None, status: Some(f.status), roles: None };
    act(&console, &s, write, &back).await
}

#[derive(Deserialize)]
struct BindingForm {
    csrf: String,
    server: String,
    executor: String,
    /// `approve`, `trust_first_use` or `follow`; empty: a new binding's default, a rebinding's own.
    #[serde(default)]
    pin: String,
}

async fn set_binding(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<BindingForm>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}");
    let pin = match f.pin.as_str() {
        "" => None,
        text => match crate::store::definitions::PinMode::parse(text) {
            Some(pin) => Some(pin),
            None => {
                let refusal =
                    AdminError::Invalid { field: "pin", message: "approve, trust_first_use or follow".into() };
                return refused(refusal, &s, &back);
            }
        },
    };
    let write = Write::SetBinding { tenant, server: f.server, executor: f.executor, prefixed: true, pin };
    act(&console, &s, write, &back).await
}

#[derive(Deserialize)]
struct GrantForm {
    csrf: String,
    server: String,
    role: Role,
    kind: GrantKind,
    name: String,
    /// `caller`, `approver`, or empty: nobody confirms.
    #[serde(default)]
    confirm: Option<String>,
}

async fn create_grant(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<GrantForm>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}");
    let confirm = match f.confirm.as_deref() {
        None | Some("") => None,
        Some(text) => match crate::model::Confirm::parse(text) {
            Some(confirm) => Some(confirm),
            None => {
                let refusal = AdminError::Invalid { field: "confirm", message: "caller, approver or nothing".into() };
                return refused(refusal, &s, &back);
            }
        },
    };
    let write = Write::CreateGrant { tenant, server: f.server, role: f.role, kind: f.kind, name: f.name, confirm };
    act(&console, &s, write, &back).await
}

async fn revoke_grant(
    State(console): State<Console>,
    headers: HeaderMap,
    Path((tenant, id)): Path<(String, String)>,
    Form(f): Form<CsrfOnly>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}");
    let Some([server, role, kind, name]) = crate::admin::read::grant_key(&id) else {
        return refused(AdminError::NotFound("no such grant".into()), &s, &back);
    };
    let (Ok(role), Ok(kind)) = (role.parse(), kind.parse()) else {
        return refused(AdminError::NotFound("no such grant".into()), &s, &back);
    };
    act(&console, &s, Write::DeleteGrant { tenant, server, role, kind, name }, &back).await
}

#[derive(Deserialize)]
struct IssuerForm {
    csrf: String,
    issuer: String,
    jwks_url: Option<String>,
    audience: Option<String>,
    subject_claim: Option<String>,
    tenant_claim: Option<String>,
    console_client_id: Option<String>,
    console_scopes: Option<String>,
}

async fn trust_issuer(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<IssuerForm>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}");
    // A field left empty is one not given: the key set discovered, the gateway's audience,
    // the subject in `sub`, every token naming this tenant.
    let given = |text: Option<String>| blank(text).map(|t| t.trim().to_owned());
    let trust = crate::admin::IssuerTrust {
        issuer: f.issuer.trim().to_owned(),
        jwks_url: given(f.jwks_url),
        audience: given(f.audience),
        subject_claim: given(f.subject_claim),
        tenant_claim: given(f.tenant_claim),
        console_client_id: given(f.console_client_id),
        console_scopes: given(f.console_scopes),
    };
    let write = Write::TrustIssuer { tenant, trust };
    act(&console, &s, write, &back).await
}

#[derive(Deserialize)]
struct DistrustForm {
    csrf: String,
    issuer: String,
}

async fn distrust_issuer(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<DistrustForm>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}");
    act(&console, &s, Write::DistrustIssuer { tenant, issuer: f.issuer }, &back).await
}

/// The audit page's filter, as the form sends it (times as `YYYY-MM-DDTHH:MM`, UTC).
#[derive(Deserialize, Default)]
struct AuditForm {
    user: Option<String>,
    tool: Option<String>,
    outcome: Option<String>,
    since: Option<String>,
    until: Option<String>,
    after: Option<String>,
}

/// A form's time (`2026-12-05T10:30`, UTC, or epoch milliseconds) in Unix milliseconds.
fn form_time(text: Option<&str>) -> Result<Option<i64>, AdminError> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else { return Ok(None) };
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(Some(ms));
    }
    let format = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]");
    let at = time::PrimitiveDateTime::parse(text, &format)
        .map_err(|_| AdminError::Invalid { field: "since", message: format!("`{text}` is not YYYY-MM-DDTHH:MM") })?;
    Ok(Some((at.assume_utc().unix_timestamp_nanos() / 1_000_000) as i64))
}

fn blank(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.trim().is_empty())
}

async fn audit(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(slug): Path<String>,
    Query(form): Query<AuditForm>,
) -> Response {
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{slug}/audit");
    let loaded = async {
        let filter = EventFilter {
            user: blank(form.user.clone()),
            tool: blank(form.tool.clone()),
            outcome: blank(form.outcome.clone()),
            since: form_time(form.since.as_deref())?,
            until: form_time(form.until.as_deref())?,
            limit: Some(50),
            after: blank(form.after.clone()),
        };
        let status = console.api.admin.audit_status(&s.who, &slug).await?;
        let page = console.api.admin.audit_events(&s.who, &slug, &filter).await?;
        // Who can sign in to the tenant is part of what its auditors check (the platform
        // chain is no tenant: nobody signs in to it).
        let issuers = if slug == crate::store::admin::PLATFORM_SLUG {
            Vec::new()
        } else {
            all(&console, &s.who, Collection::Issuers { tenant: slug.clone() }).await?
        };
        Ok::<_, AdminError>((status, page, issuers))
    };
    match loaded.await {
        Ok((status, page, issuers)) => pages::audit(
            &s.who,
            &s.csrf,
            &slug,
            &status,
            &page,
            &issuers,
            &pages::Filter {
                user: form.user.unwrap_or_default(),
                tool: form.tool.unwrap_or_default(),
                outcome: form.outcome.unwrap_or_default(),
                since: form.since.unwrap_or_default(),
                until: form.until.unwrap_or_default(),
            },
        ),
        Err(AdminError::Invalid { message, .. }) => {
            pages::refusal(&s.who, &s.csrf, StatusCode::UNPROCESSABLE_ENTITY, &message)
        }
        Err(e) => refused(e, &s, &back),
    }
}

#[derive(Deserialize)]
struct ExportForm {
    format: Option<String>,
}

async fn export(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(slug): Path<String>,
    Query(form): Query<ExportForm>,
) -> Response {
    use crate::audit::export::Format;
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (format, content_type, extension) = match form.format.as_deref() {
        Some("csv") => (Format::Csv, "text/csv; charset=utf-8", "csv"),
        _ => (Format::Jsonl, "application/x-ndjson", "jsonl"),
    };
    let reader = match console.api.admin.audit_export_stream(s.who.clone(), slug.clone(), None, format).await {
        Ok(reader) => reader,
        Err(e) => return refused(e, &s, "/console"),
    };
    let disposition = format!("attachment; filename=\"{slug}-audit.{extension}\"");
    let body = axum::body::Body::from_stream(tokio_util::io::ReaderStream::new(reader));
    ([(header::CONTENT_TYPE, content_type.to_owned()), (header::CONTENT_DISPOSITION, disposition)], body)
        .into_response()
}

async fn executors(State(console): State<Console>, headers: HeaderMap) -> Response {
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let loaded = async {
        let executors = super::admin::status::executors(&console.api, &s.who).await?;
        let sessions = super::admin::status::sessions(&console.api, &s.who).await?;
        Ok::<_, AdminError>((executors, sessions))
    };
    match loaded.await {
        Ok((executors, sessions)) => pages::executors(&s.who, &s.csrf, &executors, &sessions),
        Err(e) => refused(e, &s, "/console/executors"),
    }
}

async fn guards(State(console): State<Console>, headers: HeaderMap) -> Response {
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match crate::admin::report::guard_report(&s.who, ReportFormat::Json) {
        Ok(text) => {
            let report: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
            pages::guards(&s.who, &s.csrf, &report)
        }
        Err(e) => refused(e, &s, "/console"),
    }
}

#[derive(Deserialize, Default)]
struct PoliciesQuery {
    edit: Option<String>,
    user: Option<String>,
    tool: Option<String>,
    arguments: Option<String>,
    client: Option<String>,
    error: Option<String>,
    done: Option<String>,
}

/// The policies page: the tenant's policies, its mode, a draft (refused, or one to edit), and a
/// try-it check.
async fn policies_page(
    console: &Console,
    s: &Session,
    slug: &str,
    q: PoliciesQuery,
    draft: Option<pages::PolicyDraft>,
) -> Response {
    let back = format!("/console/tenants/{slug}/policies");
    let loaded = async {
        let list = all(console, &s.who, Collection::Policies { tenant: slug.to_owned() }).await?;
        let mode = console.api.admin.get(&s.who, &Target::PolicyMode { tenant: slug.to_owned() }).await?.view;
        Ok::<_, AdminError>((list, mode))
    };
    let (list, mode) = match loaded.await {
        Ok(loaded) => loaded,
        Err(e) => return refused(e, s, &back),
    };
    let draft = draft.or_else(|| {
        let id = q.edit.as_deref()?;
        let p = list.iter().find(|p| p["id"] == id)?;
        Some(pages::PolicyDraft {
            id: id.to_owned(),
            text: p["text"].as_str().unwrap_or_default().to_owned(),
            mode: p["mode"].as_str().unwrap_or("enforce").to_owned(),
            problems: Vec::new(),
        })
    });
    let mut tried = pages::Tried {
        user: q.user.clone().unwrap_or_default(),
        tool: q.tool.clone().unwrap_or_default(),
        arguments: q.arguments.clone().unwrap_or_default(),
        client: q.client.clone().unwrap_or_default(),
        answer: None,
    };
    if !tried.user.is_empty() && !tried.tool.is_empty() {
        let arguments = match tried.arguments.trim() {
            "" => Ok(serde_json::Map::new()),
            text => serde_json::from_str(text).map_err(|e| format!("the arguments are not a JSON object: {e}")),
        };
        tried.answer = Some(match arguments {
            Err(why) => Err(why),
            Ok(arguments) => {
                let request = crate::admin::policies::CheckRequest {
                    user: tried.user.clone(),
                    tool: tried.tool.clone(),
                    arguments,
                    client: blank(q.client.clone()),
                };
                match console.api.admin.check_policy(&s.who, slug, &request).await {
                    Ok(answer) => Ok(serde_json::to_value(answer).unwrap_or_default()),
                    Err(AdminError::Store(e)) => return failed(AdminError::Store(e)),
                    Err(e) => Err(e.to_string()),
                }
            }
        });
    }
    let notice = Notice { error: q.error, done: q.done, signed_out: None };
    let mode = mode["mode"].as_str().unwrap_or("enforce").to_owned();
    let view = pages::PoliciesView { slug, list: &list, mode: &mode, draft: draft.as_ref(), tried: &tried };
    pages::policies(&s.who, &s.csrf, &view, &notice)
}

async fn policies(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(slug): Path<String>,
    Query(q): Query<PoliciesQuery>,
) -> Response {
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    policies_page(&console, &s, &slug, q, None).await
}

#[derive(Deserialize)]
struct PolicyForm {
    csrf: String,
    id: String,
    text: String,
    mode: String,
}

/// Saves a policy; one the validator refuses comes back in the page with its errors at
/// their lines, nothing saved.
async fn put_policy(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<PolicyForm>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}/policies");
    // A browser's textarea sends CRLF line ends; the policy is kept with LF.
    let text = f.text.replace("\r\n", "\n");
    let Some(mode) = crate::policy::Mode::parse(&f.mode) else {
        return refused(AdminError::Invalid { field: "mode", message: "enforce or log_only".into() }, &s, &back);
    };
    let write = Write::PutPolicy { tenant: tenant.clone(), id: f.id.trim().to_owned(), text: text.clone(), mode };
    let caller = Caller { who: &s.who, via: "console", request_id: None, idempotency: None, if_match: None };
    match console.api.admin.write(&caller, write).await {
        Ok(_) => see_other(&format!("{back}?done=1")),
        Err(AdminError::InvalidPolicy(problems)) => {
            let draft = pages::PolicyDraft { id: f.id, text, mode: f.mode, problems };
            policies_page(&console, &s, &tenant, PoliciesQuery::default(), Some(draft)).await
        }
        Err(e) => refused(e, &s, &back),
    }
}

async fn delete_policy(
    State(console): State<Console>,
    headers: HeaderMap,
    Path((tenant, id)): Path<(String, String)>,
    Form(f): Form<CsrfOnly>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}/policies");
    act(&console, &s, Write::DeletePolicy { tenant, id }, &back).await
}

#[derive(Deserialize)]
struct PolicyModeForm {
    csrf: String,
    mode: String,
}

async fn set_policy_mode(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Form(f): Form<PolicyModeForm>,
) -> Response {
    let s = match posted(&console, &headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}/policies");
    let Some(mode) = crate::policy::Mode::parse(&f.mode) else {
        return refused(AdminError::Invalid { field: "mode", message: "enforce or log_only".into() }, &s, &back);
    };
    act(&console, &s, Write::SetPolicyMode { tenant, mode }, &back).await
}

/// Most held definitions the definitions page shows whole, each with its diff (the others are
/// named, to be decided once these are).
const SHOWN_HELD: usize = 50;
/// Most decided definitions the page lists, the latest first.
const SHOWN_DECIDED: usize = 50;

/// The definitions page: the tenant's held upstream definitions, each with what changed against
/// the approved one and, for an owner, the forms that approve or reject it; below, the latest
/// decided ones.
async fn definitions(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(slug): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{slug}/definitions");
    let loaded = async {
        let collection = Collection::Definitions { tenant: slug.clone(), state: None };
        let mut views = Vec::new();
        for item in all(&console, &s.who, collection).await? {
            let view: DefinitionView = serde_json::from_value(item)
                .map_err(|e| AdminError::Invalid { field: "definition", message: e.to_string() })?;
            views.push(view);
        }
        let (mut held, mut decided): (Vec<DefinitionView>, Vec<DefinitionView>) =
            views.into_iter().partition(|v| v.state == DefinitionState::Held);
        held.sort_by(|a, b| {
            (&a.server, a.kind, &a.name, a.first_seen_at).cmp(&(&b.server, b.kind, &b.name, b.first_seen_at))
        });
        decided.sort_by_key(|v| std::cmp::Reverse(v.decided_at.unwrap_or(v.first_seen_at)));
        decided.truncate(SHOWN_DECIDED);
        let more = held.split_off(held.len().min(SHOWN_HELD));
        let mut shown = Vec::with_capacity(held.len());
        for view in held {
            let target = Target::Definition { tenant: slug.clone(), id: view.id.clone() };
            // A stored definition that does not read is shown as such (and can still be
            // rejected); the page stays up.
            let detail = match console.api.admin.get(&s.who, &target).await {
                Ok(got) => serde_json::from_value::<DefinitionDetail>(got.view).map_err(|e| e.to_string()),
                Err(AdminError::Invalid { message, .. }) => Err(message),
                Err(e) => return Err(e),
            };
            shown.push(pages::HeldDefinition { view, detail });
        }
        Ok::<_, AdminError>((shown, more, decided))
    };
    match loaded.await {
        Ok((held, more, decided)) => {
            // The forms are an owner's (or a platform administrator's); an auditor reads.
            let can_decide = s.who.authorize(Need::Manage(&slug)).is_ok();
            let view = pages::DefinitionsView { slug: &slug, held: &held, more: &more, decided: &decided, can_decide };
            pages::definitions(&s.who, &s.csrf, &view, &notice)
        }
        Err(e @ (AdminError::NotFound(_) | AdminError::Forbidden | AdminError::Store(_))) => refused(e, &s, &back),
        // Anything else as a page of its own: sent back to this page, it would come again.
        Err(e) => pages::refusal(&s.who, &s.csrf, StatusCode::UNPROCESSABLE_ENTITY, &e.to_string()),
    }
}

async fn approve_definition(
    State(console): State<Console>,
    headers: HeaderMap,
    Path((tenant, id)): Path<(String, String)>,
    Form(f): Form<CsrfOnly>,
) -> Response {
    decide_definition(&console, &headers, &f.csrf, tenant, id, Decision::Approve).await
}

async fn reject_definition(
    State(console): State<Console>,
    headers: HeaderMap,
    Path((tenant, id)): Path<(String, String)>,
    Form(f): Form<CsrfOnly>,
) -> Response {
    decide_definition(&console, &headers, &f.csrf, tenant, id, Decision::Reject).await
}

/// An owner's decision on a held definition, then back to the definitions page.
async fn decide_definition(
    console: &Console,
    headers: &HeaderMap,
    csrf: &str,
    tenant: String,
    id: String,
    decision: Decision,
) -> Response {
    let s = match posted(console, headers, csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}/definitions");
    act(console, &s, Write::DecideDefinition { tenant, id, decision }, &back).await
}

/// Most decided calls the approvals page lists, the latest first.
const SHOWN_DECIDED_CALLS: usize = 50;

/// The approvals page: the tenant's calls waiting for a second person, each with its caller,
/// server, tool and exact arguments and, for an approver (never on the approver's own call),
/// the forms that approve or reject it; below, the latest decided ones.
async fn approvals(
    State(console): State<Console>,
    headers: HeaderMap,
    Path(slug): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    use crate::admin::approvals::ApprovalView;
    use crate::store::approvals::ApprovalState;
    let s = match session(&console, &headers).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{slug}/approvals");
    let loaded = async {
        let mut views = Vec::new();
        for item in all(&console, &s.who, Collection::Approvals { tenant: slug.clone(), state: None }).await? {
            let view: ApprovalView = serde_json::from_value(item)
                .map_err(|e| AdminError::Invalid { field: "approval", message: e.to_string() })?;
            views.push(view);
        }
        let (pending, mut decided): (Vec<ApprovalView>, Vec<ApprovalView>) =
            views.into_iter().partition(|v| v.state == ApprovalState::Pending);
        decided.truncate(SHOWN_DECIDED_CALLS);
        Ok::<_, AdminError>((pending, decided))
    };
    match loaded.await {
        Ok((pending, decided)) => {
            // The forms are an approver's; owners and auditors read.
            let approver = s.who.authorize(Need::Approve(&slug)).is_ok();
            let me = s.who.member().map(|m| m.subject.clone());
            let view =
                pages::ApprovalsView { slug: &slug, pending: &pending, decided: &decided, approver, me: me.as_deref() };
            pages::approvals(&s.who, &s.csrf, &view, &notice)
        }
        Err(e @ (AdminError::NotFound(_) | AdminError::Forbidden | AdminError::Store(_))) => refused(e, &s, &back),
        Err(e) => pages::refusal(&s.who, &s.csrf, StatusCode::UNPROCESSABLE_ENTITY, &e.to_string()),
    }
}

#[derive(Deserialize)]
struct DecisionForm {
    csrf: String,
    #[serde(default)]
    reason: Option<String>,
}

async fn approve_call(
    State(console): State<Console>,
    headers: HeaderMap,
    Path((tenant, id)): Path<(String, String)>,
    Form(f): Form<DecisionForm>,
) -> Response {
    decide_call(&console, &headers, f, tenant, id, crate::store::approvals::Decision::Approve).await
}

async fn reject_call(
    State(console): State<Console>,
    headers: HeaderMap,
    Path((tenant, id)): Path<(String, String)>,
    Form(f): Form<DecisionForm>,
) -> Response {
    decide_call(&console, &headers, f, tenant, id, crate::store::approvals::Decision::Reject).await
}

/// An approver's decision on a waiting call, then back to the approvals page (a refusal, such
/// as the approver's own call or one decided already, as a notice there).
async fn decide_call(
    console: &Console,
    headers: &HeaderMap,
    f: DecisionForm,
    tenant: String,
    id: String,
    decision: crate::store::approvals::Decision,
) -> Response {
    let s = match posted(console, headers, &f.csrf).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let back = format!("/console/tenants/{tenant}/approvals");
    let reason = f.reason.filter(|r| !r.trim().is_empty());
    // A refusal of the approver's own call is said on the page (`refused`'s notice).
    act(console, &s, Write::DecideApproval { tenant, id, decision, reason }, &back).await
}
