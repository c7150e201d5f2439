//! Storage: the pool, migrations and every SQL statement; never hands a pool to a tool.
//!
//! One code path serves SQLite and PostgreSQL through sqlx's `Any` driver: the SQL is
//! kept portable (`$n` parameters, TEXT ids, BIGINT times) and each database has its own
//! migrations folder. Query functions take the executor they run on, so the caller owns
//! the transaction.

pub mod admin;
pub mod approvals;
pub mod cluster;
pub mod definitions;
pub mod demo;
pub mod entities;
pub mod ids;
pub mod issuers;
pub mod policies;
pub mod principal;
pub mod provisioning;
pub mod roots;
pub mod tasks;
pub mod vault;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Executor};

use crate::config::DatabaseConfig;

pub use ids::{AuditEventId, FlockId, Principal, RootAllowanceId, TenantId, UserId};

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database url: {0}")]
    Url(String),
    /// Only `serve` and `migrate` create a database; every other command needs one.
    #[error("database {url} does not exist: create it with `scopegate migrate` (or `scopegate serve`) first")]
    Missing { url: String },
    #[error("database {url}: {source}")]
    Connect { url: String, source: sqlx::Error },
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("invalid {field}: {message}")]
    Invalid { field: &'static str, message: String },
}

/// What [`Db::connect`] does when the SQLite file does not exist: `serve` and `migrate` create
/// it (with its folder); every other command refuses, so a mistyped URL or the wrong working
/// folder is reported instead of answered from a new, empty database. A PostgreSQL database is
/// never created: connecting to a missing one fails either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfMissing {
    Create,
    Refuse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Sqlite,
    Postgres,
}

/// The database handle. Cloning is cheap (the pool is shared).
#[derive(Clone)]
pub struct Db {
    pool: AnyPool,
    kind: DbKind,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// Maps a unique-constraint violation to a conflict that names what already exists; any
/// other error stays a database error.
pub(crate) fn unique_conflict(e: sqlx::Error, what: impl FnOnce() -> String) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Conflict(what()),
        _ => StoreError::Sql(e),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

impl Db {
    /// Connects and sets pool limits; a missing SQLite file (and its folder) is created or
    /// refused as `missing` says. Errors name the URL, without its password. Does not migrate:
    /// call [`Db::migrate`].
    pub async fn connect(cfg: &DatabaseConfig, missing: IfMissing) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let url = cfg.url.expose();
        let shown = shown_url(url);
        let (kind, url) = if let Some(rest) = url.strip_prefix("sqlite:") {
            match sqlite_url(rest, missing)? {
                Some(url) => (DbKind::Sqlite, url),
                None => return Err(StoreError::Missing { url: shown }),
            }
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (DbKind::Postgres, url.to_owned())
        } else {
            return Err(StoreError::Url("expected sqlite:, postgres:// or postgresql://".into()));
        };
        let connect_error = |source| StoreError::Connect { url: shown.clone(), source };
        let options = AnyConnectOptions::from_str(&url).map_err(connect_error)?;
        let busy_ms = cfg.sqlite_busy_timeout_ms;
        let synchronous = cfg.sqlite_synchronous.pragma();
        let pool = AnyPoolOptions::new()
            .max_connections(cfg.max_connections)
            .min_connections(cfg.min_connections)
            .acquire_timeout(Duration::from_secs(cfg.acquire_timeout_secs))
            // No ping before each checkout: it would add a round trip to every query. A
            // broken connection fails its query (the request fails closed) and is dropped.
            .test_before_acquire(false)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if kind == DbKind::Sqlite {
                        // WAL lets readers run beside the writer; the busy timeout makes a
                        // writer wait for the lock instead of failing at once.
                        // busy_ms is a number from the configuration and `synchronous` one of
                        // two fixed words: nothing to inject. FULL (the default) syncs each
                        // commit before it is reported, so committed means durable (NORMAL
                        // can lose the newest commits on a power loss).
                        // A 16 MiB page cache per connection keeps lookups in memory as tables
                        // grow (the default 2 MiB cache made a 100,000-user lookup ~1.6x
                        // slower). No memory map: in WAL mode a connection that starts reading
                        // after another one committed unmaps its whole map, and every call
                        // commits an audit event, so each read paid an munmap (a TLB shootdown
                        // across CPUs) and page faults: ~20% of the audited call rate.
                        let pragmas = format!(
                            "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = {busy_ms}; \
                             PRAGMA foreign_keys = ON; PRAGMA synchronous = {synchronous}; \
                             PRAGMA mmap_size = 0; PRAGMA cache_size = -16384;"
                        );
                        conn.execute(sqlx::AssertSqlSafe(pragmas)).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(connect_error)?;
        Ok(Self { pool, kind })
    }

    pub fn kind(&self) -> DbKind {
        self.kind
    }

    fn migrator(&self) -> &'static Migrator {
        match self.kind {
            DbKind::Sqlite => &SQLITE_MIGRATIONS,
            DbKind::Postgres => &POSTGRES_MIGRATIONS,
        }
    }

    /// Applies every pending migration.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrator().run(&self.pool).await?;
        Ok(())
    }

    /// True when the database answers and the newest migration has been applied.
    pub async fn is_ready(&self) -> bool {
        let Some(latest) = self.migrator().iter().map(|m| m.version).max() else {
            return false;
        };
        let applied: Result<i64, _> =
            sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE version = $1 AND success = TRUE")
                .bind(latest)
                .fetch_one(&self.pool)
                .await;
        matches!(applied, Ok(1))
    }

    /// Connections in use and idle, for metrics.
    pub fn pool_usage(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// `sqlite://data/x.db` -> an absolute-or-relative path URL. To create: `mode=rwc`, and the
/// parent folder created so a fresh machine needs nothing. To refuse: `None` when the file
/// does not exist, else `mode=rw` (nothing is created should it vanish meanwhile).
fn sqlite_url(rest: &str, missing: IfMissing) -> Result<Option<String>, StoreError> {
    let rest = rest.trim_start_matches("//");
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if path.is_empty() || path == ":memory:" {
        return Err(StoreError::Url(
            "sqlite needs a file path (an in-memory database is one database per connection)".into(),
        ));
    }
    let mode = match missing {
        IfMissing::Create => {
            if let Some(parent) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| StoreError::Url(format!("cannot create {}: {e}", parent.display())))?;
            }
            "mode=rwc"
        }
        IfMissing::Refuse if !Path::new(path).exists() => return Ok(None),
        IfMissing::Refuse => "mode=rw",
    };
    let mut query = query.map(str::to_owned).unwrap_or_default();
    if !query.split('&').any(|kv| kv.starts_with("mode=")) {
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str(mode);
    }
    Ok(Some(format!("sqlite://{path}?{query}")))
}

/// A database URL as it may be shown in an error: a password, in the user part or as a
/// `password` parameter, replaced.
fn shown_url(url: &str) -> String {
    const HIDDEN: &str = "[redacted]";
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut shown = match head.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            match authority.rsplit_once('@') {
                Some((userinfo, host)) if userinfo.contains(':') => {
                    let user = userinfo.split(':').next().unwrap_or_default();
                    format!("{scheme}://{user}:{HIDDEN}@{host}{path}")
                }
                _ => head.to_owned(),
            }
        }
        None => head.to_owned(),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}={HIDDEN}"),
                _ => kv.to_owned(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&params.join("&"));
    }
    shown
}

impl Db {
    /// A transaction that may write: the administrative functions in [`admin`] and
    /// [`demo`], and the scoped store's units of work.
    ///
    /// On SQLite it begins `IMMEDIATE`, taking the write lock at once (waiting for it up to
    /// the busy timeout). A deferred transaction that reads and then writes can't upgrade to a
    /// writer once another connection has committed since its read, and fails at once with
    /// SQLITE_BUSY, whatever the busy timeout: two tenants writing at the same time made
    /// each other's calls fail that way.
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        Ok(match self.kind {
            DbKind::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            DbKind::Postgres => self.pool.begin().await?,
        })
    }

    /// [`Db::begin`] on a connection the caller already holds.
    pub(crate) async fn begin_on<'c>(
        &self,
        conn: &'c mut sqlx::AnyConnection,
    ) -> Result<sqlx::Transaction<'c, sqlx::Any>, StoreError> {
        use sqlx::Connection as _;
        Ok(match self.kind {
            DbKind::Sqlite => conn.begin_with("BEGIN IMMEDIATE").await?,
            DbKind::Postgres => conn.begin().await?,
        })
    }

    /// The key named `name` that every replica on this database shares (32 bytes): created
    /// at random by the first to ask, read by the others. A stored key that is not 32 bytes
    /// of base64 is an error, never replaced (replicas that disagree would refuse each other).
    pub async fn shared_key(&self, name: &str) -> Result<[u8; 32], StoreError> {
        use base64::Engine as _;
        use base64::engine::general_purpose::STANDARD;
        use ring::rand::{SecureRandom as _, SystemRandom};
        let mut fresh = [0u8; 32];
        SystemRandom::new().fill(&mut fresh).map_err(|_| StoreError::Invalid {
            field: "shared_keys.secret",
            message: "the system random source failed".into(),
        })?;
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO shared_keys (name, secret, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(STANDARD.encode(fresh))
        .bind(now_millis())
        .execute(&mut *tx)
        .await?;
        let stored: String =
            sqlx::query_scalar("SELECT secret FROM shared_keys WHERE name = $1").bind(name).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        STANDARD.decode(stored.trim()).ok().and_then(|b| <[u8; 32]>::try_from(b).ok()).ok_or_else(|| {
            StoreError::Invalid {
                field: "shared_keys.secret",
                message: format!("the stored `{name}` key is not 32 bytes of base64"),
            }
        })
    }

    /// A transaction that only reads (one consistent snapshot), which on SQLite does not hold
    /// the write lock and so never delays writers.
    pub async fn begin_read(&self) -> Result<sqlx::Transaction<'static, sqlx::Any>, StoreError> {
        Ok(self.pool.begin().await?)
    }
}
