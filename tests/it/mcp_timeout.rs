//! The per-call timeout (`mcp.call_timeout_secs`): a tool that outlives it is cut off, the
//! caller gets the timeout error, the audit records a failed call of class `timeout`, and the
//! gateway goes on answering.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::*;

async fn call_timeout(backend: Backend, mode: Mode) {
    let tools = scopegate::mcp::ToolSet::native()
        .with(slow_tools::Slow, slow_tools::Slow::tool_router(), slow_tools::SPECS)
        .unwrap();
    let live = Live::start_with_tools(backend, mode, &[("mcp.call_timeout_secs", json!(1))], tools).await;
    let olivia = live.client("olivia@acme.test").await;

    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(20), call(&olivia, "slow_report", json!({})))
        .await
        .expect("the client got an answer");
    let elapsed = started.elapsed();
    let error = answer.expect_err("a call past the timeout fails");
    assert_eq!(error.message, "tool call timed out", "{error:?}");
    assert!(elapsed >= Duration::from_millis(900), "answered before the timeout: {elapsed:?}");
    assert!(elapsed < slow_tools::SLEEP, "the tool was not cut off: {elapsed:?}");

    // Audited as a failed call of class `timeout`.
    live.settle_audit().await;
    let mut tx = live.db.begin().await.unwrap();
    let sql = format!("SELECT outcome, error_class FROM {AUDITED_CALLS} e WHERE tool = 'slow_report'");
    let events: Vec<(String, Option<String>)> =
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&mut *tx).await.unwrap();
    drop(tx);
    assert_eq!(events, [("failed".to_owned(), Some("timeout".to_owned()))]);

    // The gateway answers the next call, on the same client. Two calls, each its record and its
    // outcome: four events.
    assert_eq!(ok(&olivia, "whoami", json!({})).await["user"], "olivia@acme.test");
    live.settle_audit().await;
    let reports = scopegate::audit::verify::verify(&live.db, Some("acme")).await.unwrap();
    assert_eq!((reports[0].events, &reports[0].broken), (4, &None), "{reports:?}");
    assert!(reports[0].outcome_unknown.is_empty(), "{reports:?}");
    olivia.cancel().await.ok();
}
all_modes!(mcp_call_timeout, call_timeout);
