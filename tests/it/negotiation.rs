//! Protocol revisions between the gateway's callers and its upstreams: how each upstream's
//! revision is settled (negotiated modern first for 2026-07-28 callers, `initialize` first for
//! legacy callers, or pinned by the declaration), against upstreams that serve both eras, only
//! the legacy one, only the modern one, or answer UnsupportedProtocolVersionError first; what
//! a 2026-07-28 caller may not use (removed methods: 404 / -32601); its `subscriptions/listen`
//! streams, which carry only what the caller may see; and cache hints that never let a shared
//! cache keep an answer made for one caller. The upstream is the fixture's `everything` mode
//! over Streamable HTTP (its `FIXTURE_ERA` gate plays the eras and logs what it was sent);
//! rmcp's client over real HTTP; on SQLite and PostgreSQL.

use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ServerNotification, SubscriptionFilter};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServiceExt};
use scopegate::model::Role;
use scopegate::store::entities::{self, GrantKind};
use serde_json::{Value, json};

use crate::support::*;

/// How long the gateway may take to open its listen stream to an upstream after the first
/// use of it (one request to a local upstream): what a list change waits for before it can
/// travel that stream.
const LISTEN_OPENS: Duration = Duration::from_millis(500);

/// A listen stream is taken to have said all it will once it has been quiet this long: the
/// call that changed the lists has been answered, its notifications were sent before that
/// answer on streams already open, and each reaches the caller in milliseconds.
const QUIET: Duration = Duration::from_millis(800);

/// How long to listen for a notification that must not come: the upstream would have sent it
/// before answering the call that caused it, the gateway passes it on as it comes, and the
/// client's handler runs right after, all within milliseconds.
const UNSENT_NOTIFICATION: Duration = Duration::from_millis(300);

async fn gateway(backend: Backend) -> Live {
    let live = Live::start(backend, Mode::Session, &[("upstream.connect_timeout_secs", json!(15))]).await;
    let mut tx = live.db.begin().await.unwrap();
    entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    tx.commit().await.unwrap();
    live
}

/// Declares `declaration` as `server` of acme (prefixed) and grants `grants` to `role`.
async fn bind(live: &Live, server: &str, declaration: Value, grants: &[(Role, GrantKind, &str)]) {
    let mut tx = live.db.begin().await.unwrap();
    entities::create_entity(&mut tx, "acme", &format!("defaults/mcp-servers/{server}"), &declaration).await.unwrap();
    entities::bind_server(&mut tx, "acme", server, "local").await.unwrap();
    for (role, kind, name) in grants {
        entities::grant(&mut tx, "acme", server, *role, *kind, name).await.unwrap();
    }
    tx.commit().await.unwrap();
}

const OWNER_ALL: &[(Role, GrantKind, &str)] = &[
    (Role::Owner, GrantKind::Tool, "*"),
    (Role::Owner, GrantKind::Prompt, "*"),
    (Role::Owner, GrantKind::Resource, "*"),
];

/// rmcp's client on protocol 2025-11-25 (a session).
async fn legacy(live: &Live, subject: &str) -> RunningService<RoleClient, ()> {
    ().serve(live.transport(subject)).await.unwrap_or_else(|e| panic!("{subject} connects: {e}"))
}

/// rmcp's client on protocol 2026-07-28 (no session).
async fn modern(live: &Live, subject: &str) -> RunningService<RoleClient, ()> {
    let lifecycle =
        ClientLifecycleMode::Discover { preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28] };
    ().serve_with_lifecycle(live.transport(subject), lifecycle).await.unwrap_or_else(|e| panic!("{subject}: {e}"))
}

async fn simple_text(client: &RunningService<RoleClient, ()>, tool: &str) -> String {
    let result =
        client.call_tool(CallToolRequestParams::new(tool.to_owned())).await.unwrap_or_else(|e| panic!("{tool}: {e}"));
    result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect()
}

/// What the upstream was sent, in order: `method version` per request.
fn sent(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Each kind of upstream, with a legacy caller and a 2026-07-28 caller: both are served, and
/// the upstream is spoken to in the era it serves, the caller's own where it serves both. A
/// revision without `initialize` is never offered in one; a pinned declaration is spoken to
/// in its revision only.
async fn negotiation(backend: Backend) {
    let live = gateway(backend).await;
    let dir = tempfile::tempdir().unwrap();
    // (server, FIXTURE_ERA, pinned protocolVersion)
    let cases = [
        ("dual", "", None),
        ("old", "legacy", None),
        ("new", "modern", None),
        ("picky", "unsupported-first", None),
        ("pinold", "", Some("2025-06-18")),
        ("pinnew", "", Some("2026-07-28")),
    ];
    let mut children = Vec::new();
    for (server, era, pinned) in cases {
        let log = dir.path().join(format!("{server}.log"));
        let env = [("FIXTURE_ERA", era), ("FIXTURE_ERA_LOG", log.to_str().unwrap())];
        let (child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &env).await;
        children.push(child);
        let mut declaration = json!({"url": format!("http://{addr}/mcp")});
        if let Some(version) = pinned {
            declaration["protocolVersion"] = json!(version);
        }
        bind(&live, server, declaration, OWNER_ALL).await;
    }
    let (old_caller, new_caller) = (legacy(&live, "olivia@acme.test").await, modern(&live, "olivia@acme.test").await);
    for (server, _, _) in cases {
        let tool = format!("{server}__test_simple_text");
        for (who, caller) in [("legacy", &old_caller), ("2026-07-28", &new_caller)] {
            let text = simple_text(caller, &tool).await;
            assert_eq!(text, "This is a simple text response for testing.", "{who} caller, {server}");
        }
    }
    let calls =
        |lines: &[String], version: &str| lines.iter().filter(|l| *l == &format!("tools/call {version}")).count();
    for (server, _, _) in cases {
        let lines = sent(&dir.path().join(format!("{server}.log")));
        assert!(
            !lines.iter().any(|l| l == "initialize 2026-07-28"),
            "{server}: initialize offered 2026-07-28: {lines:?}"
        );
        let (legacy_calls, modern_calls) = (calls(&lines, "2025-11-25"), calls(&lines, "2026-07-28"));
        match server {
            // Each caller in its own era.
            "dual" | "picky" => assert_eq!((legacy_calls, modern_calls), (1, 1), "{server}: {lines:?}"),
            // A single-era server serves both callers in its era.
            "old" => assert_eq!((legacy_calls, modern_calls), (2, 0), "{server}: {lines:?}"),
            "new" | "pinnew" => assert_eq!((legacy_calls, modern_calls), (0, 2), "{server}: {lines:?}"),
            "pinold" => assert_eq!(calls(&lines, "2025-06-18"), 2, "{server}: {lines:?}"),
            _ => unreachable!(),
        }
        match server {
            // The legacy-only server was probed (modern first, for the 2026-07-28 caller) and
            // the gateway fell back to initialize.
            "old" => assert!(lines.iter().any(|l| l.starts_with("server/discover")), "{lines:?}"),
            // The modern-only server refused initialize; the gateway went on with discover.
            "new" => {
                assert!(lines.iter().any(|l| l == "initialize 2025-11-25"), "{lines:?}");
                assert!(lines.iter().any(|l| l == "server/discover 2026-07-28"), "{lines:?}");
            }
            // The version refused at first is asked again once the server names it supported.
            "picky" => {
                let discovers = lines.iter().filter(|l| l.starts_with("server/discover")).count();
                assert_eq!(discovers, 2, "{lines:?}");
            }
            "pinold" => assert!(lines.iter().all(|l| !l.starts_with("server/discover")), "{lines:?}"),
            "pinnew" => assert!(lines.iter().all(|l| !l.starts_with("initialize")), "{lines:?}"),
            _ => {}
        }
    }
    old_caller.cancel().await.unwrap();
    new_caller.cancel().await.unwrap();
}

both_dbs!(negotiation_settles_each_upstreams_revision, negotiation);

/// The next notification on `stream` within `wait`, if any.
async fn next_within(stream: &mut rmcp::service::Subscription, wait: Duration) -> Option<ServerNotification> {
    tokio::time::timeout(wait, stream.next()).await.ok().and_then(|n| n.ok().flatten())
}

fn kind(notification: &ServerNotification) -> &'static str {
    match notification {
        ServerNotification::ToolListChangedNotification(_) => "tools",
        ServerNotification::PromptListChangedNotification(_) => "prompts",
        ServerNotification::ResourceListChangedNotification(_) => "resources",
        ServerNotification::ResourceUpdatedNotification(_) => "updated",
        _ => "other",
    }
}

/// Every notification that arrives on `stream` until it has been quiet for `quiet`.
async fn drain(stream: &mut rmcp::service::Subscription, quiet: Duration) -> Vec<&'static str> {
    let mut got = Vec::new();
    while let Some(n) = next_within(stream, quiet).await {
        got.push(kind(&n));
    }
    got.sort_unstable();
    got
}

/// A 2026-07-28 caller's `subscriptions/listen`: the acknowledgement first, then list changes,
/// each only of the servers and kinds the caller holds grants for. A worker granted one tool
/// of one server hears of that server's tool list and of nothing else; a resource he may not
/// read is acknowledged like any other and never reported.
async fn listen_scoping(backend: Backend) {
    let live = gateway(backend).await;
    let declaration = json!({"command": FIXTURE, "args": ["everything", "stdio"]});
    bind(&live, "seen", declaration.clone(), OWNER_ALL).await;
    bind(&live, "unseen", declaration, OWNER_ALL).await;
    let mut tx = live.db.begin().await.unwrap();
    entities::grant(&mut tx, "acme", "seen", Role::Worker, GrantKind::Tool, "test_simple_text").await.unwrap();
    tx.commit().await.unwrap();

    let (olivia, wanda) = (modern(&live, "olivia@acme.test").await, modern(&live, "wanda@acme.test").await);
    let every = || {
        let mut f = SubscriptionFilter::new();
        (f.tools_list_changed, f.prompts_list_changed, f.resources_list_changed) = (Some(true), Some(true), Some(true));
        f.resource_subscriptions = Some(vec!["scopegate://unseen/test://watched-resource".to_owned()]);
        f
    };
    let mut olivia_stream = olivia.peer().listen(every()).await.expect("olivia listens");
    let mut wanda_stream = wanda.peer().listen(every()).await.expect("wanda listens");
    assert_eq!(wanda_stream.acknowledged().tools_list_changed, Some(true), "acknowledged as asked");
    // The listen streams follow each upstream's own (opened by the gateway on first use).
    simple_text(&olivia, "seen__test_simple_text").await;
    simple_text(&olivia, "unseen__test_simple_text").await;
    tokio::time::sleep(LISTEN_OPENS).await;

    // A server the worker holds no grant for changes its lists: only the owner hears of it.
    let params = CallToolRequestParams::new("unseen__change_lists");
    olivia.call_tool(params).await.expect("change_lists");
    let quiet = QUIET;
    assert_eq!(drain(&mut olivia_stream, quiet).await, ["prompts", "resources", "tools"], "the owner hears all");
    assert_eq!(drain(&mut wanda_stream, quiet).await, Vec::<&str>::new(), "the worker hears nothing of `unseen`");

    // The server he holds one tool of: its tool list only.
    olivia.call_tool(CallToolRequestParams::new("seen__change_lists")).await.expect("change_lists");
    assert_eq!(drain(&mut olivia_stream, quiet).await, ["prompts", "resources", "tools"]);
    assert_eq!(drain(&mut wanda_stream, quiet).await, ["tools"], "the worker hears only of the kind he is granted");

    olivia.cancel().await.unwrap();
    wanda.cancel().await.unwrap();
}

both_dbs!(listen_streams_carry_only_what_the_caller_may_see, listen_scoping);

/// POSTs one 2026-07-28 request with the standard headers and `_meta`; the status and body.
async fn raw_modern(live: &Live, id: u64, method: &str, params: Value) -> (u16, Value) {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    // The standard headers (SEP-2243): the method, and the name or URI a request is about.
    let name = params.get("name").or_else(|| params.get("uri")).and_then(Value::as_str).map(str::to_owned);
    let mut request = reqwest::Client::new()
        .post(live.url())
        .bearer_auth(live.token_for("olivia@acme.test"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = name {
        request = request.header("mcp-name", name);
    }
    let response =
        request.json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Methods 2026-07-28 removed (and unknown ones) answer 404 with -32601 and the request's id;
/// GET and DELETE answer 405. Every cacheable result for a caller says `cacheScope: private`,
/// whatever its upstream said of its own answer (a shared cache must never serve one caller's
/// list or read to another); and relayed results carry `resultType`.
async fn modern_surface(backend: Backend) {
    let live = gateway(backend).await;
    let (_child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &[("FIXTURE_CACHE_PUBLIC", "1")]).await;
    bind(&live, "fx", json!({"url": format!("http://{addr}/mcp")}), OWNER_ALL).await;

    for (i, method) in
        ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "no/such"]
            .iter()
            .enumerate()
    {
        let id = 40 + i as u64;
        let (status, body) = raw_modern(&live, id, method, json!({})).await;
        assert_eq!(status, 404, "{method}: {body}");
        assert_eq!(body["error"]["code"], -32601, "{method}: {body}");
        assert_eq!(body["id"], id, "{method}: {body}");
    }
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let status = reqwest::Client::new()
            .request(method.clone(), live.url())
            .bearer_auth(live.token_for("olivia@acme.test"))
            .header("accept", "text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 405, "{method}");
    }

    for (method, params) in [
        ("tools/list", json!({})),
        ("prompts/list", json!({})),
        ("resources/list", json!({})),
        ("resources/templates/list", json!({})),
        ("resources/read", json!({"uri": "scopegate://fx/test://static-text"})),
    ] {
        let (status, body) = raw_modern(&live, 7, method, params).await;
        assert_eq!(status, 200, "{method}: {body}");
        assert_eq!(body["result"]["cacheScope"], "private", "{method}: {body}");
        assert_eq!(body["result"]["resultType"], "complete", "{method}: {body}");
    }
    let (_, body) = raw_modern(&live, 8, "tools/call", json!({"name": "fx__test_simple_text", "arguments": {}})).await;
    assert_eq!(body["result"]["resultType"], "complete", "{body}");
    // rmcp's client reads the same.
    let client = modern(&live, "olivia@acme.test").await;
    let read = client.read_resource(ReadResourceRequestParams::new("scopegate://fx/test://static-text")).await.unwrap();
    assert_eq!(read.cache_scope, Some(rmcp::model::CacheScope::Private), "{read:?}");
    client.cancel().await.unwrap();
}

both_dbs!(modern_callers_get_404_for_removed_methods_and_private_cache_hints, modern_surface);

/// A legacy session's client that records the log lines and resource updates it is sent.
#[derive(Clone, Default)]
struct Heard(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Heard {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[allow(deprecated)]
impl rmcp::ClientHandler for Heard {
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(format!("log {}", params.data.as_str().unwrap_or_default()));
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(format!("updated {}", params.uri));
    }
}

/// A legacy session in front of a modern-only upstream: its `logging/setLevel` reaches the
/// upstream as each request's level (`_meta`), and `resources/subscribe` rides the connection's
/// `subscriptions/listen` stream to that upstream (updates reach the subscribed session under
/// the URI it knows; after `unsubscribe`, none).
#[allow(deprecated)]
async fn bridged_to_modern(backend: Backend) {
    use rmcp::model::{LoggingLevel, SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams};
    let live = gateway(backend).await;
    let (_child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &[("FIXTURE_ERA", "modern")]).await;
    bind(&live, "mod", json!({"url": format!("http://{addr}/mcp")}), OWNER_ALL).await;
    let heard = Heard::default();
    let session = heard.clone().serve(live.transport("olivia@acme.test")).await.expect("connects");
    let call = |tool: &str| session.call_tool(CallToolRequestParams::new(tool.to_owned()));

    // The session's level (default info) travels with the request: the upstream logs.
    call("mod__test_tool_with_logging").await.expect("call");
    eventually("the upstream's log lines reach the session", || async {
        heard.0.lock().unwrap().iter().filter(|l| l.starts_with("log Tool")).count() >= 3
    })
    .await;
    let logs = heard.take();
    assert_eq!(logs.iter().filter(|l| l.starts_with("log Tool")).count(), 3, "{logs:?}");
    // warning and above: the upstream's info lines are not even sent.
    session.set_level(SetLevelRequestParams::new(LoggingLevel::Warning)).await.expect("setLevel");
    call("mod__test_tool_with_logging").await.expect("call");
    tokio::time::sleep(UNSENT_NOTIFICATION).await;
    assert!(heard.take().iter().all(|l| !l.starts_with("log")), "no line below warning");

    // Subscribed: an update of the resource reaches the session (once the connection's listen
    // stream to the upstream names the URI).
    let uri = "scopegate://mod/test://watched-resource";
    session.subscribe(SubscribeRequestParams::new(uri)).await.expect("subscribe");
    let got = eventually("an update reaches the subscribed session", || async {
        let got = heard.take();
        if !got.is_empty() {
            return Some(got);
        }
        call("mod__update_watched_resource").await.expect("update");
        None
    })
    .await;
    assert!(got.iter().any(|h| h == &format!("updated {uri}")), "{got:?}");
    session.unsubscribe(UnsubscribeRequestParams::new(uri)).await.expect("unsubscribe");
    // Updates still on their way from before the unsubscription land, and are wiped.
    tokio::time::sleep(UNSENT_NOTIFICATION).await;
    heard.take();
    call("mod__update_watched_resource").await.expect("update");
    tokio::time::sleep(UNSENT_NOTIFICATION).await;
    assert_eq!(heard.take(), Vec::<String>::new(), "no update after unsubscribe");
    session.cancel().await.unwrap();
}

both_dbs!(legacy_sessions_are_bridged_to_a_modern_upstream, bridged_to_modern);

/// A legacy stdio server that leaves the modern probe unanswered (it never sees it: a filter
/// in front of it drops `server/discover`): a 2026-07-28 caller's connection waits for the
/// probe, falls back to `initialize` (the 2026-07-28 rules: "the probe ... times out, and the
/// client falls back"), and is served.
async fn silent_probe(backend: Backend) {
    // The handshake's time as configured by default (the probe's wait comes on top of it).
    let live = Live::start(backend, Mode::Session, &[("upstream.connect_timeout_secs", json!(5))]).await;
    let mut tx = live.db.begin().await.unwrap();
    entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    tx.commit().await.unwrap();
    let script = format!("grep --line-buffered -v server/discover | exec {FIXTURE} everything stdio");
    let declaration = json!({"command": "/bin/sh", "args": ["-c", script], "env": {"PATH": "/usr/bin:/bin"}});
    bind(&live, "quiet", declaration, OWNER_ALL).await;
    let caller = modern(&live, "olivia@acme.test").await;
    let started = std::time::Instant::now();
    let text = simple_text(&caller, "quiet__test_simple_text").await;
    assert_eq!(text, "This is a simple text response for testing.");
    assert!(started.elapsed() >= Duration::from_secs(9), "the probe was waited for: {:?}", started.elapsed());
    caller.cancel().await.unwrap();
}

both_dbs!(an_unanswered_probe_falls_back_to_initialize, silent_probe);

/// An upstream that sends its progress in a burst: the caller gets every step, in the order
/// the upstream sent them (rmcp runs the gateway's notification handlers concurrently). Read
/// off the wire (a client library's own handlers may run concurrently too).
async fn progress_in_order(backend: Backend) {
    let live = gateway(backend).await;
    let env = [("FIXTURE_PROGRESS_BURST", "40")];
    let (_child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &env).await;
    bind(&live, "burst", json!({"url": format!("http://{addr}/mcp")}), OWNER_ALL).await;
    let client = reqwest::Client::new();
    let post = |session: Option<&str>, body: Value| {
        let mut request = client
            .post(live.url())
            .bearer_auth(live.token_for("olivia@acme.test"))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    // Sampling declared: the call takes rmcp's path (the lean relay reads progress itself).
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"sampling": {}}, "clientInfo": {"name": "t", "version": "1"}}});
    let response = post(None, init).await.unwrap();
    let session = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    response.text().await.unwrap();
    post(Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await.unwrap();
    for id in 2..7 {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "burst__test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": id}}});
        let body = post(Some(&session), call).await.unwrap().text().await.unwrap();
        let got: Vec<f64> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .filter(|m| m["method"] == "notifications/progress")
            .filter_map(|m| m["params"]["progress"].as_f64())
            .collect();
        assert_eq!(got.len(), 40, "every step: {got:?}");
        assert!(got.windows(2).all(|w| w[0] <= w[1]), "in order: {got:?}");
    }
}

both_dbs!(progress_reaches_the_caller_in_order, progress_in_order);

/// A `subscriptions/listen` stream lives no longer than its caller's token: after `exp` the
/// gateway no longer knows who listens, and ends the stream.
async fn listen_ends_with_the_token(backend: Backend) {
    let live = gateway(backend).await;
    let mut claims = claims(&live.config, "acme", "olivia@acme.test");
    claims["exp"] = json!(now() + 3);
    let token = Signer::dev().sign(&claims);
    let transport = transport(&live.url(), &token);
    let lifecycle =
        ClientLifecycleMode::Discover { preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28] };
    let caller = ().serve_with_lifecycle(transport, lifecycle).await.expect("connects");
    let mut filter = SubscriptionFilter::new();
    filter.tools_list_changed = Some(true);
    let mut stream = caller.peer().listen(filter).await.expect("listens");
    let started = std::time::Instant::now();
    let ended =
        tokio::time::timeout(Duration::from_secs(10), async { while let Ok(Some(_)) = stream.next().await {} }).await;
    assert!(ended.is_ok(), "the stream outlived the token");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "it ended with the token, not at once: {:?}",
        started.elapsed()
    );
    caller.cancel().await.unwrap();
}

both_dbs!(a_listen_stream_ends_with_its_callers_token, listen_ends_with_the_token);

/// A 2026-07-28 upstream that asks a 2026-07-28 caller something the caller did not declare
/// (here sampling, of a client that declared nothing): the question is not passed on, the call
/// fails as "does not support", and the refusal is audited.
async fn undeclared_question(backend: Backend) {
    let live = gateway(backend).await;
    bind(&live, "asks", json!({"command": FIXTURE, "args": ["everything", "stdio"]}), OWNER_ALL).await;
    let caller = modern(&live, "olivia@acme.test").await;
    let params = CallToolRequestParams::new("asks__test_sampling")
        .with_arguments(json!({"prompt": "nobody declared this"}).as_object().cloned().unwrap());
    let refused = caller.peer().call_tool(params).await.expect_err("refused");
    assert!(refused.to_string().contains("does not support sampling/createMessage"), "{refused}");
    let mut tx = live.db.begin().await.unwrap();
    let rows: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT outcome, error_class FROM audit_events WHERE tool = 'asks:sampling/createMessage'")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    assert_eq!(rows, [("failed".to_owned(), Some("not_declared".to_owned()))]);
    caller.cancel().await.unwrap();
}

both_dbs!(an_undeclared_question_is_not_passed_through, undeclared_question);
