//! Proxied `tools/call` through the gateway (JWT, identity, grants, identity assertion, audit
//! all on; in a session, so on the lean relay) against direct calls to the same Streamable HTTP upstream (the fixture server, a
//! separate process), in the same run, with 1 and with 16 concurrent clients; beside them a
//! bare rmcp forwarder (an rmcp server relaying each call over an rmcp client, nothing else),
//! the floor for any proxy built on rmcp. Gateway, upstream and clients share the machine's
//! CPUs (the clients on a runtime of their own, so the gateway's worker threads serve only the
//! gateway). An `rmcp-path` row calls the same tool through the same gateway from clients that
//! declare `roots` (so an upstream could ask them something, and their calls go through rmcp's
//! server and client instead of the lean relay): the path every proxied call took before the
//! relay. A `remote` row calls the same upstream through a remote executor: a real
//! `scopegate executor` agent process on loopback, so the gateway reaches the upstream over
//! the agent's tunnel; it is compared with the `scopegate` row (the local executor). A
//! `via-peer` row makes the same remote-executor call on a second gateway on the same database,
//! to which the agent is not connected: it reaches the agent through the first gateway (a
//! replica-to-replica link); it is compared with the `remote` row. Prints
//! figures, with the CPU time per call of the serving side and of the upstream (process CPU
//! over the row's turns / calls, from `/proc`); asserts nothing. In a session, the
//! `scopegate` row's calls take the lean relay.
//!
//! `cargo bench --bench proxy` (SECONDS per row, default 5, measured in ROUNDS turns, default
//! 4: the rows take turns, so a change in a shared machine's load falls on all of them;
//! DATABASES, default `sqlite,postgres`; CLIENTS, default `1,16`; ROWS, default
//! `direct,bare-fwd,scopegate,rmcp-path,remote,via-peer,native`; IDENTITY_CACHE_MS and ASSERTION_REUSE_MS, default as
//! shipped; PostgreSQL at
//! SCOPEGATE_BENCH_PG_URL or postgres://postgres@127.0.0.1:5432).

mod support;

use std::sync::Arc;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::{ErrorData, ServerHandler};
use scopegate::Gateway;
use scopegate::auth::mint::dev_token;
use scopegate::config::{Config, DEFAULT_TOML};
use scopegate::model::Role;
use scopegate::store::{demo, entities};
use serde_json::json;
use sqlx::Connection;
use support::{Client, Row, Target, client_runtime, close, connect, connect_all_as, on_clients};

const SCOPEGATE: &str = env!("CARGO_BIN_EXE_scopegate");

/// The floor for any proxy built on rmcp: a bare rmcp server whose `tools/call` forwards to
/// the upstream over one shared rmcp client, with no authentication, identity, grants,
/// assertion or audit. Its gap to `direct` is what rmcp's server and client cost per hop.
#[derive(Clone)]
struct BareForwarder {
    upstream: Arc<Client>,
}

impl ServerHandler for BareForwarder {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.upstream.list_tools(request).await.map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result =
            self.upstream.call_tool(request).await.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(CallToolResponse::Complete(result))
    }
}

/// Serves a [`BareForwarder`] to `upstream` on a port of its own (session mode, like the
/// gateway); returns its URL.
async fn bare_forwarder(upstream: &str) -> String {
    let forwarder = BareForwarder { upstream: Arc::new(connect(upstream, None).await) };
    let config = StreamableHttpServerConfig::default();
    let service =
        StreamableHttpService::new(move || Ok(forwarder.clone()), Arc::new(LocalSessionManager::default()), config);
    support::serve_on_loopback(axum::Router::new().route_service("/mcp", service)).await
}

fn gateway_config(db_url: &str, cache_ms: u64, reuse_ms: Option<u64>) -> Config {
    let mut figment = Figment::from(Toml::string(DEFAULT_TOML))
        .merge(Serialized::default("database.url", db_url))
        .merge(Serialized::default("database.max_connections", 16))
        .merge(Serialized::default("server.listen", "127.0.0.1:0"))
        .merge(Serialized::default("auth.identity_cache_ms", cache_ms))
        .merge(Serialized::default("limits.tenant_per_sec", 0.0))
        .merge(Serialized::default("limits.user_per_sec", 0.0))
        .merge(Serialized::default("telemetry.filter", "warn"));
    if let Some(reuse_ms) = reuse_ms {
        figment = figment.merge(Serialized::default("upstream.assertion_reuse_ms", reuse_ms));
    }
    Config::from_figment(figment).expect("bench configuration")
}

/// The fixture's Streamable HTTP server, verifying assertions against `gateway`'s keys.
async fn fixture(gateway: &str, issuer: &str) -> (tokio::process::Child, String) {
    let jwks = format!("http://{gateway}/.well-known/jwks.json");
    support::fixture_http(&[("FIXTURE_JWKS_URL", &jwks), ("FIXTURE_SERVER_ID", "fx"), ("FIXTURE_ISSUER", issuer)]).await
}

/// Waits (bounded) until the gateway lists `tool`: the agent has connected.
async fn wait_for_tool(url: &str, token: &str, tool: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let client = connect(url, Some(token)).await;
        let listed = client.list_all_tools().await.unwrap_or_default();
        let _ = client.cancel().await;
        if listed.iter().any(|t| t.name == tool) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{tool} never listed: the executor agent did not connect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sqlx::any::install_default_drivers();
    scopegate::http::install_tls_provider();
    let secs: f64 = std::env::var("SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5.0);
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(4).max(1);
    let cache_ms: u64 = support::identity_cache_ms();
    let reuse_ms: Option<u64> =
        std::env::var("ASSERTION_REUSE_MS").ok().map(|v| v.parse().expect("ASSERTION_REUSE_MS"));
    let client_counts: Vec<usize> = std::env::var("CLIENTS")
        .unwrap_or_else(|_| "1,16".to_owned())
        .split(',')
        .map(|n| n.trim().parse().expect("CLIENTS: comma-separated client counts"))
        .collect();
    let clients_rt = client_runtime();
    let rows_spec = std::env::var("ROWS")
        .unwrap_or_else(|_| "direct,bare-fwd,scopegate,rmcp-path,remote,via-peer,native".to_owned());
    let rows: Vec<&str> = rows_spec.split(',').map(str::trim).collect();
    let databases = std::env::var("DATABASES").unwrap_or_else(|_| "sqlite,postgres".to_owned());
    let pg_server =
        std::env::var("SCOPEGATE_BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    println!(
        "tools/call echo on a Streamable HTTP upstream: direct vs through scopegate (session mode), {secs}s per row in {rounds} turns, \
         real HTTP on loopback, auth.identity_cache_ms = {cache_ms}, upstream.assertion_reuse_ms = {}",
        reuse_ms.map_or_else(|| "as shipped".to_owned(), |ms| ms.to_string())
    );
    println!(
        "{:<9} {:>7} {:<9} | {:>9} {:>8} {:>8} | {:>14} {:>15} | {:>13} {:>13}",
        "database",
        "clients",
        "path",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "vs direct/local",
        "added p50 ms",
        "serving µs/call",
        "upstream µs/call"
    );
    for backend in databases.split(',') {
        let dir = tempfile::tempdir().unwrap();
        let pg_name = format!("sg_bench_{}", uuid::Uuid::new_v4().simple());
        let url = if backend == "sqlite" {
            format!("sqlite://{}", dir.path().join("bench.db").display())
        } else {
            let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {pg_name}"))).execute(&mut conn).await.unwrap();
            format!("{pg_server}/{pg_name}")
        };
        let config = gateway_config(&url, cache_ms, reuse_ms);
        let gateway = Gateway::build(config.clone()).await.expect("gateway");
        let addr = gateway.local_addr();
        let public = gateway.state().config.public_url();
        // The real port is known only now, and the token's audience follows it.
        let live_config = Config::clone(&gateway.state().config);
        let db = gateway.state().db.clone();
        demo::seed(&db).await.unwrap();
        tokio::spawn(gateway.run(std::future::pending()));
        let (mut child, upstream_url) = fixture(&addr.to_string(), &public).await;
        let mut tx = db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "bench-host", "gateway", "local", &[]).await.unwrap();
        let declaration = json!({"type": "http", "url": upstream_url});
        entities::create_entity(&mut tx, "acme", "defaults/mcp-servers/fx", &declaration).await.unwrap();
        entities::bind_server(&mut tx, "acme", "fx", "local").await.unwrap();
        entities::grant_tool(&mut tx, "acme", "fx", Role::Owner, "*").await.unwrap();
        // The same upstream through a remote executor, whose agent runs beside the gateway.
        let secret = entities::create_executor(&mut tx, "bench-box", "bench-box", "ci", "remote", &["acme"])
            .await
            .unwrap()
            .expect("a remote executor's secret");
        entities::create_entity(&mut tx, "acme", "defaults/mcp-servers/rx", &declaration).await.unwrap();
        entities::bind_server(&mut tx, "acme", "rx", "bench-box").await.unwrap();
        entities::grant_tool(&mut tx, "acme", "rx", Role::Owner, "*").await.unwrap();
        tx.commit().await.unwrap();
        let secret_file = dir.path().join("bench-box.secret");
        std::fs::write(&secret_file, &secret).unwrap();
        let root = format!("file://{}", dir.path().canonicalize().unwrap().display());
        let mut agent = tokio::process::Command::new(SCOPEGATE)
            .args(["executor", "--gateway", &format!("http://{addr}"), "--name", "bench-box", "--root", &root])
            .arg("--secret-file")
            .arg(&secret_file)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("the agent starts");
        let token = dev_token(&live_config, "acme", "olivia@acme.test", 3600).unwrap();
        let gw_url = format!("http://{addr}/mcp");
        let bare_url = bare_forwarder(&upstream_url).await;
        if rows.contains(&"remote") || rows.contains(&"via-peer") {
            wait_for_tool(&gw_url, &token, "rx__echo").await;
        }
        // A second replica on the same database, without the agent (same public URL: the
        // tokens' audience).
        let mut peer_config = config.clone();
        peer_config.server.public_url = Some(public.clone());
        let peer = Gateway::build(peer_config).await.expect("the second replica");
        let peer_url = format!("http://{}/mcp", peer.local_addr());
        tokio::spawn(peer.run(std::future::pending()));
        if rows.contains(&"via-peer") {
            wait_for_tool(&peer_url, &token, "rx__echo").await;
        }

        for &clients in &client_counts {
            let mut targets = Vec::new();
            for &path in &rows {
                let (name, url, token, tool) = match path {
                    "direct" => ("direct", upstream_url.clone(), None, "echo"),
                    "bare-fwd" => ("bare-fwd", bare_url.clone(), None, "echo"),
                    "scopegate" => ("scopegate", gw_url.clone(), Some(token.clone()), "fx__echo"),
                    "rmcp-path" => ("rmcp-path", gw_url.clone(), Some(token.clone()), "fx__echo"),
                    "remote" => ("remote", gw_url.clone(), Some(token.clone()), "rx__echo"),
                    "via-peer" => ("via-peer", peer_url.clone(), Some(token.clone()), "rx__echo"),
                    // A native call through the same gateway: what the gateway costs without an upstream.
                    "native" => ("native", gw_url.clone(), Some(token.clone()), "whoami"),
                    other => panic!("ROWS: unknown row {other}"),
                };
                let args = if tool.ends_with("echo") { json!({"text": "ping"}) } else { json!({}) };
                let args = args.as_object().cloned().unwrap();
                #[allow(deprecated)]
                let info = if name == "rmcp-path" {
                    ClientConfig::new(
                        ClientCapabilities::builder().enable_roots().build(),
                        Implementation::new("bench", "1.0"),
                    )
                } else {
                    ClientConfig::default()
                };
                let peers =
                    on_clients(&clients_rt, async move { connect_all_as(&url, token.as_deref(), clients, info).await })
                        .await;
                let agent_pid = if matches!(name, "remote" | "via-peer") { agent.id() } else { None };
                let upstream_pids = child.id().filter(|_| name != "native").into_iter().collect();
                targets.push(
                    Target::new(name, peers, tool, args).with_pids(agent_pid.into_iter().collect(), upstream_pids),
                );
            }
            // The paths take turns, so a change in the machine's load falls on all of them.
            let slice = Duration::from_secs_f64(secs / rounds as f64);
            let targets = on_clients(&clients_rt, async move {
                for target in &targets {
                    target.warm_up().await;
                }
                for _ in 0..rounds {
                    for target in &mut targets {
                        target.measure(slice).await;
                    }
                }
                targets
            })
            .await;
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let mut direct_row: Option<Row> = None;
            let mut local_row: Option<Row> = None;
            let mut remote_row: Option<Row> = None;
            for mut target in targets {
                let row = target.row();
                let versus = |base: &Row| {
                    format!(
                        "{:>14.0}% {:>15.3}",
                        100.0 * row.calls_per_sec / base.calls_per_sec,
                        ms(row.p50) - ms(base.p50)
                    )
                };
                let versus = match (target.name, &direct_row, &local_row, &remote_row) {
                    ("bare-fwd" | "scopegate" | "rmcp-path", Some(direct), ..) => versus(direct),
                    ("remote", _, Some(local), _) => versus(local),
                    ("via-peer", .., Some(remote)) => versus(remote),
                    _ => String::new(),
                };
                let versus = if versus.is_empty() { format!("{:>30}", "") } else { versus };
                println!(
                    "{backend:<9} {clients:>7} {:<9} | {:>9.0} {:>8.3} {:>8.3} | {versus} | {:>15.0} {:>16.0}",
                    target.name,
                    row.calls_per_sec,
                    ms(row.p50),
                    ms(row.p99),
                    row.gateway_us,
                    row.upstream_us
                );
                match target.name {
                    "direct" => direct_row = Some(row),
                    "scopegate" => local_row = Some(row),
                    "remote" => remote_row = Some(row),
                    _ => {}
                }
                on_clients(&clients_rt, close(target.peers)).await;
            }
        }
        let mut tx = db.begin().await.unwrap();
        let audited: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__echo'")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        drop(tx);
        println!("{backend:<9} audit events of proxied calls: {audited}");
        let _ = child.kill().await;
        let _ = agent.kill().await;
        db.close().await;
        if backend == "postgres" {
            let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {pg_name} WITH (FORCE)")))
                .execute(&mut conn)
                .await;
        }
    }
    println!(
        "serving µs/call: CPU of the bench process less its client threads (the gateway, or the bare \
         forwarder, whichever the row calls; both replicas for `via-peer`; plus the executor agent \
         for `remote` and `via-peer`) per call; `vs direct/local`: `remote` against `scopegate`, \
         `via-peer` against `remote`; \
         upstream µs/call: CPU of the fixture process per call"
    );
    // A runtime may not be dropped inside another one.
    clients_rt.shutdown_background();
}
