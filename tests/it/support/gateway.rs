//! The one way a test gets a gateway: [`TestGateway`] sets up a fresh database (SQLite or
//! PostgreSQL), the configuration with the test's overrides, the demo data and the tool set,
//! and starts the gateway in this process on port 0 as a [`Live`], which signs tokens for it,
//! connects clients to it, stops and restarts it, and runs replicas beside it.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ServiceExt};
use scopegate::Gateway;
use scopegate::config::Config;
use scopegate::executor::remote::Agents;
use scopegate::http::AppState;
use scopegate::mcp::ToolSet;
use scopegate::store::Db;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::clients::transport;
use super::db::{Backend, TestDb, config_from_file, config_with, db_for, seed_demo};
use super::probe::Probe;
use super::tokens::{Signer, claims, tenant_of};
use super::wait::patience;

/// How long a stopped gateway may take to finish (its shutdown grace, at most a few seconds
/// in these tests, plus closing its pool).
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Whether the gateway keeps MCP sessions (`mcp.stateless`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Session,
    Stateless,
}

/// What a test's gateway is made of; [`TestGateway::start`] builds and serves it.
#[must_use]
pub struct TestGateway {
    backend: Backend,
    overrides: Vec<(String, Value)>,
    /// A configuration file's text, in place of the tests' defaults.
    file: Option<String>,
    seed: bool,
    tools: Option<ToolSet>,
}

impl TestGateway {
    /// A gateway on `backend` with the demo data, the native tools and the tests' defaults.
    pub fn new(backend: Backend) -> Self {
        Self { backend, overrides: Vec::new(), file: None, seed: true, tools: None }
    }

    pub fn mode(self, mode: Mode) -> Self {
        self.set("mcp.stateless", json!(mode == Mode::Stateless))
    }

    /// One configuration setting (a dotted key); later settings win.
    pub fn set(mut self, key: &str, value: Value) -> Self {
        self.overrides.push((key.to_owned(), value));
        self
    }

    /// Configured by `toml`, a configuration file's text, as `--config FILE` configures a
    /// gateway: over the built-in defaults, not the tests' (see [`config_from_file`]).
    pub fn config_file(mut self, toml: &str) -> Self {
        self.file = Some(toml.to_owned());
        self
    }

    /// Several settings, in order.
    pub fn overrides(mut self, overrides: &[(&str, Value)]) -> Self {
        self.overrides.extend(overrides.iter().map(|(key, value)| ((*key).to_owned(), value.clone())));
        self
    }

    /// Serves `tools` (the native tools plus any the test registers) instead of the native ones.
    pub fn tools(mut self, tools: ToolSet) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Without the demo data: the database is only migrated.
    pub fn unseeded(mut self) -> Self {
        self.seed = false;
        self
    }

    /// The database and the configuration, for a test that sets data up before the gateway
    /// starts, or starts it some other way.
    pub async fn prepare(self) -> Prepared {
        scopegate::http::install_tls_provider();
        let test_db = TestDb::new(self.backend).await;
        let overrides: Vec<(&str, Value)> = self.overrides.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let config = match &self.file {
            Some(toml) => config_from_file(&test_db.url, toml, &overrides),
            None => config_with(&test_db.url, &overrides),
        };
        let db = db_for(&config).await;
        if self.seed {
            seed_demo(&db).await;
        }
        Prepared { config, db, test_db, tools: self.tools }
    }

    pub async fn start(self) -> Live {
        self.prepare().await.start().await
    }
}

/// A test's database, set up, and the configuration of its gateway, not started yet.
pub struct Prepared {
    pub config: Config,
    pub db: Db,
    /// Keep it: dropping it drops the database.
    pub test_db: TestDb,
    tools: Option<ToolSet>,
}

impl Prepared {
    pub async fn start(self) -> Live {
        let Self { config, db, test_db, tools } = self;
        let gateway = Running::start(config.clone(), tools.unwrap_or_else(ToolSet::native)).await;
        let mut config = config;
        config.server.listen = gateway.addr;
        Live { addr: gateway.addr, config, db, gateway, _test_db: test_db }
    }

    /// A gateway of this configuration whose only gated route is the probe (see [`Probe`]).
    pub async fn probe(&self) -> Probe {
        Probe::start(self.config.clone()).await
    }
}

/// A gateway serving in this process (stopped when dropped), its configuration, and its
/// database (dropped with it).
pub struct Live {
    pub addr: SocketAddr,
    /// As served: `server.listen` is the bound address.
    pub config: Config,
    pub db: Db,
    gateway: Running,
    _test_db: TestDb,
}

impl Live {
    pub async fn start(backend: Backend, mode: Mode, overrides: &[(&str, Value)]) -> Self {
        TestGateway::new(backend).mode(mode).overrides(overrides).start().await
    }

    /// A gateway serving `tools` (the native tools plus any a test registers).
    pub async fn start_with_tools(backend: Backend, mode: Mode, overrides: &[(&str, Value)], tools: ToolSet) -> Self {
        TestGateway::new(backend).mode(mode).overrides(overrides).tools(tools).start().await
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("{}/mcp", self.base_url())
    }

    pub fn token(&self, tenant: &str, subject: &str) -> String {
        Signer::hs256(self.config.auth.hs256_secret.expose()).sign(&claims(&self.config, tenant, subject))
    }

    /// A token for `subject`, of the tenant its domain names.
    pub fn token_for(&self, subject: &str) -> String {
        self.token(tenant_of(subject), subject)
    }

    /// rmcp's transport to this gateway, with `subject`'s token.
    pub fn transport(&self, subject: &str) -> StreamableHttpClientTransport<reqwest::Client> {
        transport(&self.url(), &self.token_for(subject))
    }

    pub async fn client(&self, subject: &str) -> RunningService<RoleClient, ()> {
        self.client_with(subject, ()).await
    }

    /// rmcp's client for `subject` with `handler` (its capabilities and what it does with
    /// what the gateway sends it).
    pub async fn client_with<H: ClientHandler>(&self, subject: &str, handler: H) -> RunningService<RoleClient, H> {
        handler.serve(self.transport(subject)).await.unwrap_or_else(|e| panic!("{subject} connects: {e}"))
    }

    /// A client of the replica at `base` (`http://ADDR`), with a token of this gateway.
    pub async fn client_at(&self, base: &str, subject: &str) -> RunningService<RoleClient, ()> {
        let transport = transport(&format!("{base}/mcp"), &self.token_for(subject));
        ().serve(transport).await.unwrap_or_else(|e| panic!("{subject} connects to {base}: {e}"))
    }

    pub async fn count(&self, sql: &str) -> i64 {
        if sql.contains("audit_events") {
            self.settle_audit().await;
        }
        let mut tx = self.db.begin().await.unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned())).fetch_one(&mut *tx).await.unwrap()
    }

    /// Returns once every audit event of a call answered so far is committed: a forwarded
    /// call's outcome is appended after its answer, and waits a little to ride in another
    /// commit.
    pub async fn settle_audit(&self) {
        self.gateway.state().audit.flush().await;
    }

    /// Runs `sql` (a change made by hand, as an operator could) and commits it.
    pub async fn execute(&self, sql: &str) {
        let mut tx = self.db.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
    }

    pub async fn flock_id(&self, name: &str) -> String {
        let mut tx = self.db.begin().await.unwrap();
        sqlx::query_scalar("SELECT id FROM flocks WHERE name = $1").bind(name).fetch_one(&mut *tx).await.unwrap()
    }

    /// The Prometheus text of `/metrics`, on the metrics listener.
    pub async fn metrics(&self) -> String {
        self.gateway.metrics().await
    }

    /// Where the metrics listener serves `/metrics` (`http://ADDR/metrics`).
    pub fn metrics_url(&self) -> String {
        self.gateway.metrics_url()
    }

    /// The metrics listener's address; `None` with metrics off.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.gateway.metrics_addr
    }

    pub fn state(&self) -> &AppState {
        &self.gateway.state
    }

    /// The executor agents connected to the running gateway (new at each start).
    pub fn agents(&self) -> &Arc<Agents> {
        &self.gateway.agents
    }

    /// Tells the gateway to stop and hands back its task, which ends when it has.
    pub fn shutdown(&mut self) -> JoinHandle<io::Result<()>> {
        self.gateway.shutdown()
    }

    /// Stops the gateway and waits (bounded) until it has.
    pub async fn stop(&mut self) {
        self.gateway.stop().await;
    }

    /// Starts the gateway again on the address it had, with the native tools.
    pub async fn restart(&mut self) {
        self.gateway = Running::start(self.config.clone(), ToolSet::native()).await;
        self.addr = self.gateway.addr;
    }

    /// Another replica on the same database and configuration, on a port of its own.
    pub async fn replica(&self) -> Running {
        let mut config = self.config.clone();
        config.server.listen = "127.0.0.1:0".parse().unwrap();
        Running::start(config, ToolSet::native()).await
    }
}

/// A gateway serving in this process until it is stopped or dropped.
pub struct Running {
    pub addr: SocketAddr,
    /// The metrics listener's address (metrics are on in the tests' configuration).
    pub metrics_addr: Option<SocketAddr>,
    state: AppState,
    agents: Arc<Agents>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl Running {
    pub async fn start(config: Config, tools: ToolSet) -> Self {
        // As the binary does: this build's compiled walk is the report the gateway serves.
        scopegate::admin::report::install(scopegate::embedded_guard_report!());
        let gateway = Gateway::build_with_tools(config, tools).await.expect("the gateway builds");
        let (addr, state, agents) = (gateway.local_addr(), gateway.state().clone(), Arc::clone(gateway.agents()));
        let metrics_addr = gateway.metrics_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(gateway.run(async move {
            let _ = stopped.await;
        }));
        Self { addr, metrics_addr, state, agents, stop: Some(stop), task: Some(task) }
    }

    /// `http://ADDR/metrics` on the metrics listener.
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics_addr.expect("metrics are enabled"))
    }

    /// The Prometheus text of `/metrics`, on the metrics listener.
    pub async fn metrics(&self) -> String {
        reqwest::get(self.metrics_url()).await.unwrap().text().await.unwrap()
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn url(&self) -> String {
        format!("{}/mcp", self.base_url())
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Tells the gateway to stop and hands back its task, which ends when it has.
    pub fn shutdown(&mut self) -> JoinHandle<io::Result<()>> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.take().expect("the gateway runs")
    }

    /// Stops the gateway and waits (bounded) until it has.
    pub async fn stop(&mut self) {
        if self.task.is_some() {
            let _ = tokio::time::timeout(patience(STOP_WAIT), self.shutdown()).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
