//! Protocol 2026-07-28 (no initialize and no session: each request carries its client context in
//! `_meta`) is served statelessly even with sessions on, behind the same gate, the same
//! `McpCallContext` factory, the same authorization table and the same audit. And the client
//! name and version in audit events: from `initialize` in a session, from the request's `_meta`
//! when it carries them, and absent (never a made-up value) otherwise.

use http::StatusCode;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ClientLifecycleMode, ClientServiceExt, ServiceExt};
use serde_json::{Value, json};

use crate::support::*;

fn client_info(name: &str, version: &str) -> ClientConfig {
    ClientConfig::new(ClientCapabilities::default(), Implementation::new(name, version))
}

/// rmcp's client on protocol 2026-07-28: `server/discover`, then self-contained requests.
async fn modern_client(live: &Live, subject: &str) -> RunningService<RoleClient, ClientConfig> {
    let lifecycle = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    client_info("modern-test", "2.5")
        .serve_with_lifecycle(live.transport(subject), lifecycle)
        .await
        .unwrap_or_else(|e| panic!("{subject} connects on 2026-07-28: {e}"))
}

/// rmcp's client on the session protocol (initialize handshake), with its own name.
async fn legacy_client(live: &Live, subject: &str) -> RunningService<RoleClient, ClientConfig> {
    client_info("legacy-test", "1.7").serve(live.transport(subject)).await.unwrap()
}

fn flock_names(list: &Value) -> Vec<&str> {
    list["flocks"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect()
}

/// tool, outcome, error class, session id, request id, client name, client version.
type EventRow =
    (Option<String>, String, Option<String>, Option<String>, Option<String>, Option<String>, Option<String>);

/// The audit rows of `subject`'s calls, oldest first.
async fn events_of(live: &Live, subject: &str) -> Vec<Value> {
    live.settle_audit().await;
    let mut tx = live.db.begin().await.unwrap();
    let sql = format!(
        "SELECT a.tool, a.outcome, a.error_class, a.session_id, a.request_id, a.client_name, a.client_version \
             FROM {AUDITED_CALLS} a JOIN users u ON u.id = a.user_id WHERE u.subject = $1 ORDER BY a.seq"
    );
    let rows: Vec<EventRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(subject).fetch_all(&mut *tx).await.unwrap();
    rows.into_iter()
        .map(|(tool, outcome, class, session, request, name, version)| {
            json!({"tool": tool, "outcome": outcome, "class": class, "session": session,
                   "request_id": request, "client": [name, version]})
        })
        .collect()
}

/// A raw POST on protocol 2026-07-28 (the headers rmcp's client would send).
async fn post_modern(live: &Live, token: Option<&str>, session: Option<&str>, body: &Value) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(live.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", body["method"].as_str().unwrap())
        .body(body.to_string());
    if let Some(name) = body["params"]["name"].as_str() {
        req = req.header("mcp-name", name);
    }
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    if let Some(session) = session {
        req = req.header("mcp-session-id", session);
    }
    req.send().await.unwrap()
}

async fn modern_protocol(backend: Backend, mode: Mode) {
    let live = Live::start(backend, mode, &[]).await;
    let wanda = modern_client(&live, "wanda@acme.test").await;
    let negotiated = wanda.peer_info().map(|info| info.protocol_version.clone());
    assert_eq!(negotiated, Some(ProtocolVersion::V_2026_07_28));

    // The tool learns the caller through McpCallContext, built for this very request.
    let me = ok(&wanda, "whoami", json!({})).await;
    assert_eq!((&me["user"], &me["flock_scope"]), (&json!("wanda@acme.test"), &json!(["north-barn"])));
    assert_eq!(flock_names(&ok(&wanda, "list_flocks", json!({})).await), ["north-barn"]);
    let write = json!({"flock": "north-barn", "day": yesterday(), "eggs": 31});
    assert_eq!(ok(&wanda, "record_egg_count", write).await["eggs"], 31);
    let outside = json!({"flock": "south-barn", "day": yesterday(), "eggs": 1});
    assert_eq!(tool_error(&wanda, "record_egg_count", outside).await["error"], "not_found");

    // One authorization decision: not listed, and answered as an unknown tool.
    let listed: Vec<String> = wanda.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    assert!(!listed.contains(&"recent_audit_events".to_owned()), "{listed:?}");
    let denied = call(&wanda, "recent_audit_events", json!({})).await.unwrap_err();
    let unknown = call(&wanda, "no_such_tool", json!({})).await.unwrap_err();
    assert_eq!((denied.code, denied.message), (unknown.code, unknown.message));

    // Every call audited: no session, the request id, the client named in each request's _meta.
    let events = events_of(&live, "wanda@acme.test").await;
    let summary: Vec<(&Value, &Value, &Value)> =
        events.iter().map(|e| (&e["tool"], &e["outcome"], &e["class"])).collect();
    assert_eq!(
        summary,
        [
            (&json!("whoami"), &json!("ok"), &Value::Null),
            (&json!("list_flocks"), &json!("ok"), &Value::Null),
            (&json!("record_egg_count"), &json!("ok"), &Value::Null),
            (&json!("record_egg_count"), &json!("failed"), &json!("not_found")),
            (&json!("recent_audit_events"), &json!("denied"), &json!("unknown_tool")),
            (&json!("no_such_tool"), &json!("denied"), &json!("unknown_tool")),
        ]
    );
    for e in &events {
        assert_eq!(e["session"], Value::Null, "served statelessly: {e}");
        assert!(e["request_id"].is_string(), "{e}");
        assert_eq!(e["client"], json!(["modern-test", "2.5"]), "{e}");
    }
    wanda.cancel().await.ok();

    // On the wire: no session is issued, and the gate still runs first.
    let token = live.token_for("olivia@acme.test");
    let reply = post_modern(&live, Some(&token), None, &modern_call(7, "whoami", None)).await;
    assert_eq!(reply.status(), StatusCode::OK);
    assert!(reply.headers().get("mcp-session-id").is_none(), "a 2026-07-28 request gets no session");
    let reply = message(reply).await;
    assert_eq!(reply["result"]["structuredContent"]["user"], "olivia@acme.test", "{reply}");
    let anonymous = post_modern(&live, None, None, &modern_call(8, "whoami", None)).await;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    // A session id on a 2026-07-28 request is still checked against its owner: unknown = 404.
    let stray = post_modern(&live, Some(&token), Some("no-such-session"), &modern_call(9, "whoami", None)).await;
    assert_eq!(stray.status(), StatusCode::NOT_FOUND);
    // clientInfo is optional in 2026-07-28's `_meta`: recorded when there, absent (never made
    // up) when not.
    let named = post_modern(&live, Some(&token), None, &modern_call(10, "whoami", Some(("raw-modern", "0.9")))).await;
    assert_eq!(named.status(), StatusCode::OK);
    let olivia = events_of(&live, "olivia@acme.test").await;
    let seen: Vec<(&Value, &Value)> = olivia.iter().map(|e| (&e["request_id"], &e["client"])).collect();
    assert_eq!(
        seen,
        [(&json!("7"), &json!([null, null])), (&json!("10"), &json!(["raw-modern", "0.9"]))],
        "only the authenticated calls with no stray session ran"
    );
}
all_modes!(mcp_modern_protocol, modern_protocol);

/// The client name and version recorded for the older protocol versions: from the session's
/// `initialize` in session mode; absent in stateless mode, where the `initialize` was a request of
/// its own and nothing in a later call names the client.
async fn legacy_client_in_audit(backend: Backend, mode: Mode) {
    let live = Live::start(backend, mode, &[]).await;
    let olivia = legacy_client(&live, "olivia@acme.test").await;
    ok(&olivia, "whoami", json!({})).await;
    let events = events_of(&live, "olivia@acme.test").await;
    assert_eq!(events.len(), 1);
    let expected = match mode {
        Mode::Session => json!(["legacy-test", "1.7"]),
        Mode::Stateless => json!([null, null]),
    };
    assert_eq!(events[0]["client"], expected, "{mode:?}: {}", events[0]);
    olivia.cancel().await.ok();
}
all_modes!(mcp_client_in_audit, legacy_client_in_audit);
