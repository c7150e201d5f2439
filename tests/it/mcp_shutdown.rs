//! Graceful shutdown after audited calls: the gateway stops and its database pool closes
//! (nothing, the audit writer included, keeps a connection past shutdown).

use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use scopegate::Gateway;
use serde_json::json;

use crate::mcp::ok;
use crate::support::*;

async fn shutdown_after_calls(backend: Backend) {
    scopegate::http::install_tls_provider();
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[("server.shutdown_grace_secs", json!(2))]);
    seed_demo(&db_for(&config).await).await;
    let gateway = Gateway::build(config.clone()).await.unwrap();
    let url = format!("http://{}/mcp", gateway.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(gateway.run(async {
        let _ = stopped.await;
    }));

    let token = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));
    let transport = StreamableHttpClientTransport::with_client(
        reqwest::Client::builder().tcp_nodelay(true).build().unwrap(),
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    let olivia = ().serve(transport).await.unwrap();
    for _ in 0..3 {
        ok(&olivia, "list_flocks", json!({})).await;
    }
    olivia.cancel().await.ok();

    stop.send(()).unwrap();
    let finished = tokio::time::timeout(Duration::from_secs(15), server).await;
    assert!(finished.is_ok(), "the gateway did not stop: something holds a database connection");
    // `run` returns only after the pool has closed.
    finished.unwrap().unwrap().unwrap();
}
both_dbs!(mcp_shutdown_after_audited_calls, shutdown_after_calls);
