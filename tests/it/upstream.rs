//! Entity resolution for upstream MCP servers, on SQLite and PostgreSQL: the first match of
//! machine profile, user, defaults, always in the bound executor's context.

use scopegate::store::entities::{self, ResolvedEntity};
use scopegate::store::{Db, TenantId};
use serde_json::json;

use crate::support::*;

async fn setup(backend: Backend) -> (TestDb, Db) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    seed_demo(&db).await;
    let mut tx = db.begin().await.unwrap();
    // The gateway host itself, and a build machine.
    entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    entities::create_executor(&mut tx, "build-01", "build-01", "ci", "remote", &["acme"]).await.unwrap();
    tx.commit().await.unwrap();
    (test_db, db)
}

async fn put(db: &Db, tenant: &str, name: &str) {
    let mut tx = db.begin().await.unwrap();
    entities::create_entity(&mut tx, tenant, name, &json!({"command": "echo", "args": [name]})).await.unwrap();
    tx.commit().await.unwrap();
}

async fn bind(db: &Db, tenant: &str, server: &str, executor: &str) {
    let mut tx = db.begin().await.unwrap();
    entities::bind_server(&mut tx, tenant, server, executor).await.unwrap();
    tx.commit().await.unwrap();
}

async fn tenant(db: &Db, slug: &str) -> TenantId {
    let mut tx = db.begin().await.unwrap();
    let id: String =
        sqlx::query_scalar("SELECT id FROM tenants WHERE slug = $1").bind(slug).fetch_one(&mut *tx).await.unwrap();
    id.parse().unwrap()
}

async fn winner(db: &Db, tenant_slug: &str, server: &str) -> Option<String> {
    let t = tenant(db, tenant_slug).await;
    db.resolve_server(t, server).await.unwrap().map(|r: ResolvedEntity| r.entity)
}

async fn machine_profile_wins(backend: Backend) {
    let (_t, db) = setup(backend).await;
    put(&db, "acme", "defaults/mcp-servers/db").await;
    put(&db, "acme", "users/ci/mcp-servers/db").await;
    put(&db, "acme", "machines/build-01/profile/mcp-servers/db").await;
    bind(&db, "acme", "db", "build-01").await;
    let t = tenant(&db, "acme").await;
    let resolved = db.resolve_server(t, "db").await.unwrap().unwrap();
    assert_eq!(resolved.entity, "machines/build-01/profile/mcp-servers/db");
    assert_eq!(resolved.executor.name, "build-01");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&resolved.declaration).unwrap()["args"][0],
        "machines/build-01/profile/mcp-servers/db"
    );
}
both_dbs!(resolve_bound_executor_machine_profile_wins_over_user_and_defaults, machine_profile_wins);

async fn falls_back(backend: Backend) {
    let (_t, db) = setup(backend).await;
    bind(&db, "acme", "db", "build-01").await;
    assert_eq!(winner(&db, "acme", "db").await, None, "no entity: nothing resolves");
    put(&db, "acme", "defaults/mcp-servers/db").await;
    assert_eq!(winner(&db, "acme", "db").await.as_deref(), Some("defaults/mcp-servers/db"));
    put(&db, "acme", "users/ci/mcp-servers/db").await;
    assert_eq!(winner(&db, "acme", "db").await.as_deref(), Some("users/ci/mcp-servers/db"));
    // Another user's and another machine's entries never match.
    put(&db, "acme", "users/someone-else/mcp-servers/db").await;
    put(&db, "acme", "machines/build-02/profile/mcp-servers/db").await;
    assert_eq!(winner(&db, "acme", "db").await.as_deref(), Some("users/ci/mcp-servers/db"));
    // An unbound server resolves to nothing, whatever entities exist.
    put(&db, "acme", "defaults/mcp-servers/cache").await;
    assert_eq!(winner(&db, "acme", "cache").await, None);
}
both_dbs!(resolve_falls_back_through_user_then_defaults, falls_back);

async fn bound_context_not_resolving_instance(backend: Backend) {
    let (_t, db) = setup(backend).await;
    // An entity under the gateway host's own machine name.
    put(&db, "acme", "machines/gw-host/profile/mcp-servers/db").await;
    put(&db, "acme", "users/gateway/mcp-servers/db").await;
    put(&db, "acme", "defaults/mcp-servers/db").await;
    bind(&db, "acme", "db", "build-01").await;
    assert_eq!(
        winner(&db, "acme", "db").await.as_deref(),
        Some("defaults/mcp-servers/db"),
        "a server bound to build-01 must not pick the gateway host's profile or user"
    );
    bind(&db, "acme", "db", "local").await;
    assert_eq!(winner(&db, "acme", "db").await.as_deref(), Some("machines/gw-host/profile/mcp-servers/db"));
}
both_dbs!(resolve_uses_bound_executor_context_not_resolving_instance, bound_context_not_resolving_instance);

async fn cross_tenant_never_matches(backend: Backend) {
    let (_t, db) = setup(backend).await;
    put(&db, "globex", "machines/build-01/profile/mcp-servers/db").await;
    put(&db, "globex", "defaults/mcp-servers/db").await;
    bind(&db, "acme", "db", "build-01").await;
    assert_eq!(winner(&db, "acme", "db").await, None, "globex's entities are not acme's");
    put(&db, "acme", "defaults/mcp-servers/db").await;
    assert_eq!(winner(&db, "acme", "db").await.as_deref(), Some("defaults/mcp-servers/db"));
    assert_eq!(winner(&db, "globex", "db").await, None, "globex never bound db");
}
both_dbs!(resolve_cross_tenant_entities_never_match, cross_tenant_never_matches);

async fn admin_refusals(backend: Backend) {
    let (_t, db) = setup(backend).await;
    let cases = vec![
        (
            "dup executor",
            admin_tx!(db, |tx| entities::create_executor(&mut tx, "local", "x", "y", "local", &[])).map(|_| ()),
            "local",
        ),
        (
            "bad kind",
            admin_tx!(db, |tx| entities::create_executor(&mut tx, "e2", "x", "y", "cloud", &[])).map(|_| ()),
            "kind",
        ),
        (
            "slash machine",
            admin_tx!(db, |tx| entities::create_executor(&mut tx, "e3", "a/b", "y", "local", &[])).map(|_| ()),
            "machine",
        ),
        (
            "bad entity name",
            admin_tx!(db, |tx| entities::create_entity(&mut tx, "acme", "servers/db", &json!({}))),
            "name",
        ),
        (
            "bad server",
            admin_tx!(db, |tx| entities::create_entity(&mut tx, "acme", "defaults/mcp-servers/a__b", &json!({}))),
            "server",
        ),
        (
            "unknown tenant",
            admin_tx!(db, |tx| entities::create_entity(&mut tx, "initech", "defaults/mcp-servers/db", &json!({}))),
            "initech",
        ),
        ("unknown executor", admin_tx!(db, |tx| entities::bind_server(&mut tx, "acme", "db", "nowhere")), "nowhere"),
    ];
    for (name, result, mentions) in cases {
        let err = result.expect_err(name);
        assert!(err.to_string().contains(mentions), "{name}: `{err}` should mention `{mentions}`");
    }
    bind(&db, "acme", "db", "build-01").await;
    let mut tx = db.begin().await.unwrap();
    let err = entities::delete_executor(&mut tx, "build-01").await.expect_err("a bound executor stays");
    assert!(err.to_string().contains("bound"), "{err}");
}
both_dbs!(upstream_admin_refusals, admin_refusals);

/// The upstream fixture (a real child process over stdio) verifies the gateway's identity
/// assertion with the keys the gateway publishes, and refuses forged, misaddressed or
/// missing ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_verifies_the_gateways_identity_assertion() {
    use rmcp::ServiceExt;
    use rmcp::model::{CallToolRequestParams, MetaObject, RequestMetaObject};
    use rmcp::transport::TokioChildProcess;
    use scopegate::auth::assertion::{AssertedCaller, AssertionSigner};

    let live = TestGateway::new(Backend::Sqlite).unseeded().set("upstream.assertion_ttl_secs", json!(2)).start().await;
    let config = &live.config;
    let signer = std::sync::Arc::clone(&live.state().assertions);

    let workdir = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(FIXTURE);
    cmd.arg("stdio")
        .current_dir(workdir.path())
        .env("FIXTURE_JWKS_URL", format!("{}/.well-known/jwks.json", live.base_url()))
        .env("FIXTURE_SERVER_ID", "notes")
        .env("FIXTURE_ISSUER", config.public_url())
        .env("FIXTURE_DECLARED_VALUE", "only-from-the-declaration");
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.expect("fixture starts");

    let caller = AssertedCaller {
        tenant: "acme".into(),
        tenant_id: "t-1".into(),
        user: "wanda@acme.test".into(),
        user_id: "u-1".into(),
        roles: vec!["worker".into()],
        flocks: json!(["f-1"]),
    };
    let call = |token: Option<String>| {
        let mut params = CallToolRequestParams::new("whoami_upstream");
        if let Some(token) = token {
            let mut meta = serde_json::Map::new();
            meta.insert("io.scopegate/identity".into(), json!(token));
            params.meta = Some(RequestMetaObject(MetaObject(meta)));
        }
        client.call_tool(params)
    };

    let result = call(Some(signer.sign(&caller, "notes").unwrap())).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let echoed = result.structured_content.unwrap();
    assert_eq!(echoed["tenant"], "acme");
    assert_eq!(echoed["user"], "wanda@acme.test");
    assert_eq!(echoed["roles"], json!(["worker"]));
    assert_eq!(echoed["flocks"], json!(["f-1"]));
    assert_eq!(echoed["declared_value"], "only-from-the-declaration");
    let cwd = std::path::PathBuf::from(echoed["cwd"].as_str().unwrap());
    assert_eq!(cwd.canonicalize().unwrap(), workdir.path().canonicalize().unwrap());

    let forger = AssertionSigner::new(config.public_url(), std::time::Duration::from_secs(30)).unwrap();
    for (name, token) in [
        ("forged", Some(forger.sign(&caller, "notes").unwrap())),
        ("another audience", Some(signer.sign(&caller, "billing").unwrap())),
        ("none", None),
        ("garbage", Some("not.a.jwt".to_owned())),
    ] {
        let result = call(token).await.unwrap();
        assert_eq!(result.is_error, Some(true), "{name}: {result:?}");
        let text = serde_json::to_string(&result.content).unwrap();
        assert!(text.contains("assertion refused"), "{name}: {text}");
    }
    let expiring = signer.sign(&caller, "notes").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(3100)).await;
    let result = call(Some(expiring)).await.unwrap();
    assert_eq!(result.is_error, Some(true), "an expired assertion is refused: {result:?}");
    client.cancel().await.ok();
}
