//! Interop beyond the suite (issue 27): third-party MCP servers behind the gateway, each
//! listed and called through it by rmcp's client over real HTTP, as a legacy caller (rmcp's
//! default handshake, 2025-11-25) and as a 2026-07-28 caller (`server/discover`):
//!
//! - the published `@modelcontextprotocol/server-everything` (TypeScript SDK) over stdio and
//!   over Streamable HTTP;
//! - a server written with the official Python SDK (`mcp` on PyPI,
//!   tests/fixtures/python/interop_server.py) over stdio and over Streamable HTTP.
//!
//! The servers are installed by the tests themselves, pinned, once, into `<target>/interop/`
//! (see [`installs`](crate::support::installs)). A missing `node`, `npm` or `python3` fails
//! the tests, it never skips them. On SQLite and PostgreSQL.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProtocolVersion};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServiceExt};
use scopegate::model::Role;
use scopegate::store::entities::{self, GrantKind};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::support::installs::{fixture_file, npm_tree, python};
use crate::support::*;

// @modelcontextprotocol/server-everything (2026.8.31, the newest release, which runs on Node 20)
// and everything below it, the TypeScript SDK (1.32.2) included, are pinned by
// tests/fixtures/npm/package-lock.json; the Python SDK by `installs::PY_MCP_VERSION`.

/// Node and the entry point of the pinned server-everything.
struct NodeServer {
    node: PathBuf,
    entry: PathBuf,
}

async fn everything() -> NodeServer {
    let tree = npm_tree().await;
    let entry = tree
        .module("@modelcontextprotocol/server-everything/dist/index.js")
        .unwrap_or_else(|e| panic!("installing @modelcontextprotocol/server-everything: {e}"));
    NodeServer { node: tree.node.clone(), entry }
}

fn python_fixture() -> String {
    fixture_file("python/interop_server.py").display().to_string()
}

/// A Node preload for server-everything's Streamable HTTP mode, which listens on `PORT` on
/// every interface: on 127.0.0.1 instead, and the port it got reported on stderr (`PORT=0`
/// takes a free one without a race).
const LISTEN_ON_LOOPBACK: &str = r#"import net from "node:net";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (port, ...rest) {
  if (typeof port === "number" || typeof port === "string") {
    this.once("listening", () => process.stderr.write(`listening on 127.0.0.1:${this.address().port}\n`));
    return listen.call(this, Number(port), "127.0.0.1", rest.find((a) => typeof a === "function"));
  }
  return listen.call(this, port, ...rest);
};
"#;

/// Starts an HTTP upstream (killed when dropped) and waits for its `listening on ADDR` line on
/// stdout or stderr; the rest of its output is drained.
pub(crate) async fn http_upstream(
    mut cmd: tokio::process::Command,
    on_stderr: bool,
) -> (tokio::process::Child, String) {
    let (out, err) = if on_stderr { (Stdio::null(), Stdio::piped()) } else { (Stdio::piped(), Stdio::null()) };
    let mut child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).kill_on_drop(true).spawn().unwrap();
    let pipe: Box<dyn AsyncRead + Unpin + Send> =
        if on_stderr { Box::new(child.stderr.take().unwrap()) } else { Box::new(child.stdout.take().unwrap()) };
    let mut lines = BufReader::new(pipe).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(addr) = line.strip_prefix("listening on ") {
                return Some(addr.trim().to_owned());
            }
            seen.push(line);
        }
        None
    })
    .await;
    let Ok(Some(addr)) = found else { panic!("{cmd:?} did not report its address: {found:?}, output {seen:?}") };
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// A gateway with the demo data and the local executor.
struct Gateway {
    live: Live,
    _root: tempfile::TempDir,
}

impl Gateway {
    async fn start(backend: Backend) -> Self {
        let root = tempfile::tempdir().unwrap();
        let root_uri = format!("file://{}", root.path().canonicalize().unwrap().display());
        let overrides = [("upstream.local_root", json!(root_uri)), ("upstream.connect_timeout_secs", json!(30))];
        let live = Live::start(backend, Mode::Session, &overrides).await;
        let mut tx = live.db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
        tx.commit().await.unwrap();
        Self { live, _root: root }
    }

    /// `declaration` as acme's `server`, bound (prefixed) to the local executor; the owner may
    /// use all of it.
    async fn bind(&self, server: &str, declaration: Value) {
        let mut tx = self.live.db.begin().await.unwrap();
        entities::create_entity(&mut tx, "acme", &format!("defaults/mcp-servers/{server}"), &declaration)
            .await
            .unwrap();
        entities::bind_server_with_prefix(&mut tx, "acme", server, "local", unprefixed_beside(true)).await.unwrap();
        for kind in [GrantKind::Tool, GrantKind::Prompt, GrantKind::Resource] {
            entities::grant(&mut tx, "acme", server, Role::Owner, kind, "*").await.unwrap();
        }
        tx.commit().await.unwrap();
    }

    /// rmcp's client as `subject`: its default handshake (`initialize`, 2025-11-25) or, when
    /// `modern`, `server/discover` on 2026-07-28.
    async fn client(&self, subject: &str, modern: bool) -> RunningService<RoleClient, ()> {
        let transport = self.live.transport(subject);
        let connected = if modern {
            let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
            ().serve_with_lifecycle(transport, lifecycle).await
        } else {
            ().serve(transport).await
        };
        connected.unwrap_or_else(|e| panic!("{subject} connects (modern: {modern}): {e}"))
    }

    /// Audit rows of acme's calls of `tool`: (outcome, error class).
    async fn audited(&self, tool: &str, expected: usize) -> Vec<(String, Option<String>)> {
        self.live.settle_audit().await;
        eventually(format!("{expected} audit events of {tool}"), || async {
            let mut tx = self.live.db.begin().await.unwrap();
            let sql = format!("SELECT outcome, error_class FROM {AUDITED_CALLS} e WHERE tool = $1 ORDER BY seq");
            let rows: Vec<(String, Option<String>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(tool).fetch_all(&mut *tx).await.unwrap();
            if rows.len() >= expected { Ok(rows) } else { Err(format!("{rows:?}")) }
        })
        .await
    }
}

fn text_of(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect()
}

/// What one third-party server must show through the gateway.
struct Expected {
    /// Tools it is known to have (unprefixed).
    tools: &'static [&'static str],
    /// A tool, its arguments, and the text its result must be; `{caller}` in either is the
    /// caller's kind (`legacy` or `modern`; `{CALLER}` in capitals), so each call is told apart.
    tool: &'static str,
    args: &'static str,
    text: &'static str,
    /// The revision the gateway settles with the upstream for a legacy caller and for a
    /// 2026-07-28 caller.
    upstream: [&'static str; 2],
}

/// The revisions the gateway has connected to upstream `server` on (its metrics, which are
/// process-wide: each test binds its own server id).
async fn upstream_revisions(gateway: &Gateway, server: &str) -> Vec<String> {
    let text = gateway.live.metrics().await;
    let label = format!("scopegate_upstream_connections_total{{server=\"{server}\",revision=\"");
    text.lines().filter_map(|l| l.strip_prefix(&label)?.split('"').next().map(str::to_owned)).collect()
}

/// How many of `server`'s proxied calls the path `relay` (`lean` or `rmcp`) served (the
/// metrics are process-wide: each test binds server ids of its own).
async fn served_by(gateway: &Gateway, server: &str, relay: &str) -> u64 {
    let text = gateway.live.metrics().await;
    let (server, relay) = (format!("server=\"{server}\""), format!("relay=\"{relay}\""));
    text.lines()
        .filter(|l| l.starts_with("scopegate_proxied_calls_total{") && l.contains(&server) && l.contains(&relay))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// `base` for one backend's test: the two run at once in one process, whose metrics they share.
fn named(base: &str, backend: Backend) -> String {
    match backend {
        Backend::Sqlite => format!("{base}-lite"),
        Backend::Postgres => format!("{base}-pg"),
    }
}

/// As a legacy caller and as a 2026-07-28 caller: the server's tools listed under its prefix,
/// one called with arguments, its answer relayed, on the upstream revision expected for that
/// caller (the 2026-07-28 caller's by the lean relay); both calls audited.
async fn list_and_call(gateway: &Gateway, server: &str, expected: &Expected) {
    let prefixed = |name: &str| format!("{server}__{name}");
    for (i, (caller, modern)) in [("legacy", false), ("modern", true)].into_iter().enumerate() {
        let olivia = gateway.client("olivia@acme.test", modern).await;
        let version = olivia.peer_info().map(|info| info.protocol_version.clone());
        let era = if modern { ProtocolVersion::V_2026_07_28 } else { ProtocolVersion::V_2025_11_25 };
        assert_eq!(version, Some(era), "{caller} caller's revision");

        let tools: Vec<String> = olivia
            .list_all_tools()
            .await
            .unwrap_or_else(|e| panic!("{caller} caller lists tools: {e}"))
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        for tool in expected.tools {
            assert!(tools.contains(&prefixed(tool)), "{caller} caller: {} in {tools:?}", prefixed(tool));
        }
        assert!(
            !tools.iter().any(|t| t == expected.tool),
            "{caller} caller: no unprefixed {} in {tools:?}",
            expected.tool
        );

        let args: Value = serde_json::from_str(&expected.args.replace("{caller}", caller)).unwrap();
        let lean_before = served_by(gateway, server, "lean").await;
        let params =
            CallToolRequestParams::new(prefixed(expected.tool)).with_arguments(args.as_object().cloned().unwrap());
        let result = olivia
            .call_tool(params)
            .await
            .unwrap_or_else(|e| panic!("{caller} caller calls {}: {e}", prefixed(expected.tool)));
        assert_ne!(result.is_error, Some(true), "{caller} caller: {result:?}");
        let text = expected.text.replace("{caller}", caller).replace("{CALLER}", &caller.to_uppercase());
        assert_eq!(text_of(&result), text, "{caller} caller: {result:?}");
        // (A session's first calls may reach rmcp before its `initialized` is handled.)
        if modern {
            let lean = served_by(gateway, server, "lean").await;
            assert_eq!(lean, lean_before + 1, "the 2026-07-28 caller's call took the lean relay");
        }

        let revisions = upstream_revisions(gateway, server).await;
        let revision = expected.upstream[i];
        assert!(revisions.iter().any(|r| r == revision), "{caller} caller: upstream on {revision}: {revisions:?}");
        olivia.cancel().await.unwrap();
    }
    let revisions = upstream_revisions(gateway, server).await;
    assert!(revisions.iter().all(|r| expected.upstream.contains(&r.as_str())), "{revisions:?}");
    let rows = gateway.audited(&prefixed(expected.tool), 2).await;
    assert_eq!(rows, vec![("ok".to_owned(), None), ("ok".to_owned(), None)], "the two calls' audit rows");
}

/// Legacy only (TypeScript SDK 1.x: up to 2025-11-25): `initialize` for either caller.
const EVERYTHING: Expected = Expected {
    tools: &["echo", "get-sum", "get-tiny-image"],
    tool: "echo",
    args: r#"{"message": "hello from the {caller} caller"}"#,
    text: "Echo: hello from the {caller} caller",
    upstream: ["2025-11-25", "2025-11-25"],
};

/// Both eras (Python SDK 2.x): each caller's own.
const PYTHON: Expected = Expected {
    tools: &["shout", "add"],
    tool: "shout",
    args: r#"{"text": "hello from the {caller} caller"}"#,
    text: "HELLO FROM THE {CALLER} CALLER!",
    upstream: ["2025-11-25", "2026-07-28"],
};

/// server-everything over stdio, started by the gateway.
async fn everything_over_stdio(backend: Backend) {
    let server = everything().await;
    let gateway = Gateway::start(backend).await;
    let declaration = json!({
        "command": server.node.display().to_string(),
        "args": [server.entry.display().to_string(), "stdio"],
        "env": {},
    });
    let name = named("everything", backend);
    gateway.bind(&name, declaration).await;
    list_and_call(&gateway, &name, &EVERYTHING).await;
    policies_over_everything(&gateway, &name).await;
    policies_over_everything_items(&gateway, &name).await;
}

both_dbs!(interop_everything_over_stdio, everything_over_stdio);

/// Cedar policies over server-everything's own tools, their arguments typed from its input
/// schemas (zod's JSON Schema) and their annotations: rmcp's client as a worker and an auditor,
/// each case allowed and refused.
async fn policies_over_everything(gateway: &Gateway, server: &str) {
    use reqwest::Method;

    use crate::admin_api::send;

    let live = &gateway.live;
    let owner = live.token_for("olivia@acme.test");
    // The gateway recorded the server's tools when the owner listed them (list_and_call).
    eventually(format!("{server}'s tools recorded"), || async {
        let n = live.count(&format!("SELECT COUNT(*) FROM tool_catalogue WHERE server = '{server}'")).await;
        if n > 0 { Ok(()) } else { Err("not yet".to_owned()) }
    })
    .await;
    let put = |id: &'static str, text: String| {
        let owner = owner.clone();
        async move {
            let path = format!("/admin/v1/tenants/acme/policies/{id}");
            let answer = send(live, Method::PUT, &path, &owner, json!({ "text": text })).await;
            assert_eq!(answer.status, 201, "{id}: {}", answer.body);
        }
    };
    put(
        "clean-echo",
        format!(
            "permit (principal in Role::\"worker\", action == Action::\"{server}__echo\", resource) \
             unless {{ context.arguments.message like \"*forbidden*\" }};"
        ),
    )
    .await;
    put(
        "small-sums",
        format!(
            "permit (principal in Role::\"worker\", action == Action::\"{server}__get-sum\", resource) \
             when {{ context.arguments.a.lessThan(decimal(\"50.0\")) && context.arguments.b.lessThan(decimal(\"50.0\")) }};"
        ),
    )
    .await;
    put(
        "auditors-read",
        format!(
            "permit (principal in Role::\"auditor\", action in Action::\"call_tool\", resource in Server::\"{server}\") \
             when {{ resource.readOnlyHint }};"
        ),
    )
    .await;

    let call = |client: &RunningService<RoleClient, ()>, tool: &str, args: Value| {
        let params =
            CallToolRequestParams::new(format!("{server}__{tool}")).with_arguments(args.as_object().cloned().unwrap());
        let peer = client.peer().clone();
        async move { peer.call_tool(params).await }
    };
    let walt = gateway.client("walt@acme.test", false).await;
    let echoed = eventually("the worker's echo is permitted", || async {
        call(&walt, "echo", json!({"message": "hello"})).await.map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(text_of(&echoed), "Echo: hello");
    let refused = |result: Result<CallToolResult, rmcp::ServiceError>, what: &str| match result {
        Err(rmcp::ServiceError::McpError(e)) => assert_eq!(e.message, "tool not found", "{what}"),
        other => panic!("{what}: refused as an unknown tool, got {other:?}"),
    };
    refused(call(&walt, "echo", json!({"message": "a forbidden word"})).await, "echo with the word");
    let sum = call(&walt, "get-sum", json!({"a": 20, "b": 22.5})).await.unwrap();
    assert!(text_of(&sum).contains("42.5"), "{sum:?}");
    refused(call(&walt, "get-sum", json!({"a": 70, "b": 1})).await, "a sum over the bound");
    refused(call(&walt, "get-env", json!({})).await, "a tool no policy permits");

    let audrey = gateway.client("audrey@acme.test", false).await;
    let names: Vec<String> = audrey.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    assert!(names.contains(&format!("{server}__echo")), "read-only tools are listed for auditors: {names:?}");
    assert!(!names.contains(&format!("{server}__toggle-simulated-logging")), "others are not: {names:?}");
    call(&audrey, "get-sum", json!({"a": 500, "b": 500})).await.unwrap();
    refused(call(&audrey, "toggle-simulated-logging", json!({})).await, "a tool that is not read-only");
    walt.cancel().await.unwrap();
    audrey.cancel().await.unwrap();

    // The same decisions for the Python SDK's client.
    let calls = json!([
        {"tool": format!("{server}__echo"), "arguments": {"message": "from python"}},
        {"tool": format!("{server}__echo"), "arguments": {"message": "forbidden from python"}},
        {"tool": format!("{server}__get-sum"), "arguments": {"a": 1, "b": 2}},
        {"tool": format!("{server}__get-sum"), "arguments": {"a": 1, "b": 99}},
    ]);
    let out = tokio::process::Command::new(python().await)
        .arg(fixture_file("python/policy_client.py"))
        .arg(live.url())
        .arg(live.token_for("walt@acme.test"))
        .arg(calls.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "the Python client: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = report["tools"].as_array().unwrap();
    assert!(listed.contains(&json!(format!("{server}__echo"))), "{report}");
    assert!(!listed.contains(&json!(format!("{server}__get-env"))), "{report}");
    let calls = report["calls"].as_array().unwrap();
    assert_eq!(
        (calls[0]["ok"].as_bool(), calls[0]["text"].as_str()),
        (Some(true), Some("Echo: from python")),
        "{report}"
    );
    assert!(calls[1]["error"].as_str().is_some_and(|e| e.contains("tool not found")), "{report}");
    assert_eq!(calls[2]["ok"], true, "{report}");
    assert!(calls[3]["error"].as_str().is_some_and(|e| e.contains("tool not found")), "{report}");
}

/// Cedar policies over server-everything's prompts, resources and completions, for a worker
/// holding no grant on it: what they permit is listed and served, what they do not is answered
/// as a name that does not exist and audited with the deciding policies.
async fn policies_over_everything_items(gateway: &Gateway, server: &str) {
    use reqwest::Method;
    use rmcp::model::{GetPromptRequestParams, GetPromptResponse, ReadResourceRequestParams};

    use crate::admin_api::{delete, send};

    let live = &gateway.live;
    let owner = live.token_for("olivia@acme.test");
    for (id, text) in [
        (
            "worker-prompts",
            format!(
                "permit (principal in Role::\"worker\", action == Action::\"get_prompt\", resource is Prompt in Server::\"{server}\") \
                 unless {{ resource.name == \"args-prompt\" }};"
            ),
        ),
        (
            "worker-completions",
            format!(
                "permit (principal in Role::\"worker\", action == Action::\"complete\", resource is Prompt in Server::\"{server}\") \
                 when {{ resource.name == \"completable-prompt\" }};"
            ),
        ),
        (
            "worker-docs",
            format!(
                "permit (principal in Role::\"worker\", action == Action::\"read_resource\", resource is Resource in Server::\"{server}\") \
                 when {{ resource.uri like \"demo://resource/static/*\" }};"
            ),
        ),
        (
            "no-instructions",
            "forbid (principal, action == Action::\"read_resource\", resource is Resource) \
             when { resource.uri like \"*instructions*\" };"
                .to_owned(),
        ),
    ] {
        let path = format!("/admin/v1/tenants/acme/policies/{id}");
        let answer = send(live, Method::PUT, &path, &owner, json!({ "text": text })).await;
        assert_eq!(answer.status, 201, "{id}: {}", answer.body);
    }
    let walt = gateway.client("walt@acme.test", false).await;
    let prompts: Vec<String> = eventually("the worker's prompts are listed", || async {
        let names: Vec<String> =
            walt.list_all_prompts().await.map_err(|e| e.to_string())?.into_iter().map(|p| p.name).collect();
        if names.is_empty() { Err("none yet".to_owned()) } else { Ok(names) }
    })
    .await;
    let prompt = |name: &str| format!("{server}__{name}");
    assert!(prompts.contains(&prompt("simple-prompt")), "{prompts:?}");
    assert!(!prompts.contains(&prompt("args-prompt")), "no policy permits it: {prompts:?}");
    match walt.get_prompt_once(GetPromptRequestParams::new(prompt("simple-prompt"))).await.unwrap() {
        GetPromptResponse::Complete(result) => assert_eq!(result.messages.len(), 1, "{result:?}"),
        other => panic!("{other:?}"),
    }
    let mut arguments = serde_json::Map::new();
    arguments.insert("city".to_owned(), json!("Paris"));
    let refused =
        walt.get_prompt_once(GetPromptRequestParams::new(prompt("args-prompt")).with_arguments(arguments)).await;
    match refused {
        Err(rmcp::ServiceError::McpError(e)) => assert_eq!(e.message, "prompt not found"),
        other => panic!("args-prompt is refused as unknown: {other:?}"),
    }
    let departments = walt.complete_prompt_simple(prompt("completable-prompt"), "department", "E").await.unwrap();
    assert_eq!(departments, ["Engineering"]);
    match walt.complete_prompt_simple(prompt("simple-prompt"), "department", "E").await {
        Err(rmcp::ServiceError::McpError(e)) => assert_eq!(e.message, "prompt not found"),
        other => panic!("a completion no policy permits: {other:?}"),
    }

    let uris: Vec<String> = walt.list_all_resources().await.unwrap().into_iter().map(|r| r.uri).collect();
    let doc = |name: &str| uris.iter().find(|u| u.ends_with(name)).cloned();
    let features = doc("features.md").unwrap_or_else(|| panic!("the static documents are listed: {uris:?}"));
    assert!(doc("instructions.md").is_none(), "a forbidden document is not listed: {uris:?}");
    assert!(uris.iter().all(|u| u.contains("/static/")), "only the static documents: {uris:?}");
    let read = walt.read_resource(ReadResourceRequestParams::new(features.clone())).await.unwrap();
    assert!(!read.contents.is_empty());
    let instructions = features.replace("features.md", "instructions.md");
    match walt.read_resource(ReadResourceRequestParams::new(instructions.clone())).await {
        Err(rmcp::ServiceError::McpError(e)) => assert_eq!(e.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND),
        other => panic!("a forbidden document reads as missing: {other:?}"),
    }
    walt.cancel().await.unwrap();

    // The audit names the policies that decided.
    let policy_of = |item: String| async move {
        eventually(format!("the audit of {item}"), || async {
            let mut tx = live.db.begin().await.unwrap();
            let row: Option<(String, Option<String>, Option<String>)> = sqlx::query_as(
                "SELECT outcome, error_class, policy FROM audit_events WHERE tool = $1 ORDER BY seq DESC LIMIT 1",
            )
            .bind(&item)
            .fetch_optional(&mut *tx)
            .await
            .unwrap();
            row.ok_or_else(|| "not yet".to_owned())
        })
        .await
    };
    let (outcome, class, policy) = policy_of(format!("prompts/get {}", prompt("args-prompt"))).await;
    assert_eq!((outcome.as_str(), class.as_deref()), ("denied", Some("policy_no_permit")));
    let policy: Value = serde_json::from_str(&policy.unwrap()).unwrap();
    assert_eq!((&policy["decision"], &policy["reason"]), (&json!("deny"), &json!("no_permit")), "{policy}");
    let (outcome, _, policy) = policy_of(format!("prompts/get {}", prompt("simple-prompt"))).await;
    assert_eq!(outcome, "ok");
    let policy: Value = serde_json::from_str(&policy.unwrap()).unwrap();
    assert_eq!(policy["policies"], json!(["worker-prompts"]), "{policy}");

    for id in ["worker-prompts", "worker-completions", "worker-docs", "no-instructions"] {
        let answer = delete(live, &format!("/admin/v1/tenants/acme/policies/{id}"), &owner).await;
        assert_eq!(answer.status, 204, "{id}: {}", answer.body);
    }
}

/// server-everything over Streamable HTTP (`streamableHttp`, path /mcp), on 127.0.0.1.
async fn everything_over_http(backend: Backend) {
    let server = everything().await;
    let preload = base64::engine::general_purpose::STANDARD.encode(LISTEN_ON_LOOPBACK);
    let mut cmd = tokio::process::Command::new(&server.node);
    cmd.arg("--import").arg(format!("data:text/javascript;base64,{preload}"));
    cmd.arg(&server.entry).arg("streamableHttp").env("PORT", "0");
    let (_child, addr) = http_upstream(cmd, true).await;
    let gateway = Gateway::start(backend).await;
    let name = named("everything-http", backend);
    gateway.bind(&name, json!({"url": format!("http://{addr}/mcp")})).await;
    list_and_call(&gateway, &name, &EVERYTHING).await;
}

both_dbs!(interop_everything_over_http, everything_over_http);

/// The Python SDK fixture over stdio, started by the gateway.
async fn python_over_stdio(backend: Backend) {
    let python = python().await;
    let gateway = Gateway::start(backend).await;
    let declaration = json!({
        "command": python.display().to_string(),
        "args": [python_fixture(), "stdio"],
        "env": {},
    });
    let name = named("py", backend);
    gateway.bind(&name, declaration).await;
    list_and_call(&gateway, &name, &PYTHON).await;
}

both_dbs!(interop_python_sdk_over_stdio, python_over_stdio);

/// The Python SDK fixture over Streamable HTTP, on 127.0.0.1.
async fn python_over_http(backend: Backend) {
    let python = python().await;
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(python_fixture()).arg("http");
    let (_child, addr) = http_upstream(cmd, false).await;
    let gateway = Gateway::start(backend).await;
    let name = named("py-http", backend);
    gateway.bind(&name, json!({"url": format!("http://{addr}/mcp")})).await;
    list_and_call(&gateway, &name, &PYTHON).await;
}

both_dbs!(interop_python_sdk_over_http, python_over_http);
