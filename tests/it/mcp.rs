//! End to end: rmcp's own client over real HTTP against a gateway on port 0, on SQLite and
//! PostgreSQL, in session mode and in stateless mode.

use rmcp::model::CallToolResult;
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};

use crate::support::*;

fn names(list: &Value) -> Vec<String> {
    list["flocks"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap().to_owned()).collect()
}

async fn listed(client: &RunningService<RoleClient, ()>) -> Vec<String> {
    let mut tools: Vec<String> =
        client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    tools.sort();
    tools
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
    let tools = scopegate::mcp::ToolSet::native()
        .with(extra_tools::Reports, extra_tools::Reports::tool_router(), extra_tools::SPECS)
        .unwrap();
    let live = TestGateway::new(backend).mode(mode).tools(tools).start().await;

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
    // Audited like native calls: the two that ran as a record and its outcome, the refusal as
    // one event.
    let audited = |outcome: &str| {
        format!("SELECT COUNT(*) FROM {AUDITED_CALLS} e WHERE tool = 'tenant_report' AND outcome = '{outcome}'")
    };
    assert_eq!(live.count(&audited("ok")).await, 2);
    assert_eq!(live.count(&audited("denied")).await, 1);
    assert_eq!(live.count("SELECT COUNT(*) FROM audit_events WHERE tool = 'tenant_report'").await, 5);
    for c in [olivia, gary, wanda] {
        c.cancel().await.ok();
    }
}
all_modes!(mcp_registered_tool_set, registered_tool_set);
