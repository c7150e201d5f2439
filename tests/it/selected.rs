//! Selected plugin roots, end to end: a session names roots on a remote executor at
//! `initialize`; the plugin's `.mcp.json` is read through the real agent, its stdio server runs
//! on the agent's side, and its tools are that session's alone, frozen, following the
//! executor's readiness. Both databases.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    ClientCapabilities, Implementation, InitializeRequestParams, ReadResourceRequestParams, RequestMetaObject,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use scopegate::model::Role;
use scopegate::store::roots;
use serde_json::{Value, json};

use crate::support::*;

const KEY: &str = "io.scopegate/selectedRoots";

/// How long the gateway may take, once an agent's link is gone, to act on the loss (the
/// ready sets it changes and the runtimes it stops are worked out in that same step, with
/// nothing to wait for): a wait this long with nothing changed shows nothing will.
const LOSS_HANDLED: Duration = Duration::from_millis(300);

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
    let transport = site.live.transport(subject);
    let handler = Selecting { roots, changed: Arc::default() };
    let changed = Arc::clone(&handler.changed);
    handler.serve(transport).await.map(|c| (c, changed)).map_err(|e| e.to_string())
}

/// A plugin folder `plugins/NAME` under the agent's root, declaring a stdio server `demo` (the
/// fixture) that reports the agent-only variable, `ev` (the fixture's `everything` mode: prompts
/// and resources) and a broken one; returns its `file:` URI.
fn plugin(site: &Site, name: &str, value: &str) -> String {
    let dir = site.root.path().join("plugins").join(name);
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let mcp = json!({ "mcpServers": {
        "demo": {
            "command": FIXTURE,
            "args": ["stdio"],
            "cwd": "bin",
            "env": {
                "FIXTURE_JWKS_URL": format!("{}/.well-known/jwks.json", site.live.base_url()),
                "FIXTURE_SERVER_ID": "demo",
                "FIXTURE_ISSUER": site.live.config.public_url(),
                "FIXTURE_DECLARED_VALUE": value,
            }
        },
        "ev": { "command": FIXTURE, "args": ["everything", "stdio"] },
        "broken": { "command": 42 }
    }});
    std::fs::write(dir.join(".mcp.json"), mcp.to_string()).unwrap();
    format!("{}/plugins/{name}", site.root_uri())
}

async fn allow(site: &Site, tenant: &str, executor: &str, base: &str, role: Role) {
    let mut tx = site.live.db.begin().await.unwrap();
    roots::allow_root(&mut tx, tenant, executor, base, role).await.unwrap();
    tx.commit().await.unwrap();
}

fn names(tools: &[rmcp::model::Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

/// Waits (bounded) until `client` lists `tool` (`present`) or no longer does.
async fn wait_listed(client: &RunningService<RoleClient, Selecting>, tool: &str, present: bool) {
    eventually(format!("{tool} listed = {present}"), || async {
        let tools = names(&client.list_all_tools().await.unwrap());
        if tools.iter().any(|t| t == tool) == present {
            Ok(())
        } else {
            Err(format!("{tool} listed = {}, wanted {present}: {tools:?}", !present))
        }
    })
    .await
}

/// Executor `build-01` owned by acme, its agent started, acme's owners allowed under
/// `plugins/`; returns the site, the agent, the secret file and the plugin's URI.
async fn with_plugin(backend: Backend) -> (Site, Agent, PathBuf, String) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let root = plugin(&site, "demo", "${SCOPEGATE_TEST_AGENT_ONLY}");
    allow(&site, "acme", "build-01", &format!("{}/plugins", site.root_uri()), Role::Owner).await;
    let agent = site.agent("build-01", &secret);
    agent.wait_log("connected to the gateway").await;
    (site, agent, secret, root)
}

async fn only_that_session(backend: Backend) {
    let (site, _agent, _secret, root) = with_plugin(backend).await;
    let selection = json!([{ "executor": "build-01", "path": root }]);
    let (olivia, _) = connect(&site, "olivia@acme.test", Some(selection.clone())).await.unwrap();
    let advertised = &olivia.peer_info().unwrap().capabilities.experimental;
    assert!(advertised.as_ref().is_some_and(|e| e.contains_key(KEY)), "the extension is advertised: {advertised:?}");
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
        site.live
            .count("SELECT COUNT(*) FROM audit_events WHERE tool = 'r1.demo__whoami_upstream' AND outcome = 'ok'")
            .await,
        1,
        "audited like any call"
    );

    // Its servers' prompts and resources are the session's too.
    let prompts: Vec<String> = olivia.list_all_prompts().await.unwrap().into_iter().map(|p| p.name).collect();
    assert!(prompts.contains(&"r1.ev__test_simple_prompt".to_owned()), "{prompts:?}");
    let read = olivia.read_resource(ReadResourceRequestParams::new("scopegate://r1.ev/test://static-text")).await;
    let read = serde_json::to_value(read.unwrap()).unwrap();
    assert_eq!(read["contents"][0]["uri"], "scopegate://r1.ev/test://static-text", "{read}");

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
    assert!(plain.list_all_prompts().await.unwrap().iter().all(|p| !p.name.starts_with("r1.")));
    let err = plain.read_resource(ReadResourceRequestParams::new("scopegate://r1.ev/test://static-text")).await;
    assert!(
        matches!(err, Err(rmcp::service::ServiceError::McpError(e)) if e.code == rmcp::model::ErrorCode::RESOURCE_NOT_FOUND)
    );

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
        site.live
            .count("SELECT COUNT(*) FROM audit_events WHERE tool = 'io.scopegate/selectedRoots' AND outcome = 'denied'")
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
    // While the set of ready roots is unchanged, the same runtime: the same process, even
    // when another executor (not selected) comes and goes meanwhile.
    let other_secret = site.remote_executor("build-02", "build-02", "ci", &["acme"]).await;
    let mut other = site.agent("build-02", &other_secret);
    other.wait_log("connected to the gateway").await;
    other.kill();
    site.wait_connected("build-02", false).await;
    tokio::time::sleep(LOSS_HANDLED).await;
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

/// A 2026-07-28 request (no session) names its roots in its own `_meta`: checked and served for
/// that request alone.
async fn stateless(backend: Backend) {
    let (site, _agent, _secret, root) = with_plugin(backend).await;
    let token = site.live.token_for("olivia@acme.test");
    let post = |body: Value| {
        let request = reqwest::Client::new()
            .post(format!("{}/mcp", site.live.base_url()))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", body["method"].as_str().unwrap())
            .header("authorization", format!("Bearer {token}"));
        let request = match body["params"]["name"].as_str() {
            Some(name) => request.header("mcp-name", name),
            None => request,
        };
        async move { message(request.body(body.to_string()).send().await.unwrap()).await }
    };
    let meta = |roots: Option<Value>| {
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        if let Some(roots) = roots {
            meta[KEY] = roots;
        }
        meta
    };
    let selection = json!([{ "executor": "build-01", "path": root }]);
    eventually("r1.demo__whoami_upstream listed", || async {
        let list = post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                               "params": {"_meta": meta(Some(selection.clone()))}}))
        .await;
        let tools: Vec<&str> =
            list["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        if tools.contains(&"r1.demo__whoami_upstream") { Ok(()) } else { Err(format!("never listed: {list}")) }
    })
    .await;
    let call = |roots: Option<Value>| {
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "r1.demo__whoami_upstream", "arguments": {}, "_meta": meta(roots)}})
    };
    let answer = post(call(Some(selection.clone()))).await;
    assert_eq!(answer["result"]["structuredContent"]["declared_value"], "ran-on-build-01", "{answer}");
    // Without the selection in its own `_meta`, the request has no such tool.
    let answer = post(call(None)).await;
    assert_eq!(answer["error"]["message"], "tool not found", "{answer}");
    // A root it may not select: -32602 naming the field.
    let outside = json!([{ "executor": "build-01", "path": format!("{}/elsewhere", site.root_uri()) }]);
    let answer = post(call(Some(outside))).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("io.scopegate/selectedRoots[0].path"), "{answer}");
}
both_dbs!(selected_roots_in_a_stateless_request, stateless);

/// A selected plugin declaring a Streamable HTTP server that only the executor can reach (it
/// listens on the loopback of the network namespace where the agent runs): served through the
/// agent, over the executor's network.
async fn http_over_the_executors_network(backend: Backend) {
    let netns = Netns::create();
    let site = Site::start(
        backend,
        &[
            ("server.listen", json!(format!("{}:0", netns.host_ip))),
            ("server.allowed_hosts", json!([netns.host_ip])),
            ("auth.hs256_secret", json!("selected-netns-test-secret-0123456789abcdef")),
        ],
    )
    .await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let (_upstream, addr) = http_fixture_in(&netns, &site, "web").await;
    let dir = site.root.path().join("plugins/web");
    std::fs::create_dir_all(&dir).unwrap();
    let mcp = json!({ "web": { "type": "http", "url": format!("http://{addr}/mcp") } });
    std::fs::write(dir.join(".mcp.json"), mcp.to_string()).unwrap();
    allow(&site, "acme", "build-01", &format!("{}/plugins", site.root_uri()), Role::Owner).await;
    let _agent = site.agent_in(Some(&netns.name), "build-01", &secret, &[site.live.base_url()]);
    let selection = json!([{ "executor": "build-01", "path": format!("{}/plugins/web", site.root_uri()) }]);
    let (olivia, _) = connect(&site, "olivia@acme.test", Some(selection)).await.unwrap();
    wait_listed(&olivia, "r1.web__whoami_upstream", true).await;
    let me = ok(&olivia, "r1.web__whoami_upstream", json!({})).await;
    assert_eq!(me["user"], "olivia@acme.test");
    assert_eq!(me["assertion_source"], "header", "the agent carried the assertion in the header");
}
both_dbs!(selected_plugin_http_server_over_the_executors_network, http_over_the_executors_network);

/// A Windows-convention root, lexically end to end: the agent (on this Linux host) serves
/// `file:///C:/plugins` from a test folder; the tenant allows `file:///C:/plugins`, the session
/// selects `file:///C:/plugins/demo`, the gateway reads `file:///C:/plugins/demo/.mcp.json`
/// through the agent and places the server under the URI without ever making a host path of
/// it, and the agent maps what it is sent onto its folder.
async fn windows_root(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("win-01", "win-01", "ci", &["acme"]).await;
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().canonicalize().unwrap().join("plugins");
    std::fs::create_dir_all(plugins.join("demo").join("bin")).unwrap();
    let mcp = json!({ "demo": {
        "command": FIXTURE,
        "args": ["stdio"],
        "cwd": "bin",
        "env": {
            "FIXTURE_JWKS_URL": format!("{}/.well-known/jwks.json", site.live.base_url()),
            "FIXTURE_SERVER_ID": "demo",
            "FIXTURE_ISSUER": site.live.config.public_url(),
            "FIXTURE_DECLARED_VALUE": "${SCOPEGATE_TEST_AGENT_ONLY}",
        }
    }});
    std::fs::write(plugins.join("demo").join(".mcp.json"), mcp.to_string()).unwrap();
    allow(&site, "acme", "win-01", "file:///C:/plugins", Role::Owner).await;
    let agent = site.agent_mapped("win-01", &secret, "file:///C:/plugins", &plugins);
    agent.wait_log("connected to the gateway").await;

    // A lower-case drive is not the canonical form: refused, naming the field.
    let lower = json!([{ "executor": "win-01", "path": "file:///c:/plugins/demo" }]);
    let err = connect(&site, "olivia@acme.test", Some(lower)).await.unwrap_err();
    assert!(err.contains("io.scopegate/selectedRoots[0].path"), "{err}");

    let selection = json!([{ "executor": "win-01", "path": "file:///C:/plugins/demo" }]);
    let (olivia, _) = connect(&site, "olivia@acme.test", Some(selection)).await.unwrap();
    wait_listed(&olivia, "r1.demo__whoami_upstream", true).await;
    let me = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await;
    assert_eq!(me["declared_value"], "ran-on-win-01");
    let cwd = me["cwd"].as_str().unwrap();
    assert_eq!(Path::new(cwd), plugins.join("demo").join("bin"), "file:///C:/plugins/demo/bin, mapped by the agent");
}
both_dbs!(selected_windows_root_mapped_onto_an_agent_folder, windows_root);

/// The worked `initialize` of the MCP reference (docs/reference/mcp.md) is what the gateway
/// reads: posted as written (its executor is not one of this tenant's), it is refused naming
/// that entry's executor.
async fn readme_example(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/mcp.md")).unwrap();
    let start =
        readme.find("```json\n{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"initialize\"").expect("the example");
    let body = &readme[start + "```json\n".len()..];
    let example: Value = serde_json::from_str(&body[..body.find("```").unwrap()]).expect("the example is JSON");
    assert!(example["params"]["_meta"][KEY].is_array());
    let token = site.live.token_for("olivia@acme.test");
    let response = reqwest::Client::new()
        .post(format!("{}/mcp", site.live.base_url()))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .body(example.to_string())
        .send()
        .await
        .unwrap();
    let answer = message(response).await;
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    assert!(
        answer["error"]["message"].as_str().unwrap().starts_with("io.scopegate/selectedRoots[0].executor"),
        "{answer}"
    );
}
both_dbs!(selected_roots_readme_example_is_what_the_gateway_reads, readme_example);

/// A replica the agent is not connected to serves a session that selects a root on it: the
/// plugin's `.mcp.json` is read, and its server run, through the replica that holds the agent.
async fn through_another_replica(backend: Backend) {
    let (site, _agent, _secret, root) = with_plugin(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let secret = site.live.config.auth.hs256_secret.expose().to_owned();
    let other = Replica::start_with(
        dir.path(),
        site.live.config.database.url.expose(),
        &site.live.config.public_url(),
        &[("SCOPEGATE_AUTH__HS256_SECRET", secret.as_str())],
    );
    let selection = json!([{ "executor": "build-01", "path": root }]);
    let handler = Selecting { roots: Some(selection), changed: Arc::default() };
    let url = format!("http://{}/mcp", other.addr);
    let olivia = handler.serve(transport(&url, &site.live.token_for("olivia@acme.test"))).await.unwrap();
    wait_listed(&olivia, "r1.demo__whoami_upstream", true).await;
    let me = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await;
    assert_eq!(me["declared_value"], "ran-on-build-01", "it ran on the executor: {me}");
    let metrics =
        reqwest::get(other.metrics_url.as_deref().expect("metrics are on")).await.unwrap().text().await.unwrap();
    let relayed = metrics.lines().find(|l| l.starts_with("scopegate_executor_channels_total{route=\"relayed\"}"));
    assert!(relayed.is_some_and(|l| !l.ends_with(" 0")), "channels through the other replica: {metrics}");
    assert!(metrics.contains("scopegate_executor_file_reads_total{outcome=\"ok\"}"), "{metrics}");
    olivia.cancel().await.unwrap();
}
both_dbs!(a_replica_without_the_agent_serves_a_selected_root, through_another_replica);

/// A session on a replica the agent is not connected to selects a root before the agent is up
/// anywhere: once the agent connects to another replica, the root becomes ready here too.
async fn agent_arrives_elsewhere(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let root = plugin(&site, "demo", "${SCOPEGATE_TEST_AGENT_ONLY}");
    allow(&site, "acme", "build-01", &format!("{}/plugins", site.root_uri()), Role::Owner).await;
    let dir = tempfile::tempdir().unwrap();
    let hs256 = site.live.config.auth.hs256_secret.expose().to_owned();
    let other = Replica::start_with(
        dir.path(),
        site.live.config.database.url.expose(),
        &site.live.config.public_url(),
        &[("SCOPEGATE_AUTH__HS256_SECRET", hs256.as_str()), ("SCOPEGATE_CLUSTER__HEARTBEAT_MS", "200")],
    );
    let selection = json!([{ "executor": "build-01", "path": root }]);
    let handler = Selecting { roots: Some(selection), changed: Arc::default() };
    let url = format!("http://{}/mcp", other.addr);
    let olivia = handler.serve(transport(&url, &site.live.token_for("olivia@acme.test"))).await.unwrap();
    let tools = names(&olivia.list_all_tools().await.unwrap());
    assert!(tools.iter().all(|t| !t.starts_with("r1.")), "no agent anywhere yet: {tools:?}");
    let _agent = site.agent("build-01", &secret);
    wait_listed(&olivia, "r1.demo__whoami_upstream", true).await;
    let me = ok(&olivia, "r1.demo__whoami_upstream", json!({})).await;
    assert_eq!(me["declared_value"], "ran-on-build-01", "{me}");
    olivia.cancel().await.unwrap();
}
both_dbs!(a_root_becomes_ready_when_its_agent_connects_to_another_replica, agent_arrives_elsewhere);
