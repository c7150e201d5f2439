//! The lean relay for proxied `tools/call` (a session's calls to an upstream),
//! seen from a raw HTTP client: which calls it takes (answered as plain JSON; rmcp answers a
//! session's request with an event stream), that it asserts the caller, enforces the grants,
//! audits before answering and fails closed, and that it leaves to rmcp what it can't serve
//! the same way. Progress, log lines, timeouts and cancellation on it are proven by the proxy
//! tests run over HTTP (`proxy::*_over_http`, `proxy_hanging_http_upstream_*`).

use std::time::Duration;

use reqwest::StatusCode;
use scopegate::model::Role;
use serde_json::{Value, json};

use crate::support::*;

/// How long rmcp may take to run a session's `initialized` handler once it has answered the
/// notification (the relay may serve the session from then on): a task on the gateway's own
/// runtime with nothing to wait for, so a few milliseconds. After this wait a session's calls
/// are ones the relay would take if it could: those it serves show it, and those it must
/// leave to rmcp show that it left them, which no event could.
const INITIALIZED_HANDLED: Duration = Duration::from_millis(200);

fn content_type(reply: &Reply) -> &str {
    reply.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// The tool result's text, parsed as JSON (the fixture's `whoami_upstream` answers that way).
fn result_json(reply: &Reply) -> Value {
    let text = reply.message["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{:?}", reply.message));
    serde_json::from_str(text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

/// A call the relay takes, once the session's `initialized` has been handled (rmcp answers the
/// notification before its handler runs): the first answer that comes as plain JSON.
async fn lean_call(proxy: &Proxy, token: &str, session: &str, id: i64, tool: &str, args: Value) -> Reply {
    eventually(format!("the relay takes {tool}"), || async {
        let reply = post(&proxy.live, token, Some(session), &tool_call(id, tool, args.clone()), &[]).await;
        if content_type(&reply).starts_with("application/json") {
            Ok(reply)
        } else {
            Err(format!("answered as {:?}", content_type(&reply)))
        }
    })
    .await
}

async fn serves_plain_session_calls(backend: Backend) {
    let header = ("upstream.assertion_header", json!("x-acme-caller"));
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[header], Over::Http).await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session(live, &olivia).await.unwrap();

    let reply = lean_call(&proxy, &olivia, &session, 2, "fx__whoami_upstream", json!({})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(content_type(&reply).starts_with("application/json"), "the relay answers: {:?}", reply.headers);
    assert_eq!(reply.message["id"], 2);
    let me = result_json(&reply);
    assert_eq!((me["tenant"].as_str(), me["user"].as_str()), (Some("acme"), Some("olivia@acme.test")));
    assert_eq!(me["assertion_source"], "header", "the assertion travels in the configured header");
    assert_eq!(me["authorization"], Value::Null, "the client's token never goes upstream");
    assert_eq!(me["declared_header"], "from-the-declaration");
    // Audited before the answer: the event is there as soon as the answer is.
    let sql = "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__whoami_upstream' AND outcome = 'ok'";
    let audited = live.count(sql).await;
    assert!(audited >= 1, "the call was audited before it was answered");

    // The arguments reach the upstream as sent; a tool error is relayed as one.
    let echoed =
        post(&proxy.live, &olivia, Some(&session), &tool_call(3, "fx__echo", json!({"text": "héllo \"x\""})), &[])
            .await;
    assert!(content_type(&echoed).starts_with("application/json"));
    assert_eq!(echoed.message["result"]["content"][0]["text"], "héllo \"x\"");

    // A native tool is rmcp's: an event stream.
    let native = post(live, &olivia, Some(&session), &tool_call(4, "whoami", json!({})), &[]).await;
    assert!(content_type(&native).starts_with("text/event-stream"), "{:?}", native.headers);

    // The worker's grant names one tool: the other is answered as one that does not exist,
    // and nothing reaches the upstream.
    let wanda = live.token_for("wanda@acme.test");
    let theirs = open_session(live, &wanda).await.unwrap();
    let me = lean_call(&proxy, &wanda, &theirs, 2, "fx__whoami_upstream", json!({})).await;
    assert_eq!(result_json(&me)["user"], "wanda@acme.test", "the assertion names the caller of this call");
    let refused = post(live, &wanda, Some(&theirs), &tool_call(3, "fx__echo", json!({"text": "x"})), &[]).await;
    assert_eq!(refused.message["error"]["message"], "tool not found", "{:?}", refused.message);
    let denied = "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__echo' AND outcome = 'denied'";
    assert_eq!(live.count(denied).await, 1);

    // Another tenant's caller never reaches acme's server, by name or otherwise.
    let gary = live.token_for("gary@globex.test");
    let globex = open_session(live, &gary).await.unwrap();
    let foreign = post(live, &gary, Some(&globex), &tool_call(2, "fx__whoami_upstream", json!({})), &[]).await;
    assert_eq!(foreign.message["error"]["message"], "tool not found");

    // Someone else's session is no session at all, on the relay too.
    let hijack = post(live, &gary, Some(&session), &tool_call(5, "fx__whoami_upstream", json!({})), &[]).await;
    assert_eq!(hijack.status, StatusCode::NOT_FOUND);
}
both_dbs!(lean_relay_serves_plain_session_calls, serves_plain_session_calls);

/// A stdio upstream is served by the relay too, through rmcp's client on the running
/// connection: the same assertion (in `_meta` over stdio), grants, audit before the answer,
/// and failing closed; a tool the gateway runs as a task stays with rmcp.
async fn serves_stdio_upstreams(backend: Backend) {
    let proxy = Proxy::start(backend, Mode::Session, &[]).await;
    let mut declaration = proxy.stdio("fx", "from-the-declaration");
    declaration["tasks"] = json!({"crash": "required"});
    proxy.declare("acme", "fx", &declaration, "local").await;
    proxy.grant("acme", "fx", Role::Owner, "*").await;
    proxy.grant("acme", "fx", Role::Worker, "whoami_upstream").await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session_declaring(live, &olivia, json!({"roots": {"listChanged": true}})).await;

    let reply = lean_call(&proxy, &olivia, &session, 2, "fx__whoami_upstream", json!({})).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.message["id"], 2);
    let me = result_json(&reply);
    assert_eq!((me["tenant"].as_str(), me["user"].as_str()), (Some("acme"), Some("olivia@acme.test")));
    assert_eq!(me["assertion_source"], "meta", "over stdio the assertion travels in _meta");
    assert!(reply.message["result"].get("resultType").is_none(), "{:?}", reply.message);
    let sql = "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__whoami_upstream' AND outcome = 'ok'";
    assert!(live.count(sql).await >= 1, "the call was audited before it was answered");
    let echoed = post(live, &olivia, Some(&session), &tool_call(3, "fx__echo", json!({"text": "héllo"})), &[]).await;
    assert!(content_type(&echoed).starts_with("application/json"), "{:?}", echoed.headers);
    assert_eq!(echoed.message["result"]["content"][0]["text"], "héllo");
    // A tool the gateway runs as a task of its own is left to rmcp, which refuses it to a
    // caller that can't take a task.
    let task = post(live, &olivia, Some(&session), &tool_call(5, "fx__crash", json!({})), &[]).await;
    assert_eq!(task.message["error"]["code"], -32021, "{:?}", task.message);

    // The worker's grant names one tool: the other is not found, and is audited denied.
    let wanda = live.token_for("wanda@acme.test");
    let theirs = open_session(live, &wanda).await.unwrap();
    lean_call(&proxy, &wanda, &theirs, 2, "fx__whoami_upstream", json!({})).await;
    let refused = post(live, &wanda, Some(&theirs), &tool_call(3, "fx__echo", json!({"text": "x"})), &[]).await;
    assert_eq!(refused.message["error"]["message"], "tool not found", "{:?}", refused.message);

    sabotage_audit(&live.db, backend).await;
    let reply = post(live, &olivia, Some(&session), &tool_call(4, "fx__whoami_upstream", json!({})), &[]).await;
    assert!(content_type(&reply).starts_with("application/json"), "the relay answered: {:?}", reply.headers);
    assert_eq!(reply.message["error"]["message"], "internal error", "{:?}", reply.message);
    assert!(reply.message.get("result").is_none());
}
both_dbs!(lean_relay_serves_stdio_upstreams, serves_stdio_upstreams);

/// A client that declared something the upstream could ask it (sampling here) is served by the
/// relay too (it asks on the call's answer: `surface::asked_on_the_answer`); a request whose
/// headers rmcp must judge is left to rmcp.
async fn leaves_to_rmcp(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session_declaring(live, &olivia, json!({"sampling": {}})).await;
    let call = lean_call(&proxy, &olivia, &session, 2, "fx__whoami_upstream", json!({})).await;
    assert_eq!(result_json(&call)["user"], "olivia@acme.test");

    let plain = open_session(live, &olivia).await.unwrap();
    lean_call(&proxy, &olivia, &plain, 2, "fx__whoami_upstream", json!({})).await;
    // A foreign origin is judged (and refused) by rmcp, as for every other request.
    let foreign = post(
        live,
        &olivia,
        Some(&plain),
        &tool_call(3, "fx__whoami_upstream", json!({})),
        &[("origin", "https://evil.example")],
    )
    .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
}
both_dbs!(lean_relay_leaves_what_it_cannot_serve_alike_to_rmcp, leaves_to_rmcp);

/// Fail closed: when the audit can't be written, the relay's call is answered with an error,
/// never with the upstream's result.
async fn fails_closed(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session(live, &olivia).await.unwrap();
    lean_call(&proxy, &olivia, &session, 2, "fx__whoami_upstream", json!({})).await;

    sabotage_audit(&live.db, backend).await;

    let reply = post(live, &olivia, Some(&session), &tool_call(3, "fx__whoami_upstream", json!({})), &[]).await;
    assert!(content_type(&reply).starts_with("application/json"), "the relay answered: {:?}", reply.headers);
    assert_eq!(reply.message["error"]["message"], "internal error", "{:?}", reply.message);
    assert!(reply.message.get("result").is_none());

    // Once the audit can be written again, so is the next call's event, after the last one
    // in its chain: the failed write left nothing open behind it.
    restore_audit(&live.db, backend).await;
    let reply = post(live, &olivia, Some(&session), &tool_call(4, "fx__whoami_upstream", json!({})), &[]).await;
    assert_eq!(result_json(&reply)["user"], "olivia@acme.test", "{:?}", reply.message);
    let sql = "SELECT COUNT(*) FROM audit_events WHERE request_id = '4' AND outcome = 'ok'";
    assert_eq!(live.count(sql).await, 1);
    let chains = scopegate::audit::verify::verify(&live.db, Some("acme")).await.unwrap();
    assert!(chains.iter().all(|c| c.broken.is_none()), "{chains:?}");
}
both_dbs!(lean_relay_fails_closed_without_its_audit, fails_closed);

/// A grant on another role of the same tenant does not open a tool to this caller on the
/// relay (the grant is checked there, not only when listing).
async fn grant_checked(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    proxy.grant("acme", "fx", Role::Manager, "echo").await;
    let live = &proxy.live;
    let audrey = live.token_for("audrey@acme.test");
    let session = open_session(live, &audrey).await.unwrap();
    tokio::time::sleep(INITIALIZED_HANDLED).await;
    for (id, tool) in [(2, "fx__echo"), (3, "fx__whoami_upstream"), (4, "fx__hang")] {
        let reply = post(live, &audrey, Some(&session), &tool_call(id, tool, json!({"text": "x"})), &[]).await;
        assert_eq!(reply.message["error"]["message"], "tool not found", "{tool}: {:?}", reply.message);
    }
}
both_dbs!(lean_relay_checks_the_grant_of_each_call, grant_checked);

/// `mcp.lean_relay = false`: every call goes through rmcp (an event stream in a session), and
/// works the same.
async fn switched_off(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[("mcp.lean_relay", json!(false))], Over::Http).await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session(live, &olivia).await.unwrap();
    tokio::time::sleep(INITIALIZED_HANDLED).await;
    let reply = post(live, &olivia, Some(&session), &tool_call(2, "fx__whoami_upstream", json!({})), &[]).await;
    assert!(content_type(&reply).starts_with("text/event-stream"), "rmcp answers: {:?}", reply.headers);
    assert_eq!(result_json(&reply)["user"], "olivia@acme.test");
}
both_dbs!(lean_relay_can_be_switched_off, switched_off);

/// An upstream declared on protocol 2026-07-28 (no session; each request carries the version,
/// the client's info and capabilities, and the standard `Mcp-Method`/`Mcp-Name` headers, which
/// the upstream checks against the body): the relay sends them as rmcp's client would.
async fn modern_upstream(backend: Backend) {
    let header = ("upstream.assertion_header", json!("x-acme-caller"));
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[header], Over::Http).await;
    let live = &proxy.live;
    // The same fixture (its server id is `fx`), declared on 2026-07-28 for another tenant.
    let fx = proxy.fx_url().unwrap();
    let modern =
        json!({"type": "http", "url": fx, "protocolVersion": "2026-07-28", "headers": {"x-declared": "modern"}});
    proxy.declare("globex", "fx", &modern, "local").await;
    proxy.grant("globex", "fx", Role::Owner, "*").await;
    let gary = live.token_for("gary@globex.test");
    let session = open_session(live, &gary).await.unwrap();
    let reply = lean_call(&proxy, &gary, &session, 2, "fx__whoami_upstream", json!({})).await;
    assert!(content_type(&reply).starts_with("application/json"), "the relay answers: {:?}", reply.headers);
    let me = result_json(&reply);
    assert_eq!((me["tenant"].as_str(), me["user"].as_str()), (Some("globex"), Some("gary@globex.test")));
    assert_eq!(me["declared_header"], "modern");
    let echo = tool_call(3, "fx__echo", json!({"text": "twenty-six"}));
    let echoed = post(live, &gary, Some(&session), &echo, &[]).await;
    assert_eq!(echoed.message["result"]["content"][0]["text"], "twenty-six", "{:?}", echoed.message);
}
both_dbs!(lean_relay_speaks_to_a_2026_upstream, modern_upstream);

/// A hand-written Streamable HTTP upstream with one tool, `noisy`, whose answer is one event
/// stream holding ten progress notifications and ten log lines and then the result,
/// pretty-printed (several lines): all of it arrives at once, before the gateway could pass any
/// of it on. Serves a session; everything else is accepted or refused plainly.
async fn raw_upstream() -> (String, tokio::task::JoinHandle<()>) {
    use axum::response::IntoResponse;
    async fn mcp(body: axum::body::Bytes) -> axum::response::Response {
        let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str()) else {
            return StatusCode::ACCEPTED.into_response();
        };
        let answer = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
        match method {
            "initialize" => {
                let result = json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw", "version": "1.0"},
                });
                ([("mcp-session-id", "raw-session")], axum::Json(answer(result))).into_response()
            }
            "tools/list" => {
                let tool = json!({"name": "noisy", "inputSchema": {"type": "object"}});
                axum::Json(answer(json!({"tools": [tool]}))).into_response()
            }
            "tools/call" => {
                let token = message["params"]["_meta"]["progressToken"].clone();
                let mut events = String::new();
                for i in 1..=10 {
                    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
                        "params": {"progressToken": token, "progress": i, "total": 10}});
                    let log = json!({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": format!("fixture log: raw {i}")}});
                    events.push_str(&format!("data: {progress}\n\ndata: {log}\n\n"));
                }
                let result = answer(json!({"content": [{"type": "text", "text": "done"}], "isError": false}));
                for line in serde_json::to_string_pretty(&result).unwrap().lines() {
                    events.push_str(&format!("data: {line}\n"));
                }
                events.push('\n');
                ([("content-type", "text/event-stream")], events).into_response()
            }
            _ => axum::Json(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no"}}))
                .into_response(),
        }
    }
    let app = axum::Router::new().route(
        "/mcp",
        axum::routing::post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }).delete(|| async { StatusCode::OK }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    (url, tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }))
}

/// What an upstream sends on a call's own event stream before its answer reaches the caller,
/// all of it and before the answer, even when it all arrives at once; a multi-line result is
/// relayed intact.
async fn notifications_before_the_answer(backend: Backend) {
    use std::sync::atomic::Ordering;

    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let (url, server) = raw_upstream().await;
    proxy.declare("acme", "raw", &json!({"type": "http", "url": url}), "local").await;
    proxy.grant("acme", "raw", Role::Owner, "*").await;
    let listener = Listener::default();
    let client = listener.client(&proxy.live, "olivia@acme.test").await;
    tokio::time::sleep(INITIALIZED_HANDLED).await;
    for round in 1..=3 {
        let result = client.call_tool(rmcp::model::CallToolRequestParams::new("raw__noisy")).await.unwrap();
        assert_eq!(serde_json::to_value(&result.content).unwrap()[0]["text"], "done", "{result:?}");
        // The test client handles notifications in tasks of their own: give them a moment.
        eventually("every notification reaches the session", || async { listener.heard(10 * round) }).await;
        assert_eq!(listener.progress.load(Ordering::SeqCst), 10 * round, "every progress notification, round {round}");
        assert_eq!(listener.logs.load(Ordering::SeqCst), 10 * round, "every log line, round {round}");
    }
    let ok = "SELECT COUNT(*) FROM audit_events WHERE tool = 'raw__noisy' AND outcome = 'ok'";
    assert_eq!(proxy.live.count(ok).await, 3);
    server.abort();
}
both_dbs!(lean_relay_passes_on_what_comes_before_the_answer, notifications_before_the_answer);

/// A call of the everything fixture's elicitation `tool` asking `message`; with `state`, the
/// retry that answers it (gary accepts) under `key`.
fn elicitation(tool: &str, message: &str, key: &str, state: Option<String>) -> rmcp::model::CallToolRequestParams {
    let mut p = rmcp::model::CallToolRequestParams::new(tool.to_owned())
        .with_arguments(json!({"message": message}).as_object().cloned().unwrap());
    if let Some(state) = state {
        p.request_state = Some(state);
        let answer = json!({"action": "accept", "content": {"username": "gary", "email": "gary@globex.test"}});
        p.input_responses = Some([(key.to_owned(), answer)].into_iter().collect());
    }
    p
}

/// How long after a change of servers or grants a caller without a session sees it for sure:
/// more than two reads of the change counter (`auth.identity_cache_ms`, 100 ms). By then either
/// a read saw the change, or the last read is too old to trust and nothing is reused.
const CHANGE_SEEN: Duration = Duration::from_millis(300);

/// A 2026-07-28 request standing alone (no session) is served by the relay too, with what its
/// own `_meta` says of its client: the relay's HTTP leg reaches the upstream (its own request
/// ids), the result carries `resultType`, the audit names the request's client and no session.
/// One whose headers or `_meta` rmcp must judge is left to rmcp, which refuses it. A question
/// the upstream asks (rmcp's client on 2026-07-28 calling): by a request in the middle of the
/// call (the fixture on 2025-11-25) or by its own `input_required` (on 2026-07-28), it is the
/// request's answer (`input_required`), and the retry that answers it gets the call's result.
async fn serves_2026_callers(backend: Backend) {
    use rmcp::model::CallToolResponse;
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let live = &proxy.live;
    // The same fixture (its server id is `fx`), declared for globex on 2025-11-25: a 2026-07-28
    // caller's calls are bridged.
    let fx = proxy.fx_url().unwrap();
    proxy.declare("globex", "fx", &json!({"type": "http", "url": fx, "protocolVersion": "2025-11-25"}), "local").await;
    proxy.grant("globex", "fx", Role::Owner, "*").await;
    let gary = live.token_for("gary@globex.test");
    let tool = "fx__whoami_upstream";
    let body = modern_call(7, tool, Some(("it-alone", "2.0"))).to_string();
    let reply = post(live, &gary, None, &body, &alone_headers(tool)).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.message);
    assert!(content_type(&reply).starts_with("application/json"), "{:?}", reply.headers);
    assert_eq!(reply.message["id"], 7);
    assert_eq!(reply.message["result"]["resultType"], "complete", "{:?}", reply.message);
    let me = result_json(&reply);
    assert_eq!((me["tenant"].as_str(), me["user"].as_str()), (Some("globex"), Some("gary@globex.test")));
    let id = me["request_id"].as_str().unwrap_or_default();
    assert!(id.starts_with("scopegate-"), "sent on the relay's HTTP leg: {me}");
    let audited = "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__whoami_upstream' AND outcome = 'ok' \
        AND client_name = 'it-alone' AND client_version = '2.0' AND session_id IS NULL AND request_id = '7'";
    assert_eq!(live.count(audited).await, 1, "audited with the request's client, in no session");

    // What rmcp must judge is left to it, and refused as always: an `Mcp-Name` that is not the
    // tool's, no `Mcp-Method`, a `_meta` without the client's capabilities.
    let wrong_name = post(live, &gary, None, &body, &alone_headers("fx__echo")).await;
    assert_eq!(wrong_name.status, StatusCode::BAD_REQUEST, "{:?}", wrong_name.message);
    let no_method = [("mcp-protocol-version", "2026-07-28"), ("mcp-name", tool)];
    let no_method = post(live, &gary, None, &body, &no_method).await;
    assert_eq!(no_method.status, StatusCode::BAD_REQUEST, "{:?}", no_method.message);
    let mut bare = modern_call(8, tool, None);
    bare["params"]["_meta"].as_object_mut().unwrap().remove("io.modelcontextprotocol/clientCapabilities");
    let no_caps = post(live, &gary, None, &bare.to_string(), &alone_headers(tool)).await;
    assert_eq!(no_caps.status, StatusCode::BAD_REQUEST, "{:?}", no_caps.message);
    let calls = "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__whoami_upstream' AND call_id IS NULL";
    assert_eq!(live.count(calls).await, 1);

    // The everything fixture over HTTP on 2025-11-25 asks its client in the middle of a call.
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("call-ids");
    let env = [("FIXTURE_CALL_IDS", ids.to_str().unwrap())];
    let (mut child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &env).await;
    let everything = json!({"type": "http", "url": format!("http://{addr}/mcp"), "protocolVersion": "2025-11-25"});
    proxy.declare("globex", "ev", &everything, "local").await;
    proxy.grant("globex", "ev", Role::Owner, "*").await;
    tokio::time::sleep(CHANGE_SEEN).await;
    let client = modern_client(&live.url(), &gary, false).await;
    let ask = |state: Option<String>| elicitation("ev__test_elicitation", "who asks alone?", "input", state);
    let asked = client.call_tool_once(ask(None)).await.unwrap();
    let CallToolResponse::InputRequired(asked) = asked else { panic!("input_required expected: {asked:?}") };
    let requests = serde_json::to_value(asked.input_requests.as_ref().unwrap()).unwrap();
    assert_eq!(requests["input"]["method"], "elicitation/create", "{requests}");
    assert!(requests.to_string().contains("who asks alone?"), "{requests}");
    let sent = std::fs::read_to_string(&ids).unwrap_or_default();
    assert!(sent.lines().any(|l| l.contains("scopegate-")), "the relay sent the call: {sent}");
    let state = asked.request_state.expect("a requestState");
    let done = client.call_tool_once(ask(Some(state.clone()))).await.unwrap();
    let CallToolResponse::Complete(done) = done else { panic!("the call's result expected: {done:?}") };
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert!(serde_json::to_string(&done).unwrap().contains("gary"), "{done:?}");
    assert_eq!(sent.lines().count(), 1, "the call was sent once: {sent}");
    let again = client.call_tool_once(ask(Some(state))).await;
    assert!(
        matches!(&again, Err(rmcp::ServiceError::McpError(e)) if e.message.contains("requestState")),
        "used once: {again:?}"
    );
    let rounds = "SELECT COUNT(*) FROM audit_events WHERE tool = 'ev__test_elicitation' AND outcome = 'ok'";
    assert_eq!(live.count(rounds).await, 2, "the question and the retry that answered it");
    let relayed = "SELECT COUNT(*) FROM audit_events WHERE tool = 'ev:elicitation/create' AND outcome = 'ok'";
    assert_eq!(live.count(relayed).await, 1, "the question, as asked of the caller");

    // Declared without a revision, the same fixture is spoken to on 2026-07-28 for this caller:
    // its own `input_required` passes through (its key, its question), its state sealed inside
    // the gateway's, and the retry carries it back.
    let dual = json!({"type": "http", "url": format!("http://{addr}/mcp")});
    proxy.declare("globex", "ev2", &dual, "local").await;
    proxy.grant("globex", "ev2", Role::Owner, "*").await;
    tokio::time::sleep(CHANGE_SEEN).await;
    let ask = |state: Option<String>| elicitation("ev2__test_elicitation", "who passes through?", "contact", state);
    let asked = client.call_tool_once(ask(None)).await.unwrap();
    let CallToolResponse::InputRequired(asked) = asked else { panic!("input_required expected: {asked:?}") };
    let requests = serde_json::to_value(asked.input_requests.as_ref().unwrap()).unwrap();
    assert_eq!(requests["contact"]["method"], "elicitation/create", "{requests}");
    let state = asked.request_state.expect("a requestState");
    assert_ne!(state, "fixture-elicitation-state", "the upstream's own state travels sealed");
    let sent = std::fs::read_to_string(&ids).unwrap_or_default();
    assert_eq!(sent.lines().filter(|l| l.contains("scopegate-")).count(), 2, "the relay sent it: {sent}");
    let done = client.call_tool_once(ask(Some(state))).await.unwrap();
    let CallToolResponse::Complete(done) = done else { panic!("the call's result expected: {done:?}") };
    assert!(serde_json::to_string(&done).unwrap().contains("gary"), "{done:?}");
    let rounds = "SELECT COUNT(*) FROM audit_events WHERE tool = 'ev2__test_elicitation' AND outcome = 'ok'";
    assert_eq!(live.count(rounds).await, 2, "the question and the retry that answered it");
    let passed = "SELECT COUNT(*) FROM audit_events WHERE tool = 'ev2:elicitation/create' AND outcome = 'ok'";
    assert_eq!(live.count(passed).await, 1, "the question, as asked of the caller");
    client.cancel().await.ok();
    child.kill().await.ok();
}
both_dbs!(lean_relay_serves_2026_callers_alone, serves_2026_callers);

/// A 2026-07-28 call of `fx__whoami_upstream` by `token`, standing alone.
async fn whoami_alone(live: &Live, token: &str, id: i64) -> Reply {
    let tool = "fx__whoami_upstream";
    post(live, token, None, &modern_call(id, tool, None).to_string(), &alone_headers(tool)).await
}

/// Calls until the call is `granted` (answered with a result) or not, within a bound far below
/// the 60 s a reused snapshot may live without a counter change.
async fn applies_within(live: &Live, token: &str, what: &str, granted: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for id in 10.. {
        let reply = whoami_alone(live, token, id).await;
        if reply.message.get("result").is_some() == granted {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what} not applied: {:?}", reply.message);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A caller without a session reuses its resolved servers only while nothing they are resolved
/// from changed: a revoked grant, and a grant given back, apply to its next calls within a read
/// of the change counter (`auth.identity_cache_ms`, 100 ms by default), on the relay and on
/// rmcp's path alike.
async fn alone_follows_changes(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    for id in 1..=3 {
        let reply = whoami_alone(live, &olivia, id).await;
        assert_eq!(result_json(&reply)["user"], "olivia@acme.test", "call {id}: {:?}", reply.message);
    }
    live.execute("DELETE FROM mcp_server_grants WHERE server = 'fx'").await;
    applies_within(live, &olivia, "the revoked grant", false).await;
    let refused = whoami_alone(live, &olivia, 99).await;
    assert_eq!(refused.message["error"]["code"], -32602, "answered as an unknown tool: {:?}", refused.message);
    proxy.grant("acme", "fx", Role::Owner, "*").await;
    applies_within(live, &olivia, "the grant given back", true).await;
}
both_dbs!(lean_relay_callers_alone_follow_grant_changes, alone_follows_changes);

/// An upstream that closes a call's event stream mid-call after an event with an id (SEP-1699
/// polling: the everything fixture's `test_reconnection` over HTTP answers only once its client
/// resumed the stream with `GET` and `Last-Event-ID`) is resumed on each leg that reads it: the
/// relay's own reader, for a session's call and for a 2026-07-28 caller's (bridged to the
/// upstream's session), and rmcp's client, for a session's call the relay leaves to rmcp (it
/// carries an `Origin`). Each caller gets its own call's answer. The relay passes the polling
/// on to a caller whose session is on 2025-11-25 (SEP-1699's revision): its answer is an event
/// stream that ends, as the upstream's did, after an event with an id and the upstream's
/// `retry` (the fixture's 200 ms), before the answer, which the caller's `GET` with that
/// `Last-Event-ID` brings. A 2025-06-18 session's caller (a server SHOULD NOT end its stream
/// before the answer) and a 2026-07-28 caller (its revision resumes nothing) get their answers
/// whole, as JSON.
async fn resumes_streams_closed_mid_call(backend: Backend) {
    let proxy = Proxy::start(backend, Mode::Session, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("call-ids");
    let env = [("FIXTURE_CALL_IDS", ids.to_str().unwrap())];
    let (mut child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &env).await;
    // On 2025-11-25 for every caller, so a 2026-07-28 caller's call goes on a session too.
    let everything = json!({"type": "http", "url": format!("http://{addr}/mcp"), "protocolVersion": "2025-11-25"});
    proxy.declare("acme", "ev", &everything, "local").await;
    proxy.grant("acme", "ev", Role::Owner, "*").await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let tool = "ev__test_reconnection";
    let resumed = |leg: &str, message: &Value, id: i64| {
        assert_eq!(message["id"], id, "{leg}: {message:?}");
        let text = message["result"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("the client resumed it"), "{leg}: {message:?}");
    };

    let session = open_session(live, &olivia).await.unwrap();
    lean_call(&proxy, &olivia, &session, 1, "ev__test_simple_text", json!({})).await;
    let latest = [("mcp-protocol-version", "2025-11-25")];
    let init = INIT.replace("2025-06-18", "2025-11-25");
    let opened = post(live, &olivia, None, &init, &latest).await;
    assert_eq!(opened.message["result"]["protocolVersion"], "2025-11-25", "{:?}", opened.message);
    let polling = opened.headers["mcp-session-id"].to_str().unwrap().to_owned();
    post(live, &olivia, Some(&polling), INITIALIZED, &latest).await;
    lean_call(&proxy, &olivia, &polling, 1, "ev__test_simple_text", json!({})).await;
    let sent_before = std::fs::read_to_string(&ids).unwrap_or_default().lines().count();

    let whole = post(live, &olivia, Some(&session), &tool_call(2, tool, json!({})), &[]).await;
    resumed("the relay, in a 2025-06-18 session", &whole.message, 2);
    assert!(content_type(&whole).starts_with("application/json"), "its answer whole: {:?}", whole.headers);
    let polled = send(live, &olivia, Some(&polling), tool_call(2, tool, json!({})).into_bytes(), &latest).await;
    let kind = polled.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(kind.starts_with("text/event-stream"), "the polling passed on as an event stream: {kind}");
    // Read to its end: the relay ends it, as the upstream ended its own.
    let body = polled.text().await.unwrap();
    let events = events_of(&body);
    let (priming, last) = (events[0], events[events.len() - 1]);
    assert!(field(priming, "id").is_some() && field(priming, "retry").is_some(), "a priming event first: {body}");
    assert_eq!(field(last, "retry"), Some("200"), "the upstream's retry on the last event: {body}");
    assert_eq!(field(last, "data"), Some(""), "no data on it: {body}");
    assert!(!body.contains("\"result\""), "the stream ends before the answer: {body}");
    let last_id = field(last, "id").unwrap_or_else(|| panic!("an id to resume from: {last:?}"));
    let (status, rest) = resume_stream(live, &olivia, &polling, last_id).await;
    assert_eq!(status, StatusCode::OK);
    let answer = events_of(&rest).iter().find_map(|e| field(e, "data").and_then(|d| serde_json::from_str(d).ok()));
    resumed("the relay, in a 2025-11-25 session, on the client's GET", &answer.unwrap_or_default(), 2);
    let origin = live.config.public_url();
    let by_rmcp = post(live, &olivia, Some(&session), &tool_call(3, tool, json!({})), &[("origin", &origin)]).await;
    resumed("rmcp's client, in a session", &by_rmcp.message, 3);
    let alone = post(live, &olivia, None, &modern_call(4, tool, None).to_string(), &alone_headers(tool)).await;
    resumed("the relay, for a 2026-07-28 caller", &alone.message, 4);
    assert!(content_type(&alone).starts_with("application/json"), "its answer whole: {:?}", alone.headers);
    assert_eq!(alone.message["result"]["resultType"], "complete", "{:?}", alone.message);

    // Which leg sent each call: the relay's own ids, or rmcp's numbers.
    let sent = std::fs::read_to_string(&ids).unwrap_or_default();
    let sent: Vec<&str> = sent.lines().skip(sent_before).collect();
    let by_relay = sent.iter().filter(|l| l.contains("scopegate-")).count();
    assert_eq!((by_relay, sent.len()), (3, 4), "three calls on the relay's leg, one on rmcp's: {sent:?}");
    let ok = "SELECT COUNT(*) FROM audit_events WHERE tool = 'ev__test_reconnection' AND outcome = 'ok'";
    assert_eq!(live.count(ok).await, 4);
    child.kill().await.ok();
}
both_dbs!(upstream_streams_closed_mid_call_are_resumed_on_both_legs, resumes_streams_closed_mid_call);

/// The events of an event stream's body.
fn events_of(body: &str) -> Vec<&str> {
    body.split("\n\n").filter(|e| !e.trim().is_empty()).collect()
}

/// The value of an event's field `name` (its first line of that name).
fn field<'e>(event: &'e str, name: &str) -> Option<&'e str> {
    event.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':'))).map(str::trim)
}

/// A `GET` resuming one of a session's event streams after `last` (its `Last-Event-ID`): the
/// whole body, read to its end.
async fn resume_stream(live: &Live, token: &str, session: &str, last: &str) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .get(live.url())
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", session)
        .header("last-event-id", last)
        .send()
        .await
        .unwrap();
    (response.status(), response.text().await.unwrap())
}

/// A session's call the relay answers as an event stream (its upstream sends something before
/// the answer) can be resumed as rmcp's answers can (SEP-1699): a priming event first (an id
/// of the relay's, a `retry`, no data), an id on every event, and a `GET` with `Last-Event-ID`
/// in the same session brings the events after that id, the answer included. Another session
/// gets none of them.
async fn answers_resumably(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let (url, server) = raw_upstream().await;
    proxy.declare("acme", "raw", &json!({"type": "http", "url": url}), "local").await;
    proxy.grant("acme", "raw", Role::Owner, "*").await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session(live, &olivia).await.unwrap();
    lean_call(&proxy, &olivia, &session, 1, "fx__whoami_upstream", json!({})).await;

    let call = tool_call(2, "raw__noisy", json!({})).into_bytes();
    let response = send(live, &olivia, Some(&session), call, &[]).await;
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let body = response.text().await.unwrap();
    let events = events_of(&body);
    let priming = events[0];
    let first_id = field(priming, "id").unwrap_or_else(|| panic!("an id on the priming event: {priming:?}"));
    assert!(first_id.starts_with("scopegate-lean-"), "{priming:?}");
    assert!(field(priming, "retry").is_some_and(|r| r.parse::<u64>().is_ok()), "a retry: {priming:?}");
    assert_eq!(field(priming, "data"), Some(""), "no data: {priming:?}");
    assert!(events.iter().all(|e| field(e, "id").is_some()), "an id on every event: {body}");
    // Ten log lines; no progress: the call asked for none.
    assert_eq!(events.len(), 12, "the priming event, ten log lines, the answer: {body}");
    let answer = events[11];
    assert!(answer.contains("\"id\":2") && answer.contains("done"), "the answer last: {body}");

    let (status, resumed) = resume_stream(live, &olivia, &session, first_id).await;
    assert_eq!(status, StatusCode::OK);
    let again = events_of(&resumed);
    assert_eq!(again, events[1..], "every event after the one named, the answer included");
    let (_, from_answer) = resume_stream(live, &olivia, &session, field(answer, "id").unwrap()).await;
    assert!(from_answer.trim().is_empty(), "nothing after the answer: {from_answer:?}");

    let other = open_session(live, &olivia).await.unwrap();
    let (status, foreign) = resume_stream(live, &olivia, &other, first_id).await;
    assert!(!foreign.contains("fixture log") && !foreign.contains("done"), "another session's events: {foreign:?}");
    assert!(status.is_success(), "{status}");
    server.abort();
}
both_dbs!(lean_relay_answers_sessions_resumably, answers_resumably);
