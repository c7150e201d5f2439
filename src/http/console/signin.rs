//! The console's sign-in through the identity provider: authorization code + PKCE (S256) with
//! `auth.issuer`, the endpoints discovered from its metadata. It ends where a pasted token
//! does: the access token the code is exchanged for is resolved by the admin API's own
//! [`resolve`] and kept in the session cookie. It never trusts anything of the callback's
//! query but the code, and only once the state matches the one it sent.
//!
//! Between the redirect to the provider and the callback the state, the PKCE verifier and the
//! nonce wait in a cookie of their own: `SameSite=Lax`, since the browser comes back from the
//! provider's site and would not send a `Strict` cookie on that navigation; MACed under the
//! console's key, so it can't be forged; ten minutes long. The resource indicator (RFC 8707)
//! asks for an access token whose audience is the gateway, the one `resolve` accepts. A
//! signed-in callback answers with a page of the gateway's that moves on by itself, not with
//! a redirect: after a navigation a page of the provider started, a browser withholds the
//! session's `SameSite=Strict` cookie from the redirect that follows.

use std::time::Duration;

use axum::extract::{Query, State};
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
use crate::auth::discovery::{ProviderMetadata, discover};
use crate::auth::jwks::BodyError;
use crate::config::{Config, Secret};

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

/// The console's client at the identity provider.
pub(super) struct Provider {
    issuer: String,
    client_id: String,
    client_secret: Secret,
    scope: String,
    redirect_uri: String,
    resource: String,
    http: reqwest::Client,
    /// The provider's metadata, discovered on first use and again after a failure.
    metadata: RwLock<Option<ProviderMetadata>>,
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
}

impl Provider {
    /// The console's client, when `console.oidc_client_id` is set.
    pub(super) fn configured(config: &Config) -> Option<Self> {
        let console = &config.console;
        if console.oidc_client_id.is_empty() {
            return None;
        }
        crate::tls::install_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build();
        let http = match http {
            Ok(http) => http,
            Err(e) => {
                tracing::error!(error = %e, "console: no HTTP client for the identity provider; sign-in through it is off");
                return None;
            }
        };
        Some(Self {
            issuer: config.auth.issuer.clone(),
            client_id: console.oidc_client_id.clone(),
            client_secret: console.oidc_client_secret.clone(),
            scope: config.console_scopes().join(" "),
            redirect_uri: format!("{}{CALLBACK_PATH}", config.public_url()),
            resource: config.audience(),
            http,
            metadata: RwLock::new(None),
        })
    }

    async fn metadata(&self) -> Result<ProviderMetadata, SignInError> {
        if let Some(metadata) = self.metadata.read().await.as_ref() {
            return Ok(metadata.clone());
        }
        let metadata = discover(&self.http, &self.issuer).await.map_err(|e| SignInError::Unreachable(e.to_string()))?;
        *self.metadata.write().await = Some(metadata.clone());
        Ok(metadata)
    }

    /// Forgets the metadata, so the next sign-in discovers it again.
    async fn forget(&self) {
        *self.metadata.write().await = None;
    }

    /// The provider's answer to the code: the access token, and how long it lives if it says.
    async fn exchange(&self, code: &str, verifier: &str) -> Result<TokenAnswer, SignInError> {
        let metadata = self.metadata().await?;
        let endpoint = endpoint(metadata.token_endpoint, "token_endpoint")?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &self.redirect_uri),
            ("code_verifier", verifier),
            ("resource", &self.resource),
        ];
        let mut request = self.http.post(&endpoint).header(header::ACCEPT, "application/json");
        if self.client_secret.is_empty() {
            form.push(("client_id", &self.client_id));
        } else {
            // RFC 6749 section 2.3.1: both form-encoded before they are joined.
            let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let pair = format!("{}:{}", encode(&self.client_id), encode(self.client_secret.expose()));
            let basic = base64::engine::general_purpose::STANDARD.encode(pair);
            request = request.header(header::AUTHORIZATION, format!("Basic {basic}"));
        }
        let body = form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        let sent = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded").body(body).send().await;
        let mut response = match sent {
            Ok(response) => response,
            Err(e) => {
                self.forget().await;
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
                self.forget().await;
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

/// `GET /console/signin/provider`: to the provider's authorization endpoint.
pub(super) async fn start(State(console): State<Console>) -> Response {
    let Some(provider) = console.provider.as_deref() else { return not_found().await };
    let endpoint =
        match provider.metadata().await.and_then(|m| endpoint(m.authorization_endpoint, "authorization_endpoint")) {
            Ok(endpoint) => endpoint,
            Err(e) => {
                provider.forget().await;
                return sign_in_failed(&e);
            }
        };
    let (Some(state), Some(verifier), Some(nonce)) = (random(), random(), random()) else {
        return sign_in_failed(&SignInError::Setup("the system random source failed".into()));
    };
    let flow = Flow { state, verifier, nonce, expires: now() + FLOW_SECS };
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(flow.verifier.as_bytes()));
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("response_type", "code"),
            ("client_id", &provider.client_id),
            ("redirect_uri", &provider.redirect_uri),
            ("scope", &provider.scope),
            ("state", &flow.state),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("nonce", &flow.nonce),
            ("resource", &provider.resource),
        ])
        .finish();
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
    let Some(provider) = console.provider.as_deref() else { return not_found().await };
    let mut response = match finish(&console, provider, &headers, answer).await {
        Ok(response) => response,
        Err(e) => sign_in_failed(&e),
    };
    // The flow is over, whatever its end: its cookie goes.
    response.headers_mut().append(header::SET_COOKIE, flow_cookie("", 0));
    response
}

async fn finish(
    console: &Console,
    provider: &Provider,
    headers: &HeaderMap,
    answer: Callback,
) -> Result<Response, SignInError> {
    let sealed = cookie(headers, FLOW_COOKIE).ok_or(SignInError::State("no flow cookie"))?;
    let flow = console.unseal(sealed).await?;
    let sent = answer.state.unwrap_or_default();
    if !same_bytes(sent.as_bytes(), flow.state.as_bytes()) {
        return Err(SignInError::State("the callback's state is not the flow's"));
    }
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
    let tokens = provider.exchange(&code, &flow.verifier).await?;
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
        SignInError::Unreachable(why) | SignInError::Setup(why) | SignInError::Exchange(why) => why,
    };
    tracing::warn!(cause, "console: sign-in through the identity provider failed: {e}");
    denied(&format!("sign-in failed: {e}"))
}
