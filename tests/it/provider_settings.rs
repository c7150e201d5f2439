//! What a SaaS's identity provider needs of the gateway, without a provider process (the real
//! one is in idp.rs): scopes in the metadata, the challenges and the step-up refusal; the key
//! set found through the issuer's metadata, a start with the provider down and its keys fetched
//! when it comes up; tenants and subjects from nested, array and mapped claims.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use http::StatusCode;
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::support::*;

fn www_authenticate(headers: &http::HeaderMap) -> String {
    headers.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

/// Scopes: published in the metadata with the resource name, named in every 401 challenge, and
/// a token without a required scope answered 403 `insufficient_scope` naming what to ask for
/// (the scopes it has and the missing ones), never reaching the route.
#[tokio::test]
async fn scopes_are_published_challenged_and_required() {
    let prepared = TestGateway::new(Backend::Sqlite)
        .set("auth.scopes_supported", json!(["mcp:read", "mcp:write", "profile"]))
        .set("auth.required_scopes", json!(["mcp:read"]))
        .set("auth.resource_name", json!("Acme Farm MCP"))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    let (status, _, metadata) = probe.get("/.well-known/oauth-protected-resource").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(metadata["scopes_supported"], json!(["mcp:read", "mcp:write", "profile"]));
    assert_eq!(metadata["resource_name"], "Acme Farm MCP");

    let (status, headers, _) = probe.call(None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(www_authenticate(&headers).contains(r#"scope="mcp:read""#), "{headers:?}");
    let (status, headers, _) = probe.call(Some("not-a-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let challenge = www_authenticate(&headers);
    assert!(challenge.contains(r#"error="invalid_token""#) && challenge.contains(r#"scope="mcp:read""#), "{challenge}");

    let signer = Signer::dev();
    let base = claims(&prepared.config, "acme", "olivia@acme.test");
    let with = |extra: Value| {
        let mut c = base.clone();
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        signer.sign(&c)
    };
    for token in [signer.sign(&base), with(json!({"scope": "profile mcp:write"})), with(json!({"scp": ["mcp:reader"]}))]
    {
        let before = probe.reached();
        let (status, headers, body) = probe.call(Some(&token)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["error"], "insufficient_scope");
        let challenge = www_authenticate(&headers);
        assert!(challenge.starts_with(r#"Bearer error="insufficient_scope""#), "{challenge}");
        assert!(challenge.contains("resource_metadata=\"http://gateway.test/.well-known/oauth-protected-resource\""));
        assert!(challenge.contains("mcp:read"), "{challenge}");
        assert_eq!(probe.reached(), before, "a refused token reaches no route");
    }
    // What the token had is asked for again with the missing scope.
    let (_, headers, _) = probe.call(Some(&with(json!({"scope": "profile mcp:write"})))).await;
    assert!(www_authenticate(&headers).contains(r#"scope="mcp:write profile mcp:read""#), "{headers:?}");

    for token in [
        with(json!({"scope": "mcp:read"})),
        with(json!({"scp": ["mcp:read", "x"]})),
        with(json!({"scp": "a mcp:read"})),
    ] {
        let (status, _, body) = probe.call(Some(&token)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["tenant"], "acme");
    }
}

/// A tiny identity provider: OpenID discovery at its issuer and a key set, which can be down
/// (503) or up, and which counts what was asked of it.
struct Provider {
    issuer: String,
    up: Arc<AtomicBool>,
    metadata_hits: Arc<AtomicUsize>,
    jwks_hits: Arc<AtomicUsize>,
}

impl Provider {
    /// `named_issuer`: the issuer its metadata names (None: its own).
    async fn start(jwks: String, named_issuer: Option<&str>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let up = Arc::new(AtomicBool::new(false));
        let metadata_hits = Arc::new(AtomicUsize::new(0));
        let jwks_hits = Arc::new(AtomicUsize::new(0));
        let metadata = json!({
            "issuer": named_issuer.unwrap_or(&issuer),
            "jwks_uri": format!("{issuer}/keys"),
            "authorization_endpoint": format!("{issuer}/authorize"),
            "token_endpoint": format!("{issuer}/token"),
        });
        let answer = |up: &AtomicBool, hits: &AtomicUsize, body: String| {
            hits.fetch_add(1, Ordering::SeqCst);
            if up.load(Ordering::SeqCst) {
                (StatusCode::OK, [("cache-control", "max-age=3600")], body)
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, [("cache-control", "no-store")], String::new())
            }
        };
        let app = {
            let (up1, hits1, up2, hits2) =
                (Arc::clone(&up), Arc::clone(&metadata_hits), Arc::clone(&up), Arc::clone(&jwks_hits));
            axum::Router::new()
                .route(
                    "/.well-known/openid-configuration",
                    axum::routing::get(move || {
                        let out = answer(&up1, &hits1, metadata.to_string());
                        async move { out }
                    }),
                )
                .route(
                    "/keys",
                    axum::routing::get(move || {
                        let out = answer(&up2, &hits2, jwks.clone());
                        async move { out }
                    }),
                )
        };
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { issuer, up, metadata_hits, jwks_hits }
    }
}

/// `auth.issuer` alone: the gateway starts while the provider is down, says not ready, answers
/// tokens 503 (never 401: the client keeps its token), fetches the keys in the background once
/// the provider is up, and names the issuer as the authorization server.
#[tokio::test]
async fn the_issuer_alone_is_enough_and_the_provider_may_be_down_at_start() {
    let rsa = Signer::from_pem(Algorithm::RS256, "rsa.pem", "k1");
    let provider = Provider::start(jwks_json(&[&rsa]), None).await;
    let prepared = TestGateway::new(Backend::Sqlite)
        .set("auth.issuer", json!(provider.issuer))
        .set("auth.hs256_secret", json!(""))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    let (status, _, metadata) = probe.get("/.well-known/oauth-protected-resource").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(metadata["authorization_servers"], json!([provider.issuer]));

    let (status, _, body) = probe.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let token = rsa.sign(&claims(&prepared.config, "acme", "olivia@acme.test"));
    let (status, headers, body) = probe.call(Some(&token)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    assert!(headers.get("www-authenticate").is_none(), "no challenge: the token is not at fault");

    provider.up.store(true, Ordering::SeqCst);
    eventually("ready once the provider answers", || async { probe.get("/readyz").await.0 == StatusCode::OK }).await;
    assert!(provider.metadata_hits.load(Ordering::SeqCst) >= 2);
    let (status, _, body) = probe.call(Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tenant"], "acme");
}

/// Metadata that names another issuer is not used: its key set is never fetched, and the
/// gateway stays not ready.
#[tokio::test]
async fn metadata_naming_another_issuer_is_not_used() {
    let rsa = Signer::from_pem(Algorithm::RS256, "rsa.pem", "k1");
    let provider = Provider::start(jwks_json(&[&rsa]), Some("http://idp.elsewhere.test")).await;
    provider.up.store(true, Ordering::SeqCst);
    let prepared = TestGateway::new(Backend::Sqlite)
        .set("auth.issuer", json!(provider.issuer))
        .set("auth.hs256_secret", json!(""))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    // The start-up attempt, then the background's first retry.
    eventually("the metadata is asked for again", || async { provider.metadata_hits.load(Ordering::SeqCst) >= 2 })
        .await;
    assert_eq!(provider.jwks_hits.load(Ordering::SeqCst), 0, "the key set it names is never fetched");
    assert_eq!(probe.get("/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
    let token = rsa.sign(&claims(&prepared.config, "acme", "olivia@acme.test"));
    assert_eq!(probe.call(Some(&token)).await.0, StatusCode::SERVICE_UNAVAILABLE);
}

/// Claim mapping, on both databases: the tenant from a nested claim holding an organization id
/// that a platform administrator recorded on the tenant through the admin API, the subject
/// from another claim; an array claim naming several tenants is refused, one naming one is
/// taken; an organization id nobody recorded, or one cleared, names no tenant.
async fn tenants_come_from_mapped_claims(backend: Backend) {
    const PLATFORM: &str = "ops@platform.test";
    let prepared = TestGateway::new(backend)
        .set("admin.platform_subjects", json!([PLATFORM]))
        .set("auth.tenant_claim", json!("/org/id"))
        .set("auth.tenant_match", json!("org_id"))
        .set("auth.subject_claim", json!("email"))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    let signer = Signer::dev();
    let token_of = |org: Value, email: &str| {
        let mut c = claims(&prepared.config, "", "opaque-subject-1");
        let c = c.as_object_mut().unwrap();
        c.remove("tid");
        c.insert("org".into(), json!({"id": org}));
        c.insert("email".into(), json!(email));
        signer.sign(&Value::Object(c.clone()))
    };
    let olivia = token_of(json!("org_AbC123"), "olivia@acme.test");
    assert_eq!(probe.call(Some(&olivia)).await.0, StatusCode::FORBIDDEN, "no tenant has this organization yet");

    let mut admin = claims(&prepared.config, "", PLATFORM);
    admin.as_object_mut().unwrap().insert("email".into(), json!(PLATFORM));
    let admin = signer.sign(&admin);
    let (status, _, view) =
        probe.send(http::Method::PATCH, "/admin/v1/tenants/acme", &admin, json!({"org_id": "org_AbC123"})).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["org_id"], "org_AbC123");
    let (status, _, body) =
        probe.send(http::Method::PATCH, "/admin/v1/tenants/globex", &admin, json!({"org_id": "org_AbC123"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "one organization, one tenant: {body}");

    // Within the change counter's interval (a refusal read before the change may be reused
    // until then).
    let body = eventually("the recorded organization id names acme", || async {
        let (status, _, body) = probe.call(Some(&olivia)).await;
        (status == StatusCode::OK).then_some(body)
    })
    .await;
    assert_eq!((body["tenant"].as_str(), body["user"].as_str()), (Some("acme"), Some("olivia@acme.test")));
    // The slug is not an organization id.
    assert_eq!(probe.call(Some(&token_of(json!("acme"), "olivia@acme.test"))).await.0, StatusCode::FORBIDDEN);
    // Gary is globex's, not acme's: the organization decides the tenant, the subject is looked
    // up there only.
    assert_eq!(probe.call(Some(&token_of(json!("org_AbC123"), "gary@globex.test"))).await.0, StatusCode::FORBIDDEN);

    let mut tx = prepared.db.begin().await.unwrap();
    let events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_events WHERE action = 'admin.tenant.update'")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    drop(tx);
    assert!(events >= 2, "the change is audited in the tenant's chain and the platform's");

    let (status, _, view) =
        probe.send(http::Method::PATCH, "/admin/v1/tenants/acme", &admin, json!({"org_id": ""})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(view.get("org_id").is_none(), "{view}");
    eventually("a cleared organization id names no tenant (within the change counter's interval)", || async {
        probe.call(Some(&olivia)).await.0 == StatusCode::FORBIDDEN
    })
    .await;
}
both_dbs!(tenants_come_from_mapped_claims_on, tenants_come_from_mapped_claims);

/// Array and object tenant claims (slugs): one element names its tenant, several are refused.
#[tokio::test]
async fn array_and_object_tenant_claims() {
    let prepared = TestGateway::new(Backend::Sqlite).set("auth.tenant_claim", json!("organization")).prepare().await;
    let probe = prepared.probe().await;
    let signer = Signer::dev();
    let token_of = |org: Value| {
        let mut c = claims(&prepared.config, "", "olivia@acme.test");
        let c = c.as_object_mut().unwrap();
        c.remove("tid");
        c.insert("organization".into(), org);
        signer.sign(&Value::Object(c.clone()))
    };
    for one in [json!(["acme"]), json!({"acme": {"id": "42"}}), json!("acme")] {
        let (status, _, body) = probe.call(Some(&token_of(one.clone()))).await;
        assert_eq!((status, body["tenant"].as_str()), (StatusCode::OK, Some("acme")), "{one}");
    }
    for several in [json!(["globex", "acme"]), json!({"acme": {}, "globex": {}}), json!([7.5]), json!([])] {
        let (status, _, _) = probe.call(Some(&token_of(several.clone()))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{several}");
    }
}

/// Step-up: a tool that needs a scope beyond the required ones (`auth.tool_scopes`, by name or
/// prefix) is refused 403 `insufficient_scope` naming what the token has plus what the tool
/// needs; other tools, and other methods naming it, pass; with the scope, it passes too.
#[tokio::test]
async fn a_tool_may_need_more_scope() {
    let prepared = TestGateway::new(Backend::Sqlite)
        .set("auth.scopes_supported", json!(["mcp:read", "mcp:write", "mcp:admin"]))
        .set("auth.required_scopes", json!(["mcp:read"]))
        .set("auth.tool_scopes", json!({"delete_*": ["mcp:write"], "delete_flock": ["mcp:admin"]}))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    let signer = Signer::dev();
    let token = |scope: &str| {
        let mut c = claims(&prepared.config, "acme", "olivia@acme.test");
        c["scope"] = json!(scope);
        signer.sign(&c)
    };
    let call = |tool: &str| json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": tool}});
    let read = token("mcp:read");
    let (status, headers, body) = probe.request(Some(&read), call("delete_flock"), &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let challenge = www_authenticate(&headers);
    assert!(challenge.contains(r#"error="insufficient_scope", scope="mcp:read mcp:write mcp:admin""#), "{challenge}");
    let (status, headers, _) = probe.request(Some(&read), call("delete_egg"), &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(www_authenticate(&headers).contains(r#"scope="mcp:read mcp:write""#), "{headers:?}");
    assert_eq!(probe.request(Some(&read), call("whoami"), &[]).await.0, StatusCode::OK);
    let listing = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {"name": "delete_flock"}});
    assert_eq!(probe.request(Some(&read), listing, &[]).await.0, StatusCode::OK);
    assert_eq!(probe.request(Some(&token("mcp:read mcp:write")), call("delete_egg"), &[]).await.0, StatusCode::OK);
    let all = token("mcp:read mcp:write mcp:admin");
    assert_eq!(probe.request(Some(&all), call("delete_flock"), &[]).await.0, StatusCode::OK);
}

/// The issuers tenants trust are not in the public metadata unless advertising is switched on:
/// a tenant's owner does not add authorization servers to what every tenant's clients read.
#[tokio::test]
async fn tenant_issuers_are_advertised_only_when_configured() {
    for advertise in [false, true] {
        let prepared = TestGateway::new(Backend::Sqlite)
            .set("auth.tenant_issuers_insecure", json!(true))
            .set("auth.advertise_tenant_issuers", json!(advertise))
            .prepare()
            .await;
        let new = scopegate::store::issuers::NewIssuer {
            issuer: "https://login.acme.example/".into(),
            jwks_url: None,
            audience: None,
            subject_claim: "sub".into(),
            tenant_claim: None,
            console_client_id: None,
            console_scopes: None,
        };
        let mut tx = prepared.db.begin().await.unwrap();
        scopegate::store::issuers::add(&mut tx, "acme", &new).await.unwrap();
        tx.commit().await.unwrap();
        let probe = prepared.probe().await;
        let (_, _, metadata) = probe.get("/.well-known/oauth-protected-resource").await;
        let listed = metadata["authorization_servers"].as_array().unwrap().contains(&json!(new.issuer));
        assert_eq!(listed, advertise, "{metadata}");
    }
}
