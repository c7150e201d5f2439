//! Two gateway processes on one database: concurrent writes and reads of one tenant from both
//! all succeed, and the tenant's audit chain verifies afterwards.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;

use crate::cli::scopegate;
use crate::mcp::call;
use crate::support::*;

/// A `scopegate serve` process; killed when dropped. Its stderr is drained on a thread (a
/// full pipe would stall the gateway) and kept for failure messages.
struct Replica {
    child: Child,
    addr: String,
    log: Arc<std::sync::Mutex<String>>,
}

impl Replica {
    fn start(dir: &std::path::Path, db_url: &str) -> Self {
        let mut child = scopegate(dir)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("SCOPEGATE_DATABASE__URL", db_url)
            .env("SCOPEGATE_SERVER__PUBLIC_URL", PUBLIC_URL)
            // Both replicas take the whole load of one tenant; the rate limits are not under test.
            .env("SCOPEGATE_LIMITS__TENANT_PER_SEC", "0")
            .env("SCOPEGATE_LIMITS__USER_PER_SEC", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn scopegate serve");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        let addr = loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                panic!("the gateway exited before listening: {seen}");
            }
            if let Some(rest) = line.strip_prefix("scopegate listening on http://") {
                break rest.trim().to_owned();
            }
            seen.push_str(&line);
        };
        let log = Arc::new(std::sync::Mutex::new(seen));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
            sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&rest);
        });
        Self { child, addr, log }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const CLIENTS_PER_REPLICA: usize = 4;
const ROUNDS: usize = 15;

async fn two_replicas_append_to_one_chain(backend: Backend) {
    scopegate::http::install_tls_provider();
    let test_db = TestDb::new(backend).await;
    let config = config_with(&test_db.url, &[]);
    let db = db_for(&config).await;
    seed_demo(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let replicas = [Replica::start(dir.path(), &test_db.url), Replica::start(dir.path(), &test_db.url)];
    let token = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));

    let mut tasks = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        for c in 0..CLIENTS_PER_REPLICA {
            let transport = StreamableHttpClientTransport::with_client(
                reqwest::Client::builder().tcp_nodelay(true).build().unwrap(),
                StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", replica.addr))
                    .auth_header(token.clone()),
            );
            let client = ().serve(transport).await.expect("client connects");
            let writer = r * CLIENTS_PER_REPLICA + c;
            tasks.push(tokio::spawn(async move {
                let mut failures = Vec::new();
                for i in 0..ROUNDS {
                    // A day of its own per write, so every write is valid on its own.
                    let back = 1 + (writer * ROUNDS + i) as i64;
                    let day = (time::OffsetDateTime::now_utc().date() - time::Duration::days(back)).to_string();
                    let calls = [
                        ("record_egg_count", json!({"flock": "north-barn", "day": day, "eggs": i})),
                        ("list_flocks", json!({})),
                    ];
                    for (tool, args) in calls {
                        match call(&client, tool, args).await {
                            Ok(result) if result.is_error != Some(true) => {}
                            other => failures.push(format!("{tool}: {other:?}")),
                        }
                    }
                }
                client.cancel().await.ok();
                failures
            }));
        }
    }
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.unwrap());
    }
    let calls = 2 * CLIENTS_PER_REPLICA * ROUNDS * 2;
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed, e.g. {:?}\nreplica logs: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)],
        replicas.iter().map(|r| r.log.lock().unwrap_or_else(|p| p.into_inner()).clone()).collect::<Vec<_>>()
    );
    drop(replicas);

    let out = scopegate(dir.path())
        .args(["audit", "verify", "--tenant", "acme"])
        .env("SCOPEGATE_DATABASE__URL", &test_db.url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim(), format!("acme: ok ({calls} events)"), "every call left one event");
    db.close().await;
}
both_dbs!(replicas_append_to_one_chain, two_replicas_append_to_one_chain);
