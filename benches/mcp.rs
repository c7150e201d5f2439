//! Native `tools/call` throughput and latency through the whole gateway (JWT, identity,
//! scoped read, audit) beside the same tool served by a bare rmcp server with none of
//! scopegate's layers, in the same run: SQLite and PostgreSQL, session and stateless
//! modes, 16 concurrent clients over real HTTP. Prints figures; asserts nothing.
//!
//! `cargo bench --bench mcp` (SECONDS per row, default 5; CLIENTS, default 16;
//! PostgreSQL at SCOPEGATE_BENCH_PG_URL or postgres://postgres@127.0.0.1:5432).
//! The bare server and the gateway take turns (ROUNDS turns each, default 4, SECONDS split
//! between them), so a change in a shared machine's load falls on both.
//! For profiling one server alone: ROWS (e.g. `sqlite-session,postgres-stateless`) and
//! SERVERS (`bare`, `scopegate`) pick what runs, and DATABASES (`sqlite,postgres`) which
//! databases; by default everything does.
//! IDENTITY_CACHE_MS sets `auth.identity_cache_ms` and SQLITE_SYNCHRONOUS (`full` or
//! `normal`) `database.sqlite_synchronous` (default: as shipped).

mod support;

use std::sync::Arc;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Json;
use rmcp::model::{JsonObject, ServerCapabilities, ServerConfig};
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::{ErrorData, ServerHandler, tool, tool_handler, tool_router};
use scopegate::Gateway;
use scopegate::auth::mint::dev_token;
use scopegate::config::{Config, DEFAULT_TOML};
use scopegate::store::demo;
use serde::Serialize;
use sqlx::{AnyPool, Connection, Row};
use support::{Target, close, connect_all};

/// The bare server: the same read (acme's flocks, by name), no auth, identity or audit.
#[derive(Clone)]
struct Bare {
    pool: AnyPool,
    tenant: String,
    tool_router: ToolRouter<Bare>,
}

#[derive(Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct BareFlock {
    id: String,
    name: String,
    breed: String,
    hen_count: i64,
}

#[derive(Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct BareFlocks {
    flocks: Vec<BareFlock>,
}

#[tool_router]
impl Bare {
    #[tool(description = "List flocks")]
    async fn list_flocks(&self) -> Result<Json<BareFlocks>, ErrorData> {
        let rows = sqlx::query("SELECT id, name, breed, hen_count FROM flocks WHERE tenant_id = $1 ORDER BY name")
            .bind(&self.tenant)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let flocks = rows
            .iter()
            .map(|r| BareFlock {
                id: r.get("id"),
                name: r.get("name"),
                breed: r.get("breed"),
                hen_count: r.get("hen_count"),
            })
            .collect();
        Ok(Json(BareFlocks { flocks }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bare {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

fn gateway_config(db_url: &str, stateless: bool, cache_ms: u64, synchronous: &str) -> Config {
    let figment = Figment::from(Toml::string(DEFAULT_TOML))
        .merge(Serialized::default("database.url", db_url))
        .merge(Serialized::default("database.max_connections", 16))
        .merge(Serialized::default("server.listen", "127.0.0.1:0"))
        .merge(Serialized::default("metrics.listen", "127.0.0.1:0"))
        .merge(Serialized::default("server.public_url", "http://bench.test"))
        .merge(Serialized::default("mcp.stateless", stateless))
        .merge(Serialized::default("auth.identity_cache_ms", cache_ms))
        .merge(Serialized::default("limits.tenant_per_sec", 0.0))
        .merge(Serialized::default("limits.user_per_sec", 0.0))
        .merge(Serialized::default("telemetry.filter", "warn"))
        .merge(Serialized::default("database.sqlite_synchronous", synchronous));
    Config::from_figment(figment).expect("bench configuration")
}

async fn bare_server(db_url: &str, stateless: bool) -> String {
    let pool = AnyPool::connect(&any_url(db_url)).await.unwrap();
    let tenant: String =
        sqlx::query_scalar("SELECT id FROM tenants WHERE slug = 'acme'").fetch_one(&pool).await.unwrap();
    let bare = Bare { pool, tenant, tool_router: Bare::tool_router() };
    let config = StreamableHttpServerConfig::default().with_legacy_session_mode(!stateless);
    let service =
        StreamableHttpService::new(move || Ok(bare.clone()), Arc::new(LocalSessionManager::default()), config);
    support::serve_on_loopback(axum::Router::new().route_service("/mcp", service)).await
}

fn any_url(db_url: &str) -> String {
    match db_url.strip_prefix("sqlite://") {
        Some(path) => format!("sqlite://{path}?mode=rwc"),
        None => db_url.to_owned(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sqlx::any::install_default_drivers();
    scopegate::http::install_tls_provider();
    let secs: f64 = std::env::var("SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5.0);
    let clients: usize = std::env::var("CLIENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4).max(1);
    // auth.identity_cache_ms for the gateway (the shipped default unless IDENTITY_CACHE_MS says).
    let cache_ms: u64 = support::identity_cache_ms();
    // database.sqlite_synchronous (the shipped default unless SQLITE_SYNCHRONOUS says).
    let synchronous = std::env::var("SQLITE_SYNCHRONOUS").unwrap_or_else(|_| {
        Figment::from(Toml::string(DEFAULT_TOML))
            .extract_inner("database.sqlite_synchronous")
            .expect("the shipped default")
    });
    let pg_server =
        std::env::var("SCOPEGATE_BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    println!(
        "tools/call list_flocks: {clients} concurrent clients, {secs}s per server and row in {rounds} turns, \
         real HTTP on loopback, auth.identity_cache_ms = {cache_ms}, database.sqlite_synchronous = {synchronous}"
    );
    println!(
        "{:<9} {:<9} {:<9} | {:>9} {:>8} {:>8} | {:>13}",
        "database", "mode", "server", "calls/s", "p50 ms", "p99 ms", "gateway/bare"
    );
    let rows = std::env::var("ROWS").unwrap_or_default();
    let servers = std::env::var("SERVERS").unwrap_or_else(|_| "bare,scopegate".to_owned());
    let databases = std::env::var("DATABASES").unwrap_or_else(|_| "sqlite,postgres".to_owned());
    for backend in ["sqlite", "postgres"].into_iter().filter(|b| databases.split(',').any(|d| d == *b)) {
        for stateless in [false, true] {
            let mode = if stateless { "stateless" } else { "session" };
            if !rows.is_empty() && !rows.split(',').any(|r| r == format!("{backend}-{mode}")) {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let pg_name = format!("sg_bench_{}", uuid::Uuid::new_v4().simple());
            let url = if backend == "sqlite" {
                format!("sqlite://{}", dir.path().join("bench.db").display())
            } else {
                let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {pg_name}")))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                format!("{pg_server}/{pg_name}")
            };
            let config = gateway_config(&url, stateless, cache_ms, &synchronous);
            let gateway = Gateway::build(config.clone()).await.expect("gateway");
            demo::seed(&gateway.state().db).await.unwrap();
            let gw_url = format!("http://{}/mcp", gateway.local_addr());
            let metrics_url = format!("http://{}/metrics", gateway.metrics_addr().expect("metrics are on"));
            let db = gateway.state().db.clone();
            tokio::spawn(gateway.run(std::future::pending()));
            let token = dev_token(&config, "acme", "olivia@acme.test", 3600).unwrap();
            let bare_url = bare_server(&url, stateless).await;

            let mut targets = Vec::new();
            if servers.contains("bare") {
                let peers = connect_all(&bare_url, None, clients).await;
                targets.push(Target::new("bare", peers, "list_flocks", JsonObject::new()));
            }
            if servers.contains("scopegate") {
                let peers = connect_all(&gw_url, Some(&token), clients).await;
                targets.push(Target::new("scopegate", peers, "list_flocks", JsonObject::new()));
            }
            for target in &targets {
                target.warm_up().await;
            }
            // The servers take turns, so a change in the machine's load falls on both.
            for _ in 0..rounds {
                for target in &mut targets {
                    target.measure(Duration::from_secs_f64(secs / rounds as f64)).await;
                }
            }
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let mut bare_rate = None;
            for mut target in targets {
                let row = target.row();
                let ratio = match (target.name, bare_rate) {
                    ("bare", _) => {
                        bare_rate = Some(row.calls_per_sec);
                        String::new()
                    }
                    (_, Some(bare)) => format!("{:>12.0}%", 100.0 * row.calls_per_sec / bare),
                    (_, None) => String::new(),
                };
                println!(
                    "{backend:<9} {mode:<9} {:<9} | {:>9.0} {:>8.2} {:>8.2} | {ratio}",
                    target.name,
                    row.calls_per_sec,
                    ms(row.p50),
                    ms(row.p99)
                );
                close(target.peers).await;
            }
            let mut tx = db.begin().await.unwrap();
            let audited: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM audit_events").fetch_one(&mut *tx).await.unwrap();
            drop(tx);
            let metrics = reqwest::get(&metrics_url).await.unwrap().text().await.unwrap();
            let stat = |name: &str| -> f64 {
                metrics
                    .lines()
                    .find(|l| l.starts_with(name) && !l.contains('{'))
                    .and_then(|l| l.split_whitespace().last())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            let batches = stat("scopegate_audit_batch_events_count");
            let commit_secs = stat("scopegate_audit_commit_duration_seconds_sum");
            println!(
                "{backend:<9} {mode:<9} audit events written: {audited}; group commits so far (all rows): {batches:.0}, \
                 mean {:.1} events and {:.2} ms each",
                stat("scopegate_audit_batch_events_sum") / batches.max(1.0),
                1e3 * commit_secs / batches.max(1.0)
            );
            db.close().await;
            if backend == "postgres" {
                let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {pg_name} WITH (FORCE)")))
                    .execute(&mut conn)
                    .await;
            }
        }
    }
}
