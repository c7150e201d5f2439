//! The fixture's OAuth modes (`authserver`, `protected`), driven by hand over plain HTTP the
//! way an MCP client does it: the 401 challenge, protected resource and authorization server
//! metadata, dynamic registration, authorization with PKCE, the code exchange, MCP calls with
//! the token, refresh, and revocation; and every refusal the gateway's OAuth tests rely on.
//!
//! [`OAuthFixtures`] starts the pair for other tests (on loopback or in a network namespace).

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use crate::remote::Netns;

const FIXTURE: &str = env!("CARGO_BIN_EXE_scopegate-fixture-upstream");
const SECRET: &str = "oauth-fixture-test-secret-0123456789";
/// The redirect URI the tests register; nothing listens there (redirects are not followed).
const REDIRECT: &str = "http://127.0.0.1:9/callback";

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
    /// the namespace reaches them; the stats helpers then cannot) or [`netns_ip`] (this host
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
        let (auth_server, as_addr) = spawn(netns, "authserver", &addr, &env).await;
        let as_url = format!("http://{as_addr}");
        let env = [("FIXTURE_AS_SECRET", secret), ("FIXTURE_AS_ISSUER", &as_url)];
        let (protected, resource_addr) = spawn(netns, "protected", &addr, &env).await;
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

/// The namespace's own address on the veth pair `Netns::create` sets up: its /30 gives the
/// host `.1` mod 4 and the namespace the next address.
pub fn netns_ip(netns: &Netns) -> String {
    let (prefix, last) = netns.host_ip.rsplit_once('.').expect("an IPv4 host address");
    format!("{prefix}.{}", last.parse::<u8>().expect("an IPv4 host address") + 1)
}

/// Starts the fixture in `mode` (in `netns` if given) and reads its bound address.
async fn spawn(netns: Option<&str>, mode: &str, addr: &str, env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut command = match netns {
        Some(name) => {
            let mut command = tokio::process::Command::new("ip");
            command.args(["netns", "exec", name, FIXTURE]);
            command
        }
        None => tokio::process::Command::new(FIXTURE),
    };
    let mut child =
        command.args([mode, addr]).envs(env.iter().copied()).stdout(Stdio::piped()).kill_on_drop(true).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.expect("the fixture starts");
    let first = first.unwrap().unwrap_or_else(|| panic!("{mode} exited before listening"));
    let addr = first.strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {first:?}"));
    (child, addr.to_owned())
}

/// A client that follows no redirects (the Location of `/authorize` is read, not visited).
fn http() -> reqwest::Client {
    scopegate::http::install_tls_provider();
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

async fn get_json(url: &str) -> Value {
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
fn pkce() -> (String, String) {
    let verifier = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let challenge = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()));
    (verifier, challenge)
}

/// The claims of a JWT, unverified (the test reads what the fixture put there).
fn claims(jwt: &str) -> Value {
    let payload = jwt.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// Registers a client; the answer's `client_id`.
async fn register(as_url: &str, metadata: Value) -> String {
    let response = http().post(format!("{as_url}/register")).json(&metadata).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["token_endpoint_auth_method"], "none");
    assert_eq!(answer["redirect_uris"], metadata["redirect_uris"]);
    answer["client_id"].as_str().unwrap().to_owned()
}

/// A well-formed authorization request of `client` for the fixtures' resource.
fn authorize_params<'a>(fx: &'a OAuthFixtures, client: &'a str, challenge: &'a str) -> Vec<(&'a str, &'a str)> {
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

async fn authorize(fx: &OAuthFixtures, params: &[(&str, &str)]) -> reqwest::Response {
    http().get(format!("{}/authorize?{}", fx.as_url, form(params))).send().await.unwrap()
}

/// Authorizes `client` as `user`; the code from the redirect, whose state and issuer are checked.
async fn code_for(fx: &OAuthFixtures, client: &str, challenge: &str, user: &str) -> String {
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
fn exchange<'a>(client: &'a str, code: &'a str, verifier: &'a str, resource: &'a str) -> Vec<(&'a str, &'a str)> {
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
async fn token(fx: &OAuthFixtures, pairs: &[(&str, &str)]) -> (u16, Value) {
    let response = http()
        .post(format!("{}/token", fx.as_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(pairs))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

async fn refresh(fx: &OAuthFixtures, client: &str, refresh_token: &str) -> (u16, Value) {
    let pairs = [
        ("grant_type", "refresh_token"),
        ("client_id", client),
        ("refresh_token", refresh_token),
        ("resource", &fx.resource_url),
    ];
    token(fx, &pairs).await
}

fn assert_refused(answer: (u16, Value), status: u16, error: &str) {
    assert_eq!((answer.0, answer.1["error"].as_str()), (status, Some(error)), "{}", answer.1);
}

/// `tools/call whoami_oauth` over rmcp's client, with `access_token` as the bearer.
async fn whoami(fx: &OAuthFixtures, access_token: &str) -> Value {
    let config = StreamableHttpClientTransportConfig::with_uri(fx.resource_url.clone()).auth_header(access_token);
    let client = ().serve(StreamableHttpClientTransport::with_client(reqwest::Client::new(), config)).await.unwrap();
    let result = client.call_tool(CallToolRequestParams::new("whoami_oauth")).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    client.cancel().await.ok();
    result.structured_content.unwrap()
}

/// A raw MCP `initialize` POST to the protected server with `authorization` (if any).
async fn initialize(fx: &OAuthFixtures, authorization: Option<&str>) -> reqwest::Response {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let mut request = http().post(&fx.resource_url).header("accept", "application/json, text/event-stream").json(&body);
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    request.send().await.unwrap()
}

fn challenge_of(response: &reqwest::Response) -> String {
    assert_eq!(response.status(), 401);
    response.headers()["www-authenticate"].to_str().unwrap().to_owned()
}

/// From the 401 to a tool call, then refresh (rotating), revocation and refresh on 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_fixture_serves_the_whole_flow() {
    let fx = OAuthFixtures::start(SECRET, 3600).await;

    // Discovery, as a client does it: the challenge names the resource metadata.
    let challenge = challenge_of(&initialize(&fx, None).await);
    let metadata_url = format!("{}/.well-known/oauth-protected-resource/mcp", fx.resource_base);
    assert_eq!(challenge, format!("Bearer resource_metadata=\"{metadata_url}\""));
    let resource = get_json(&metadata_url).await;
    assert_eq!(resource["resource"], fx.resource_url);
    assert_eq!(resource["authorization_servers"], json!([fx.as_url]));
    assert_eq!(get_json(&format!("{}/.well-known/oauth-protected-resource", fx.resource_base)).await, resource);
    let server = get_json(&format!("{}/.well-known/oauth-authorization-server", fx.as_url)).await;
    assert_eq!(server["issuer"], fx.as_url);
    assert_eq!(server["code_challenge_methods_supported"], json!(["S256"]));
    assert_eq!(server, get_json(&format!("{}/.well-known/openid-configuration", fx.as_url)).await);

    let registration = server["registration_endpoint"].as_str().unwrap();
    assert_eq!(registration, format!("{}/register", fx.as_url));
    let client = register(&fx.as_url, json!({"client_name": "t", "redirect_uris": [REDIRECT]})).await;
    let (verifier, challenge) = pkce();
    let code = code_for(&fx, &client, &challenge, "alice@as.test").await;
    let (status, tokens) = token(&fx, &exchange(&client, &code, &verifier, &fx.resource_url)).await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!((tokens["token_type"].as_str(), tokens["expires_in"].as_u64()), (Some("Bearer"), Some(3600)));
    assert_eq!(tokens["scope"], "mcp");
    let access = tokens["access_token"].as_str().unwrap();
    let issued = claims(access);
    assert_eq!((issued["sub"].as_str(), issued["iss"].as_str()), (Some("alice@as.test"), Some(fx.as_url.as_str())));
    assert_eq!(issued["aud"], fx.resource_url);
    assert_eq!(issued["exp"].as_u64().unwrap() - issued["iat"].as_u64().unwrap(), 3600);

    let me = whoami(&fx, access).await;
    let want = json!({
        "sub": "alice@as.test", "aud": fx.resource_url, "jti": issued["jti"], "iat": issued["iat"],
        "meta_keys": ["progressToken"],
    });
    assert_eq!(me, want);

    // Refresh rotates: the new refresh token works once, the old one never again.
    let first_refresh = tokens["refresh_token"].as_str().unwrap();
    let (status, rotated) = refresh(&fx, &client, first_refresh).await;
    assert_eq!(status, 200, "{rotated}");
    let second_refresh = rotated["refresh_token"].as_str().unwrap();
    assert_ne!(second_refresh, first_refresh);
    assert_refused(refresh(&fx, &client, first_refresh).await, 400, "invalid_grant");
    let rotated_access = rotated["access_token"].as_str().unwrap();
    assert_eq!(whoami(&fx, rotated_access).await["jti"], claims(rotated_access)["jti"]);

    // Revoked: both tokens are refused, and a refreshed one works.
    fx.revoke().await;
    for old in [access, rotated_access] {
        let refused = challenge_of(&initialize(&fx, Some(&format!("Bearer {old}"))).await);
        assert_eq!(refused, format!("Bearer resource_metadata=\"{metadata_url}\", error=\"invalid_token\""));
    }
    let (status, fresh) = refresh(&fx, &client, second_refresh).await;
    assert_eq!(status, 200, "{fresh}");
    assert_eq!(whoami(&fx, fresh["access_token"].as_str().unwrap()).await["sub"], "alice@as.test");

    let stats = fx.as_stats().await;
    assert_eq!(
        stats,
        json!({
            "registrations": 1,
            "authorizations": 1,
            "token": {"authorization_code": 1, "refresh_token": 2},
            "refused": {"registration": 0, "authorize": 0, "token": 1},
            "resources": [fx.resource_url],
            "peers": ["127.0.0.1"],
        })
    );
    let stats = fx.resource_stats().await;
    assert_eq!(stats["unauthorized"], 3, "{stats}");
    assert!(stats["authorized"].as_u64().unwrap() >= 3, "{stats}");
}

/// Registration, authorization and token requests the server must refuse, and how.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_fixture_refuses_bad_requests() {
    let fx = OAuthFixtures::start(SECRET, 3600).await;

    for bad in [
        json!("not an object"),
        json!({}),
        json!({"redirect_uris": []}),
        json!({"redirect_uris": ["/relative/callback"]}),
        json!({"redirect_uris": ["ftp://127.0.0.1/callback"]}),
        json!({"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_basic"}),
    ] {
        let response = http().post(format!("{}/register", fx.as_url)).json(&bad).send().await.unwrap();
        assert_eq!(response.status(), 400, "{bad}");
        assert_eq!(response.json::<Value>().await.unwrap()["error"], "invalid_client_metadata", "{bad}");
    }
    let client = register(&fx.as_url, json!({"redirect_uris": [REDIRECT]})).await;
    let other = register(&fx.as_url, json!({"redirect_uris": [REDIRECT]})).await;
    let (verifier, challenge) = pkce();

    // Refused authorizations answer 400 here, never a redirect.
    let refusals: [(&str, Option<&str>, &str); 9] = [
        ("client_id", Some("never-registered"), "invalid_client"),
        ("redirect_uri", Some("http://127.0.0.1:9/elsewhere"), "invalid_request"),
        ("resource", None, "invalid_target"),
        ("code_challenge_method", Some("plain"), "invalid_request"),
        ("code_challenge_method", None, "invalid_request"),
        ("code_challenge", None, "invalid_request"),
        ("state", None, "invalid_request"),
        ("response_type", Some("token"), "unsupported_response_type"),
        ("scope", Some("mcp admin"), "invalid_scope"),
    ];
    for (key, value, error) in refusals {
        let mut params = authorize_params(&fx, &client, &challenge);
        params.retain(|(k, _)| *k != key);
        params.extend(value.map(|v| (key, v)));
        let response = authorize(&fx, &params).await;
        assert_eq!(response.status(), 400, "{key}={value:?}");
        assert!(response.headers().get("location").is_none());
        assert_eq!(response.json::<Value>().await.unwrap()["error"], error, "{key}={value:?}");
    }

    // A wrong verifier is refused and spends the code.
    let code = code_for(&fx, &client, &challenge, "bob").await;
    let (wrong, _) = pkce();
    assert_refused(token(&fx, &exchange(&client, &code, &wrong, &fx.resource_url)).await, 400, "invalid_grant");
    assert_refused(token(&fx, &exchange(&client, &code, &verifier, &fx.resource_url)).await, 400, "invalid_grant");

    // A replayed code is refused, and revokes the refresh token its first use gave.
    let code = code_for(&fx, &client, &challenge, "bob").await;
    let (status, tokens) = token(&fx, &exchange(&client, &code, &verifier, &fx.resource_url)).await;
    assert_eq!(status, 200, "{tokens}");
    assert_refused(token(&fx, &exchange(&client, &code, &verifier, &fx.resource_url)).await, 400, "invalid_grant");
    assert_refused(refresh(&fx, &client, tokens["refresh_token"].as_str().unwrap()).await, 400, "invalid_grant");

    // The code is bound to its client, redirect URI and resource, and needs a verifier.
    let code = code_for(&fx, &client, &challenge, "bob").await;
    assert_refused(token(&fx, &exchange(&other, &code, &verifier, &fx.resource_url)).await, 400, "invalid_grant");
    let code = code_for(&fx, &client, &challenge, "bob").await;
    let mut moved = exchange(&client, &code, &verifier, &fx.resource_url);
    moved.retain(|(k, _)| *k != "redirect_uri");
    moved.push(("redirect_uri", "http://127.0.0.1:9/elsewhere"));
    assert_refused(token(&fx, &moved).await, 400, "invalid_grant");
    let code = code_for(&fx, &client, &challenge, "bob").await;
    let elsewhere = "http://127.0.0.1:9/mcp";
    assert_refused(token(&fx, &exchange(&client, &code, &verifier, elsewhere)).await, 400, "invalid_target");
    let code = code_for(&fx, &client, &challenge, "bob").await;
    let mut bare = exchange(&client, &code, &verifier, &fx.resource_url);
    bare.retain(|(k, _)| *k != "code_verifier");
    assert_refused(token(&fx, &bare).await, 400, "invalid_grant");

    // The refresh token is bound to its client; unknown clients and grant types are refused.
    let tokens = fx.token_for("carol").await;
    let carols = tokens["refresh_token"].as_str().unwrap();
    assert_refused(refresh(&fx, &client, carols).await, 400, "invalid_grant");
    assert_refused(
        token(&fx, &[("grant_type", "password"), ("client_id", &client)]).await,
        400,
        "unsupported_grant_type",
    );
    assert_refused(refresh(&fx, "never-registered", carols).await, 401, "invalid_client");

    let stats = fx.as_stats().await;
    assert_eq!(stats["refused"], json!({"registration": 6, "authorize": 9, "token": 11}), "{stats}");
    assert_eq!(stats["token"], json!({"authorization_code": 2, "refresh_token": 0}), "{stats}");
    let resources: BTreeSet<&str> = stats["resources"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(resources, BTreeSet::from([elsewhere, fx.resource_url.as_str()]), "{stats}");
}

/// Only a token from the authorization server, for this resource, unexpired and not revoked,
/// reaches the MCP server; a missing one gets the bare challenge, a bad one `invalid_token`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_fixture_protected_refuses_bad_tokens() {
    use jsonwebtoken::{EncodingKey, Header};
    let fx = OAuthFixtures::start(SECRET, 3600).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let good = json!({
        "sub": "mallory", "aud": fx.resource_url, "iss": fx.as_url, "iat": now.as_secs(),
        "exp": now.as_secs() + 60, "jti": "j-1", "scope": "mcp", "client_id": "c",
        "issued_at_us": u64::try_from(now.as_micros()).unwrap(),
    });
    let sign = |claims: &Value, secret: &str| {
        let token =
            jsonwebtoken::encode(&Header::default(), claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap());
        format!("Bearer {}", token.unwrap())
    };
    let with = |key: &str, value: Value| {
        let mut claims = good.clone();
        claims[key] = value;
        claims
    };
    assert_eq!(initialize(&fx, Some(&sign(&good, SECRET))).await.status(), 200, "a token like the AS's is served");

    let bare = format!("Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"", fx.resource_base);
    for absent in [None, Some("Basic bWFsbG9yeTp4")] {
        assert_eq!(challenge_of(&initialize(&fx, absent).await), bare, "{absent:?}");
    }
    let mut unsigned = good.clone();
    unsigned.as_object_mut().unwrap().remove("issued_at_us");
    let bad = [
        sign(&good, "another-secret-entirely-0123456789"),
        sign(&with("aud", json!("http://127.0.0.1:9/mcp")), SECRET),
        sign(&with("iss", json!("http://127.0.0.1:9")), SECRET),
        sign(&with("exp", json!(now.as_secs() - 1)), SECRET),
        sign(&unsigned, SECRET),
        "Bearer not-a-jwt".to_owned(),
    ];
    for token in &bad {
        let challenge = challenge_of(&initialize(&fx, Some(token)).await);
        assert_eq!(challenge, format!("{bare}, error=\"invalid_token\""), "{token}");
    }
    let stats = fx.resource_stats().await;
    assert_eq!(stats, json!({"unauthorized": 8, "authorized": 1}));

    // Neither server starts without the shared secret.
    for mode in ["authserver", "protected"] {
        let out = tokio::process::Command::new(FIXTURE)
            .args([mode, "127.0.0.1:0"])
            .env_remove("FIXTURE_AS_SECRET")
            .env("FIXTURE_AS_ISSUER", &fx.as_url)
            .output()
            .await
            .unwrap();
        assert!(!out.status.success(), "{mode} started without FIXTURE_AS_SECRET");
        assert!(String::from_utf8_lossy(&out.stderr).contains("FIXTURE_AS_SECRET"), "{mode}");
    }
}

/// In a network namespace, bound to the namespace's veth address: reached from this host, and
/// the token endpoint records this host's address as the peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_fixtures_in_a_netns_record_the_peer() {
    let netns = Netns::create();
    let fx = OAuthFixtures::start_in(&netns, &netns_ip(&netns), SECRET, 60).await;
    assert!(fx.as_url.starts_with(&format!("http://{}:", netns_ip(&netns))), "{}", fx.as_url);
    let tokens = fx.token_for("dave").await;
    assert_eq!(tokens["expires_in"], 60);
    assert_eq!(whoami(&fx, tokens["access_token"].as_str().unwrap()).await["sub"], "dave");
    assert_eq!(fx.as_stats().await["peers"], json!([netns.host_ip]));
}

/// rmcp's own OAuth client (the one the gateway uses) gets through the fixtures: discovery from
/// the resource URL, registration, the authorization URL it builds (PKCE, `resource`, state),
/// the callback's issuer, the exchange, and a refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_fixture_satisfies_rmcps_oauth_client() {
    use rmcp::transport::auth::AuthorizationManager;
    scopegate::http::install_tls_provider();
    let fx = OAuthFixtures::start(SECRET, 3600).await;

    let mut manager = AuthorizationManager::new(fx.resource_url.as_str()).await.unwrap();
    let resolution = manager.resolve_metadata().await.unwrap();
    assert_eq!(resolution.metadata.issuer.as_deref(), Some(fx.as_url.as_str()));
    manager.set_metadata(resolution.metadata);
    manager.register_client("scopegate-test", REDIRECT, &["mcp"]).await.unwrap();
    let url = manager.get_authorization_url(&["mcp"]).await.unwrap();
    let response = http().get(format!("{url}&login_hint=erin")).send().await.unwrap();
    assert_eq!(response.status(), 302);
    let location = reqwest::Url::parse(response.headers()["location"].to_str().unwrap()).unwrap();
    let query: std::collections::HashMap<_, _> = location.query_pairs().into_owned().collect();
    manager.exchange_code_for_token_with_issuer(&query["code"], &query["state"], Some(&query["iss"])).await.unwrap();
    let access = manager.get_access_token().await.unwrap();
    assert_eq!(whoami(&fx, &access).await["sub"], "erin");

    manager.refresh_token().await.unwrap();
    let refreshed = manager.get_access_token().await.unwrap();
    assert_ne!(claims(&refreshed)["jti"], claims(&access)["jti"]);
    assert_eq!(whoami(&fx, &refreshed).await["sub"], "erin");

    let stats = fx.as_stats().await;
    assert_eq!(stats["token"], json!({"authorization_code": 1, "refresh_token": 1}), "{stats}");
    assert_eq!(stats["refused"], json!({"registration": 0, "authorize": 0, "token": 0}), "{stats}");
    assert_eq!(stats["resources"], json!([fx.resource_url]), "{stats}");
}
