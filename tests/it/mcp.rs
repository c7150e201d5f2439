//! End to end: rmcp's own client over real HTTP against a gateway on port 0, on SQLite and
//! PostgreSQL, in session mode and in stateless mode.

use std::net::SocketAddr;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ErrorData, ServiceExt};
use scopegate::Gateway;
use scopegate::config::Config;
use scopegate::store::Db;
use scopegate::tools::ERROR_CLASS_META;
use serde_json::{Value, json};

use crate::support::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Session,
    Stateless,
}

/// A running gateway with the demo data.
pub struct Live {
    pub addr: SocketAddr,
    pub config: Config,
    pub db: Db,
    _test_db: TestDb,
}

impl Live {
    pub async fn start(backend: Backend, mode: Mode, overrides: &[(&str, Value)]) -> Self {
        Self::start_with_tools(backend, mode, overrides, scopegate::mcp::ToolSet::native()).await
    }

    /// A gateway serving `tools` (the native tools plus any a test registers).
    pub async fn start_with_tools(
        backend: Backend,
        mode: Mode,
        overrides: &[(&str, Value)],
        tools: scopegate::mcp::ToolSet,
    ) -> Self {
        scopegate::http::install_tls_provider();
        let test_db = TestDb::new(backend).await;
        let mut all = vec![("mcp.stateless", json!(mode == Mode::Stateless))];
        all.extend(overrides.iter().cloned());
        let config = config_with(&test_db.url, &all);
        let db = db_for(&config).await;
        seed_demo(&db).await;
        let gateway = Gateway::build_with_tools(config.clone(), tools).await.expect("gateway");
        let addr = gateway.local_addr();
        tokio::spawn(gateway.run(std::future::pending()));
        Self { addr, config, db, _test_db: test_db }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn token(&self, tenant: &str, subject: &str) -> String {
        Signer::dev().sign(&claims(&self.config, tenant, subject))
    }

    pub fn token_for(&self, subject: &str) -> String {
        let tenant = subject.rsplit('@').next().unwrap().split('.').next().unwrap();
        self.token(tenant, subject)
    }

    pub async fn client(&self, subject: &str) -> RunningService<RoleClient, ()> {
        let transport = StreamableHttpClientTransport::with_client(
            reqwest::Client::builder().tcp_nodelay(true).build().unwrap(),
            StreamableHttpClientTransportConfig::with_uri(self.url()).auth_header(self.token_for(subject)),
        );
        ().serve(transport).await.unwrap_or_else(|e| panic!("{subject} connects: {e}"))
    }

    pub async fn count(&self, sql: &str) -> i64 {
        let mut tx = self.db.begin().await.unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned())).fetch_one(&mut *tx).await.unwrap()
    }

    pub async fn flock_id(&self, name: &str) -> String {
        let mut tx = self.db.begin().await.unwrap();
        sqlx::query_scalar("SELECT id FROM flocks WHERE name = $1").bind(name).fetch_one(&mut *tx).await.unwrap()
    }
}

pub async fn call(client: &Peer<RoleClient>, tool: &str, args: Value) -> Result<CallToolResult, ErrorData> {
    let params =
        CallToolRequestParams::new(tool.to_owned()).with_arguments(args.as_object().cloned().unwrap_or_default());
    match client.call_tool(params).await {
        Ok(result) => Ok(result),
        Err(ServiceError::McpError(e)) => Err(e),
        Err(other) => panic!("{tool}: transport failure {other}"),
    }
}

/// The structured content of a successful call.
pub async fn ok(client: &Peer<RoleClient>, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args.clone()).await.unwrap_or_else(|e| panic!("{tool} {args}: {e:?}"));
    assert_ne!(result.is_error, Some(true), "{tool} {args}: {result:?}");
    result.structured_content.expect("structured output")
}

/// The tool error of a call that ran and failed (`isError: true`), as `{error, message}`: the
/// error class from the result's `_meta` and the message from its text. An error result never
/// carries structured content (it would have to match the tool's output schema).
pub async fn tool_error(client: &Peer<RoleClient>, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args.clone()).await.unwrap_or_else(|e| panic!("{tool} {args}: {e:?}"));
    error_of(tool, &args, &result)
}

/// `{error, message}` of a tool error result, which must carry no structured content.
pub fn error_of(tool: &str, args: &Value, result: &CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(true), "{tool} {args} should fail: {result:?}");
    assert_eq!(result.structured_content, None, "{tool} {args}: an error result has no structured content");
    let class = result.meta.as_ref().and_then(|m| m.get(ERROR_CLASS_META)).cloned();
    let message: String = result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect();
    assert!(!message.is_empty(), "{tool} {args}: the error is told in text: {result:?}");
    json!({ "error": class.unwrap_or(Value::Null), "message": message })
}

fn names(list: &Value) -> Vec<String> {
    list["flocks"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap().to_owned()).collect()
}

async fn listed(client: &RunningService<RoleClient, ()>) -> Vec<String> {
    let mut tools: Vec<String> =
        client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    tools.sort();
    tools
}

fn yesterday() -> String {
    (time::OffsetDateTime::now_utc().date() - time::Duration::days(1)).to_string()
}

async fn cross_tenant(backend: Backend, mode: Mode) {
    let live = Live::start(backend, mode, &[]).await;
    let gary = live.client("gary@globex.test").await;
    let olivia = live.client("olivia@acme.test").await;
    let north = live.flock_id("north-barn").await;
    let hilltop = live.flock_id("hilltop").await;

    assert_eq!(names(&ok(&gary, "list_flocks", json!({})).await), ["hilltop"]);
    assert_eq!(names(&ok(&olivia, "list_flocks", json!({})).await), ["north-barn", "south-barn"]);

    // Another tenant's flock, by name or by id, answers exactly like one that does not exist.
    let missing = tool_error(&gary, "get_flock", json!({"flock": "no-such-barn"})).await;
    let missing_id = tool_error(&gary, "get_flock", json!({"flock": uuid::Uuid::now_v7().to_string()})).await;
    assert_eq!(missing, missing_id);
    for flock in ["north-barn", north.as_str()] {
        assert_eq!(tool_error(&gary, "get_flock", json!({"flock": flock})).await, missing, "{flock}");
        let write = json!({"flock": flock, "day": yesterday(), "eggs": 1});
        assert_eq!(tool_error(&gary, "record_egg_count", write).await, missing, "{flock}");
        let query = json!({"from": "2020-01-01", "to": "2020-12-31", "flock": flock});
        assert_eq!(tool_error(&gary, "query_egg_counts", query).await, missing, "{flock}");
    }
    for flock in ["hilltop", hilltop.as_str()] {
        assert_eq!(tool_error(&olivia, "get_flock", json!({"flock": flock})).await, missing, "{flock}");
    }
    let today = time::OffsetDateTime::now_utc().date();
    let window = json!({"from": (today - time::Duration::days(30)).to_string(), "to": today.to_string()});
    let report = ok(&gary, "query_egg_counts", window.clone()).await;
    assert!(report["counts"].as_array().unwrap().iter().all(|c| c["flock"] == "hilltop"), "{report}");
    assert_eq!(report["per_flock"].as_array().unwrap().len(), 1);

    // Nothing of acme's was written by gary.
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts WHERE recorded_by = 'gary@globex.test'").await, 0);
    gary.cancel().await.ok();
    olivia.cancel().await.ok();
}
all_modes!(mcp_cross_tenant, cross_tenant);

async fn worker_narrowing(backend: Backend, mode: Mode) {
    let live = Live::start(backend, mode, &[]).await;
    let wanda = live.client("wanda@acme.test").await;
    let walt = live.client("walt@acme.test").await;
    let audrey = live.client("audrey@acme.test").await;
    let olivia = live.client("olivia@acme.test").await;
    let day = yesterday();

    assert_eq!(names(&ok(&wanda, "list_flocks", json!({})).await), ["north-barn"]);
    let wrote = ok(&wanda, "record_egg_count", json!({"flock": "north-barn", "day": day, "eggs": 77})).await;
    assert_eq!(wrote["eggs"], 77);
    let not_found = tool_error(&wanda, "get_flock", json!({"flock": "no-such-barn"})).await;
    let south = json!({"flock": "south-barn", "day": day, "eggs": 5});
    assert_eq!(tool_error(&wanda, "record_egg_count", south.clone()).await, not_found);

    assert_eq!(names(&ok(&walt, "list_flocks", json!({})).await), Vec::<String>::new());
    assert_eq!(ok(&walt, "whoami", json!({})).await["flock_scope"], json!([]));
    let north = json!({"flock": "north-barn", "day": day, "eggs": 5});
    assert_eq!(tool_error(&walt, "record_egg_count", north.clone()).await, not_found);

    assert_eq!(names(&ok(&olivia, "list_flocks", json!({})).await), ["north-barn", "south-barn"]);
    ok(&olivia, "record_egg_count", south).await;

    // Audrey reads the audit trail and can't write egg counts; the write tool isn't even listed.
    let events = ok(&audrey, "recent_audit_events", json!({"limit": 50})).await;
    assert!(!events["events"].as_array().unwrap().is_empty());
    let audrey_tools = listed(&audrey).await;
    assert!(!audrey_tools.contains(&"record_egg_count".to_owned()), "{audrey_tools:?}");
    let unknown = call(&audrey, "no_such_tool", json!({})).await.unwrap_err();
    let forbidden = call(&audrey, "record_egg_count", north).await.unwrap_err();
    assert_eq!(
        (forbidden.code, forbidden.message.clone(), forbidden.data.clone()),
        (unknown.code, unknown.message, unknown.data)
    );

    // Wanda doesn't see the audit tool at all, and calling it is an unknown tool.
    let wanda_tools = listed(&wanda).await;
    assert_eq!(wanda_tools, ["get_flock", "list_flocks", "query_egg_counts", "record_egg_count", "whoami"]);
    let denied = call(&wanda, "recent_audit_events", json!({})).await.unwrap_err();
    assert_eq!((denied.code, denied.message), (forbidden.code, forbidden.message));

    // The writes that happened are exactly the allowed ones.
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts WHERE recorded_by = 'wanda@acme.test'").await, 1);
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts WHERE recorded_by = 'walt@acme.test'").await, 0);
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts WHERE recorded_by = 'audrey@acme.test'").await, 0);
    // Every call was audited, denied ones included, and the chains verify.
    let denied_events =
        live.count("SELECT COUNT(*) FROM audit_events WHERE outcome = 'denied' AND error_class = 'unknown_tool'").await;
    assert_eq!(denied_events, 3, "no_such_tool, audrey's write, wanda's audit read");
    let reports = scopegate::audit::verify::verify(&live.db, None).await.unwrap();
    assert!(reports.iter().all(|r| r.broken.is_none()), "{reports:?}");
    for c in [wanda, walt, audrey, olivia] {
        c.cancel().await.ok();
    }
}
all_modes!(mcp_worker_narrowing, worker_narrowing);

/// A SaaS's own tool set, registered beside the native tools: served behind the same
/// McpCallContext, the same authorization table and the same audit.
mod extra_tools {
    use rmcp::{tool, tool_router};
    use scopegate::McpCallContext;
    use scopegate::model::Role;
    use scopegate::tools::{NoArguments, ToolSpec, arguments};

    #[derive(Clone, Copy, Default)]
    pub struct Reports;

    pub const SPECS: &[ToolSpec] =
        &[ToolSpec { name: "tenant_report", roles: &[Role::Owner], validate: arguments::<NoArguments> }];

    #[tool_router(vis = "pub")]
    impl Reports {
        #[tool(description = "A report for the caller's tenant.")]
        async fn tenant_report(&self, ctx: McpCallContext) -> String {
            format!("report for {} requested by {}", ctx.tenant_slug(), ctx.subject())
        }
    }
}

async fn registered_tool_set(backend: Backend, mode: Mode) {
    scopegate::http::install_tls_provider();
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[("mcp.stateless", json!(mode == Mode::Stateless))]);
    let db = db_for(&config).await;
    seed_demo(&db).await;
    let tools = scopegate::mcp::ToolSet::native()
        .with(extra_tools::Reports, extra_tools::Reports::tool_router(), extra_tools::SPECS)
        .unwrap();
    let gateway = Gateway::build_with_tools(config.clone(), tools).await.unwrap();
    let live = Live { addr: gateway.local_addr(), config, db, _test_db: test_db };
    tokio::spawn(gateway.run(std::future::pending()));

    let olivia = live.client("olivia@acme.test").await;
    let gary = live.client("gary@globex.test").await;
    let wanda = live.client("wanda@acme.test").await;
    let text = |r: CallToolResult| serde_json::to_string(&r.content).unwrap();
    assert!(
        text(call(&olivia, "tenant_report", json!({})).await.unwrap()).contains("report for acme requested by olivia")
    );
    assert!(
        text(call(&gary, "tenant_report", json!({})).await.unwrap()).contains("report for globex requested by gary")
    );
    // Not in wanda's roles: not listed, and answered as an unknown tool.
    assert!(!listed(&wanda).await.contains(&"tenant_report".to_owned()));
    let denied = call(&wanda, "tenant_report", json!({})).await.unwrap_err();
    let unknown = call(&wanda, "no_such_tool", json!({})).await.unwrap_err();
    assert_eq!((denied.code, denied.message), (unknown.code, unknown.message));
    // Audited like native calls.
    assert_eq!(live.count("SELECT COUNT(*) FROM audit_events WHERE tool = 'tenant_report'").await, 3);
    for c in [olivia, gary, wanda] {
        c.cancel().await.ok();
    }
}
all_modes!(mcp_registered_tool_set, registered_tool_set);
