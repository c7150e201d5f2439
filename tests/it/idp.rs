//! A real identity provider (oidc-provider, tests/fixtures/npm/idp.mjs) in front of the
//! gateway, and real third-party MCP clients (the official TypeScript and Python SDKs) that
//! run the whole OAuth flow against it: the 401 challenge, protected-resource metadata,
//! authorization-server discovery, dynamic registration, PKCE, the resource indicator, and
//! the token the gateway then verifies through the provider's JWKS. On SQLite and PostgreSQL.

use base64::Engine;
use serde_json::{Value, json};

use crate::support::*;

/// A gateway that trusts only `idp`: its issuer, its JWKS, no development secret. Its public
/// URL is its own address, so the resource the clients discover from the 401 challenge is the
/// endpoint they connect to.
async fn gateway_for(idp: &Idp, backend: Backend) -> Live {
    TestGateway::new(backend)
        .set("server.public_url", json!(""))
        .set("auth.issuer", json!(idp.issuer()))
        .set("auth.jwks_url", json!(idp.jwks_url()))
        .set("auth.hs256_secret", json!(""))
        .set("auth.authorization_servers", json!([idp.issuer()]))
        .start()
        .await
}

/// The client logged in as olivia, listed the tools, and `whoami` answered as acme's owner.
fn assert_called_whoami_as_olivia(run: &ClientRun, live: &Live) {
    let authorize = run.step("authorize").unwrap_or_else(|| panic!("an authorization: {run:#?}"));
    assert_eq!(authorize["resource"], json!(live.url()), "the resource indicator is the endpoint");
    assert_eq!((run.authorizations(), run.refreshes()), (1, 0), "one authorization, no refresh: {run:#?}");
    assert!(run.tool_names().iter().any(|t| t == "whoami"), "{:?}", run.tool_names());
    let result = &run.step("call").unwrap_or_else(|| panic!("a call: {run:#?}"))["result"];
    let me = &result["structuredContent"];
    assert_eq!(me["tenant"], "acme", "{result}");
    assert_eq!(me["user"], "olivia@acme.test", "{result}");
    assert!(me["roles"].as_array().is_some_and(|r| r.contains(&json!("owner"))), "{result}");
}

const WHOAMI: [&str; 6] = ["--tool", "whoami", "--args", "{}", "--login-hint", "olivia@acme.test"];

/// The Python SDK, asking for the scopes it picks itself (the provider's `scopes_supported`,
/// as the gateway advertises none), completes the flow and calls a tool.
async fn python_client(backend: Backend) {
    let idp = Idp::start(IdpOptions::demo()).await;
    let live = gateway_for(&idp, backend).await;
    let run = run_py_client(&live.url(), &WHOAMI).await;
    run.assert_success("the Python SDK client");
    assert_called_whoami_as_olivia(&run, &live);
}

both_dbs!(idp_python_sdk_client, python_client);

/// The TypeScript SDK completes the flow and calls a tool.
async fn typescript_client(backend: Backend) {
    let idp = Idp::start(IdpOptions::demo()).await;
    let live = gateway_for(&idp, backend).await;
    // TODO(scopes): drop --scope once the gateway advertises scopes_supported
    let args = [&WHOAMI[..], &["--scope", "mcp:read mcp:write"]].concat();
    let run = run_ts_client(&live.url(), &args).await;
    run.assert_success("the TypeScript SDK client");
    assert_called_whoami_as_olivia(&run, &live);
    assert_eq!(run.step("authorize").unwrap()["scope"], "mcp:read mcp:write");
}

both_dbs!(idp_typescript_sdk_client, typescript_client);

/// The payload of a JWT, and its header.
fn decode(token: &str) -> (Value, Value) {
    let part = |i: usize| {
        let text = token.split('.').nth(i).expect("three parts");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).expect("base64url");
        serde_json::from_slice::<Value>(&bytes).expect("JSON")
    };
    (part(1), part(0))
}

/// The kids of the key set at `jwks_url`, in order.
async fn published_kids(jwks_url: String) -> Vec<String> {
    let jwks: Value = reqwest::get(jwks_url).await.unwrap().json().await.unwrap();
    jwks["keys"].as_array().unwrap().iter().map(|k| k["kid"].as_str().unwrap().to_owned()).collect()
}

/// The fixture itself: what its access tokens hold, its JWKS caching header, a rotation that
/// keeps the old key published until it is dropped, and a restart that serves the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idp_fixture_tokens_keys_and_restart() {
    let mut idp = Idp::start(IdpOptions { jwks_max_age_secs: Some(42), ..IdpOptions::demo() }).await;
    let resource = "http://127.0.0.1:9/mcp";
    let first = idp.current_kid().await;

    let (claims, header) = decode(&idp.mint("olivia@acme.test", resource, None).await);
    assert_eq!(header["alg"], "RS256", "{header}");
    assert_eq!(header["typ"], "at+jwt", "{header}");
    assert_eq!(header["kid"], json!(first), "{header}");
    assert_eq!(claims["iss"], json!(idp.issuer()), "{claims}");
    assert_eq!(claims["aud"], resource, "one audience, the resource itself: {claims}");
    assert_eq!(claims["sub"], "olivia@acme.test", "{claims}");
    assert_eq!(claims["scope"], "mcp:read mcp:write", "a space-separated string: {claims}");
    assert_eq!(claims["client_id"], "test-minter", "{claims}");
    assert_eq!(claims["tid"], "acme", "{claims}");
    assert_eq!(claims["org"], json!({"id": "org_acme1"}), "{claims}");

    let jwks = reqwest::get(idp.jwks_url()).await.unwrap();
    assert_eq!(jwks.headers()["cache-control"], "max-age=42");
    let jwks_url = idp.jwks_url();
    let kids = || published_kids(jwks_url.clone());
    assert_eq!(kids().await, [first.as_str()]);

    let second = idp.rotate().await;
    assert_ne!(second, first);
    assert_eq!(idp.current_kid().await, second);
    assert_eq!(kids().await, [second.clone(), first.clone()], "the old key is still published");
    let (_, header) = decode(&idp.mint("olivia@acme.test", resource, None).await);
    assert_eq!(header["kid"], json!(second), "tokens are signed with the new key");

    idp.stop().await;
    assert!(reqwest::get(idp.jwks_url()).await.is_err(), "a stopped provider refuses connections");
    idp.start_again().await;
    assert_eq!(idp.current_kid().await, second, "the same keys after a restart");
    idp.drop_old_keys().await;
    assert_eq!(kids().await, [second]);
}
