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
    let prepared = TestGateway::new(backend).set("auth.service_subjects", json!(["svc:reports"])).prepare().await;
    let (config, db) = (prepared.config.clone(), &prepared.db);
    let probe = prepared.probe().await;
    let dev = Signer::dev();
    let north = flock_id(db, "acme", "north-barn").await;

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
    // No identity reuse: every request reads the rows.
    let prepared = TestGateway::new(backend).set("auth.identity_cache_ms", json!(0)).prepare().await;
    let (config, db) = (prepared.config.clone(), &prepared.db);
    let probe = prepared.probe().await;
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
    let prepared = TestGateway::new(Backend::Sqlite).prepare().await;
    let probe = prepared.probe().await;
    let token = Signer::dev().sign(&claims(&prepared.config, "acme", "olivia@acme.test"));

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

/// The identity cache's poll interval in these tests.
const POLL_MS: u64 = 150;

/// Long enough for the poller to have read the counter since the last change.
async fn after_a_poll() {
    tokio::time::sleep(std::time::Duration::from_millis(3 * POLL_MS)).await;
}

/// A gateway with the identity cache polling every [`POLL_MS`], the demo data, and wanda's
/// token; the counter has been read once. Keep `_test_db` bound: dropping it drops the database.
struct Cached {
    _test_db: TestDb,
    config: scopegate::config::Config,
    db: scopegate::store::Db,
    probe: Probe,
    wanda: String,
}

async fn cached(backend: Backend) -> Cached {
    let prepared = TestGateway::new(backend).set("auth.identity_cache_ms", json!(POLL_MS)).prepare().await;
    let probe = prepared.probe().await;
    let Prepared { config, db, test_db, .. } = prepared;
    let wanda = Signer::dev().sign(&claims(&config, "acme", "wanda@acme.test"));
    after_a_poll().await;
    Cached { _test_db: test_db, config, db, probe, wanda }
}

/// With the identity cache on, rows are reused until a change: every kind of revocation
/// applies within one poll of the change counter (entries otherwise live for a minute).
async fn cached_revocation_applies_within_one_poll(backend: Backend) {
    let Cached { _test_db, config, db, probe, wanda } = cached(backend).await;
    let (_, _, body) = probe.call(Some(&wanda)).await;
    assert_eq!(body["flocks"].as_array().unwrap().len(), 1, "read and cached");

    admin_tx!(db, |tx| admin_fns::unassign_flock(&mut tx, "acme", "wanda@acme.test", "north-barn")).unwrap();
    after_a_poll().await;
    let (status, _, body) = probe.call(Some(&wanda)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["flocks"], json!([]), "an unassignment applies within a poll");

    admin_tx!(db, |tx| admin_fns::set_user_status(
        &mut tx,
        "acme",
        "wanda@acme.test",
        scopegate::model::UserStatus::Disabled
    ))
    .unwrap();
    after_a_poll().await;
    assert_eq!(probe.call(Some(&wanda)).await.0, StatusCode::FORBIDDEN, "a disabled user, within a poll");

    let olivia = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));
    assert_eq!(probe.call(Some(&olivia)).await.0, StatusCode::OK);
    admin_tx!(db, |tx| admin_fns::set_tenant_status(&mut tx, "acme", scopegate::model::TenantStatus::Suspended))
        .unwrap();
    after_a_poll().await;
    assert_eq!(probe.call(Some(&olivia)).await.0, StatusCode::FORBIDDEN, "a suspended tenant, within a poll");
}
both_dbs!(identity_cached_revocation_applies_within_one_poll, cached_revocation_applies_within_one_poll);

/// The counter moves on changes made outside the admin commands too (SQL by hand, another
/// replica), cascades included; reading identity rows does not move it.
async fn every_identity_change_moves_the_counter(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[]);
    let db = db_for(&config).await;
    seed_demo(&db).await;
    let north = flock_id(&db, "acme", "north-barn").await;
    // (statement, whether it must move the counter): insert, update and delete of each of the
    // four identity tables, each on its own, so a missing trigger shows as its statement.
    let mut statements = vec![
        (
            "INSERT INTO tenants (id, slug, name, status, created_at) VALUES ('t-x', 'initech', 'Initech', 'active', 0)",
            true,
        ),
        ("UPDATE tenants SET name = 'Acme Farms' WHERE slug = 'acme'", true),
        (
            "INSERT INTO users (id, tenant_id, subject, display_name, status, created_at) \
             VALUES ('u-x', 't-x', 'pat@initech.test', 'Pat', 'active', 0)",
            true,
        ),
        ("UPDATE users SET display_name = 'W.' WHERE subject = 'wanda@acme.test'", true),
        ("INSERT INTO user_roles (tenant_id, user_id, role) VALUES ('t-x', 'u-x', 'worker')", true),
        ("UPDATE user_roles SET role = 'manager' WHERE user_id = 'u-x'", true),
        (
            "INSERT INTO flocks (id, tenant_id, name, breed, hen_count, created_at) VALUES ('f-x', 't-x', 'barn', 'x', 1, 0)",
            false,
        ),
        ("INSERT INTO flock_assignments (tenant_id, user_id, flock_id) VALUES ('t-x', 'u-x', 'f-x')", true),
        ("UPDATE flock_assignments SET flock_id = 'f-x' WHERE user_id = 'u-x'", true),
        ("DELETE FROM flock_assignments WHERE user_id = 'u-x'", true),
        ("DELETE FROM user_roles WHERE user_id = 'u-x'", true),
        ("DELETE FROM users WHERE id = 'u-x'", true),
        ("DELETE FROM tenants WHERE id = 't-x'", true),
        ("DELETE FROM user_roles WHERE user_id = (SELECT id FROM users WHERE subject = 'audrey@acme.test')", true),
        // Deleting a flock cascades to its assignments (wanda's).
        ("DELETE FROM egg_counts WHERE flock_id = $1", false),
        ("DELETE FROM flocks WHERE id = $1", true),
    ];
    if backend == Backend::Postgres {
        // PostgreSQL's TRUNCATE fires no row or delete trigger: it has its own.
        statements.push(("TRUNCATE user_roles", true));
    }
    for (sql, moves) in statements {
        let before = db.identity_epoch().await.unwrap();
        let mut tx = db.begin().await.unwrap();
        let query = sqlx::query(sqlx::AssertSqlSafe(sql));
        let query = if sql.contains("$1") { query.bind(&north) } else { query };
        query.execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        let after = db.identity_epoch().await.unwrap();
        if moves {
            assert!(after > before, "{sql}: the counter must move ({before} -> {after})");
        } else {
            assert_eq!(after, before, "{sql}: not an identity row");
        }
    }
    let assigned: i64 = {
        let mut tx = db.begin().await.unwrap();
        sqlx::query_scalar("SELECT COUNT(*) FROM flock_assignments WHERE flock_id = $1")
            .bind(&north)
            .fetch_one(&mut *tx)
            .await
            .unwrap()
    };
    assert_eq!(assigned, 0, "the cascade removed the assignment");

    let before = db.identity_epoch().await.unwrap();
    db.load_principal(scopegate::store::principal::TenantKey::Slug("acme"), Some("olivia@acme.test")).await.unwrap();
    assert_eq!(db.identity_epoch().await.unwrap(), before, "a read moves nothing");
}
both_dbs!(identity_every_change_moves_the_counter, every_identity_change_moves_the_counter);

/// Rows are reused while the counter stands still (a change that bypasses the triggers is
/// not seen), and fail closed: when the counter can't be read, cached rows stop serving and
/// every request reads the database, so that change then applies.
async fn unreadable_counter_turns_the_cache_off(backend: Backend) {
    let Cached { _test_db, db, probe, wanda, .. } = cached(backend).await;
    assert_eq!(probe.call(Some(&wanda)).await.0, StatusCode::OK, "read and cached");

    // Disable wanda behind the counter's back: its trigger removed first.
    let drop_trigger = match backend {
        Backend::Sqlite => "DROP TRIGGER identity_epoch_users_update",
        Backend::Postgres => "DROP TRIGGER identity_epoch_users ON users",
    };
    let mut tx = db.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(drop_trigger)).execute(&mut *tx).await.unwrap();
    sqlx::query("UPDATE users SET status = 'disabled' WHERE subject = 'wanda@acme.test'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    after_a_poll().await;
    assert_eq!(probe.call(Some(&wanda)).await.0, StatusCode::OK, "the counter did not move: the cached rows serve");

    // Now the counter can't be read: two intervals later the cache is off.
    let mut tx = db.begin().await.unwrap();
    sqlx::query("DROP TABLE identity_epoch").execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    after_a_poll().await;
    assert_eq!(
        probe.call(Some(&wanda)).await.0,
        StatusCode::FORBIDDEN,
        "with the counter unreadable, the rows are read again"
    );
}
both_dbs!(identity_unreadable_counter_turns_the_cache_off, unreadable_counter_turns_the_cache_off);
