//! Storage on SQLite and PostgreSQL: migrations, readiness, the demo seed, administrative
//! writes that validate first and leave nothing half-written, and cross-tenant links
//! refused by the database itself.

use http::StatusCode;
use scopegate::model::Role;
use scopegate::store::demo::{self, SeedOutcome};
use scopegate::store::{Db, IfMissing, StoreError};
use tower::ServiceExt;

use crate::support::*;

async fn count(db: &Db, table: &str) -> i64 {
    let mut tx = db.begin().await.unwrap();
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}"))).fetch_one(&mut *tx).await.unwrap()
}

async fn migrations_and_readiness(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[]);
    let db = Db::connect(&config.database, IfMissing::Create).await.unwrap();
    assert!(!db.is_ready().await, "not ready before migrations");
    db.migrate().await.unwrap();
    db.migrate().await.expect("migrating twice is a no-op");
    assert!(db.is_ready().await);

    let gateway = scopegate::Gateway::build(config).await.unwrap();
    let response =
        gateway.router().oneshot(http::Request::get("/readyz").body(axum::body::Body::empty()).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // Readiness follows the database: closed pool, not ready.
    gateway.state().db.close().await;
    let response =
        gateway.router().oneshot(http::Request::get("/readyz").body(axum::body::Body::empty()).unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}
both_dbs!(store_migrations_and_readiness, migrations_and_readiness);

async fn demo_seed_is_all_or_nothing(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    assert_eq!(demo::seed(&db).await.unwrap(), SeedOutcome::Seeded);
    // The two demo tenants, and the platform chain's row.
    assert_eq!(count(&db, "tenants").await, 3);
    assert_eq!(count(&db, "users").await, 5);
    assert_eq!(count(&db, "flocks").await, 3);
    assert_eq!(count(&db, "flock_assignments").await, 1);
    assert_eq!(count(&db, "egg_counts").await, 15);
    assert_eq!(demo::seed(&db).await.unwrap(), SeedOutcome::AlreadyPresent, "a second run changes nothing");
    assert_eq!(count(&db, "users").await, 5);

    // A database holding other tenants is refused, and nothing is written.
    let other = TestDb::new(backend).await;
    let db = db_for(&config_with(&other.url, &[])).await;
    admin_tx!(db, |tx| admin_fns::create_tenant(&mut tx, "initech", "Initech")).unwrap();
    assert!(matches!(demo::seed(&db).await, Err(StoreError::Conflict(_))));
    assert_eq!(count(&db, "tenants").await, 2, "initech and the platform chain's row");
    assert_eq!(count(&db, "users").await, 0);
}
both_dbs!(store_demo_seed_is_all_or_nothing, demo_seed_is_all_or_nothing);

async fn admin_writes_validate_and_leave_nothing_half_written(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    seed_demo(&db).await;
    let users = count(&db, "users").await;
    let roles = count(&db, "user_roles").await;

    let cases: Vec<(&str, Result<(), StoreError>, &str)> = vec![
        ("bad slug", admin_tx!(db, |tx| admin_fns::create_tenant(&mut tx, "Bad Slug", "x")).map(|_| ()), "slug"),
        ("empty name", admin_tx!(db, |tx| admin_fns::create_tenant(&mut tx, "newco", " ")).map(|_| ()), "name"),
        (
            "duplicate tenant",
            admin_tx!(db, |tx| admin_fns::create_tenant(&mut tx, "acme", "Acme again")).map(|_| ()),
            "acme",
        ),
        (
            "user in unknown tenant",
            admin_tx!(db, |tx| admin_fns::create_user(&mut tx, "initech", "x@y", "X", &[Role::Owner])).map(|_| ()),
            "initech",
        ),
        (
            "duplicate user",
            admin_tx!(db, |tx| admin_fns::create_user(&mut tx, "acme", "olivia@acme.test", "O", &[Role::Owner]))
                .map(|_| ()),
            "olivia@acme.test",
        ),
        (
            "control characters in subject",
            admin_tx!(db, |tx| admin_fns::create_user(&mut tx, "acme", "a\u{0}b", "A", &[Role::Worker])).map(|_| ()),
            "subject",
        ),
        (
            "another tenant's flock",
            admin_tx!(db, |tx| admin_fns::assign_flock(&mut tx, "acme", "wanda@acme.test", "hilltop")),
            "hilltop",
        ),
        (
            "negative hen count",
            admin_tx!(db, |tx| admin_fns::create_flock(&mut tx, "acme", "east-barn", "Silkie", -1)).map(|_| ()),
            "hen_count",
        ),
    ];
    for (name, result, mentions) in cases {
        let err = result.expect_err(name);
        assert!(err.to_string().contains(mentions), "{name}: `{err}` should mention `{mentions}`");
    }
    // The two demo tenants, and the platform chain's row.
    assert_eq!(count(&db, "tenants").await, 3);
    assert_eq!(count(&db, "users").await, users);
    assert_eq!(count(&db, "user_roles").await, roles);
    assert_eq!(count(&db, "flocks").await, 3);
    assert_eq!(count(&db, "flock_assignments").await, 1);

    // A role named twice is one role: the user is made with it once (never a key violation).
    admin_tx!(db, |tx| admin_fns::create_user(
        &mut tx,
        "acme",
        "dora@acme.test",
        "Dora",
        &[Role::Manager, Role::Manager]
    ))
    .expect("a repeated role is one role");
    assert_eq!(count(&db, "users").await, users + 1);
    assert_eq!(count(&db, "user_roles").await, roles + 1);
}
both_dbs!(store_admin_writes_validate, admin_writes_validate_and_leave_nothing_half_written);

/// Even SQL that skips the code's checks can't link a user to another tenant's flock:
/// the composite foreign keys refuse it.
async fn database_refuses_cross_tenant_links(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let db = db_for(&config_with(&test_db.url, &[])).await;
    seed_demo(&db).await;
    let mut tx = db.begin().await.unwrap();
    let result = sqlx::query(
        "INSERT INTO flock_assignments (tenant_id, user_id, flock_id) \
         SELECT u.tenant_id, u.id, f.id FROM users u, flocks f \
          WHERE u.subject = 'wanda@acme.test' AND f.name = 'hilltop'",
    )
    .execute(&mut *tx)
    .await;
    assert!(result.is_err(), "a user of acme assigned to a globex flock must be refused");
    drop(tx);

    let mut tx = db.begin().await.unwrap();
    let result = sqlx::query(
        "INSERT INTO egg_counts (tenant_id, flock_id, day, eggs, recorded_by, recorded_at) \
         SELECT t.id, f.id, '2026-01-01', 5, 'x', 0 FROM tenants t, flocks f \
          WHERE t.slug = 'acme' AND f.name = 'hilltop'",
    )
    .execute(&mut *tx)
    .await;
    assert!(result.is_err(), "an acme egg count on a globex flock must be refused");
}
both_dbs!(store_database_refuses_cross_tenant_links, database_refuses_cross_tenant_links);

/// Committed means durable: SQLite syncs every commit (`PRAGMA synchronous = FULL`, 2) unless
/// `database.sqlite_synchronous = "normal"` (1) is chosen; PostgreSQL keeps its durable
/// `synchronous_commit = on`. Every connection of the pool is checked, not only the first.
async fn commits_are_durable_by_default(backend: Backend) {
    async fn reported(db: &Db, connections: usize) -> Vec<String> {
        let mut held = Vec::new();
        let mut values = Vec::new();
        for _ in 0..connections {
            let mut tx = db.begin_read().await.unwrap();
            let value = match db.kind() {
                scopegate::store::DbKind::Sqlite => {
                    let n: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&mut *tx).await.unwrap();
                    n.to_string()
                }
                scopegate::store::DbKind::Postgres => {
                    sqlx::query_scalar("SELECT current_setting('synchronous_commit')")
                        .fetch_one(&mut *tx)
                        .await
                        .unwrap()
                }
            };
            values.push(value);
            held.push(tx);
        }
        values
    }
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[]);
    let db = db_for(&config).await;
    let expected = if backend == Backend::Sqlite { "2" } else { "on" };
    assert_eq!(reported(&db, 3).await, vec![expected; 3], "the default is durable on every connection");
    db.close().await;

    let config = config_with(&test_db.url, &[("database.sqlite_synchronous", serde_json::json!("normal"))]);
    let db = db_for(&config).await;
    let expected = if backend == Backend::Sqlite { "1" } else { "on" };
    assert_eq!(reported(&db, 3).await, vec![expected; 3], "`normal` is SQLite's opt-in; PostgreSQL stays durable");
    db.close().await;
}
both_dbs!(store_commits_are_durable_by_default, commits_are_durable_by_default);

/// What the replicas keep of each other: who is alive and where, which holds which agent
/// (only while alive, the newest connection first), and the published keys (while their
/// `publish_until` is ahead, never shortened); a stopped replica's rows go, and rows silent for
/// long are purged.
async fn replica_rows(backend: Backend) {
    let test_db = TestDb::new(backend).await;
    let db = Db::connect(&config_with(&test_db.url, &[]).database, IfMissing::Create).await.unwrap();
    db.migrate().await.unwrap();
    db.register_replica("a", "http://10.0.0.1:8080", 1_000).await.unwrap();
    db.register_replica("b", "http://10.0.0.2:8080", 1_000).await.unwrap();
    assert!(db.replica_seen("a", 5_000).await.unwrap());
    assert!(!db.replica_seen("nobody", 5_000).await.unwrap(), "an unknown replica is told to register");
    assert_eq!(db.live_replica_url("a", 4_000).await.unwrap().as_deref(), Some("http://10.0.0.1:8080"));
    assert_eq!(db.live_replica_url("b", 4_000).await.unwrap(), None, "b was last seen before");

    db.agent_held("build-01", "a", "file:///srv/a", 2_000).await.unwrap();
    db.agent_held("build-01", "b", "file:///srv/b", 3_000).await.unwrap();
    let holders = |since| {
        let db = db.clone();
        async move { db.agent_holders("build-01", since).await.unwrap() }
    };
    let all: Vec<String> = holders(0).await.into_iter().map(|h| h.replica_id).collect();
    assert_eq!(all, ["b", "a"], "the newest connection first");
    assert_eq!(
        db.agents_held_since(0).await.unwrap(),
        [("build-01".to_owned(), "a".to_owned()), ("build-01".to_owned(), "b".to_owned())]
    );
    assert_eq!(db.agents_held_since(4_000).await.unwrap(), [("build-01".to_owned(), "a".to_owned())], "b is not alive");
    let alive = holders(4_000).await;
    assert_eq!(alive.len(), 1);
    assert_eq!((alive[0].replica_id.as_str(), alive[0].root.as_str()), ("a", "file:///srv/a"));
    // A release of an older connection leaves a newer one's row.
    db.agent_released("build-01", "b", 2_500).await.unwrap();
    assert_eq!(holders(0).await.len(), 2);
    db.agent_released("build-01", "b", 3_000).await.unwrap();
    assert_eq!(holders(0).await.len(), 1);

    db.publish_signing_key("k1", r#"{"kid":"k1"}"#, "a", 1_000, 10_000).await.unwrap();
    db.publish_signing_key("k2", r#"{"kid":"k2"}"#, "b", 2_000, 20_000).await.unwrap();
    db.extend_signing_key("k1", 30_000).await.unwrap();
    db.extend_signing_key("k2", 15_000).await.unwrap();
    assert_eq!(db.published_signing_keys(12_000).await.unwrap().len(), 2);
    assert_eq!(db.published_signing_keys(25_000).await.unwrap(), [r#"{"kid":"k1"}"#], "k2 kept its later end");
    assert_eq!(db.purge_signing_keys(25_000).await.unwrap(), 1);
    assert_eq!(count(&db, "signing_keys").await, 1);

    db.replica_gone("a").await.unwrap();
    assert_eq!(db.live_replica_url("a", 0).await.unwrap(), None);
    assert!(holders(0).await.is_empty(), "a stopped replica's agents go with it");
    db.agent_held("build-01", "b", "file:///srv/b", 6_000).await.unwrap();
    assert_eq!(db.purge_replicas(2_000).await.unwrap(), 1, "b, last seen at 1000");
    assert_eq!((count(&db, "replicas").await, count(&db, "replica_agents").await), (0, 0));
    db.close().await;
}
both_dbs!(store_replica_rows, replica_rows);
