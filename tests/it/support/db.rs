//! Databases for one test (a temporary SQLite file, or a fresh PostgreSQL database),
//! configuration without the process environment, and the demo data.

use std::path::PathBuf;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use scopegate::config::{Config, DEFAULT_TOML};
use scopegate::store::{Db, IfMissing, demo};
use serde_json::Value;
use sqlx::Connection;

/// The tests' gateway URL (the token audience is `<PUBLIC_URL>/mcp`).
pub const PUBLIC_URL: &str = "http://gateway.test";
pub const PG_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A database that exists for one test and is removed after it.
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    pg_name: Option<String>,
}

pub fn pg_server_url() -> String {
    std::env::var("SCOPEGATE_TEST_PG_URL").unwrap_or_else(|_| PG_DEFAULT.to_owned())
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path: PathBuf = dir.path().join("scopegate.db");
                Self { url: format!("sqlite://{}", path.display()), _dir: Some(dir), pg_name: None }
            }
            Backend::Postgres => {
                let name = format!("sg_test_{}", uuid::Uuid::new_v4().simple());
                let server = pg_server_url();
                let mut conn = sqlx::PgConnection::connect(&format!("{server}/postgres"))
                    .await
                    .unwrap_or_else(|e| panic!("PostgreSQL at {server} is required by the tests: {e}"));
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut conn)
                    .await
                    .expect("create test database");
                Self { url: format!("{server}/{name}"), _dir: None, pg_name: Some(name) }
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(name) = self.pg_name.take() else {
            return;
        };
        // Drop runs outside async context: a short-lived thread with its own runtime.
        let server = pg_server_url();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&format!("{server}/postgres")).await.ok()?;
                sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
                    .execute(&mut conn)
                    .await
                    .ok()
            })
        })
        .join();
    }
}

/// Defaults plus `overrides` (dotted keys), never the process environment.
pub fn config_with(db_url: &str, overrides: &[(&str, Value)]) -> Config {
    let mut figment = Figment::from(Toml::string(DEFAULT_TOML))
        .merge(Serialized::default("database.url", db_url))
        .merge(Serialized::default("server.listen", "127.0.0.1:0"))
        .merge(Serialized::default("metrics.listen", "127.0.0.1:0"))
        .merge(Serialized::default("server.public_url", PUBLIC_URL))
        .merge(Serialized::default("auth.hs256_secret", super::tokens::TEST_SECRET))
        .merge(Serialized::default("database.max_connections", 4));
    for (key, value) in overrides {
        figment = figment.merge(Serialized::default(key, value.clone()));
    }
    Config::from_figment(figment).expect("test configuration is valid")
}

/// `toml`, a configuration file's text, over the defaults as `--config FILE` is, with the
/// test's database and a free loopback port; none of the tests' other defaults (their public
/// URL, their HS256 secret), so the file's settings are what the gateway runs with.
pub fn config_from_file(db_url: &str, toml: &str, overrides: &[(&str, Value)]) -> Config {
    let mut figment = Figment::from(Toml::string(DEFAULT_TOML))
        .merge(Toml::string(toml))
        .merge(Serialized::default("database.url", db_url))
        .merge(Serialized::default("server.listen", "127.0.0.1:0"))
        .merge(Serialized::default("metrics.listen", "127.0.0.1:0"))
        .merge(Serialized::default("database.max_connections", 4));
    for (key, value) in overrides {
        figment = figment.merge(Serialized::default(key, value.clone()));
    }
    Config::from_figment(figment).unwrap_or_else(|e| panic!("the configuration file is refused: {e}\n{toml}"))
}

/// Connected and migrated.
pub async fn db_for(config: &Config) -> Db {
    let db = Db::connect(&config.database, IfMissing::Create).await.expect("connect");
    db.migrate().await.expect("migrate");
    db
}

pub async fn seed_demo(db: &Db) {
    assert_eq!(demo::seed(db).await.expect("seed"), demo::SeedOutcome::Seeded);
}

/// Convenience: the admin module's functions, for tests that set up data.
pub use scopegate::store::admin as admin_fns;

/// Yesterday's date (`YYYY-MM-DD`): a day an egg count may be recorded for.
pub fn yesterday() -> String {
    (time::OffsetDateTime::now_utc().date() - time::Duration::days(1)).to_string()
}

/// Makes every audit insert fail from now on (a trigger that raises).
pub async fn sabotage_audit(db: &Db, backend: Backend) {
    let mut tx = db.begin().await.unwrap();
    sabotage_audit_in(&mut tx, backend).await;
    tx.commit().await.unwrap();
}

/// Creates the trigger of [`sabotage_audit`] in `conn`'s transaction: audit inserts fail once it
/// commits.
pub async fn sabotage_audit_in(conn: &mut sqlx::AnyConnection, backend: Backend) {
    let statements: &[&str] = match backend {
        Backend::Sqlite => &[
            "CREATE TRIGGER audit_sabotage BEFORE INSERT ON audit_events BEGIN SELECT RAISE(ABORT, 'audit sabotaged'); END",
        ],
        Backend::Postgres => &[
            "CREATE FUNCTION audit_sabotage() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'audit sabotaged'; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER audit_sabotage BEFORE INSERT ON audit_events FOR EACH ROW EXECUTE FUNCTION audit_sabotage()",
        ],
    };
    for sql in statements {
        sqlx::query(*sql).execute(&mut *conn).await.unwrap();
    }
}

/// The audit chain's events with the record and the outcome of a call that ran as one row (as the admin
/// API shows them): the record's columns, the outcome's `outcome` and `error_class` (`unknown`
/// when no outcome follows the record). Use it where a query names `audit_events`:
/// `format!("... FROM {AUDITED_CALLS} e ...")`.
pub const AUDITED_CALLS: &str = "(SELECT r.id, r.tenant_id, r.seq, r.occurred_at, r.user_id, r.session_id, \
     r.request_id, r.client_name, r.client_version, r.action, r.tool, r.args_digest, r.args_raw, r.calls, r.policy, \
     CASE WHEN r.outcome = 'started' THEN COALESCE(o.outcome, 'unknown') ELSE r.outcome END AS outcome, \
     CASE WHEN r.outcome = 'started' THEN o.error_class ELSE r.error_class END AS error_class \
     FROM audit_events r LEFT JOIN audit_events o ON o.tenant_id = r.tenant_id AND o.call_id = r.id \
     WHERE r.call_id IS NULL)";

/// Undoes [`sabotage_audit`]: audit events can be inserted again.
pub async fn restore_audit(db: &Db, backend: Backend) {
    let statements: &[&str] = match backend {
        Backend::Sqlite => &["DROP TRIGGER audit_sabotage"],
        Backend::Postgres => &["DROP TRIGGER audit_sabotage ON audit_events", "DROP FUNCTION audit_sabotage()"],
    };
    let mut tx = db.begin().await.unwrap();
    for sql in statements {
        sqlx::query(*sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// What `binding set` passes the store for `prefixed`: `None` keeps the prefix, else the
/// gateway's native tool names, which an unprefixed server may not shadow.
pub fn unprefixed_beside(prefixed: bool) -> Option<&'static [&'static str]> {
    static NATIVE: std::sync::LazyLock<Vec<&'static str>> =
        std::sync::LazyLock::new(|| scopegate::tools::TOOLS.iter().map(|t| t.name).collect());
    (!prefixed).then(|| NATIVE.as_slice())
}
