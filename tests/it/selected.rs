//! Selected plugin roots, end to end: a session names roots on a remote executor at
//! `initialize`; the plugin's `.mcp.json` is read through the real agent, its stdio server runs
//! on the agent's side, and its tools are that session's alone, frozen, following the
//! executor's readiness. Both databases.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{ClientCapabilities, Implementation, InitializeRequestParams, RequestMetaObject};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use scopegate::model::Role;
use scopegate::store::roots;
use serde_json::{Value, json};

use crate::mcp::{call, ok};
use crate::remote::{Agent, Site, pid_alive, wait_gone};
use crate::support::*;

const FIXTURE: &str = env!("CARGO_BIN_EXE_scopegate-fixture-upstream");
const KEY: &str = "io.scopegate/selectedRoots";

/// A client that selects roots at `initialize` and counts `tools/list_changed`.
#[derive(Clone, Debug, Default)]
struct Selecting {
    roots: Option<Value>,
    changed: Arc<tokio::sync::Notify>,
}

impl ClientHandler for Selecting {
    fn get_info(&self) -> InitializeRequestParams {
        let mut params = InitializeRequestParams::new(ClientCapabilities::default(), Implementation::new("it", "1"));
        if let Some(roots) = &self.roots {
            let mut meta = RequestMetaObject::new();
            meta.0.0.insert(KEY.to_owned(), roots.clone());
            params.meta = Some(meta);
        }
        params
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }
}

async fn connect(
    site: &Site,
    subject: &str,
    roots: Option<Value>,
) -> Result<(RunningService<RoleClient, Selecting>, Arc<tokio::sync::Notify>), String> {
    let tenant = subject.rsplit('@').next().unwrap().split('.').next().unwrap();
    let token = Signer::hs256(site.config.auth.hs256_secret.expose()).sign(&claims(&site.config, tenant, subject));
    let transport = StreamableHttpClientTransport::with_client(
        reqwest::Client::new(),
        StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", site.base_url())).auth_header(token),
    );
    let handler = Selecting { roots, changed: Arc::default() };
    let changed = Arc::clone(&handler.changed);
    handler.serve(transport).await.map(|c| (c, changed)).map_err(|e| e.to_string())
}

/// A plugin folder `plugins/NAME` under the agent's root, declaring one stdio server `demo`
/// (the fixture) that reports the agent-only variable; returns its `file:` URI.
fn plugin(site: &Site, name: &str, value: &str) -> String {
    let dir = site.root.path().join("plugins").join(name);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let mcp = json!({ "mcpServers": {
        "demo": {
            "command": FIXTURE,
            "args": ["stdio"],
            "cwd": "bin",
            "env": {
                "FIXTURE_JWKS_URL": format!("{}/.well-known/jwks.json", site.base_url()),
                "FIXTURE_SERVER_ID": "demo",
                "FIXTURE_ISSUER": site.config.public_url(),
                "FIXTURE_DECLARED_VALUE": value,
            }
        },
        "broken": { "command": 42 }
    }});
    std::fs::write(dir.join(".mcp.json"), mcp.to_string()).unwrap();
    format!("{}/plugins/{name}", site.root_uri())
}

async fn allow(site: &Site, tenant: &str, executor: &str, base: &str, role: Role) {
    let mut tx = site.db.begin().await.unwrap();
    roots::allow_root(&mut tx, tenant, executor, base, role).await.unwrap();
    tx.commit().await.unwrap();
}

fn names(tools: &[rmcp::model::Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

/// Waits (bounded) until `client` lists `tool` (`present`) or no longer does.
async fn wait_listed(client: &RunningService<RoleClient, Selecting>, tool: &str, present: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tools = names(&client.list_all_tools().await.unwrap());
        if tools.iter().any(|t| t == tool) == present {
            return;
        }
        assert!(Instant::now() < deadline, "{tool} listed = {}, wanted {present}: {tools:?}", !present);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Executor `build-01` owned by acme, its agent started, acme's owners allowed under
/// `plugins/`; returns the site, the agent, the secret file and the plugin's URI.
async fn with_plugin(backend: Backend) -> (Site, Agent, PathBuf, String) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let root = plugin(&site, "demo", "${SCOPEGATE_TEST_AGENT_ONLY}");
    allow(&site, "acme", "build-01", &format!("{}/plugins", site.root_uri()), Role::Owner).await;
    let agent = site.agent("build-01", &secret);
    agent.wait_log("connected").await;
    (site, agent, secret, root)
}

async fn only_that_session(backend: Backend) {
    let (site, _agent, _secret, root) = with_plugin(backend).await;
    let selection = json!([{ "executor": "build-01", "path": root }]);
    let (olivia, _) = connect(&site, "olivia@acme.test", Some(selection.clone())).await.unwrap();
    wait_listed(&olivia, "r1.demo__whoami_upstream", true).await;
    let tools = names(&olivia.list_all_tools().await.unwrap());
    assert!(tools.iter().all(|t| !t.starts_with("r1.broken")), "the broken sibling is left out: {tools:?}");
    let me = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await;
    assert_eq!(me["declared_value"], "ran-on-build-01", "an executor-only value: it ran on the executor");
    assert_eq!(me["user"], "olivia@acme.test", "the identity assertion reaches the plugin's server");
    let cwd = me["cwd"].as_str().unwrap();
    assert_eq!(Path::new(cwd), site.root.path().canonicalize().unwrap().join("plugins/demo/bin"), "cwd under the root");
    let pid = me["pid"].as_u64().unwrap();
    assert_eq!(
        site.count("SELECT COUNT(*) FROM audit_events WHERE tool = 'r1.demo__whoami_upstream' AND outcome = 'ok'")
            .await,
        1,
        "audited like any call"
    );

    // A reload of the tenant's declarations (a new entity and binding) does not discard it,
    // and a changed `.mcp.json` does not change it: the selection is frozen.
    site.serve("acme", "extra", &site.stdio("extra", "x"), "build-01").await;
    std::fs::write(site.root.path().join("plugins/demo/.mcp.json"), "{}").unwrap();
    let again = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await;
    assert_eq!(again["pid"].as_u64().unwrap(), pid, "the same server process");

    // Another session of the same user, without the root, neither sees nor reaches it.
    let (plain, _) = connect(&site, "olivia@acme.test", None).await.unwrap();
    let tools = names(&plain.list_all_tools().await.unwrap());
    assert!(tools.iter().all(|t| !t.starts_with("r1.")), "{tools:?}");
    let err = call(&plain, "r1.demo__whoami_upstream", json!({})).await.unwrap_err();
    assert_eq!(err.message, "tool not found", "answered as a tool that does not exist");

    // Another tenant can't select it.
    let err = connect(&site, "gary@globex.test", Some(selection)).await.unwrap_err();
    assert!(err.contains("io.scopegate/selectedRoots[0].executor"), "{err}");

    // The session ends: its server stops.
    olivia.cancel().await.unwrap();
    wait_gone(pid, "the selected root's server after its session ended").await;
}
both_dbs!(selected_executor_plugin_exposes_its_stdio_mcp_only_to_that_session, only_that_session);

async fn refusals(backend: Backend) {
    let (site, _agent, _secret, root) = with_plugin(backend).await;
    let base = format!("{}/plugins", site.root_uri());
    let cases = [
        // Item 1: the path must be a canonical `file:` URI.
        (
            "olivia@acme.test",
            json!([{ "executor": "build-01", "path": site.root.path().join("plugins/demo") }]),
            ".path",
        ),
        ("olivia@acme.test", json!([{ "executor": "build-01", "path": "plugins/demo" }]), ".path"),
        ("olivia@acme.test", json!([{ "executor": "build-01", "path": "https://example.test/demo" }]), ".path"),
        ("olivia@acme.test", json!([{ "executor": "build-01", "path": format!("{root}/../demo") }]), ".path"),
        ("olivia@acme.test", json!([{ "executor": "build-01" }]), ".path"),
        ("olivia@acme.test", json!({ "executor": "build-01", "path": root }), ""),
        // Item 2: outside every allowed base, an executor not the tenant's, a role without one.
        ("olivia@acme.test", json!([{ "executor": "build-01", "path": format!("{base}2/demo") }]), ".path"),
        ("olivia@acme.test", json!([{ "executor": "build-02", "path": root }]), ".executor"),
        ("wanda@acme.test", json!([{ "executor": "build-01", "path": root }]), ".executor"),
    ];
    for (i, (subject, selection, field)) in cases.into_iter().enumerate() {
        let err = connect(&site, subject, Some(selection.clone())).await.unwrap_err();
        let want = if field.is_empty() { KEY.to_owned() } else { format!("{KEY}[0]{field}") };
        assert!(err.contains(&want), "case {i} {selection}: {err}");
    }
    assert!(
        site.count(
            "SELECT COUNT(*) FROM audit_events WHERE tool = 'io.scopegate/selectedRoots' AND outcome = 'denied'"
        )
        .await
            >= 9,
        "every refusal is audited"
    );
}
both_dbs!(selected_root_refusals_name_the_field, refusals);

async fn readiness(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let root = plugin(&site, "demo", "${SCOPEGATE_TEST_AGENT_ONLY}");
    allow(&site, "acme", "build-01", &format!("{}/plugins", site.root_uri()), Role::Owner).await;
    let selection = json!([{ "executor": "build-01", "path": root }]);

    // Not ready: the executor is not connected. The session is not refused; it has no tools
    // from the root.
    let (olivia, changed) = connect(&site, "olivia@acme.test", Some(selection)).await.unwrap();
    let tools = names(&olivia.list_all_tools().await.unwrap());
    assert!(tools.iter().all(|t| !t.starts_with("r1.")), "{tools:?}");

    // Ready: the agent connects; the session is told, and the tool appears.
    let mut agent = site.agent("build-01", &secret);
    tokio::time::timeout(Duration::from_secs(20), changed.notified()).await.expect("tools/list_changed on connect");
    wait_listed(&olivia, "r1.demo__whoami_upstream", true).await;
    let first = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await["pid"].as_u64().unwrap();
    // While ready, the same runtime: the same process.
    let tools = names(&olivia.list_all_tools().await.unwrap());
    assert!(tools.contains(&"r1.demo__whoami_upstream".to_owned()));
    let second = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await["pid"].as_u64().unwrap();
    assert_eq!(first, second, "the runtime is reused while the ready set is unchanged");

    // Lost: the agent dies; its server goes, the session is told, the tool leaves.
    agent.kill();
    wait_gone(first, "the plugin's server after its agent died").await;
    tokio::time::timeout(Duration::from_secs(20), changed.notified()).await.expect("tools/list_changed on loss");
    wait_listed(&olivia, "r1.demo__whoami_upstream", false).await;
    let err = call(&olivia, "r1.demo__whoami_upstream", json!({})).await.unwrap_err();
    assert_eq!(err.message, "tool not found");

    // Back: the agent reconnects; the frozen metadata serves again (even with the file gone).
    std::fs::remove_file(site.root.path().join("plugins/demo/.mcp.json")).unwrap();
    let _agent = site.agent("build-01", &secret);
    tokio::time::timeout(Duration::from_secs(20), changed.notified()).await.expect("tools/list_changed on return");
    wait_listed(&olivia, "r1.demo__whoami_upstream", true).await;
    let third = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await;
    assert_eq!(third["declared_value"], "ran-on-build-01");
    assert!(pid_alive(third["pid"].as_u64().unwrap()));
}
both_dbs!(selected_root_readiness_follows_the_executor, readiness);
