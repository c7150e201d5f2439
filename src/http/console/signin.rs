//! The console's sign-in through an identity provider: authorization code + PKCE (S256), the
//! endpoints discovered from the provider's metadata. The provider is the gateway's own
//! (`auth.issuer`, with `console.oidc_client_id`), or one a tenant trusts that has a console
//! client (a public one): its people start at `/console/signin/tenants/{tenant}`. It ends where a
//! pasted token does: the access token the code is exchanged for is resolved by the admin API's
//! own [`resolve`] and kept in the session cookie. It never trusts anything of the callback's
//! query but the code, and only once the state matches the one it sent; a tenant's sign-in must
//! end with a token of that tenant's provider naming a user of that tenant.
//!
//! Between the redirect to the provider and the callback the state, the PKCE verifier, the
//! nonce and the provider (the tenant and issuer) wait in a cookie of their own:
//! `SameSite=Lax`, since the browser comes back from the provider's site and would not send a
//! `Strict` cookie on that navigation; MACed under the console's key, so it can't be forged;
//! ten minutes long. For the gateway's own provider, and a tenant's whose tokens carry the
//! gateway's audience, the resource indicator (RFC 8707) asks for an access token whose
//! audience is the gateway. A signed-in callback answers with a page of the gateway's that
//! moves on by itself, not with a redirect: after a navigation a page of the provider started,
//! a browser withholds the session's `SameSite=Strict` cookie from the redirect that follows.
//!
//! A tenant's provider is the tenant's administrators' choice: the token endpoint its metadata
//! names, which the gateway calls, must be public https (`store::issuers::check_url`) unless
//! `auth.tenant_issuers_insecure`.

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue, header};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::RwLock;

use super::super::admin::{Denied, resolve};
use super::{Console, SESSION_COOKIE, cookie, failed, not_found, pages, see_other, set_cookie, start_page};
use crate::admin::Authority;
use crate::auth::discovery::{ProviderMetadata, discover};
use crate::auth::jwks::BodyError;
use crate::config::{Config, Secret};
use crate::store::issuers::TrustedIssuer;

/// The cookie that carries a sign-in's state to its callback.
const FLOW_COOKIE: &str = "scopegate_console_signin";
/// How long a sign-in at the provider may take.
const FLOW_SECS: i64 = 600;
/// The longest a session lasts, whatever the token's lifetime.
const SESSION_MAX_SECS: i64 = 12 * 3600;
/// The largest token endpoint answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Browsers drop a cookie over about 4 KiB (name and attributes included).
const MAX_TOKEN_BYTES: usize = 3800;
pub(super) const START_PATH: &str = "/console/signin/provider";
pub(super) const CALLBACK_PATH: &str = "/console/signin/callback";

/// The console's sign-in through identity providers.
pub(super) struct SignIn {
    http: reqwest::Client,
    redirect_uri: String,
    /// The gateway's audience: the resource asked for.
    audience: String,
    /// `auth.tenant_issuers_insecure`: a tenant's provider may have endpoints on loopback or
    /// private hosts, over http.
    insecure: bool,
    /// The console's client at the gateway's own provider, when `console.oidc_client_id` is set.
    own: Option<Client>,
    /// The own provider's metadata, discovered on first use and again after a failure (a
    /// tenant's is discovered on each use).
    metadata: RwLock<Option<ProviderMetadata>>,
}

/// The console's client at one provider.
struct Client {
    issuer: String,
    client_id: String,
    client_secret: Secret,
    scope: String,
    /// The resource indicator asked for, if any.
    resource: Option<String>,
    /// A tenant's provider (see the module's documentation).
    tenant: bool,
}

/// Why a sign-in through the provider failed: logged in full, shown as the message.
#[derive(Debug, thiserror::Error)]
enum SignInError {
    #[error("the sign-in was not started here, or took longer than ten minutes")]
    State(&'static str),
    #[error("the identity provider refused the sign-in ({0})")]
    Provider(String),
    #[error("the identity provider could not be reached")]
    Unreachable(String),
    #[error("the sign-in could not be started: see the gateway's log")]
    Setup(String),
    #[error("the identity provider did not issue a usable token")]
    Exchange(String),
    #[error("this identity provider no longer signs this tenant's people in")]
    Withdrawn(String),
}

impl SignIn {
    /// The console's sign-in: through the gateway's own provider when
    /// `console.oidc_client_id` is set, through tenants' providers in any case.
    pub(super) fn new(config: &Config) -> Option<Self> {
        crate::tls::install_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build();
        let http = match http {
            Ok(http) => http,
            Err(e) => {
                tracing::error!(error = %e, "console: no HTTP client for identity providers; sign-in through them is off");
                return None;
            }
        };
        let console = &config.console;
        let own = (!console.oidc_client_id.is_empty()).then(|| Client {
            issuer: config.auth.issuer.clone(),
            client_id: console.oidc_client_id.clone(),
            client_secret: console.oidc_client_secret.clone(),
            scope: config.console_scopes().join(" "),
            resource: Some(config.audience()),
            tenant: false,
        });
        Some(Self {
            http,
            redirect_uri: format!("{}{CALLBACK_PATH}", config.public_url()),
            audience: config.audience(),
            insecure: config.auth.tenant_issuers_insecure,
            own,
            metadata: RwLock::new(None),
        })
    }

    /// Whether the sign-in page offers the gateway's own provider.
    pub(super) fn offers_own(&self) -> bool {
        self.own.is_some()
    }

    /// The console's client at a tenant's provider.
    fn tenant_client(&self, trust: &TrustedIssuer) -> Option<Client> {
        Some(Client {
            issuer: trust.issuer.clone(),
            client_id: trust.console_client_id.clone()?,
            client_secret: Secret::default(),
            scope: trust.console_scopes.clone().unwrap_or_else(|| "openid".to_owned()),
            // A token for the gateway's audience is asked for by the resource indicator; an
            // audience of the provider's own is its configuration's (some providers refuse the
            // parameter).
            resource: trust.audience.is_none().then(|| self.audience.clone()),
            tenant: true,
        })
    }

    async fn metadata(&self, client: &Client) -> Result<ProviderMetadata, SignInError> {
        if !client.tenant
            && let Some(metadata) = self.metadata.read().await.as_ref()
        {
            return Ok(metadata.clone());
        }
        let metadata =
            discover(&self.http, &client.issuer).await.map_err(|e| SignInError::Unreachable(e.to_string()))?;
        if !client.tenant {
            *self.metadata.write().await = Some(metadata.clone());
        }
        Ok(metadata)
    }

    /// Forgets the own provider's metadata, so the next sign-in discovers it again.
    async fn forget(&self, client: &Client) {
        if !client.tenant {
            *self.metadata.write().await = None;
        }
    }

    /// The provider's answer to the code: the access token, and how long it lives if it says.
    async fn exchange(&self, client: &Client, code: &str, verifier: &str) -> Result<TokenAnswer, SignInError> {
        let metadata = self.metadata(client).await?;
        let endpoint = endpoint(metadata.token_endpoint, "token_endpoint")?;
        if client.tenant
            && let Err(e) = crate::store::issuers::check_url("token_endpoint", &endpoint, self.insecure)
        {
            return Err(SignInError::Setup(format!("issuer {}: {e}", client.issuer)));
        }
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &self.redirect_uri),
            ("code_verifier", verifier),
        ];
        if let Some(resource) = &client.resource {
            form.push(("resource", resource));
        }
        let mut request = self.http.post(&endpoint).header(header::ACCEPT, "application/json");
        if client.client_secret.is_empty() {
            form.push(("client_id", &client.client_id));
        } else {
            // RFC 6749 section 2.3.1: both form-encoded before they are joined.
            let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let pair = format!("{}:{}", encode(&client.client_id), encode(client.client_secret.expose()));
            let basic = base64::engine::general_purpose::STANDARD.encode(pair);
            request = request.header(header::AUTHORIZATION, format!("Basic {basic}"));
        }
        let body = form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        let sent = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded").body(body).send().await;
        let mut response = match sent {
            Ok(response) => response,
            Err(e) => {
                self.forget(client).await;
                return Err(SignInError::Unreachable(format!("{endpoint}: {e}")));
            }
        };
        let status = response.status();
        let bytes = match crate::auth::jwks::read_bounded(&mut response, MAX_ANSWER_BYTES).await {
            Ok(bytes) => bytes,
            Err(BodyError::TooLarge(_)) => {
                return Err(SignInError::Exchange(format!("answer over {MAX_ANSWER_BYTES} bytes")));
            }
            Err(BodyError::Read(e)) => return Err(SignInError::Unreachable(format!("{endpoint}: {e}"))),
        };
        if !status.is_success() {
            // Only the error code of the answer: its description may be anything.
            let error = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_default();
            if status.is_server_error() {
                self.forget(client).await;
            }
            return Err(SignInError::Exchange(format!("token endpoint: HTTP {status} {error}")));
        }
        serde_json::from_slice(&bytes).map_err(|e| SignInError::Exchange(format!("token endpoint answer: {e}")))
    }
}

/// An endpoint of the metadata, which must name it as an http(s) URL.
fn endpoint(named: Option<String>, what: &str) -> Result<String, SignInError> {
    let url = named.ok_or_else(|| SignInError::Setup(format!("the provider's metadata names no {what}")))?;
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(SignInError::Setup(format!("the provider's {what} `{url}` is not an http(s) URL")));
    }
    Ok(url)
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<i64>,
    #[serde(default)]
    id_token: Option<String>,
}

/// What waits in the flow cookie.
#[derive(Serialize, Deserialize)]
struct Flow {
    state: String,
    verifier: String,
    nonce: String,
    /// Unix seconds.
    expires: i64,
    /// A tenant's provider; `None`: the gateway's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<TenantProvider>,
}

/// The provider of a tenant's sign-in: the tenant's slug and the issuer.
#[derive(Serialize, Deserialize)]
struct TenantProvider {
    tenant: String,
    issuer: String,
}

/// 32 random bytes, base64url: a state, a nonce, or a PKCE verifier (43 characters, as
/// RFC 7636 asks).
fn random() -> Option<String> {
    let mut bytes = [0u8; 32];
    SystemRandom::new().fill(&mut bytes).ok()?;
    Some(URL_SAFE_NO_PAD.encode(bytes))
}

/// Equality whose time does not depend on where two equally long values first differ.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn now() -> i64 {
    crate::store::now_millis() / 1000
}

impl Console {
    async fn seal(&self, flow: &Flow) -> Result<String, crate::admin::AdminError> {
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(flow).unwrap_or_default());
        let tag = self.csrf("signin-flow", &payload).await?;
        Ok(format!("{payload}.{tag}"))
    }

    async fn unseal(&self, sealed: &str) -> Result<Flow, SignInError> {
        let (payload, tag) = sealed.split_once('.').ok_or(SignInError::State("malformed flow cookie"))?;
        if !self.csrf_holds("signin-flow", payload, tag).await {
            return Err(SignInError::State("the flow cookie's MAC does not hold"));
        }
        let flow: Flow = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or(SignInError::State("malformed flow cookie"))?;
        if flow.expires < now() {
            return Err(SignInError::State("the flow cookie expired"));
        }
        Ok(flow)
    }
}

fn flow_cookie(value: &str, max_age: i64) -> HeaderValue {
    let text = format!("{FLOW_COOKIE}={value}; Path=/console; HttpOnly; Secure; SameSite=Lax; Max-Age={max_age}");
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `GET /console/signin/provider`: to the gateway's own provider's authorization endpoint.
pub(super) async fn start(State(console): State<Console>) -> Response {
    let Some(signin) = console.signin.as_deref() else { return not_found().await };
    let Some(client) = signin.own.as_ref() else { return not_found().await };
    begin(&console, signin, client, None).await
}

#[derive(Deserialize)]
pub(super) struct Choice {
    issuer: Option<String>,
}

/// `GET /console/signin/tenants/{tenant}`: to the authorization endpoint of the provider the
/// tenant trusts with a console client (`?issuer=` picks one of several; without it, several
/// are offered on a page).
pub(super) async fn start_tenant(
    State(console): State<Console>,
    Path(tenant): Path<String>,
    Query(choice): Query<Choice>,
) -> Response {
    let Some(signin) = console.signin.as_deref() else { return not_found().await };
    let trusts = match console.api.trusted.console_clients(&tenant).await {
        Ok(trusts) => trusts,
        Err(e) => return failed(e.into()),
    };
    let chosen: Vec<&TrustedIssuer> =
        trusts.iter().filter(|t| choice.issuer.as_ref().is_none_or(|i| *i == t.issuer)).collect();
    match chosen.as_slice() {
        [] => not_found().await,
        [trust] => match signin.tenant_client(trust) {
            Some(client) => begin(&console, signin, &client, Some(&tenant)).await,
            None => not_found().await,
        },
        several => {
            let base = crate::admin::console_signin_path(&tenant);
            let links: Vec<(String, String)> = several
                .iter()
                .map(|t| {
                    let query =
                        form_urlencoded::Serializer::new(String::new()).append_pair("issuer", &t.issuer).finish();
                    (t.issuer.clone(), format!("{base}?{query}"))
                })
                .collect();
            pages::choose_provider(&tenant, &links)
        }
    }
}

/// To `client`'s authorization endpoint, the flow in its cookie.
async fn begin(console: &Console, signin: &SignIn, client: &Client, tenant: Option<&str>) -> Response {
    let endpoint = match signin
        .metadata(client)
        .await
        .and_then(|m| endpoint(m.authorization_endpoint, "authorization_endpoint"))
    {
        Ok(endpoint) => endpoint,
        Err(e) => {
            signin.forget(client).await;
            return sign_in_failed(&e);
        }
    };
    let (Some(state), Some(verifier), Some(nonce)) = (random(), random(), random()) else {
        return sign_in_failed(&SignInError::Setup("the system random source failed".into()));
    };
    let flow = Flow {
        state,
        verifier,
        nonce,
        expires: now() + FLOW_SECS,
        tenant: tenant.map(|tenant| TenantProvider { tenant: tenant.to_owned(), issuer: client.issuer.clone() }),
    };
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(flow.verifier.as_bytes()));
    let query = {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.extend_pairs([
            ("response_type", "code"),
            ("client_id", &client.client_id),
            ("redirect_uri", &signin.redirect_uri),
            ("scope", &client.scope),
            ("state", &flow.state),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("nonce", &flow.nonce),
        ]);
        if let Some(resource) = &client.resource {
            query.append_pair("resource", resource);
        }
        query.finish()
    };
    let separator = if endpoint.contains('?') { '&' } else { '?' };
    let sealed = match console.seal(&flow).await {
        Ok(sealed) => sealed,
        Err(e) => return failed(e),
    };
    let mut response = see_other(&format!("{endpoint}{separator}{query}"));
    response.headers_mut().insert(header::SET_COOKIE, flow_cookie(&sealed, FLOW_SECS));
    response
}

#[derive(Deserialize)]
pub(super) struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /console/signin/callback`: the provider's answer, the code exchanged, the session.
pub(super) async fn callback(
    State(console): State<Console>,
    headers: HeaderMap,
    Query(answer): Query<Callback>,
) -> Response {
    let Some(signin) = console.signin.as_deref() else { return not_found().await };
    let mut response = match finish(&console, signin, &headers, answer).await {
        Ok(response) => response,
        Err(e) => sign_in_failed(&e),
    };
    // The flow is over, whatever its end: its cookie goes.
    response.headers_mut().append(header::SET_COOKIE, flow_cookie("", 0));
    response
}

async fn finish(
    console: &Console,
    signin: &SignIn,
    headers: &HeaderMap,
    answer: Callback,
) -> Result<Response, SignInError> {
    let sealed = cookie(headers, FLOW_COOKIE).ok_or(SignInError::State("no flow cookie"))?;
    let flow = console.unseal(sealed).await?;
    let sent = answer.state.unwrap_or_default();
    if !same_bytes(sent.as_bytes(), flow.state.as_bytes()) {
        return Err(SignInError::State("the callback's state is not the flow's"));
    }
    // The provider the flow started with, as trusted now: a tenant's may have been withdrawn
    // meanwhile.
    let tenant_client;
    let client = match &flow.tenant {
        Some(TenantProvider { tenant, issuer }) => {
            let trusts = console
                .api
                .trusted
                .console_clients(tenant)
                .await
                .map_err(|e| SignInError::Setup(format!("reading the tenant's providers: {e}")))?;
            tenant_client = trusts
                .iter()
                .find(|t| t.issuer == *issuer)
                .and_then(|t| signin.tenant_client(t))
                .ok_or_else(|| SignInError::Withdrawn(format!("tenant `{tenant}`, issuer {issuer}")))?;
            &tenant_client
        }
        None => signin.own.as_ref().ok_or(SignInError::State("no sign-in through the gateway's provider"))?,
    };
    if let Some(error) = answer.error {
        tracing::info!(
            error,
            description = answer.error_description.as_deref().unwrap_or(""),
            "console: the provider refused the sign-in"
        );
        let code: String = error.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(64).collect();
        return Err(SignInError::Provider(code));
    }
    let code = answer.code.filter(|c| !c.is_empty()).ok_or(SignInError::Provider("no code".into()))?;
    let tokens = signin.exchange(client, &code, &flow.verifier).await?;
    if tokens.token_type.as_deref().is_some_and(|t| !t.eq_ignore_ascii_case("bearer")) {
        return Err(SignInError::Exchange(format!("token_type {:?}, not Bearer", tokens.token_type)));
    }
    // The ID token came straight from the token endpoint (OpenID Connect Core 3.1.3.7 lets
    // TLS stand for its signature there); its nonce must be this flow's.
    if let Some(id_token) = &tokens.id_token
        && !claims_of(id_token)
            .is_some_and(|c| c["nonce"].as_str().is_some_and(|n| same_bytes(n.as_bytes(), flow.nonce.as_bytes())))
    {
        return Err(SignInError::Exchange("the ID token's nonce is not the flow's".into()));
    }
    let token = tokens.access_token.trim();
    let cookie_safe = !token.is_empty() && token.bytes().all(|b| b.is_ascii_graphic() && b != b';' && b != b',');
    if !cookie_safe || token.len() > MAX_TOKEN_BYTES {
        return Err(SignInError::Exchange(format!(
            "an access token of {} bytes that a cookie can't hold",
            token.len()
        )));
    }
    let who = match resolve(&console.api, token).await {
        Ok(who) => who,
        Err(Denied::Failed(e)) => return Ok(failed(e)),
        Err(Denied::Limited(_)) => return Ok(denied("too many requests: try again in a moment")),
        Err(Denied::Token(e)) => {
            tracing::info!(error = %e, "console: the provider's access token is not one the gateway accepts");
            return Ok(denied(
                "access denied: the identity provider's token is not one this gateway accepts (its issuer, audience or scopes)",
            ));
        }
        Err(Denied::Nobody) => {
            tracing::info!("console: signed in at the provider, but no active user of an active tenant");
            return Ok(denied(
                "access denied: you signed in at the identity provider, but no tenant of this gateway has an active user for you",
            ));
        }
    };
    if let Some(TenantProvider { tenant, .. }) = &flow.tenant
        && !matches!(&who, Authority::Member(m) if m.slug == *tenant)
    {
        tracing::info!(tenant, "console: a tenant's provider signed in someone who is not that tenant's");
        return Ok(denied(&format!("access denied: you signed in, but not as a user of `{tenant}`")));
    }
    let mut lifetime = SESSION_MAX_SECS;
    if let Some(secs) = tokens.expires_in {
        lifetime = lifetime.min(secs);
    }
    if let Some(exp) = claims_of(token).and_then(|c| c["exp"].as_i64()) {
        lifetime = lifetime.min(exp - now());
    }
    if lifetime <= 0 {
        return Err(SignInError::Exchange("the access token has expired already".into()));
    }
    // Not a redirect: see [`pages::signed_in`].
    let mut response = pages::signed_in(&start_page(&who));
    response.headers_mut().append(header::SET_COOKIE, set_cookie(SESSION_COOKIE, token, lifetime));
    Ok(response)
}

/// The claims of a JWT whose signature was checked, or need not be (see the callers).
fn claims_of(jwt: &str) -> Option<serde_json::Value> {
    let payload = jwt.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

/// The sign-in page with `message` (and no session).
fn denied(message: &str) -> Response {
    let encoded = percent_encoding::utf8_percent_encode(message, percent_encoding::NON_ALPHANUMERIC);
    see_other(&format!("/console?error={encoded}"))
}

/// A failed sign-in: logged with its cause, the sign-in page with its message.
fn sign_in_failed(e: &SignInError) -> Response {
    let cause = match e {
        SignInError::State(why) => *why,
        SignInError::Provider(code) => code,
        SignInError::Unreachable(why)
        | SignInError::Setup(why)
        | SignInError::Exchange(why)
        | SignInError::Withdrawn(why) => why,
    };
    tracing::warn!(cause, "console: sign-in through the identity provider failed: {e}");
    denied(&format!("sign-in failed: {e}"))
}
