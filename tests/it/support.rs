//! Test support: fresh databases (a temporary SQLite file, or a fresh PostgreSQL database),
//! configuration without the process environment, token minting, and gateways on port 0.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use http::StatusCode;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rmcp::model::RequestId;
use scopegate::Gateway;
use scopegate::config::{Config, DEFAULT_TOML};
use scopegate::context::{CallSite, FlockAccess, McpCallContext};
use scopegate::identity::SessionRegistry;
use scopegate::model::Role;
use scopegate::store::{Db, demo};
use serde_json::{Value, json};
use sqlx::Connection;

/// The tests' gateway URL (the token audience is `<PUBLIC_URL>/mcp`).
pub const PUBLIC_URL: &str = "http://gateway.test";
pub const PG_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Runs an async test body once per database: `both_dbs!(name, body_fn)` defines
/// `name::sqlite` and `name::postgres`.
macro_rules! both_dbs {
    ($name:ident, $body:path) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                $body(crate::support::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                $body(crate::support::Backend::Postgres).await
            }
        }
    };
}

/// `all_modes!(name, body)`: `name::{sqlite,postgres}_{session,stateless}`.
macro_rules! all_modes {
    ($name:ident, $body:path) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_session() {
                $body(Backend::Sqlite, Mode::Session).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_stateless() {
                $body(Backend::Sqlite, Mode::Stateless).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_session() {
                $body(Backend::Postgres, Mode::Session).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_stateless() {
                $body(Backend::Postgres, Mode::Stateless).await
            }
        }
    };
}

/// A database that exists for one test and is removed after it.
pub struct TestDb {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    pg_name: Option<String>,
}

fn pg_server_url() -> String {
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
        .merge(Serialized::default("server.public_url", PUBLIC_URL))
        .merge(Serialized::default("database.max_connections", 4));
    for (key, value) in overrides {
        figment = figment.merge(Serialized::default(key, value.clone()));
    }
    Config::from_figment(figment).expect("test configuration is valid")
}

/// Connected and migrated.
pub async fn db_for(config: &Config) -> Db {
    let db = Db::connect(&config.database).await.expect("connect");
    db.migrate().await.expect("migrate");
    db
}

pub async fn seed_demo(db: &Db) {
    assert_eq!(demo::seed(db).await.expect("seed"), demo::SeedOutcome::Seeded);
}

/// Runs one administrative function in its own transaction.
macro_rules! admin_tx {
    ($db:expr, |$tx:ident| $body:expr) => {{
        let mut $tx = $db.begin().await.expect("begin");
        let out = $body.await;
        if out.is_ok() {
            $tx.commit().await.expect("commit");
        }
        out
    }};
}

/// A JWT signer for tests: any algorithm, any claims.
pub struct Signer {
    pub alg: Algorithm,
    pub kid: Option<String>,
    pub key: EncodingKey,
}

pub fn key_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/keys").join(name)
}

impl Signer {
    pub fn hs256(secret: &str) -> Self {
        Self { alg: Algorithm::HS256, kid: None, key: EncodingKey::from_secret(secret.as_bytes()).unwrap() }
    }

    pub fn dev() -> Self {
        Self::hs256(scopegate::config::SHIPPED_DEV_SECRET)
    }

    pub fn from_pem(alg: Algorithm, file: &str, kid: &str) -> Self {
        let pem = std::fs::read(key_path(file)).expect("read key");
        let key = match alg {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
            Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
            other => panic!("no PEM signer for {other:?}"),
        }
        .expect("parse key");
        Self { alg, kid: Some(kid.to_owned()), key }
    }

    /// The public JWK of this signer (asymmetric only).
    pub fn jwk(&self) -> Jwk {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).expect("jwk");
        jwk.common.key_id = self.kid.clone();
        jwk
    }

    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, claims, &self.key).expect("sign")
    }
}

pub fn jwks_json(signers: &[&Signer]) -> String {
    serde_json::to_string(&JwkSet { keys: signers.iter().map(|s| s.jwk()).collect() }).unwrap()
}

pub fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

/// Claims the gateway `config` accepts, for `subject` in `tenant`.
pub fn claims(config: &Config, tenant: &str, subject: &str) -> Value {
    json!({
        "iss": config.auth.issuer,
        "aud": config.audience(),
        "sub": subject,
        "tid": tenant,
        "iat": now(),
        "exp": now() + 600,
    })
}

/// A gateway on port 0 whose only gated route is `/probe`: it counts the requests that
/// reach it and answers with what `McpCallContext` says about the caller (the JSON-RPC id
/// of the call is the `id` of the body; the session is the `mcp-session-id` header).
pub struct Probe {
    pub gateway: Gateway,
    pub reached: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct ProbeState {
    reached: Arc<AtomicUsize>,
    sessions: Arc<SessionRegistry>,
}

async fn probe_handler(State(state): State<ProbeState>, request: axum::extract::Request) -> Response {
    state.reached.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let id: RequestId = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| serde_json::from_value(v.get("id")?.clone()).ok())
        .unwrap_or(RequestId::Number(1));
    let session = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok());
    let site = CallSite { parts: Some(&parts), request_id: &id, session_id: session };
    match McpCallContext::for_call(site, &state.sessions) {
        Ok(ctx) => {
            let flocks = match ctx.flocks() {
                FlockAccess::AllOfTenant => json!("all"),
                FlockAccess::Only(ids) => {
                    json!(ids.iter().map(|f| f.to_string()).collect::<Vec<_>>())
                }
            };
            let roles: Vec<&str> = ctx.roles().iter().map(|r: &Role| r.as_str()).collect();
            axum::Json(json!({
                "tenant": ctx.tenant_slug(),
                "tenant_id": ctx.tenant_id().to_string(),
                "user": ctx.subject(),
                "user_id": ctx.user_id().to_string(),
                "roles": roles,
                "flocks": flocks,
            }))
            .into_response()
        }
        Err(e) => (StatusCode::FORBIDDEN, axum::Json(json!({ "context_error": e.reason() }))).into_response(),
    }
}

impl Probe {
    pub async fn start(config: Config) -> Self {
        let reached = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&reached);
        let gateway = Gateway::build_with(config, move |state| {
            Router::new()
                .route("/probe", any(probe_handler))
                .with_state(ProbeState { reached: counter, sessions: Arc::clone(&state.sessions) })
        })
        .await
        .expect("gateway builds");
        Self { gateway, reached }
    }

    pub fn reached(&self) -> usize {
        self.reached.load(Ordering::SeqCst)
    }

    /// POSTs a JSON-RPC-shaped body with `id` 1 to `/probe` through the whole router.
    pub async fn call(&self, token: Option<&str>) -> (StatusCode, http::HeaderMap, Value) {
        self.request(token, json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}), &[]).await
    }

    pub async fn request(
        &self,
        token: Option<&str>,
        body: Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, http::HeaderMap, Value) {
        use tower::ServiceExt;
        let mut builder = http::Request::post("/probe").header("content-type", "application/json");
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let request = builder.body(axum::body::Body::from(body.to_string())).unwrap();
        let response = self.gateway.router().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, headers, json)
    }
}

/// Convenience: the admin module's functions, for tests that set up data.
pub use scopegate::store::admin as admin_fns;

/// Starts the fixture upstream with `args` (an HTTP mode listening on `127.0.0.1:0`) and
/// `env`; returns the child (killed when dropped) and the address it printed.
pub async fn fixture_http(args: &[&str], env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_scopegate-fixture-upstream"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut first = String::new();
    tokio::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).await.unwrap();
    let addr = first.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {first:?}")).to_owned();
    (child, addr)
}

/// What `binding set` passes the store for `prefixed`: `None` keeps the prefix, else the
/// gateway's native tool names, which an unprefixed server may not shadow.
pub fn unprefixed_beside(prefixed: bool) -> Option<&'static [&'static str]> {
    static NATIVE: std::sync::LazyLock<Vec<&'static str>> =
        std::sync::LazyLock::new(|| scopegate::tools::TOOLS.iter().map(|t| t.name).collect());
    (!prefixed).then(|| NATIVE.as_slice())
}

/// Copies the tree at `from` to `to` (created), files and folders alike.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
