//! Identity resolution through the real middleware and the McpCallContext factory, on
//! SQLite and PostgreSQL: roles, flock scopes (a worker with no assignment sees nothing),
//! the system actor, and revocation taking effect on the next request.

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

async fn flock_id(db: &scopegate::store::Db, tenant: &str, name: &str) -> String {
    let mut tx = db.begin().await.unwrap();
    let id: String = sqlx::query_scalar(
        "SELECT f.id FROM flocks f JOIN tenants t ON t.id = f.tenant_id WHERE t.slug = $1 AND f.name = $2",
    )
    .bind(tenant)
    .bind(name)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    id
}

async fn resolves_each_demo_user(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[("auth.service_subjects", json!(["svc:reports"]))]);
    let db = db_for(&config).await;
    seed_demo(&db).await;
    let probe = Probe::start(config.clone()).await;
    let dev = Signer::dev();
    let north = flock_id(&db, "acme", "north-barn").await;

    let expect: &[(&str, &str, Value, Value)] = &[
        ("acme", "olivia@acme.test", json!(["owner"]), json!("all")),
        ("acme", "wanda@acme.test", json!(["worker"]), json!([north])),
        // A worker with zero assignments: no flock at all, never the whole tenant.
        ("acme", "walt@acme.test", json!(["worker"]), json!([])),
        ("acme", "audrey@acme.test", json!(["auditor"]), json!("all")),
        ("globex", "gary@globex.test", json!(["owner"]), json!("all")),
    ];
    for (tenant, subject, roles, flocks) in expect {
        let (status, _, body) = probe.call(Some(&dev.sign(&claims(&config, tenant, subject)))).await;
        assert_eq!(status, StatusCode::OK, "{subject}: {body}");
        assert_eq!(body["tenant"], *tenant, "{subject}");
        assert_eq!(body["user"], *subject);
        assert_eq!(body["roles"], *roles, "{subject}");
        assert_eq!(body["flocks"], *flocks, "{subject}");
    }

    // The system actor resolves (the middleware lets it through) but the context refuses it.
    let before = probe.reached();
    let (status, _, body) = probe.call(Some(&dev.sign(&claims(&config, "acme", "svc:reports")))).await;
    assert_eq!(probe.reached(), before + 1, "the system actor is resolved by the middleware");
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["context_error"], "system_actor");

    // A service subject of an unknown tenant is still refused at the gate.
    let (status, _, _) = probe.call(Some(&dev.sign(&claims(&config, "initech", "svc:reports")))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(probe.reached(), before + 1);
}
both_dbs!(identity_resolves_each_demo_user, resolves_each_demo_user);

async fn revocation_applies_on_the_next_request(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[]);
    let db = db_for(&config).await;
    seed_demo(&db).await;
    let probe = Probe::start(config.clone()).await;
    let wanda = Signer::dev().sign(&claims(&config, "acme", "wanda@acme.test"));

    let (_, _, body) = probe.call(Some(&wanda)).await;
    assert_eq!(body["flocks"].as_array().unwrap().len(), 1);

    admin_tx!(db, |tx| admin_fns::unassign_flock(&mut tx, "acme", "wanda@acme.test", "north-barn")).unwrap();
    let (status, _, body) = probe.call(Some(&wanda)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["flocks"], json!([]), "an unassigned worker sees no flock on the next request");

    admin_tx!(db, |tx| admin_fns::set_user_status(
        &mut tx,
        "acme",
        "wanda@acme.test",
        scopegate::model::UserStatus::Disabled
    ))
    .unwrap();
    let (status, _, _) = probe.call(Some(&wanda)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a disabled user is refused on the next request");

    let olivia = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));
    admin_tx!(db, |tx| admin_fns::set_tenant_status(&mut tx, "acme", scopegate::model::TenantStatus::Suspended))
        .unwrap();
    let (status, _, _) = probe.call(Some(&olivia)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a suspended tenant is refused on the next request");
}
both_dbs!(identity_revocation_applies_on_the_next_request, revocation_applies_on_the_next_request);

/// Check 2 over real HTTP: the identity is bound to the JSON-RPC id of the body it came
/// with; a call with any other id gets no context.
#[tokio::test]
async fn identity_is_bound_to_the_message_it_came_with() {
    let test_db = TestDb::new(Backend::Sqlite).await;
    let config = config_with(&test_db.url, &[]);
    seed_demo(&db_for(&config).await).await;
    let probe = Probe::start(config.clone()).await;
    let token = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));

    let (status, _, _) = probe.request(Some(&token), json!({"jsonrpc": "2.0", "id": "abc", "method": "x"}), &[]).await;
    assert_eq!(status, StatusCode::OK, "string ids bind too");

    // No id in the body (a notification, or not JSON-RPC): the probe asks for id 1.
    let (status, _, body) = probe.request(Some(&token), json!({"jsonrpc": "2.0", "method": "x"}), &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["context_error"], "foreign_message");

    // A session id the registry never bound: refused.
    let (status, _, body) = probe
        .request(Some(&token), json!({"jsonrpc": "2.0", "id": 1, "method": "x"}), &[("mcp-session-id", "s-1")])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["context_error"], "session_mismatch");
}

/// With `auth.identity_cache_ms` set, a revocation applies within that staleness, not later.
async fn cached_revocation_applies_within_the_ttl(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[("auth.identity_cache_ms", json!(400))]);
    let db = db_for(&config).await;
    seed_demo(&db).await;
    let probe = Probe::start(config.clone()).await;
    let wanda = Signer::dev().sign(&claims(&config, "acme", "wanda@acme.test"));
    assert_eq!(probe.call(Some(&wanda)).await.0, StatusCode::OK);
    admin_tx!(db, |tx| admin_fns::set_user_status(
        &mut tx,
        "acme",
        "wanda@acme.test",
        scopegate::model::UserStatus::Disabled
    ))
    .unwrap();
    assert_eq!(probe.call(Some(&wanda)).await.0, StatusCode::OK, "within the staleness the cached rows serve");
    tokio::time::sleep(std::time::Duration::from_millis(450)).await;
    assert_eq!(probe.call(Some(&wanda)).await.0, StatusCode::FORBIDDEN, "after it, the revocation applies");
}
both_dbs!(identity_cached_revocation_applies_within_the_ttl, cached_revocation_applies_within_the_ttl);
