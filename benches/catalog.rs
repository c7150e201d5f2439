//! `tools/list` through the gateway as the tenant's catalog grows: one tenant with 1, 10 and
//! 50 upstream servers of 20 tools each (the fixture's Streamable HTTP server with
//! FIXTURE_TOOLS=20, a process per server), every tool granted to the caller's role, listed by
//! rmcp clients over real HTTP (session mode, default configuration, rate limits off). Each
//! row is a gateway of its own with its own upstreams, and gives three figures:
//! - cold: the gateway's first `tools/list`, which starts every upstream connection (handshake
//!   and the upstream's own `tools/list`). The gateway has served one native call before it,
//!   so its own first-use costs are not in the figure.
//! - first in a session: a new session's first `tools/list`, the connections and their lists
//!   warm; the session resolves its servers and grants from the database once.
//! - warm: further `tools/list`s in one session, which reuses the session's servers and each
//!   connection's list: the gateway filters by grant, names and serialises.
//!
//! A `direct` row lists one fixture (20 tools) straight, without the gateway: the floor. The
//! rows take turns (ROUNDS), so a change in a shared machine's load falls on all of them. The
//! clients run on a runtime of their own. Prints figures; asserts only the number of tools
//! listed (and that the client did not answer from its own cache).
//!
//! `cargo bench --bench catalog`. Environment: SERVERS (default `1,10,50`), TOOLS per server
//! (default 20), CALLS warm calls per row (default 400), NEW_SESSIONS first calls per row
//! (default 40), ROUNDS (default 4), DATABASES (default `sqlite,postgres`; PostgreSQL at
//! SCOPEGATE_BENCH_PG_URL or postgres://postgres@127.0.0.1:5432).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use rmcp::model::{CallToolRequestParams, ListToolsResult};
use scopegate::Gateway;
use scopegate::auth::mint::dev_token;
use scopegate::config::{Config, DEFAULT_TOML};
use scopegate::model::Role;
use scopegate::store::{Db, demo, entities};
use serde_json::json;
use sqlx::Connection;
use support::{Client, client_runtime, connect, on_clients};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn gateway_config(db_url: &str) -> Config {
    let figment = Figment::from(Toml::string(DEFAULT_TOML))
        .merge(Serialized::default("database.url", db_url))
        .merge(Serialized::default("server.listen", "127.0.0.1:0"))
        .merge(Serialized::default("limits.tenant_per_sec", 0.0))
        .merge(Serialized::default("limits.user_per_sec", 0.0))
        .merge(Serialized::default("telemetry.filter", "warn"));
    Config::from_figment(figment).expect("bench configuration")
}

/// A fixture upstream on Streamable HTTP listing `tools` tools; the child and its `/mcp` URL.
async fn fixture(tools: usize) -> (tokio::process::Child, String) {
    support::fixture_http(&[("FIXTURE_TOOLS", &tools.to_string())]).await
}

/// A database for one row: a SQLite file in `dir`, or a new PostgreSQL database (its name).
async fn database(backend: &str, dir: &std::path::Path, pg_server: &str) -> (String, Option<String>) {
    if backend == "postgres" {
        let name = format!("sg_bench_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
        (format!("{pg_server}/{name}"), Some(name))
    } else {
        (format!("sqlite://{}", dir.join("bench.db").display()), None)
    }
}

/// Registers `upstreams` for acme as servers `s01`, `s02`, ... on the local executor, every
/// tool granted to owners.
async fn register(db: &Db, upstreams: &[String]) {
    let mut tx = db.begin().await.unwrap();
    entities::create_executor(&mut tx, "local", "bench-host", "gateway", "local", &[]).await.unwrap();
    for (i, url) in upstreams.iter().enumerate() {
        let server = format!("s{:02}", i + 1);
        let declaration = json!({"type": "http", "url": url});
        entities::create_entity(&mut tx, "acme", &format!("defaults/mcp-servers/{server}"), &declaration)
            .await
            .unwrap();
        entities::bind_server(&mut tx, "acme", &server, "local").await.unwrap();
        entities::grant_tool(&mut tx, "acme", &server, Role::Owner, "*").await.unwrap();
    }
    tx.commit().await.unwrap();
}

/// One `tools/list` (a single request: the gateway answers every tool on one page), timed.
async fn timed_list(client: &Client) -> (Duration, ListToolsResult) {
    let started = Instant::now();
    let listed = client.list_tools(None).await.expect("tools/list");
    let took = started.elapsed();
    // Without a ttl the client keeps nothing, so every call reached the server.
    assert!(listed.ttl_ms.is_none(), "the list came with a ttl: the client may answer from its cache");
    (took, listed)
}

/// One row: a gateway with `servers` upstreams (or, for `direct`, one upstream alone).
struct Row {
    name: String,
    url: String,
    token: Option<String>,
    /// The session of the warm calls.
    session: Arc<Client>,
    cold: Duration,
    listed: usize,
    json_bytes: usize,
    warm: Vec<Duration>,
    first: Vec<Duration>,
    /// What the row holds until the end: its upstreams, its gateway (stopped by sending on
    /// `stop`) and its database's name.
    upstreams: Vec<tokio::process::Child>,
    gateway: Option<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<std::io::Result<()>>)>,
    pg_name: Option<String>,
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(lat: &mut [Duration]) -> Stats {
    lat.sort();
    if lat.is_empty() {
        return Stats { p50: Duration::ZERO, p99: Duration::ZERO, mean: Duration::ZERO };
    }
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    let mean = lat.iter().sum::<Duration>() / lat.len() as u32;
    Stats { p50: at(0.5), p99: at(0.99), mean }
}

/// Starts a gateway on a fresh database with `servers` fresh upstreams, and measures its
/// cold `tools/list`.
async fn gateway_row(
    backend: &str,
    servers: usize,
    tools: usize,
    pg_server: &str,
    dir: &std::path::Path,
    clients_rt: &tokio::runtime::Runtime,
) -> Row {
    let (db_url, pg_name) = database(backend, dir, pg_server).await;
    let gateway = Gateway::build(gateway_config(&db_url)).await.expect("gateway");
    let addr = gateway.local_addr();
    // The real port is known only now, and the token's audience follows it.
    let live_config = Config::clone(&gateway.state().config);
    let db = gateway.state().db.clone();
    demo::seed(&db).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(gateway.run(async move {
        let _ = stopped.await;
    }));
    let mut upstreams = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..servers {
        let (child, url) = fixture(tools).await;
        upstreams.push(child);
        urls.push(url);
    }
    register(&db, &urls).await;
    let token = dev_token(&live_config, "acme", "olivia@acme.test", 3600).unwrap();
    let url = format!("http://{addr}/mcp");
    let (u, t) = (url.clone(), token.clone());
    let (session, cold, listed) = on_clients(clients_rt, async move {
        // One native call first, in a session of its own: the gateway's own first-use costs
        // (identity, database, audit) are then not in the cold figure.
        let warmer = connect(&u, Some(&t)).await;
        warmer.call_tool(CallToolRequestParams::new("whoami")).await.expect("whoami");
        let _ = warmer.cancel().await;
        let session = connect(&u, Some(&t)).await;
        let (cold, listed) = timed_list(&session).await;
        (Arc::new(session), cold, listed)
    })
    .await;
    let upstream_tools = listed.tools.iter().filter(|t| t.name.contains("__")).count();
    assert_eq!(upstream_tools, servers * tools, "every upstream tool is listed");
    Row {
        name: format!("{servers}"),
        url,
        token: Some(token),
        session,
        cold,
        listed: listed.tools.len(),
        json_bytes: serde_json::to_vec(&listed).unwrap().len(),
        warm: Vec::new(),
        first: Vec::new(),
        upstreams,
        gateway: Some((stop, running)),
        pg_name,
    }
}

/// The floor: one fixture of `tools` tools listed straight, without the gateway.
async fn direct_row(tools: usize, clients_rt: &tokio::runtime::Runtime) -> Row {
    let (child, url) = fixture(tools).await;
    let u = url.clone();
    let (session, cold, listed) = on_clients(clients_rt, async move {
        let session = connect(&u, None).await;
        let (cold, listed) = timed_list(&session).await;
        (Arc::new(session), cold, listed)
    })
    .await;
    assert_eq!(listed.tools.len(), tools, "the fixture lists its tools");
    Row {
        name: "direct".to_owned(),
        url,
        token: None,
        session,
        cold,
        listed: listed.tools.len(),
        json_bytes: serde_json::to_vec(&listed).unwrap().len(),
        warm: Vec::new(),
        first: Vec::new(),
        upstreams: vec![child],
        gateway: None,
        pg_name: None,
    }
}

/// `calls` warm `tools/list`s in the row's session, then `firsts` new sessions' first ones.
async fn turn(
    row: &Row,
    calls: usize,
    firsts: usize,
    clients_rt: &tokio::runtime::Runtime,
) -> (Vec<Duration>, Vec<Duration>) {
    let (session, url, token) = (Arc::clone(&row.session), row.url.clone(), row.token.clone());
    on_clients(clients_rt, async move {
        let mut warm = Vec::with_capacity(calls);
        for _ in 0..calls {
            warm.push(timed_list(&session).await.0);
        }
        let mut first = Vec::with_capacity(firsts);
        for _ in 0..firsts {
            let fresh = connect(&url, token.as_deref()).await;
            first.push(timed_list(&fresh).await.0);
            let _ = fresh.cancel().await;
        }
        (warm, first)
    })
    .await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sqlx::any::install_default_drivers();
    scopegate::http::install_tls_provider();
    let server_counts: Vec<usize> = std::env::var("SERVERS")
        .unwrap_or_else(|_| "1,10,50".to_owned())
        .split(',')
        .map(|n| n.trim().parse().expect("SERVERS: comma-separated server counts"))
        .collect();
    let tools: usize = env_or("TOOLS", 20);
    let calls: usize = env_or("CALLS", 400);
    let firsts: usize = env_or("NEW_SESSIONS", 40);
    let rounds: usize = env_or("ROUNDS", 4usize).max(1);
    let databases = std::env::var("DATABASES").unwrap_or_else(|_| "sqlite,postgres".to_owned());
    let pg_server =
        std::env::var("SCOPEGATE_BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    let clients_rt = client_runtime();
    println!(
        "tools/list through scopegate (session mode, default configuration, rate limits off) with {server_counts:?} \
         upstream servers of {tools} tools each (the fixture over Streamable HTTP, a process per server, every tool \
         granted), real HTTP on loopback; per row: the cold call, {firsts} new sessions' first calls and {calls} warm \
         calls, in {rounds} turns"
    );
    println!(
        "{:<9} {:>7} {:>7} {:>8} | {:>8} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>10}",
        "database",
        "servers",
        "tools",
        "KiB",
        "cold ms",
        "1st p50",
        "1st p99",
        "1st mean",
        "warm p50",
        "warm p99",
        "warm mean",
        "warm p50 x"
    );
    for backend in databases.split(',').map(str::trim) {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = vec![direct_row(tools, &clients_rt).await];
        for &servers in &server_counts {
            let row_dir = dir.path().join(format!("s{servers}"));
            std::fs::create_dir_all(&row_dir).unwrap();
            rows.push(gateway_row(backend, servers, tools, &pg_server, &row_dir, &clients_rt).await);
        }
        // The rows take turns, so a change in the machine's load falls on all of them.
        for round in 0..rounds {
            let share = |n: usize| n * (round + 1) / rounds - n * round / rounds;
            for row in &mut rows {
                let (warm, first) = turn(row, share(calls), share(firsts), &clients_rt).await;
                row.warm.extend(warm);
                row.first.extend(first);
            }
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut base: Option<f64> = None;
        for row in &mut rows {
            let (first, warm) = (stats(&mut row.first), stats(&mut row.warm));
            // Ratios against the smallest gateway row.
            let ratio = match (row.name.as_str(), base) {
                ("direct", _) => String::new(),
                (_, None) => {
                    base = Some(ms(warm.p50));
                    "1.00".to_owned()
                }
                (_, Some(b)) => format!("{:.2}", ms(warm.p50) / b),
            };
            println!(
                "{backend:<9} {:>7} {:>7} {:>8.1} | {:>8.2} | {:>9.3} {:>9.3} {:>9.3} | {:>9.3} {:>9.3} {:>9.3} | {ratio:>10}",
                row.name,
                row.listed,
                row.json_bytes as f64 / 1024.0,
                ms(row.cold),
                ms(first.p50),
                ms(first.p99),
                ms(first.mean),
                ms(warm.p50),
                ms(warm.p99),
                ms(warm.mean),
            );
        }
        for row in rows {
            if let Ok(session) = Arc::try_unwrap(row.session) {
                on_clients(&clients_rt, async move {
                    let _ = session.cancel().await;
                })
                .await;
            }
            if let Some((stop, running)) = row.gateway {
                let _ = stop.send(());
                let _ = tokio::time::timeout(Duration::from_secs(15), running).await;
            }
            drop(row.upstreams);
            if let Some(name) = row.pg_name {
                let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)")))
                    .execute(&mut conn)
                    .await;
            }
        }
    }
    println!(
        "tools: every tool listed (the gateway's native tools and servers x tools upstream ones); KiB: the JSON of \
         the list; cold: the gateway's first tools/list, which starts every upstream connection; 1st: a new \
         session's first tools/list (connections warm); warm: further tools/list in one session; warm p50 x: \
         against the first gateway row"
    );
    // A runtime may not be dropped inside another one.
    clients_rt.shutdown_background();
}
