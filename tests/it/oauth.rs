//! OAuth to upstream servers, end to end: the gateway (in this process), the mock authorization
//! server and the protected MCP fixture (child processes), on SQLite and PostgreSQL. A login is
//! asked for by the CLI or by a call that needs one, started by its link (discovery from the
//! server's 401, registration, the authorization URL), completed by the callback (`state`,
//! `redirect_uri`, the PKCE exchange); calls then carry the token, refreshed on expiry and on a
//! 401. With a remote executor, every OAuth request goes through the agent.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use crate::support::*;

const AS_SECRET: &str = "oauth-fixture-secret-for-the-tests-0123456789";

/// An HTTP client that never follows redirects (the test plays the browser step by step).
fn browser() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// GETs `url` and returns the redirect's target.
async fn redirected(url: &str) -> String {
    let response = browser().get(url).send().await.unwrap();
    let status = response.status();
    let location = response.headers().get("location").map(|l| l.to_str().unwrap().to_owned());
    let body = response.text().await.unwrap_or_default();
    assert_eq!(status, 302, "{url}: {body}");
    location.expect("a Location")
}

fn param(url: &str, name: &str) -> Option<String> {
    reqwest::Url::parse(url).unwrap().query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

/// A key file for the token vault.
fn key_file(dir: &Path) -> PathBuf {
    let path = dir.join("token.key");
    std::fs::write(&path, scopegate::store::vault::VaultKey::generate().unwrap()).unwrap();
    path
}

/// `scopegate admin oauth ARGS` against the site's database, key and public URL.
fn oauth_cli(site: &Site, key: &Path, args: &[&str]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = scopegate(dir.path())
        .env("SCOPEGATE_DATABASE__URL", site.live.config.database.url.expose())
        .env("SCOPEGATE_UPSTREAM__TOKEN_KEY_FILE", key)
        .env("SCOPEGATE_SERVER__PUBLIC_URL", site.live.config.public_url())
        .args(["admin", "oauth"])
        .args(args)
        .output()
        .unwrap();
    outcome(&out)
}

/// A URL under the gateway's public URL (what it hands out), as this test reaches it.
fn local(site: &Site, url: &str) -> String {
    let public = site.live.config.public_url();
    assert!(url.starts_with(&public), "{url} is under {public}");
    url.replacen(&public, &site.live.base_url(), 1)
}

/// Plays the browser: opens the start link, lets the authorization server approve `as_user`,
/// and returns the callback URL it sends the browser to (not yet opened). Checks the
/// authorization URL on the way.
async fn authorize(site: &Site, fx: &OAuthFixtures, link: &str, as_user: &str) -> String {
    authorize_at(site, fx, link, as_user).await.1
}

/// [`authorize`], with the authorization URL.
async fn authorize_at(site: &Site, fx: &OAuthFixtures, link: &str, as_user: &str) -> (String, String) {
    let link = local(site, link);
    let auth_url = redirected(&link).await;
    assert!(auth_url.starts_with(&fx.as_url), "{auth_url}");
    assert_eq!(param(&auth_url, "response_type").as_deref(), Some("code"));
    assert_eq!(param(&auth_url, "code_challenge_method").as_deref(), Some("S256"));
    assert_eq!(param(&auth_url, "code_challenge").map(|c| c.len()), Some(43), "a SHA-256 challenge");
    assert_eq!(param(&auth_url, "redirect_uri"), Some(format!("{}/oauth/callback", site.live.config.public_url())));
    assert_eq!(param(&auth_url, "resource"), Some(fx.resource_url.clone()), "RFC 8707: the server's resource");
    assert!(param(&auth_url, "state").is_some_and(|s| s.len() >= 16));
    assert!(param(&auth_url, "client_id").is_some());
    // The start link works once.
    let again = browser().get(&link).send().await.unwrap();
    assert_eq!(again.status(), 404, "a start link is good once");
    let callback = redirected(&format!("{auth_url}&login_hint={as_user}")).await;
    assert!(callback.starts_with(&format!("{}/oauth/callback?", site.live.config.public_url())), "{callback}");
    (auth_url, local(site, &callback))
}

async fn open_callback(callback: &str) -> (u16, String) {
    let response = browser().get(callback).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// The value a `whoami_oauth` call returned.
fn whoami(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "{result:?}");
    if let Some(structured) = &result.structured_content {
        return structured.clone();
    }
    let text = result.content.iter().find_map(|c| c.as_text()).expect("text content");
    serde_json::from_str(&text.text).expect("JSON")
}

/// The login link of a call that needs a login (from the error's data and its message).
fn login_link(error: &rmcp::ErrorData) -> String {
    let link = error.data.as_ref().and_then(|d| d["loginUrl"].as_str()).expect("a loginUrl").to_owned();
    assert!(error.message.contains(&link), "the message carries the link: {}", error.message);
    link
}

async fn tool_names(site: &Site, subject: &str) -> Vec<String> {
    let client = site.live.client(subject).await;
    client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect()
}

/// The tenant's login, asked for with the CLI: discovery, registration, the authorization URL,
/// the callback (a foreign `state` and a replay refused), an authorized call, the token sealed,
/// refresh on a 401, status and logout.
async fn tenant_login(backend: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path());
    let site = Site::start(backend, &[("upstream.token_key_file", json!(key))]).await;
    let fx = OAuthFixtures::start(AS_SECRET, 3600).await;
    site.serve("acme", "api", &json!({"url": fx.resource_url, "oauth": {}}), "local").await;

    // Before any login: the owner sees only `api__login`, and a call answers with a link.
    let names = tool_names(&site, "olivia@acme.test").await;
    assert!(names.contains(&"api__login".to_owned()), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("api__") && n != "api__login"), "{names:?}");
    let olivia = site.live.client("olivia@acme.test").await;
    let error = call(olivia.peer(), "api__whoami_oauth", json!({})).await.expect_err("login needed");
    let link = login_link(&error);
    assert!(link.starts_with(&format!("{}/oauth/start/", site.live.config.public_url())), "{link}");

    // A worker may use the server but not log in for the whole tenant: no link for him.
    let mut tx = site.live.db.begin().await.unwrap();
    scopegate::store::entities::grant_tool(&mut tx, "acme", "api", scopegate::model::Role::Worker, "whoami_oauth")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let walt = site.live.client("walt@acme.test").await;
    let error = call(walt.peer(), "api__whoami_oauth", json!({})).await.expect_err("login needed");
    assert!(error.data.as_ref().is_some_and(|d| d.get("loginUrl").is_none()), "{error:?}");
    assert!(error.message.contains("owner or manager"), "{}", error.message);

    // The CLI refuses what is not a tenant login of a protected server, and asks for one.
    let (done, _, err) =
        oauth_cli(&site, &key, &["login", "--tenant", "acme", "--server", "api", "--user", "olivia@acme.test"]);
    assert!(!done && err.contains("keeps one login for the tenant: name no user"), "{err}");
    let (done, _, err) = oauth_cli(&site, &key, &["login", "--tenant", "acme", "--server", "nope"]);
    assert!(!done && err.contains("not bound"), "{err}");
    let (done, link, err) = oauth_cli(&site, &key, &["login", "--tenant", "acme", "--server", "api"]);
    assert!(done, "{err}");
    let link = link.trim().to_owned();
    let (auth_url, callback) = authorize_at(&site, &fx, &link, "acme-robot").await;
    let fx_stats = fx.as_stats().await;
    assert_eq!(fx_stats["registrations"], 1, "dynamic client registration: {fx_stats}");

    // A state the gateway never issued is refused and completes nothing.
    let state = param(&callback, "state").unwrap();
    let forged = callback.replace(&state, "forged-state-0123456789abcdef");
    assert_eq!(open_callback(&forged).await.0, 404);
    let (status, page) = open_callback(&callback).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Logged in to `api`"), "{page}");
    assert_eq!(open_callback(&callback).await.0, 404, "a state completes one login, once");
    assert_eq!(fx.as_stats().await["token"]["authorization_code"], 1);

    // The credential is sealed: the table holds no token text.
    assert_eq!(site.live.count("SELECT COUNT(*) FROM oauth_credentials").await, 1);
    assert_eq!(site.live.count("SELECT COUNT(*) FROM oauth_logins WHERE state_hash IS NOT NULL").await, 0);
    let olivia = site.live.client("olivia@acme.test").await;
    let me = whoami(&call(olivia.peer(), "api__whoami_oauth", json!({})).await.unwrap());
    assert_eq!(me["sub"], "acme-robot", "the call carried the tenant's token: {me}");
    let jti = me["jti"].as_str().unwrap().to_owned();
    let mut tx = site.live.db.begin().await.unwrap();
    let sealed: Vec<String> =
        sqlx::query_scalar("SELECT ciphertext FROM oauth_credentials").fetch_all(&mut *tx).await.unwrap();
    drop(tx);
    for text in &sealed {
        assert!(!text.contains("eyJ") && !text.contains(&jti), "no token in clear");
    }

    // The server refuses the token (revoked): one refresh, and the call goes through.
    fx.revoke().await;
    let me = whoami(&call(olivia.peer(), "api__whoami_oauth", json!({})).await.unwrap());
    assert_eq!(me["sub"], "acme-robot");
    assert_ne!(me["jti"].as_str(), Some(jti.as_str()), "a new token");
    assert_eq!(fx.as_stats().await["token"]["refresh_token"], 1);

    // Status names the credential, never its content.
    let (done, out, err) = oauth_cli(&site, &key, &["status", "--tenant", "acme"]);
    assert!(done, "{err}");
    assert!(out.starts_with("api\ttenant\tok\t"), "{out}");
    assert!(!out.contains(&jti));

    // The authorization server drops the grant (a replayed code revokes the refresh tokens it
    // led to) and the server refuses the token: the refresh is refused, the credential needs a
    // login, the call answers with a link, and the audit log records why the call failed.
    let replay = [
        ("grant_type", "authorization_code"),
        ("code", &param(&callback, "code").unwrap()),
        ("client_id", &param(&auth_url, "client_id").unwrap()),
        ("redirect_uri", &param(&auth_url, "redirect_uri").unwrap()),
        ("code_verifier", "not-the-verifier-0123456789-0123456789-0123456789"),
    ];
    let replayed = reqwest::Client::new()
        .post(format!("{}/token", fx.as_url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&replay))
        .send()
        .await
        .unwrap();
    assert_eq!(replayed.status(), 400);
    fx.revoke().await;
    let error = call(olivia.peer(), "api__whoami_oauth", json!({})).await.expect_err("the refresh was refused");
    let relogin = login_link(&error);
    let (done, out, err) = oauth_cli(&site, &key, &["status", "--tenant", "acme"]);
    assert!(done && out.starts_with("api\ttenant\tlogin_needed\t"), "{out}{err}");
    let audited = "SELECT COUNT(*) FROM audit_events WHERE tool = 'api__whoami_oauth' AND error_class = 'login_needed'";
    eventually("the call needing a login is audited", || async { site.live.count(audited).await >= 1 }).await;
    // Logging in again makes it usable; logout deletes it.
    let callback = authorize(&site, &fx, &relogin, "acme-robot").await;
    assert_eq!(open_callback(&callback).await.0, 200);
    let olivia = site.live.client("olivia@acme.test").await;
    assert_eq!(whoami(&call(olivia.peer(), "api__whoami_oauth", json!({})).await.unwrap())["sub"], "acme-robot");
    let (done, _, err) = oauth_cli(&site, &key, &["logout", "--tenant", "acme", "--server", "api"]);
    assert!(done, "{err}");
    assert_eq!(site.live.count("SELECT COUNT(*) FROM oauth_credentials").await, 0);
}
both_dbs!(oauth_tenant_login_through_the_cli, tenant_login);

/// Two replicas use one tenant credential, and the server refuses the token on both at once
/// (the authorization server answers refreshes slowly, so the two would overlap). The
/// credential's refresh lease in the database puts one refresh after the other, the second
/// with the refresh token the first one stored: both calls go through, the authorization server
/// refuses nothing, and the credential stays usable.
async fn refresh_across_replicas(backend: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path());
    let site = Site::start(backend, &[("upstream.token_key_file", json!(key))]).await;
    let fx = OAuthFixtures::start_with_slow_refresh(AS_SECRET, 3600, 300).await;
    site.serve("acme", "api", &json!({"url": fx.resource_url, "oauth": {}}), "local").await;
    let (done, link, err) = oauth_cli(&site, &key, &["login", "--tenant", "acme", "--server", "api"]);
    assert!(done, "{err}");
    let callback = authorize(&site, &fx, link.trim(), "acme-robot").await;
    assert_eq!(open_callback(&callback).await.0, 200);

    let second = site.live.replica().await;
    let second_url = second.base_url();
    let a = site.live.client("olivia@acme.test").await;
    let b = site.live.client_at(&second_url, "olivia@acme.test").await;
    for client in [&a, &b] {
        assert_eq!(whoami(&call(client.peer(), "api__whoami_oauth", json!({})).await.unwrap())["sub"], "acme-robot");
    }

    fx.revoke().await;
    let (first, second) =
        tokio::join!(call(a.peer(), "api__whoami_oauth", json!({})), call(b.peer(), "api__whoami_oauth", json!({})),);
    for (replica, answer) in [("first", first), ("second", second)] {
        let answer = answer.unwrap_or_else(|e| panic!("the {replica} replica's call failed: {e:?}"));
        assert_eq!(whoami(&answer)["sub"], "acme-robot", "{replica}");
    }
    let stats = fx.as_stats().await;
    assert_eq!(stats["refused"]["token"], 0, "no refresh token was spent twice: {stats}");
    assert!(stats["token"]["refresh_token"].as_u64().is_some_and(|n| (1..=2).contains(&n)), "{stats}");
    let (done, out, err) = oauth_cli(&site, &key, &["status", "--tenant", "acme"]);
    assert!(done && out.starts_with("api\ttenant\tok\t"), "{out}{err}");
    // Every lease is given back (by a task of its own, right after its refresh).
    eventually("every lease is given back", || async {
        site.live.count("SELECT COUNT(*) FROM oauth_refresh_leases").await == 0
    })
    .await;
}
both_dbs!(oauth_replicas_refresh_one_credential_in_turn, refresh_across_replicas);

/// Per-user tokens: each user logs in from their MCP client (the link of a call that needs a
/// login) and their calls carry their own token, never another user's; an expiring token is
/// refreshed before it runs out.
async fn per_user(backend: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path());
    let site = Site::start(backend, &[("upstream.token_key_file", json!(key))]).await;
    let fx = OAuthFixtures::start(AS_SECRET, 2).await;
    site.serve("acme", "api", &json!({"url": fx.resource_url, "oauth": {"tokens": "user"}}), "local").await;
    let mut tx = site.live.db.begin().await.unwrap();
    scopegate::store::entities::grant_tool(&mut tx, "acme", "api", scopegate::model::Role::Worker, "whoami_oauth")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let olivia = site.live.client("olivia@acme.test").await;
    let link = login_link(&call(olivia.peer(), "api__login", json!({})).await.expect_err("login needed"));
    let callback = authorize(&site, &fx, &link, "olivia-upstream").await;
    assert_eq!(open_callback(&callback).await.0, 200);
    let olivia = site.live.client("olivia@acme.test").await;
    assert_eq!(whoami(&call(olivia.peer(), "api__whoami_oauth", json!({})).await.unwrap())["sub"], "olivia-upstream");

    // Walt has no login of his own: he is asked for one, and never gets Olivia's token.
    let names = tool_names(&site, "walt@acme.test").await;
    assert_eq!(names.iter().filter(|n| n.starts_with("api__")).collect::<Vec<_>>(), ["api__login"], "{names:?}");
    let walt = site.live.client("walt@acme.test").await;
    let walt_link = login_link(&call(walt.peer(), "api__whoami_oauth", json!({})).await.expect_err("walt's own login"));
    assert_ne!(walt_link, link);
    let callback = authorize(&site, &fx, &walt_link, "walt-upstream").await;
    assert_eq!(open_callback(&callback).await.0, 200);
    let walt = site.live.client("walt@acme.test").await;
    assert_eq!(whoami(&call(walt.peer(), "api__whoami_oauth", json!({})).await.unwrap())["sub"], "walt-upstream");
    assert_eq!(whoami(&call(olivia.peer(), "api__whoami_oauth", json!({})).await.unwrap())["sub"], "olivia-upstream");
    assert_eq!(site.live.count("SELECT COUNT(*) FROM oauth_credentials WHERE user_id IS NOT NULL").await, 2);

    // The tokens live 2 s: past that, the next call refreshes first.
    let refreshes = || async { fx.as_stats().await["token"]["refresh_token"].as_u64().unwrap() };
    let refusals = || async { fx.resource_stats().await["unauthorized"].as_u64().unwrap() };
    // Walt's fresh token first, so the one he holds is all but new when the wait starts.
    assert_eq!(whoami(&call(walt.peer(), "api__whoami_oauth", json!({})).await.unwrap())["sub"], "walt-upstream");
    let (before, refused_before) = (refreshes().await, refusals().await);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert_eq!(whoami(&call(walt.peer(), "api__whoami_oauth", json!({})).await.unwrap())["sub"], "walt-upstream");
    let after = refreshes().await;
    assert!(after > before, "refreshed: {before} -> {after}");
    assert_eq!(refusals().await, refused_before, "the refresh came before the server had to refuse the token");
}
both_dbs!(oauth_per_user_tokens_stay_with_their_user, per_user);

/// With a remote executor, the authorization server and the protected server are reachable
/// only from the executor's network namespace: discovery, registration, the code exchange, the
/// MCP calls and a refresh on a 401 all go through the agent.
async fn through_the_executor(backend: Backend) {
    let netns = Netns::create();
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path());
    let site = Site::start_for(backend, &netns, &[("upstream.token_key_file", json!(key))]).await;
    let secret_file = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let fx = OAuthFixtures::start_in(&netns, "127.0.0.1", AS_SECRET, 3600).await;
    // The gateway host can't reach the authorization server.
    let direct = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .get(format!("{}/.well-known/oauth-authorization-server", fx.as_url))
        .send()
        .await;
    assert!(direct.is_err() || !direct.unwrap().status().is_success(), "only the executor reaches it");
    site.serve("acme", "api", &json!({"url": fx.resource_url, "oauth": {}}), "build-01").await;
    let _agent: Agent = site.agent_in(Some(&netns.name), "build-01", &secret_file, &[site.live.base_url()]);
    site.wait_connected("build-01", true).await;

    let (done, link, err) = oauth_cli(&site, &key, &["login", "--tenant", "acme", "--server", "api"]);
    assert!(done, "{err}");
    // The test is the browser: it reaches the authorization server inside the namespace.
    let auth_url = redirected(&local(&site, link.trim())).await;
    let callback = local(&site, &in_netns(&netns, &format!("{auth_url}&login_hint=far-robot")).await);
    assert_eq!(open_callback(&callback).await.0, 200);
    let fx_stats = in_netns_json(&netns, &format!("{}/test/stats", fx.as_url)).await;
    assert_eq!(fx_stats["token"]["authorization_code"], 1, "the exchange reached it through the agent: {fx_stats}");

    site.wait_for_tool("olivia@acme.test", "api__whoami_oauth").await;
    let olivia = site.live.client("olivia@acme.test").await;
    let me = whoami(&call(olivia.peer(), "api__whoami_oauth", json!({})).await.unwrap());
    assert_eq!(me["sub"], "far-robot");
    assert_eq!(me["meta_keys"], json!(["progressToken"]), "the token travels in the header only, never in the body");
    // Revoked at the server: the agent reports the 401, the gateway refreshes through the
    // agent and sends the call again.
    in_netns_post(&netns, &format!("{}/test/revoke", fx.resource_base)).await;
    let again = whoami(&call(olivia.peer(), "api__whoami_oauth", json!({})).await.unwrap());
    assert_eq!(again["sub"], "far-robot");
    assert_ne!(again["jti"], me["jti"]);
    assert_eq!(in_netns_json(&netns, &format!("{}/test/stats", fx.as_url)).await["token"]["refresh_token"], 1);
}
both_dbs!(oauth_through_the_remote_executor, through_the_executor);

/// `curl` run inside the namespace (the test's browser there): the redirect's target.
async fn in_netns(netns: &Netns, url: &str) -> String {
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &netns.name, "curl", "-s", "-o", "/dev/null", "-w", "%{redirect_url}", url])
        .output()
        .await
        .unwrap();
    let target = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && !target.is_empty(), "{url}: {}", String::from_utf8_lossy(&out.stderr));
    target
}

async fn in_netns_json(netns: &Netns, url: &str) -> Value {
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &netns.name, "curl", "-s", url])
        .output()
        .await
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{url}: {e}"))
}

async fn in_netns_post(netns: &Netns, url: &str) {
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &netns.name, "curl", "-s", "-X", "POST", url])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
}

/// An MCP client that takes URL-mode elicitation and plays the browser when asked to log in.
struct Browsing {
    public: String,
    base: String,
    as_user: String,
    asked: Arc<std::sync::atomic::AtomicUsize>,
}

impl rmcp::ClientHandler for Browsing {
    fn get_info(&self) -> rmcp::model::InitializeRequestParams {
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        capabilities.elicitation =
            Some(rmcp::model::ElicitationCapability::new().with_url(rmcp::model::UrlElicitationCapability::new()));
        rmcp::model::InitializeRequestParams::new(capabilities, rmcp::model::Implementation::new("it", "1"))
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ElicitRequestParams::UrlElicitationParams { url, .. } = request else {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        let local = |u: &str| u.replacen(&self.public, &self.base, 1);
        let auth_url = redirected(&local(&url)).await;
        let callback = redirected(&format!("{auth_url}&login_hint={}", self.as_user)).await;
        let (status, _) = open_callback(&local(&callback)).await;
        assert_eq!(status, 200);
        Ok(ElicitResult::new(ElicitationAction::Accept))
    }
}

/// A client that takes URL-mode elicitation is asked to log in during the call that needs it,
/// and the call then goes through with the new token.
async fn by_elicitation(backend: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path());
    let site = Site::start(backend, &[("upstream.token_key_file", json!(key))]).await;
    let fx = OAuthFixtures::start(AS_SECRET, 3600).await;
    site.serve("acme", "api", &json!({"url": fx.resource_url, "oauth": {"tokens": "user"}}), "local").await;
    let subject = "olivia@acme.test";
    let token =
        Signer::hs256(site.live.config.auth.hs256_secret.expose()).sign(&claims(&site.live.config, "acme", subject));
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
        reqwest::Client::new(),
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(format!(
            "{}/mcp",
            site.live.base_url()
        ))
        .auth_header(token),
    );
    let asked = Arc::default();
    let handler = Browsing {
        public: site.live.config.public_url(),
        base: site.live.base_url(),
        as_user: "olivia-upstream".into(),
        asked: Arc::clone(&asked),
    };
    let client = rmcp::ServiceExt::serve(handler, transport).await.unwrap();
    let me = whoami(&call(client.peer(), "api__whoami_oauth", json!({})).await.unwrap());
    assert_eq!(me["sub"], "olivia-upstream");
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1, "asked once, then logged in");
    let me = whoami(&call(client.peer(), "api__whoami_oauth", json!({})).await.unwrap());
    assert_eq!(me["sub"], "olivia-upstream");
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1, "not asked again");
}
both_dbs!(oauth_login_by_url_elicitation, by_elicitation);

/// The same login through the admin API, as the tenant's owner: the start link in the answer
/// (never kept), the login completed in a browser, the credential listed and deleted; the
/// refusals of who may not ask; every change audited.
async fn login_through_the_api(backend: Backend) {
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path());
    let site = Site::start(backend, &[("upstream.token_key_file", json!(key))]).await;
    let fx = OAuthFixtures::start(AS_SECRET, 3600).await;
    site.serve("acme", "api", &json!({"url": fx.resource_url, "oauth": {}}), "local").await;
    let base = format!("{}/admin/v1/tenants/acme/oauth", site.live.base_url());
    let http = reqwest::Client::new();
    let ask = |token: String, body: Value| {
        let http = http.clone();
        let url = format!("{base}/logins");
        async move {
            let answer = http.post(url).bearer_auth(token).json(&body).send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let olivia = site.live.token_for("olivia@acme.test");
    assert_eq!(ask(site.live.token_for("walt@acme.test"), json!({"server": "api"})).await.0, 403);
    assert_eq!(ask(site.live.token_for("gary@globex.test"), json!({"server": "api"})).await.0, 404);
    let (status, body) = ask(olivia.clone(), json!({"server": "api", "user": "olivia@acme.test"})).await;
    assert_eq!((status, body["field"].as_str()), (422, Some("user")), "{body}");
    assert_eq!(ask(olivia.clone(), json!({"server": "nope"})).await.0, 404);
    let (status, body) = ask(olivia.clone(), json!({"server": "api"})).await;
    assert_eq!(status, 201, "{body}");
    let link = body["link"].as_str().unwrap().to_owned();
    assert!(link.starts_with(&format!("{}/oauth/start/", site.live.config.public_url())), "{link}");
    assert_eq!(body["expires_in_secs"], 600);
    let secret = link.rsplit('/').next().unwrap().to_owned();
    let kept = format!("SELECT COUNT(*) FROM admin_idempotency WHERE body LIKE '%{secret}%'");
    assert_eq!(site.live.count(&kept).await, 0);

    let callback = authorize(&site, &fx, &link, "acme-robot").await;
    assert_eq!(open_callback(&callback).await.0, 200);
    let listed: Value =
        http.get(format!("{base}/credentials")).bearer_auth(&olivia).send().await.unwrap().json().await.unwrap();
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!((items[0]["server"].as_str(), items[0]["status"].as_str()), (Some("api"), Some("ok")));
    assert!(items[0]["user"].is_null());
    let logout = http.delete(format!("{base}/credentials/api")).bearer_auth(&olivia).send().await.unwrap();
    assert_eq!(logout.status(), 204);
    assert_eq!(site.live.count("SELECT COUNT(*) FROM oauth_credentials").await, 0);
    let again = http.delete(format!("{base}/credentials/api")).bearer_auth(&olivia).send().await.unwrap();
    assert_eq!(again.status(), 404);
    let audited = "SELECT COUNT(*) FROM audit_events WHERE action IN ('admin.oauth.login', 'admin.oauth.logout')";
    assert_eq!(site.live.count(audited).await, 2);

    // A gateway without the credential key serves no logins.
    let bare = TestGateway::new(backend).start().await;
    let refused = http
        .post(format!("{}/admin/v1/tenants/acme/oauth/logins", bare.base_url()))
        .bearer_auth(bare.token_for("olivia@acme.test"))
        .json(&json!({"server": "api"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
}
both_dbs!(oauth_login_through_the_admin_api, login_through_the_api);
