//! The fixture's OAuth modes (`authserver`, `protected`), driven by hand over plain HTTP the
//! way an MCP client does it: the 401 challenge, protected resource and authorization server
//! metadata, dynamic registration, authorization with PKCE, the code exchange, MCP calls with
//! the token, refresh, and revocation; and every refusal the gateway's OAuth tests rely on.

use std::collections::BTreeSet;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

use crate::support::oauth::{
    OAuthFixtures, REDIRECT, authorize, authorize_params, code_for, exchange, get_json, http, pkce, register, token,
};
use crate::support::{FIXTURE, Netns, connect, netns_ip};

const SECRET: &str = "oauth-fixture-test-secret-0123456789";

/// The claims of a JWT, unverified (the test reads what the fixture put there).
fn claims(jwt: &str) -> Value {
    let payload = jwt.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
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
    let client = connect(&fx.resource_url, access_token, ()).await;
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
