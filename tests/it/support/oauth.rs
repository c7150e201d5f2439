//! The fixture's OAuth pair for tests: the mock authorization server and the OAuth-protected
//! MCP server as child processes (on loopback or in a network namespace), and the by-hand
//! steps of the flow an MCP client runs against them (registration, authorization with PKCE,
//! the code exchange).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use super::fixtures::spawn_fixture;
use super::netns::Netns;

/// The redirect URI the tests register; nothing listens there (redirects are not followed).
pub const REDIRECT: &str = "http://127.0.0.1:9/callback";

/// The mock authorization server and the OAuth-protected MCP server, running as child
/// processes (killed when this is dropped).
pub struct OAuthFixtures {
    /// The authorization server's issuer, `http://ADDR` (no trailing slash); its metadata is
    /// at `{as_url}/.well-known/oauth-authorization-server`.
    pub as_url: String,
    /// The protected server's origin: `/test/stats` and `/test/revoke` are under it.
    pub resource_base: String,
    /// The MCP endpoint, `{resource_base}/mcp`: the `resource` (and token audience).
    pub resource_url: String,
    _children: [tokio::process::Child; 2],
}

impl OAuthFixtures {
    /// Both servers on 127.0.0.1 ports of this host; access tokens live `ttl_secs`.
    pub async fn start(secret: &str, ttl_secs: u64) -> Self {
        Self::launch(None, "127.0.0.1", secret, ttl_secs).await
    }

    /// Both servers inside `netns`, bound to `bind_ip` there: `127.0.0.1` (only what runs in
    /// the namespace reaches them; the stats helpers then cannot) or [`netns_ip`](super::netns::netns_ip) (this host
    /// reaches them too, through the veth pair).
    pub async fn start_in(netns: &Netns, bind_ip: &str, secret: &str, ttl_secs: u64) -> Self {
        Self::launch(Some(&netns.name), bind_ip, secret, ttl_secs).await
    }

    /// [`OAuthFixtures::start`], with every refresh grant answered only after `delay_ms`: two
    /// refreshes of one token made at about the same time then overlap.
    pub async fn start_with_slow_refresh(secret: &str, ttl_secs: u64, delay_ms: u64) -> Self {
        Self::launch_with(None, "127.0.0.1", secret, ttl_secs, delay_ms).await
    }

    async fn launch(netns: Option<&str>, bind_ip: &str, secret: &str, ttl_secs: u64) -> Self {
        Self::launch_with(netns, bind_ip, secret, ttl_secs, 0).await
    }

    async fn launch_with(netns: Option<&str>, bind_ip: &str, secret: &str, ttl_secs: u64, delay_ms: u64) -> Self {
        let addr = format!("{bind_ip}:0");
        let (ttl, delay) = (ttl_secs.to_string(), delay_ms.to_string());
        let env =
            [("FIXTURE_AS_SECRET", secret), ("FIXTURE_TOKEN_TTL_SECS", &ttl), ("FIXTURE_REFRESH_DELAY_MS", &delay)];
        let (auth_server, as_addr) = spawn_fixture(netns, &["authserver", &addr], &env).await;
        let as_url = format!("http://{as_addr}");
        let env = [("FIXTURE_AS_SECRET", secret), ("FIXTURE_AS_ISSUER", &as_url)];
        let (protected, resource_addr) = spawn_fixture(netns, &["protected", &addr], &env).await;
        let resource_base = format!("http://{resource_addr}");
        let resource_url = format!("{resource_base}/mcp");
        Self { as_url, resource_base, resource_url, _children: [auth_server, protected] }
    }

    /// The authorization server's `/test/stats`.
    pub async fn as_stats(&self) -> Value {
        get_json(&format!("{}/test/stats", self.as_url)).await
    }

    /// The protected server's `/test/stats`: `{unauthorized, authorized}`.
    pub async fn resource_stats(&self) -> Value {
        get_json(&format!("{}/test/stats", self.resource_base)).await
    }

    /// Makes the protected server refuse every token issued until now.
    pub async fn revoke(&self) {
        let response = http().post(format!("{}/test/revoke", self.resource_base)).send().await.unwrap();
        assert!(response.status().is_success(), "revoke: {}", response.status());
    }

    /// A token response for `user` obtained by hand (registration, authorization, exchange),
    /// for tests that need a token without running the flow through the gateway.
    pub async fn token_for(&self, user: &str) -> Value {
        let client = register(&self.as_url, json!({"redirect_uris": [REDIRECT]})).await;
        let (verifier, challenge) = pkce();
        let code = code_for(self, &client, &challenge, user).await;
        let (status, tokens) = token(self, &exchange(&client, &code, &verifier, &self.resource_url)).await;
        assert_eq!(status, 200, "{tokens}");
        tokens
    }
}

/// A client that follows no redirects (the Location of `/authorize` is read, not visited).
pub fn http() -> reqwest::Client {
    scopegate::http::install_tls_provider();
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

pub async fn get_json(url: &str) -> Value {
    let response = http().get(url).send().await.unwrap();
    assert_eq!(response.status(), 200, "GET {url}");
    response.json().await.unwrap()
}

/// An `application/x-www-form-urlencoded` body (or query string) of `pairs`.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let mut url = reqwest::Url::parse("http://form.invalid/").unwrap();
    url.query_pairs_mut().extend_pairs(pairs);
    url.query().unwrap_or_default().to_owned()
}

/// A PKCE verifier and its S256 challenge.
pub fn pkce() -> (String, String) {
    let verifier = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let challenge = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()));
    (verifier, challenge)
}

/// Registers a client; the answer's `client_id`.
pub async fn register(as_url: &str, metadata: Value) -> String {
    let response = http().post(format!("{as_url}/register")).json(&metadata).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["token_endpoint_auth_method"], "none");
    assert_eq!(answer["redirect_uris"], metadata["redirect_uris"]);
    answer["client_id"].as_str().unwrap().to_owned()
}

/// A well-formed authorization request of `client` for the fixtures' resource.
pub fn authorize_params<'a>(fx: &'a OAuthFixtures, client: &'a str, challenge: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("response_type", "code"),
        ("client_id", client),
        ("redirect_uri", REDIRECT),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
        ("state", "st-123"),
        ("resource", &fx.resource_url),
        ("scope", "mcp"),
    ]
}

pub async fn authorize(fx: &OAuthFixtures, params: &[(&str, &str)]) -> reqwest::Response {
    http().get(format!("{}/authorize?{}", fx.as_url, form(params))).send().await.unwrap()
}

/// Authorizes `client` as `user`; the code from the redirect, whose state and issuer are checked.
pub async fn code_for(fx: &OAuthFixtures, client: &str, challenge: &str, user: &str) -> String {
    let mut params = authorize_params(fx, client, challenge);
    params.push(("login_hint", user));
    let response = authorize(fx, &params).await;
    assert_eq!(response.status(), 302);
    let location = response.headers()["location"].to_str().unwrap();
    let location = reqwest::Url::parse(location).unwrap();
    assert_eq!(format!("{}://{}{}", location.scheme(), location.authority(), location.path()), REDIRECT);
    let query: std::collections::HashMap<_, _> = location.query_pairs().into_owned().collect();
    assert_eq!(query["state"], "st-123");
    assert_eq!(query["iss"], fx.as_url);
    query["code"].clone()
}

/// The form of a code exchange.
pub fn exchange<'a>(client: &'a str, code: &'a str, verifier: &'a str, resource: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("grant_type", "authorization_code"),
        ("client_id", client),
        ("code", code),
        ("redirect_uri", REDIRECT),
        ("code_verifier", verifier),
        ("resource", resource),
    ]
}

/// A token request: its status and JSON answer.
pub async fn token(fx: &OAuthFixtures, pairs: &[(&str, &str)]) -> (u16, Value) {
    let response = http()
        .post(format!("{}/token", fx.as_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(pairs))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}
