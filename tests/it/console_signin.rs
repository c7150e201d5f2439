//! The console's sign-in through a real identity provider (tests/fixtures/npm/idp.mjs, the
//! console's client registered there up front with the gateway's callback): in headless
//! Chromium, from the sign-in page's link to the provider and back, signed in as acme's owner,
//! with the provider on another site than the gateway; over plain HTTP, each way it fails ends
//! on the sign-in page with its message and no session: a state that is not the flow's, a flow
//! cookie missing or forged, the provider's `access_denied`, a subject who is no user. And a
//! confidential client, which authenticates with `client_secret_basic`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::json;

use crate::support::*;

const CLIENT_ID: &str = "scopegate-console";
const SESSION: &str = "scopegate_console";
const FLOW: &str = "scopegate_console_signin";

/// The provider with the console's client registered (its callback at `http://host:PORT`),
/// and a gateway serving there that trusts the provider and signs the console in through it.
/// `secret`: a confidential client; else a public one. `login_page`: the provider shows one.
async fn signin_gateway(backend: Backend, host: &str, secret: Option<&str>, login_page: bool) -> (Idp, Live) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://{host}:{port}");
    let mut client = json!({"client_id": CLIENT_ID, "redirect_uris": [format!("{base}/console/signin/callback")]});
    if let Some(secret) = secret {
        client["client_secret"] = json!(secret);
    }
    let mut options = IdpOptions::demo();
    // Signs in at the provider, with acme's tenant claim, but is no user of acme.
    options.accounts["nobody@acme.test"] = json!({"tid": "acme"});
    options.clients = Some(json!([client]));
    options.login_page = login_page;
    let idp = Idp::start(options).await;
    let live = TestGateway::new(backend)
        .set("server.listen", json!(format!("127.0.0.1:{port}")))
        .set("server.public_url", json!(base))
        .set("auth.issuer", json!(idp.issuer()))
        .set("auth.hs256_secret", json!(""))
        .set("console.oidc_client_id", json!(CLIENT_ID))
        .set("console.oidc_client_secret", json!(secret.unwrap_or("")))
        .set("auth.tenant_issuers_insecure", json!(true))
        .start()
        .await;
    (idp, live)
}

/// The page's cookie `name` among the browser's, if set.
fn cookie_of<'a>(cookies: &'a [(String, String)], name: &str) -> Option<&'a str> {
    cookies.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

async fn in_a_browser(backend: Backend) {
    // The gateway at `localhost`, the provider at 127.0.0.1: two sites, as in production, so
    // the callback is a cross-site navigation (the flow cookie must be `SameSite=Lax`).
    let (idp, live) = signin_gateway(backend, "localhost", None, true).await;
    let base = live.config.public_url();
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/console")).await;
    assert_eq!(browser.text("#sign-in-provider").await, "Sign in with your identity provider");
    browser.click("#sign-in-provider").await;
    // The provider's own page: the person signs in there.
    for _ in 0..100 {
        if browser.url().await.starts_with(&idp.issuer()) && browser.source().await.contains("id=\"continue\"") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    browser.click("#continue").await;
    let url = browser.wait_for_url("/console/tenants/acme").await;
    assert!(url.ends_with("/console/tenants/acme"), "{url}: {}", browser.source().await);
    assert_eq!(browser.text("header .who").await, "olivia@acme.test · owner of acme");
    assert!(browser.text("#users").await.contains("wanda@acme.test"), "acme's users are listed");
    let cookies = browser.cookies().await;
    assert!(cookie_of(&cookies, SESSION).is_some_and(|t| t.split('.').count() == 3), "{cookies:?}");
    assert_eq!(cookie_of(&cookies, FLOW), None, "the flow's cookie is gone: {cookies:?}");

    // acme's own provider (another one, with the console's client registered too), trusted by
    // acme with a console client: wanda starts at acme's sign-in link and is signed in there.
    let mut options = IdpOptions::demo();
    options.default_account = Some("wanda@acme.test".into());
    options.clients =
        Some(json!([{"client_id": "acme-console", "redirect_uris": [format!("{base}/console/signin/callback")]}]));
    let acme_idp = Idp::start(options).await;
    let new = scopegate::store::issuers::NewIssuer {
        issuer: acme_idp.issuer(),
        jwks_url: None,
        audience: None,
        subject_claim: "sub".into(),
        tenant_claim: None,
        console_client_id: Some("acme-console".into()),
        console_scopes: None,
    };
    let mut tx = live.db.begin().await.unwrap();
    scopegate::store::issuers::add(&mut tx, "acme", &new).await.unwrap();
    tx.commit().await.unwrap();
    let start = format!("{base}/console/signin/tenants/acme");
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    eventually("acme's sign-in is served", || async { http.get(&start).send().await.unwrap().status() == 303 }).await;
    browser.goto(&start).await;
    let url = browser.wait_for_url("/console/guards").await;
    assert!(url.ends_with("/console/guards"), "{url}: {}", browser.source().await);
    assert!(browser.text("header .who").await.starts_with("wanda@acme.test"), "signed in through acme's provider");
    let db = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let shot = browser.screenshot(&format!("console-signin-{db}")).await;
    browser.quit().await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);
}
both_dbs!(console_signin_through_the_provider_in_a_browser, in_a_browser);

/// A browser's part of the flow over plain HTTP, one hop at a time.
struct Hops {
    http: reqwest::Client,
    base: String,
}

/// Where one hop led, and the cookies it set (`name=value`, the empty ones included; `raw`:
/// with their attributes).
struct Hop {
    status: u16,
    location: String,
    set: Vec<String>,
    raw: Vec<String>,
    body: String,
}

impl Hop {
    fn raw(&self, name: &str) -> &str {
        self.raw
            .iter()
            .find(|c| c.starts_with(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}: {:?}", self.raw))
    }

    fn cookie(&self, name: &str) -> Option<&str> {
        self.set.iter().filter_map(|c| c.strip_prefix(name)?.strip_prefix('=')).next()
    }

    /// Where a signed-in callback's page moves on to (`<meta http-equiv="refresh">`).
    fn onward(&self) -> &str {
        assert_eq!(self.status, 200, "a signed-in page");
        self.body
            .split("content=\"0; url=")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_else(|| panic!("{}", self.body))
    }

    /// The session cookie it set, if it set one with a value.
    fn session(&self) -> Option<&str> {
        self.cookie(SESSION).filter(|v| !v.is_empty())
    }
}

impl Hops {
    fn new(live: &Live) -> Self {
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        Self { http, base: live.base_url() }
    }

    async fn get(&self, url: &str, cookie: &str) -> Hop {
        let response = self.http.get(url).header("cookie", cookie).send().await.unwrap();
        let raw: Vec<String> =
            response.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_owned()).collect();
        let set = raw.iter().map(|c| c.split(';').next().unwrap().to_owned()).collect();
        let location = response.headers().get("location").map(|l| l.to_str().unwrap().to_owned()).unwrap_or_default();
        let status = response.status().as_u16();
        Hop { status, location, set, raw, body: response.text().await.unwrap() }
    }

    /// The gateway's start: the provider's authorization URL, and the flow cookie.
    async fn start(&self) -> (String, String) {
        self.start_at("/console/signin/provider").await
    }

    /// The start at `path` (the gateway's own provider's, or a tenant's).
    async fn start_at(&self, path: &str) -> (String, String) {
        let hop = self.get(&format!("{}{path}", self.base), "").await;
        assert_eq!(hop.status, 303);
        let flow = hop.raw(FLOW);
        for attribute in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/console", "Max-Age=600"] {
            assert!(flow.contains(attribute), "{flow}");
        }
        let flow = flow.split(';').next().unwrap().to_owned();
        (hop.location, flow)
    }

    /// Follows the provider's redirects from `url` (its cookies kept) to the gateway's callback.
    async fn through_provider(&self, url: &str) -> String {
        let mut jar: Vec<String> = Vec::new();
        let mut url = url.to_owned();
        for _ in 0..10 {
            if url.starts_with(&format!("{}/console/signin/callback", self.base)) {
                return url;
            }
            let hop = self.get(&url, &jar.join("; ")).await;
            assert!((300..400).contains(&hop.status), "{url}: HTTP {}", hop.status);
            for set in hop.set.iter().filter(|c| !c.ends_with('=')) {
                let name = set.split('=').next().unwrap();
                jar.retain(|c| c.split('=').next() != Some(name));
                jar.push(set.clone());
            }
            url = reqwest::Url::parse(&url).unwrap().join(&hop.location).unwrap().to_string();
        }
        panic!("the provider never sent the browser back: {url}");
    }

    /// A whole sign-in as `login_hint` (the provider's account, or `refuse`): the callback's
    /// URL, the flow cookie, and the callback's hop.
    async fn sign_in_as(&self, login_hint: &str) -> (String, String, Hop) {
        self.sign_in_at("/console/signin/provider", login_hint).await
    }

    /// [`Hops::sign_in_as`], started at `path`.
    async fn sign_in_at(&self, path: &str, login_hint: &str) -> (String, String, Hop) {
        let (authorize, flow) = self.start_at(path).await;
        let callback = self.through_provider(&format!("{authorize}&login_hint={login_hint}")).await;
        let hop = self.get(&callback, &flow).await;
        (callback, flow, hop)
    }

    /// The sign-in page a refused callback led to: its message.
    async fn message(&self, hop: &Hop) -> String {
        assert_eq!(hop.status, 303);
        assert!(hop.location.starts_with("/console?error="), "{}", hop.location);
        assert_eq!(hop.session(), None, "no session");
        assert_eq!(hop.cookie(FLOW), Some(""), "the flow's cookie is cleared");
        let page = self.http.get(format!("{}{}", self.base, hop.location)).send().await.unwrap();
        let html = page.text().await.unwrap();
        let alert = html.split("id=\"sign-in-error\">").nth(1).unwrap_or_else(|| panic!("no message: {html}"));
        alert.split('<').next().unwrap().to_owned()
    }
}

/// A query parameter of `url` replaced.
fn with_param(url: &str, name: &str, value: &str) -> String {
    let mut url = reqwest::Url::parse(url).unwrap();
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.to_string(), if k == name { value.to_owned() } else { v.into_owned() }))
        .collect();
    url.query_pairs_mut().clear().extend_pairs(pairs);
    url.to_string()
}

/// What the start asks the provider for; a sign-in that works, over HTTP (the session cookie
/// no longer than the token); then each way it fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_signin_refusals() {
    let (idp, live) = signin_gateway(Backend::Sqlite, "127.0.0.1", None, false).await;
    let hops = Hops::new(&live);

    let (authorize, flow) = hops.start().await;
    let asked: std::collections::HashMap<String, String> =
        reqwest::Url::parse(&authorize).unwrap().query_pairs().into_owned().collect();
    assert!(authorize.starts_with(&format!("{}/", idp.issuer())), "{authorize}");
    for (key, value) in [
        ("response_type", "code"),
        ("client_id", CLIENT_ID),
        ("redirect_uri", &format!("{}/console/signin/callback", live.base_url())),
        ("scope", "openid"),
        ("code_challenge_method", "S256"),
        ("resource", &live.url()),
    ] {
        assert_eq!(asked.get(key).map(String::as_str), Some(value), "{key} in {authorize}");
    }
    for key in ["state", "nonce", "code_challenge"] {
        assert!(asked[key].len() >= 43, "{key}: {authorize}");
    }
    drop(flow);

    // The flow works end to end: the session cookie lasts no longer than the token (600 s).
    let (used, used_flow, signed) = hops.sign_in_as("olivia@acme.test").await;
    assert_eq!(signed.onward(), "/console/tenants/acme");
    assert!(signed.session().is_some(), "a session");
    let session = signed.raw(SESSION);
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/console"] {
        assert!(session.contains(attribute), "{session}");
    }
    let max_age: i64 = session.split("Max-Age=").nth(1).unwrap().parse().unwrap();
    assert!((590..=600).contains(&max_age), "the token's remaining life: {session}");
    assert_eq!(signed.cookie(FLOW), Some(""), "the flow's cookie is cleared");
    // Its code again (a replayed callback): the provider refuses a second exchange.
    let message = hops.message(&hops.get(&used, &used_flow).await).await;
    assert!(message.contains("did not issue a usable token"), "{message}");

    // The provider sends back another state than the flow's (a login CSRF: someone else's
    // code pushed into this browser): refused before any exchange.
    let (authorize, flow) = hops.start().await;
    let callback = hops.through_provider(&format!("{authorize}&login_hint=olivia@acme.test")).await;
    let forged = with_param(&callback, "state", "another-flows-state-of-the-same-length-aaaaa");
    let message = hops.message(&hops.get(&forged, &flow).await).await;
    assert!(message.contains("not started here"), "{message}");
    // The same callback without the flow's cookie, or with one whose MAC does not hold.
    let message = hops.message(&hops.get(&callback, "").await).await;
    assert!(message.contains("not started here"), "{message}");
    let state =
        reqwest::Url::parse(&callback).unwrap().query_pairs().find(|(k, _)| k == "state").unwrap().1.into_owned();
    let made_up = URL_SAFE_NO_PAD
        .encode(json!({"state": state, "verifier": "v".repeat(43), "nonce": "n", "expires": i64::MAX / 2}).to_string());
    let tag = flow.split('.').nth(1).unwrap();
    let message = hops.message(&hops.get(&callback, &format!("{FLOW}={made_up}.{tag}")).await).await;
    assert!(message.contains("not started here"), "{message}");

    // The person declines at the provider: its error, named.
    let (_, _, refused) = hops.sign_in_as("refuse").await;
    let message = hops.message(&refused).await;
    assert!(message.contains("refused the sign-in (access_denied)"), "{message}");
}

/// A subject the provider signs in, with acme's tenant claim, who is no user of acme: the
/// sign-in page says access denied, and there is no session.
async fn nobody(backend: Backend) {
    let (_idp, live) = signin_gateway(backend, "127.0.0.1", None, false).await;
    let hops = Hops::new(&live);
    let (_, _, hop) = hops.sign_in_as("nobody@acme.test").await;
    let message = hops.message(&hop).await;
    assert!(message.starts_with("access denied"), "{message}");
    // gary is globex's owner: the same provider, another tenant, let in.
    let (_, _, hop) = hops.sign_in_as("gary@globex.test").await;
    assert_eq!(hop.onward(), "/console/tenants/globex");
    assert!(hop.session().is_some());
}
both_dbs!(console_signin_of_no_user, nobody);

/// A confidential client: the code exchanged with `client_secret_basic` (a secret with
/// characters that must be form-encoded first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_signin_confidential_client() {
    let (_idp, live) = signin_gateway(Backend::Sqlite, "127.0.0.1", Some("s3cret:with+odd/chars"), false).await;
    let hops = Hops::new(&live);
    let (_, _, hop) = hops.sign_in_as("olivia@acme.test").await;
    assert_eq!(hop.onward(), "/console/tenants/acme");
    assert!(hop.session().is_some());
}

/// A provider of acme's own (at 127.0.0.1, the gateway at `host`), with the console's client
/// registered there; a gateway with no console client at its own provider, whose tenants'
/// providers may be on loopback when `insecure`.
async fn tenant_provider_gateway(backend: Backend, insecure: bool) -> (Idp, Live) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let base = format!("http://127.0.0.1:{port}");
    let mut options = IdpOptions::demo();
    options.clients =
        Some(json!([{"client_id": CLIENT_ID, "redirect_uris": [format!("{base}/console/signin/callback")]}]));
    let idp = Idp::start(options).await;
    let live = TestGateway::new(backend)
        .set("server.listen", json!(format!("127.0.0.1:{port}")))
        .set("server.public_url", json!(base))
        .set("auth.tenant_issuers_insecure", json!(insecure))
        .start()
        .await;
    (idp, live)
}

/// The console signs a tenant's people in through the provider that tenant trusts, set up by
/// its owner through the admin API with a console client: from `/console/signin/tenants/acme`
/// to the provider and back, a session that works. The same provider, trusted by globex too
/// (without a console client), signs gary in as globex's: through acme's sign-in that is
/// refused. globex, without a console client, has no sign-in of its own, nor has the gateway's
/// provider; a provider withdrawn between the start and the callback ends the sign-in.
async fn tenant_provider(backend: Backend) {
    use crate::admin_api::{delete, send};
    let (idp, live) = tenant_provider_gateway(backend, true).await;
    let hops = Hops::new(&live);
    let olivia = live.token_for("olivia@acme.test");
    let trusted = send(
        &live,
        reqwest::Method::POST,
        "/admin/v1/tenants/acme/issuers",
        &olivia,
        json!({"issuer": idp.issuer(), "tenant_claim": "tid", "console_client_id": CLIENT_ID}),
    )
    .await;
    assert_eq!(trusted.status, 201, "{}", trusted.body);
    assert_eq!(trusted.body["console_signin"], "/console/signin/tenants/acme");
    assert_eq!(trusted.body["console_scopes"], serde_json::Value::Null);
    let gary = live.token_for("gary@globex.test");
    let body = json!({"issuer": idp.issuer(), "tenant_claim": "tid"});
    let made = send(&live, reqwest::Method::POST, "/admin/v1/tenants/globex/issuers", &gary, body).await;
    assert_eq!(made.status, 201, "{}", made.body);

    // Where there is no console client: no sign-in.
    for path in ["/console/signin/provider", "/console/signin/tenants/globex", "/console/signin/tenants/nowhere"] {
        assert_eq!(hops.get(&format!("{}{path}", hops.base), "").await.status, 404, "{path}");
    }
    let page = hops.get(&format!("{}/console", hops.base), "").await;
    assert!(!page.body.contains("sign-in-provider"), "no link to the gateway's own provider");

    // What acme's start asks its provider for: the console's client there, the gateway's
    // audience (the trust names no audience of its own).
    let (authorize, _) = hops.start_at("/console/signin/tenants/acme").await;
    assert!(authorize.starts_with(&format!("{}/", idp.issuer())), "{authorize}");
    let asked: std::collections::HashMap<String, String> =
        reqwest::Url::parse(&authorize).unwrap().query_pairs().into_owned().collect();
    for (key, value) in [("client_id", CLIENT_ID), ("scope", "openid"), ("resource", &live.url())] {
        assert_eq!(asked.get(key).map(String::as_str), Some(value), "{key} in {authorize}");
    }

    // olivia signs in through acme's provider; the session is one the console takes.
    let (_, _, signed) = hops.sign_in_at("/console/signin/tenants/acme", "olivia@acme.test").await;
    assert_eq!(signed.onward(), "/console/tenants/acme");
    let session = signed.session().expect("a session").to_owned();
    let page = hops.get(&format!("{}/console/tenants/acme", hops.base), &format!("{SESSION}={session}")).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("olivia@acme.test · owner of acme"), "{}", page.body);
    assert!(page.body.contains("/console/signin/tenants/acme"), "the tenant page shows where its sign-in starts");

    // gary, whom the same provider names as globex's: acme's sign-in lets in acme's people only.
    let (_, _, hop) = hops.sign_in_at("/console/signin/tenants/acme", "gary@globex.test").await;
    let message = hops.message(&hop).await;
    assert!(message.contains("not as a user of `acme`"), "{message}");

    // Two providers with a console client: a page offers both; `?issuer=` picks one.
    let other = "http://127.0.0.1:9/other-provider";
    let body = json!({"issuer": other, "console_client_id": "other-console"});
    let made = send(&live, reqwest::Method::POST, "/admin/v1/tenants/acme/issuers", &olivia, body).await;
    assert_eq!(made.status, 201, "{}", made.body);
    let start = format!("{}/console/signin/tenants/acme", hops.base);
    eventually("both providers are offered", || async { hops.get(&start, "").await.status == 200 }).await;
    let page = hops.get(&start, "").await;
    let links = page.body.split("id=\"providers\"").nth(1).unwrap_or_default();
    assert!(links.contains(other) && links.contains(&idp.issuer()), "{}", page.body);
    let chosen = format!(
        "{start}?issuer={}",
        percent_encoding::utf8_percent_encode(&idp.issuer(), percent_encoding::NON_ALPHANUMERIC)
    );
    let hop = hops.get(&chosen, "").await;
    assert!(hop.status == 303 && hop.location.starts_with(&idp.issuer()), "{}", hop.location);
    let other_at = percent_encoding::utf8_percent_encode(other, percent_encoding::NON_ALPHANUMERIC).to_string();
    let gone = delete(&live, &format!("/admin/v1/tenants/acme/issuers/{other_at}"), &olivia).await;
    assert_eq!(gone.status, 204, "{}", gone.body);
    eventually("one provider again", || async { hops.get(&start, "").await.status == 303 }).await;

    // Withdrawn while the person is at the provider: the callback ends the sign-in.
    let (authorize, flow) = hops.start_at("/console/signin/tenants/acme").await;
    let callback = hops.through_provider(&format!("{authorize}&login_hint=olivia@acme.test")).await;
    let issuer = percent_encoding::utf8_percent_encode(&idp.issuer(), percent_encoding::NON_ALPHANUMERIC).to_string();
    let gone = delete(&live, &format!("/admin/v1/tenants/acme/issuers/{issuer}"), &olivia).await;
    assert_eq!(gone.status, 204, "{}", gone.body);
    eventually("acme's provider is withdrawn", || async {
        hops.get(&format!("{}/console/signin/tenants/acme", hops.base), "").await.status == 404
    })
    .await;
    let message = hops.message(&hops.get(&callback, &flow).await).await;
    assert!(message.contains("no longer signs this tenant's people in"), "{message}");
}
both_dbs!(console_signin_through_a_tenants_provider, tenant_provider);

/// A tenant's provider is reached only at public https addresses (unless
/// `auth.tenant_issuers_insecure`), whatever its metadata names: a trust on loopback, written
/// past the admin API's checks, gives neither a key set (the discovered `jwks_uri` is refused:
/// its tokens wait for keys, 503) nor a token endpoint the console calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_provider_endpoints_must_be_public() {
    let (idp, live) = tenant_provider_gateway(Backend::Sqlite, false).await;
    let new = scopegate::store::issuers::NewIssuer {
        issuer: idp.issuer(),
        jwks_url: None,
        audience: None,
        subject_claim: "sub".into(),
        tenant_claim: None,
        console_client_id: Some(CLIENT_ID.into()),
        console_scopes: None,
    };
    let mut tx = live.db.begin().await.unwrap();
    scopegate::store::issuers::add(&mut tx, "acme", &new).await.unwrap();
    tx.commit().await.unwrap();

    let token = idp.mint("olivia@acme.test", &live.url(), None).await;
    let tenant = reqwest::Client::new()
        .get(format!("{}/admin/v1/tenants/acme", live.base_url()))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(tenant.status(), 503, "no key set at a loopback address");

    let hops = Hops::new(&live);
    let (_, _, hop) = hops.sign_in_at("/console/signin/tenants/acme", "olivia@acme.test").await;
    let message = hops.message(&hop).await;
    assert!(message.contains("could not be started"), "{message}");
}
