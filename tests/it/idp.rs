//! A real identity provider (oidc-provider, tests/fixtures/npm/idp.mjs) in front of the
//! gateway, and real third-party MCP clients (the official TypeScript and Python SDKs) that
//! run the whole OAuth flow against it: the 401 challenge, protected-resource metadata,
//! authorization-server discovery, dynamic registration, PKCE, the resource indicator, and
//! the token the gateway then verifies through the provider's JWKS. On SQLite and PostgreSQL.

use base64::Engine;
use serde_json::{Value, json};

use crate::support::*;

/// A gateway that trusts only `idp`, configured as the production recipe says: its issuer
/// alone (keys discovered, the issuer the authorization server), no development secret, the
/// scopes it publishes and requires. Its public URL is its own address, so the resource the
/// clients discover from the 401 challenge is the endpoint they connect to.
fn gateway_for(idp: &Idp, backend: Backend) -> TestGateway {
    TestGateway::new(backend)
        .set("server.public_url", json!(""))
        .set("auth.issuer", json!(idp.issuer()))
        .set("auth.hs256_secret", json!(""))
        .set("auth.scopes_supported", json!(["mcp:read", "mcp:write"]))
        .set("auth.required_scopes", json!(["mcp:read"]))
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
    let live = gateway_for(&idp, backend).start().await;
    let run = run_py_client(&live.url(), &WHOAMI).await;
    run.assert_success("the Python SDK client");
    assert_called_whoami_as_olivia(&run, &live);
    let scope = run.step("authorize").unwrap()["scope"].as_str().unwrap_or_default().to_owned();
    assert!(scope.split(' ').any(|s| s == "mcp:read"), "the scope the gateway named: {scope}");
}

both_dbs!(idp_python_sdk_client, python_client);

/// The TypeScript SDK, with no scope of its own, asks for the one the gateway's challenge
/// names, completes the flow and calls a tool.
async fn typescript_client(backend: Backend) {
    let idp = Idp::start(IdpOptions::demo()).await;
    let live = gateway_for(&idp, backend).start().await;
    let run = run_ts_client(&live.url(), &WHOAMI).await;
    run.assert_success("the TypeScript SDK client");
    assert_called_whoami_as_olivia(&run, &live);
    assert_eq!(run.step("authorize").unwrap()["scope"], "mcp:read", "the scope of the gateway's challenge");
}

both_dbs!(idp_typescript_sdk_client, typescript_client);

/// The guide whose production recipe [`idp_production_recipe_as_written`] runs, and what the
/// recipe writes for the provider's issuer and the gateway's public URL.
const RECIPE_PAGE: &str = "docs/guide/tokens.md";
const RECIPE_START: &str = "```toml\n# production.toml";
const RECIPE_ISSUER: &str = "https://idp.example.com";
const RECIPE_PUBLIC_URL: &str = "https://mcp.example.com";

/// The recipe's TOML block, as the page writes it.
fn production_recipe() -> String {
    let page = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(RECIPE_PAGE))
        .unwrap_or_else(|e| panic!("{RECIPE_PAGE}: {e}"));
    let start = page.find(RECIPE_START).unwrap_or_else(|| panic!("{RECIPE_PAGE} has a block opening {RECIPE_START:?}"));
    let block = &page[start + "```toml\n".len()..];
    let block = &block[..block.find("```").unwrap_or_else(|| panic!("{RECIPE_PAGE}: the recipe's block ends"))];
    for example in [RECIPE_ISSUER, RECIPE_PUBLIC_URL] {
        assert!(block.contains(example), "the recipe names {example}, which the test replaces:\n{block}");
    }
    block.to_owned()
}

/// The tokens guide's production recipe, as written, with a real provider and a real client:
/// only the provider's issuer is replaced (by the test provider's), and the public URL by ""
/// (the gateway's bound address, which the client reaches). Everything else (no key set URL,
/// no development secret, the scopes) is the recipe's own, over the built-in defaults and not
/// the tests' (no test secret): a recipe that stops working fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idp_production_recipe_as_written() {
    let idp = Idp::start(IdpOptions::demo()).await;
    let toml = production_recipe().replace(RECIPE_ISSUER, &idp.issuer()).replace(RECIPE_PUBLIC_URL, "");
    let live = TestGateway::new(Backend::Sqlite).config_file(&toml).start().await;
    assert!(live.config.auth.hs256_secret.is_empty(), "the recipe turns HS256 off");
    let run = run_ts_client(&live.url(), &WHOAMI).await;
    run.assert_success("the TypeScript SDK client against the recipe's gateway");
    assert_called_whoami_as_olivia(&run, &live);
}

/// Step-up with both SDKs: `whoami` needs `mcp:write` beyond the required `mcp:read`; the
/// clients are let in with `mcp:read`, list the tools, get 403 `insufficient_scope` on the call,
/// ask the person again for both scopes, and the call succeeds. (The TypeScript SDK 1.32.2
/// tries a refresh first, which cannot widen a scope, and then gives up; its client here drops
/// the refresh token on that 403 so that the SDK authorises again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idp_step_up_with_both_sdks() {
    let idp = Idp::start(IdpOptions::demo()).await;
    let live =
        gateway_for(&idp, Backend::Sqlite).set("auth.tool_scopes", json!({"whoami": ["mcp:write"]})).start().await;
    let url = live.url();
    let ts_args = [&WHOAMI[..], &["--step-up-reauthorize"]].concat();
    let python = run_py_client(&url, &WHOAMI);
    let typescript = run_ts_client(&url, &ts_args);
    let (python, typescript) = tokio::join!(python, typescript);
    for (run, sdk) in [(&python, "Python"), (&typescript, "TypeScript")] {
        run.assert_success(sdk);
        let scopes: Vec<String> =
            run.steps_named("authorize").iter().map(|s| s["scope"].as_str().unwrap_or_default().to_owned()).collect();
        assert_eq!(scopes.len(), 2, "{sdk}: authorised, then stepped up: {run:#?}");
        assert!(!scopes[0].split(' ').any(|s| s == "mcp:write"), "{sdk}: first without mcp:write: {scopes:?}");
        assert!(scopes[1].split(' ').any(|s| s == "mcp:write"), "{sdk}: then with it: {scopes:?}");
        assert!(scopes[1].split(' ').any(|s| s == "mcp:read"), "{sdk}: keeping what it had: {scopes:?}");
        assert_eq!(run.step("call").unwrap()["result"]["structuredContent"]["tenant"], "acme", "{sdk}");
    }
}

/// `whoami` with `token` over rmcp's client: the tenant it answers, or the refusal (at the
/// handshake or at the call: a trust removed meanwhile refuses the call).
async fn whoami_with(live: &Live, token: &str) -> Result<String, String> {
    let transport = crate::support::transport(&live.url(), token);
    let client = rmcp::ServiceExt::serve((), transport).await.map_err(|e| e.to_string())?;
    let params = rmcp::model::CallToolRequestParams::new("whoami");
    let result = client.call_tool(params).await.map_err(|e| e.to_string())?;
    let me = result.structured_content.ok_or("no structured content")?;
    Ok(me["tenant"].as_str().unwrap_or_default().to_owned())
}

/// A key rotation at the provider while callers call: tokens of the new key are accepted on
/// their first use, tokens of the old one still are while it is published, and a second
/// rotation right after the first (inside the refetch floor) is taken once the floor ends:
/// no token is ever refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idp_rotation_is_taken_without_a_refusal() {
    let idp = Idp::start(IdpOptions::demo()).await;
    let live = gateway_for(&idp, Backend::Sqlite).start().await;
    let resource = live.url();
    let before = idp.mint("olivia@acme.test", &resource, None).await;
    assert_eq!(whoami_with(&live, &before).await.as_deref(), Ok("acme"));

    idp.rotate().await;
    let after = idp.mint("olivia@acme.test", &resource, None).await;
    let gary = idp.mint("gary@globex.test", &resource, None).await;
    let started = std::time::Instant::now();
    let (a, b, c) = tokio::join!(whoami_with(&live, &after), whoami_with(&live, &gary), whoami_with(&live, &before));
    eprintln!("rotation: first calls with the new key answered in {:?}", started.elapsed());
    assert_eq!((a.as_deref(), b.as_deref(), c.as_deref()), (Ok("acme"), Ok("globex"), Ok("acme")));

    idp.rotate().await;
    let third = idp.mint("wanda@acme.test", &resource, None).await;
    let started = std::time::Instant::now();
    let answers = futures_util::future::join_all((0..4).map(|_| whoami_with(&live, &third))).await;
    assert!(answers.iter().all(|a| a.as_deref() == Ok("acme")), "{answers:?}");
    eprintln!("rotation inside the floor: four calls answered in {:?}", started.elapsed());
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "taken within the floor, not a window");
}

/// The provider is down when the gateway starts: the gateway starts, says not ready, and
/// once the provider is up it fetches the keys and a client's whole flow succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idp_down_at_start_then_up() {
    let mut idp = Idp::start(IdpOptions::demo()).await;
    idp.stop().await;
    let live = gateway_for(&idp, Backend::Sqlite).start().await;
    let ready = format!("{}/readyz", live.base_url());
    assert_eq!(reqwest::get(&ready).await.unwrap().status(), 503, "not ready without the provider's keys");
    idp.start_again().await;
    eventually("ready once the provider is up", || async {
        reqwest::get(&ready).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let run = run_py_client(&live.url(), &WHOAMI).await;
    run.assert_success("the Python SDK client after the provider came up");
}

/// Two tenants, two identity providers of their own (besides the gateway's): each provider's
/// tokens reach only the tenant that trusts it; a token of acme's provider naming globex is
/// refused; an issuer removed stops working within the change counter's interval. On both
/// databases.
async fn two_tenants_two_issuers(backend: Backend) {
    // acme's provider says olivia is globex's (a provider that names another tenant).
    let acme_accounts = json!({"wanda@acme.test": {"tid": "acme"}, "olivia@acme.test": {"tid": "globex"}});
    let acme_idp = Idp::start(IdpOptions { accounts: acme_accounts, ..IdpOptions::demo() }).await;
    let globex_idp = Idp::start(IdpOptions::demo()).await;
    let live = TestGateway::new(backend)
        .set("server.public_url", json!(""))
        .set("auth.tenant_issuers_insecure", json!(true))
        .set("auth.advertise_tenant_issuers", json!(true))
        .set("admin.platform_subjects", json!(["ops@platform.test"]))
        .start()
        .await;
    let resource = live.url();
    let trust = |slug: &str, idp: &Idp, tenant_claim: Option<&str>| {
        let new = scopegate::store::issuers::NewIssuer {
            issuer: idp.issuer(),
            jwks_url: None,
            audience: None,
            subject_claim: "sub".into(),
            tenant_claim: tenant_claim.map(str::to_owned),
            console_client_id: None,
            console_scopes: None,
        };
        let (db, slug) = (live.db.clone(), slug.to_owned());
        async move {
            let mut tx = db.begin().await.unwrap();
            scopegate::store::issuers::add(&mut tx, &slug, &new).await.unwrap();
            tx.commit().await.unwrap();
        }
    };
    trust("acme", &acme_idp, Some("tid")).await;
    trust("globex", &globex_idp, None).await;

    let wanda = acme_idp.mint("wanda@acme.test", &resource, None).await;
    let gary = globex_idp.mint("gary@globex.test", &resource, None).await;
    eventually("each provider's tokens reach its tenant", || async {
        whoami_with(&live, &wanda).await.as_deref() == Ok("acme")
            && whoami_with(&live, &gary).await.as_deref() == Ok("globex")
    })
    .await;
    // A token of acme's provider naming globex (for a subject acme has): acme trusts its
    // provider only for tokens naming acme, and globex does not trust it at all.
    let forged = acme_idp.mint("olivia@acme.test", &resource, None).await;
    assert!(whoami_with(&live, &forged).await.is_err(), "a token of acme's provider naming globex is refused");
    // globex's provider vouching for acme's owner: the token resolves to globex, where olivia is
    // nobody.
    let stray = globex_idp.mint("olivia@acme.test", &resource, None).await;
    assert!(whoami_with(&live, &stray).await.is_err(), "globex's provider names no acme user");
    // A tenant's provider names that tenant's users only: never a platform administrator.
    let ops = globex_idp.mint("ops@platform.test", &resource, None).await;
    let tenants = reqwest::Client::new()
        .get(format!("{}/admin/v1/tenants", live.base_url()))
        .bearer_auth(&ops)
        .send()
        .await
        .unwrap();
    assert_eq!(tenants.status(), 403, "a tenant's provider cannot make a platform administrator");
    // Both providers are listed as authorization servers (advertised).
    let metadata: Value = reqwest::get(format!("{}/.well-known/oauth-protected-resource", live.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let servers = metadata["authorization_servers"].as_array().unwrap();
    assert!(servers.contains(&json!(acme_idp.issuer())) && servers.contains(&json!(globex_idp.issuer())), "{metadata}");

    let mut tx = live.db.begin().await.unwrap();
    scopegate::store::issuers::remove(&mut tx, "globex", &globex_idp.issuer()).await.unwrap();
    tx.commit().await.unwrap();
    eventually("a removed issuer stops working", || async { whoami_with(&live, &gary).await.is_err() }).await;
    assert_eq!(whoami_with(&live, &wanda).await.as_deref(), Ok("acme"), "the other tenant's provider still works");
}

both_dbs!(idp_two_tenants_two_issuers, two_tenants_two_issuers);

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
