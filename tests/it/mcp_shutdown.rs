//! Graceful shutdown after audited calls: the gateway stops and its database pool closes
//! (nothing, the audit writer included, keeps a connection past shutdown).

use std::time::Duration;

use serde_json::json;

use crate::support::*;

async fn shutdown_after_calls(backend: Backend) {
    let mut live = TestGateway::new(backend).set("server.shutdown_grace_secs", json!(2)).start().await;
    let olivia = live.client("olivia@acme.test").await;
    for _ in 0..3 {
        ok(&olivia, "list_flocks", json!({})).await;
    }
    olivia.cancel().await.ok();

    let server = live.shutdown();
    let finished = tokio::time::timeout(Duration::from_secs(15), server).await;
    assert!(finished.is_ok(), "the gateway did not stop: something holds a database connection");
    // `run` returns only after the pool has closed.
    finished.unwrap().unwrap().unwrap();
}
both_dbs!(mcp_shutdown_after_audited_calls, shutdown_after_calls);
