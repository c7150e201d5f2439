//! End to end over raw HTTP, where the MCP client would hide what matters: session
//! hijacking, malformed input, fail-closed audit, expiry mid-session, rate limits,
//! the audit chain under tampering, metrics.

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

use crate::support::*;

async fn other_method(live: &Live, method: reqwest::Method, token: &str, session: &str) -> StatusCode {
    session_request(live, method, token, session).await.status()
}

async fn session_hijack(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[]).await;
    let olivia = live.token_for("olivia@acme.test");
    let gary = live.token_for("gary@globex.test");
    let session = open_session(&live, &olivia).await.expect("session mode issues a session id");
    let eggs_before = live.count("SELECT COUNT(*) FROM egg_counts").await;
    let acme_events = live
        .count("SELECT COUNT(*) FROM audit_events a JOIN tenants t ON t.id = a.tenant_id WHERE t.slug = 'acme'")
        .await;

    // Gary presents Olivia's session: 404, as if it did not exist, on POST, GET and DELETE.
    let write = tool_call(2, "record_egg_count", json!({"flock": "north-barn", "day": yesterday(), "eggs": 1}));
    let hijack = post(&live, &gary, Some(&session), &write, &[]).await;
    assert_eq!(hijack.status, StatusCode::NOT_FOUND);
    let unknown = post(&live, &gary, Some("no-such-session"), &write, &[]).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(hijack.message, unknown.message, "a foreign session looks exactly like a missing one");
    assert_eq!(other_method(&live, reqwest::Method::GET, &gary, &session).await, StatusCode::NOT_FOUND);
    assert_eq!(other_method(&live, reqwest::Method::DELETE, &gary, &session).await, StatusCode::NOT_FOUND);

    // No tool ran, and Olivia's session is intact.
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts").await, eggs_before);
    let mine = post(&live, &olivia, Some(&session), &tool_call(3, "whoami", json!({})), &[]).await;
    assert_eq!(mine.status, StatusCode::OK);
    assert_eq!(mine.message["result"]["structuredContent"]["user"], "olivia@acme.test", "{:?}", mine.message);

    // The refusals are audited in the presenter's tenant (globex); acme's trail only has Olivia's
    // call (its record and its outcome).
    let refused = live
        .count(
            "SELECT COUNT(*) FROM audit_events a JOIN tenants t ON t.id = a.tenant_id \
             WHERE t.slug = 'globex' AND a.error_class = 'session_not_owned'",
        )
        .await;
    assert_eq!(refused, 3, "POST, GET and DELETE");
    // The refused tools/call is audited as one, naming its tool and request id.
    let mut tx = live.db.begin().await.unwrap();
    let events: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT a.action, a.tool, a.request_id FROM audit_events a JOIN tenants t ON t.id = a.tenant_id \
         WHERE t.slug = 'globex' AND a.error_class = 'session_not_owned' ORDER BY a.seq",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    drop(tx);
    let call = Some("record_egg_count".to_owned());
    assert_eq!(
        events,
        [
            ("tools/call".to_owned(), call, Some("2".to_owned())),
            ("mcp/session GET".to_owned(), None, None),
            ("mcp/session DELETE".to_owned(), None, None),
        ]
    );
    let acme_after = live
        .count("SELECT COUNT(*) FROM audit_events a JOIN tenants t ON t.id = a.tenant_id WHERE t.slug = 'acme'")
        .await;
    assert_eq!(acme_after, acme_events + 2);
    let olivias = format!(
        "SELECT COUNT(*) FROM {AUDITED_CALLS} e JOIN tenants t ON t.id = e.tenant_id \
         WHERE t.slug = 'acme' AND e.tool = 'whoami' AND e.outcome = 'ok'"
    );
    assert_eq!(live.count(&olivias).await, 1);

    // Olivia can end her own session; afterwards it is gone for her too.
    let status = other_method(&live, reqwest::Method::DELETE, &olivia, &session).await;
    assert_eq!(status, StatusCode::OK);
    let after = post(&live, &olivia, Some(&session), &tool_call(4, "whoami", json!({})), &[]).await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
}
both_dbs!(mcp_session_hijack, session_hijack);

/// Ending a session answers 200, which both official SDKs take as a successful termination
/// (the Python SDK accepts only 200 and 204, and reported rmcp's 202 as "Session termination
/// failed"); the session is gone afterwards, and another principal's DELETE still gets 404.
async fn session_delete_answers_200(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[]).await;
    let olivia = live.token_for("olivia@acme.test");
    let gary = live.token_for("gary@globex.test");
    let session = open_session(&live, &olivia).await.expect("session mode issues a session id");

    assert_eq!(other_method(&live, reqwest::Method::DELETE, &gary, &session).await, StatusCode::NOT_FOUND);
    let alive = post(&live, &olivia, Some(&session), &tool_call(2, "whoami", json!({})), &[]).await;
    assert_eq!(alive.status, StatusCode::OK, "a foreign DELETE ends nothing");

    assert_eq!(other_method(&live, reqwest::Method::DELETE, &olivia, &session).await, StatusCode::OK);
    let after = post(&live, &olivia, Some(&session), &tool_call(3, "whoami", json!({})), &[]).await;
    assert_eq!(after.status, StatusCode::NOT_FOUND, "the session is gone");
    assert_eq!(other_method(&live, reqwest::Method::GET, &olivia, &session).await, StatusCode::NOT_FOUND);
    assert_eq!(other_method(&live, reqwest::Method::DELETE, &olivia, &session).await, StatusCode::NOT_FOUND);
}
both_dbs!(mcp_session_delete_answers_200, session_delete_answers_200);

async fn malformed_input(backend: Backend, mode: Mode) {
    let live = Live::start(backend, mode, &[("server.body_limit_bytes", json!(65536))]).await;
    let token = live.token_for("olivia@acme.test");
    let session = open_session(&live, &token).await;
    let s = session.as_deref();
    let eggs_before = live.count("SELECT COUNT(*) FROM egg_counts").await;

    let parse = post(&live, &token, s, r#"{"jsonrpc":"2.0","id":2,"meth"#, &[]).await;
    assert_eq!(parse.message["error"]["code"], -32700, "{:?}", parse.message);
    let batch = post(&live, &token, s, r#"[{"jsonrpc":"2.0","id":2,"method":"ping"}]"#, &[]).await;
    assert_eq!(batch.message["error"]["code"], -32600, "{:?}", batch.message);
    let method = post(&live, &token, s, r#"{"jsonrpc":"2.0","id":3,"method":"no/such/method"}"#, &[]).await;
    assert_eq!(method.message["error"]["code"], -32601, "{:?}", method.message);

    let cases = [
        (json!({"flock": "north-barn", "day": yesterday(), "eggs": "many"}), "eggs"),
        (json!({"flock": "north-barn", "day": 20261128, "eggs": 3}), "day"),
        (json!({"flock": "north-barn", "eggs": 3}), "day"),
        (json!({"flock": "north-barn", "day": yesterday(), "eggs": 3, "extra": 1}), "extra"),
        (json!({"flock": "north-barn", "day": "yesterday", "eggs": 3}), "day"),
        (json!({"flock": "north-barn", "day": yesterday(), "eggs": -1}), "eggs"),
        (json!({"flock": "north-barn", "day": "2999-01-01", "eggs": 3}), "day"),
    ];
    for (i, (args, field)) in cases.into_iter().enumerate() {
        let reply = post(&live, &token, s, &tool_call(10 + i as i64, "record_egg_count", args.clone()), &[]).await;
        let result = &reply.message["result"];
        assert_eq!(result["isError"], true, "{args}: {:?}", reply.message);
        assert!(result.get("structuredContent").is_none(), "{args}: an error has no structured content");
        let message = result["content"][0]["text"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("`{field}`")), "{args}: the error must name `{field}`: {message}");
    }

    let big = tool_call(30, "get_flock", json!({"flock": "x".repeat(70_000)}));
    assert_eq!(post(&live, &token, s, &big, &[]).await.status, StatusCode::PAYLOAD_TOO_LARGE);
    let foreign =
        post(&live, &token, s, &tool_call(31, "whoami", json!({})), &[("origin", "https://evil.example")]).await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);

    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts").await, eggs_before, "nothing was written");
}
all_modes!(mcp_malformed_input, malformed_input);

async fn fail_closed_audit(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[]).await;
    let olivia = live.client("olivia@acme.test").await;
    ok(&olivia, "list_flocks", json!({})).await;

    sabotage_audit(&live.db, backend).await;

    let day = yesterday();
    let before = live.count("SELECT COUNT(*) FROM egg_counts").await;
    let write = call(&olivia, "record_egg_count", json!({"flock": "south-barn", "day": day, "eggs": 4242})).await;
    assert!(write.is_err(), "a write whose audit fails must fail: {write:?}");
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts WHERE eggs = 4242").await, 0, "no egg-count row");
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts").await, before);
    for (tool, args) in
        [("list_flocks", json!({})), ("whoami", json!({})), ("get_flock", json!({"flock": "north-barn"}))]
    {
        let read = call(&olivia, tool, args).await;
        assert!(read.is_err(), "{tool}: a read whose audit fails must fail: {read:?}");
    }
    olivia.cancel().await.ok();
}
both_dbs!(mcp_fail_closed_audit, fail_closed_audit);

async fn token_expiring_mid_session(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[("auth.leeway_secs", json!(0))]).await;
    let mut c = claims(&live.config, "acme", "olivia@acme.test");
    c["exp"] = json!(now() + 2);
    let token = Signer::dev().sign(&c);
    let session = open_session(&live, &token).await;
    let first = post(&live, &token, session.as_deref(), &tool_call(2, "whoami", json!({})), &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let later = post(&live, &token, session.as_deref(), &tool_call(3, "whoami", json!({})), &[]).await;
    assert_eq!(later.status, StatusCode::UNAUTHORIZED);
    let challenge = later.headers["www-authenticate"].to_str().unwrap();
    assert!(challenge.contains("invalid_token"), "{challenge}");
}
both_dbs!(mcp_token_expiring_mid_session, token_expiring_mid_session);

async fn audit_chain_detects_tampering(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[]).await;
    let olivia = live.client("olivia@acme.test").await;
    let gary = live.client("gary@globex.test").await;
    for _ in 0..3 {
        ok(&olivia, "list_flocks", json!({})).await;
        ok(&gary, "whoami", json!({})).await;
    }
    let day = yesterday();
    ok(&olivia, "record_egg_count", json!({"flock": "north-barn", "day": day, "eggs": 12})).await;
    live.settle_audit().await;
    let reports = scopegate::audit::verify::verify(&live.db, None).await.unwrap();
    let acme = reports.iter().find(|r| r.tenant == "acme").unwrap();
    // Four calls, each its record and its outcome.
    assert_eq!((acme.events, &acme.broken), (8, &None));

    // Rewrite history: a changed outcome (the second call's, an event of its own) breaks the
    // chain at that event, in that tenant only.
    let mut tx = live.db.begin().await.unwrap();
    let edited = sqlx::query(
        "UPDATE audit_events SET outcome = 'denied' WHERE seq = 4 AND call_id IS NOT NULL AND outcome = 'ok' \
         AND tenant_id = (SELECT id FROM tenants WHERE slug = 'acme')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(edited.rows_affected(), 1, "seq 4 is the second call's outcome");
    tx.commit().await.unwrap();
    let reports = scopegate::audit::verify::verify(&live.db, None).await.unwrap();
    let acme = reports.iter().find(|r| r.tenant == "acme").unwrap();
    assert_eq!(acme.broken.as_ref().map(|b| b.seq), Some(4), "{reports:?}");
    let globex = reports.iter().find(|r| r.tenant == "globex").unwrap();
    assert!(globex.broken.is_none());

    // A deleted event (globex's first call's record) is found too.
    let mut tx = live.db.begin().await.unwrap();
    let deleted = sqlx::query(
        "DELETE FROM audit_events WHERE seq = 1 AND call_id IS NULL \
         AND tenant_id = (SELECT id FROM tenants WHERE slug = 'globex')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(deleted.rows_affected(), 1, "seq 1 is the first call's record");
    tx.commit().await.unwrap();
    let reports = scopegate::audit::verify::verify(&live.db, Some("globex")).await.unwrap();
    assert_eq!(reports[0].broken.as_ref().map(|b| b.seq), Some(2), "{reports:?}");
    olivia.cancel().await.ok();
    gary.cancel().await.ok();
}
both_dbs!(mcp_audit_chain_detects_tampering, audit_chain_detects_tampering);

/// With `audit.record_raw_arguments`, a call's arguments are stored in their canonical form (keys
/// sorted, whatever order the client sent), the stored digest is the hash of exactly that text,
/// and the chain over them verifies.
async fn raw_arguments_are_stored_canonically(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[("audit.record_raw_arguments", json!(true))]).await;
    let olivia = live.client("olivia@acme.test").await;
    let day = yesterday();
    ok(&olivia, "record_egg_count", json!({"flock": "north-barn", "eggs": 12, "day": day})).await;
    live.settle_audit().await;
    // The arguments are the call's record's; its outcome does not repeat them.
    let mut tx = live.db.begin().await.unwrap();
    let sql = format!("SELECT args_raw, args_digest, outcome FROM {AUDITED_CALLS} e WHERE tool = 'record_egg_count'");
    let rows: Vec<(Option<String>, Option<String>, String)> =
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&mut *tx).await.unwrap();
    let repeated: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM audit_events WHERE tool = 'record_egg_count' AND call_id IS NOT NULL \
         AND args_raw IS NOT NULL",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    drop(tx);
    let expected = format!(r#"{{"day":"{day}","eggs":12,"flock":"north-barn"}}"#);
    assert_eq!(rows.len(), 1, "the call is audited: {rows:?}");
    for (raw, digest, outcome) in rows {
        assert_eq!(raw.as_deref(), Some(expected.as_str()));
        assert_eq!(digest, Some(scopegate::audit::digest::sha256_hex(expected.as_bytes())));
        assert_eq!(outcome, "ok");
    }
    assert_eq!(repeated, 0);
    let reports = scopegate::audit::verify::verify(&live.db, Some("acme")).await.unwrap();
    assert_eq!(reports[0].broken, None, "{reports:?}");
    olivia.cancel().await.ok();
}
both_dbs!(mcp_raw_arguments_are_stored_canonically, raw_arguments_are_stored_canonically);

/// Stateless: a call that sends nothing before its answer gets plain JSON, not an SSE stream
/// (a call that sends progress first falls back to SSE: `proxy_progress_and_logs_*`).
async fn stateless_call_answers_plain_json(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let token = live.token_for("olivia@acme.test");
    let body = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"whoami","arguments":{}}}"#;
    let reply = post(&live, &token, None, body, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let content_type = reply.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(content_type.starts_with("application/json"), "{content_type}");
    assert_eq!(reply.message["id"], 7, "{}", reply.message);
    assert_eq!(reply.message["result"]["structuredContent"]["user"], "olivia@acme.test", "{}", reply.message);
}
both_dbs!(mcp_stateless_call_answers_plain_json, stateless_call_answers_plain_json);

/// Many concurrent calls (group commit) still leave one gap-free chain per tenant.
async fn concurrent_calls_keep_the_chain(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let olivia = std::sync::Arc::new(live.client("olivia@acme.test").await);
    let mut tasks = Vec::new();
    for i in 0..40 {
        let c = std::sync::Arc::clone(&olivia);
        tasks.push(tokio::spawn(async move {
            if i % 4 == 0 {
                let day = (time::OffsetDateTime::now_utc().date() - time::Duration::days(1 + i)).to_string();
                ok(&c, "record_egg_count", json!({"flock": "north-barn", "day": day, "eggs": i})).await;
            } else {
                ok(&c, "list_flocks", json!({})).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Forty calls, each its record and its outcome: eighty events, every record followed by
    // its outcome.
    live.settle_audit().await;
    let reports = scopegate::audit::verify::verify(&live.db, Some("acme")).await.unwrap();
    assert_eq!(reports[0].events, 80);
    assert!(reports[0].broken.is_none(), "{reports:?}");
    assert!(reports[0].outcome_unknown.is_empty(), "{reports:?}");
}
both_dbs!(mcp_concurrent_calls_keep_the_chain, concurrent_calls_keep_the_chain);

/// Two tenants writing at once: each write reads (its flock) and then writes in one
/// transaction while the other tenant's audit events commit. None may fail (on SQLite a
/// deferred transaction that read before another connection committed can't upgrade to a
/// writer and fails at once with SQLITE_BUSY: write transactions there begin IMMEDIATE).
async fn concurrent_writes_of_two_tenants(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let writers = [("olivia@acme.test", "north-barn"), ("gary@globex.test", "hilltop")];
    let mut tasks = Vec::new();
    for (subject, flock) in writers {
        let client = std::sync::Arc::new(live.client(subject).await);
        for i in 0..40 {
            let c = std::sync::Arc::clone(&client);
            tasks.push(tokio::spawn(async move {
                let day = (time::OffsetDateTime::now_utc().date() - time::Duration::days(10 + i)).to_string();
                ok(&c, "record_egg_count", json!({"flock": flock, "day": day, "eggs": i})).await;
                ok(&c, "list_flocks", json!({})).await;
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Eighty calls a tenant, each its record and its outcome.
    live.settle_audit().await;
    for slug in ["acme", "globex"] {
        let reports = scopegate::audit::verify::verify(&live.db, Some(slug)).await.unwrap();
        assert_eq!(reports[0].events, 160, "{slug}");
        assert!(reports[0].broken.is_none(), "{reports:?}");
        assert!(reports[0].outcome_unknown.is_empty(), "{reports:?}");
    }
}
both_dbs!(mcp_concurrent_writes_of_two_tenants, concurrent_writes_of_two_tenants);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_rate_limit_answers_429_with_retry_after() {
    let live = Live::start(
        Backend::Sqlite,
        Mode::Stateless,
        &[("limits.user_per_sec", json!(0.5)), ("limits.user_burst", json!(3.0))],
    )
    .await;
    let token = live.token_for("wanda@acme.test");
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for i in 0..5 {
        let reply = post(&live, &token, None, &tool_call(i, "whoami", json!({})), &[]).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            retry_after = reply.headers.get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        }
        statuses.push(reply.status);
    }
    assert_eq!(&statuses[..3], &[StatusCode::OK; 3], "the burst passes");
    assert_eq!(statuses[3], StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    // Another user of the same tenant is not held back by wanda's bucket.
    let olivia = live.token_for("olivia@acme.test");
    assert_eq!(post(&live, &olivia, None, &tool_call(9, "whoami", json!({})), &[]).await.status, StatusCode::OK);
    // Only the admitted calls ran (the refused ones are audited as denied, see `hardening`).
    assert_eq!(live.count("SELECT COUNT(*) FROM audit_events WHERE outcome = 'ok'").await, 4);
}

/// `mcp.max_sessions_per_user`: a user holds at most that many sessions. Ten `initialize`s
/// at once with room for three open three sessions, and the other seven answer 429 and leave
/// nothing behind; another user is not held back; a session ended with DELETE makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_per_user_are_capped() {
    let live = Live::start(Backend::Sqlite, Mode::Session, &[("mcp.max_sessions_per_user", json!(3))]).await;
    let olivia = live.token_for("olivia@acme.test");
    let replies = futures_util::future::join_all((0..10).map(|_| post(&live, &olivia, None, INIT, &[]))).await;
    let opened: Vec<String> = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .map(|r| r.headers.get("mcp-session-id").expect("a session id").to_str().unwrap().to_owned())
        .collect();
    assert_eq!(opened.len(), 3, "{:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
    for refused in replies.iter().filter(|r| r.status != StatusCode::OK) {
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.message["error"], "too_many_sessions", "{}", refused.message);
        assert!(refused.headers.get("mcp-session-id").is_none(), "a refused initialize opens no session");
    }
    for session in &opened {
        assert_eq!(post(&live, &olivia, Some(session), INITIALIZED, &[]).await.status, StatusCode::ACCEPTED);
    }
    assert_eq!(post(&live, &olivia, None, INIT, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    // Another user has sessions of her own to open.
    let wanda = live.token_for("wanda@acme.test");
    assert!(open_session(&live, &wanda).await.is_some());
    // Calls in the open sessions go on; one ended makes room for one more.
    let call = post(&live, &olivia, Some(&opened[0]), &tool_call(2, "whoami", json!({})), &[]).await;
    assert_eq!(call.status, StatusCode::OK);
    assert_eq!(other_method(&live, reqwest::Method::DELETE, &olivia, &opened[0]).await, StatusCode::OK);
    assert!(open_session(&live, &olivia).await.is_some(), "room for one after a DELETE");
    assert_eq!(post(&live, &olivia, None, INIT, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_metrics_have_no_tenant_or_user_labels_by_default() {
    let live = Live::start(Backend::Sqlite, Mode::Session, &[]).await;
    let olivia = live.client("olivia@acme.test").await;
    ok(&olivia, "list_flocks", json!({})).await;
    // After a poll of the identity change counter, identities come from the cache.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    ok(&olivia, "list_flocks", json!({})).await;
    let _ = call(&olivia, "no_such_tool", json!({})).await;
    let text = live.metrics().await;
    assert!(text.contains(r#"scopegate_identity_lookups_total{source="cache"}"#), "{text}");
    assert!(text.contains(r#"scopegate_identity_lookups_total{source="database"}"#), "{text}");
    assert!(text.contains("scopegate_identity_counter_readable"), "{text}");
    assert!(text.contains("scopegate_tool_calls_total"), "{text}");
    assert!(text.contains(r#"tool="list_flocks""#), "{text}");
    assert!(text.contains("scopegate_tool_call_duration_seconds_bucket"), "a latency histogram: {text}");
    assert!(text.contains("scopegate_http_requests_total"), "{text}");
    assert!(text.contains("scopegate_db_pool_connections"), "{text}");
    assert!(text.contains(r#"reason="unknown_tool""#), "{text}");
    assert!(!text.contains("acme") && !text.contains("olivia"), "no tenant or user in labels: {text}");
    let ids: Vec<String> = {
        let mut tx = live.db.begin().await.unwrap();
        sqlx::query_scalar("SELECT id FROM users").fetch_all(&mut *tx).await.unwrap()
    };
    assert!(ids.iter().all(|id| !text.contains(id.as_str())));
    olivia.cancel().await.ok();
}

/// `/metrics` is served on `metrics.listen` alone: the gateway's port answers it as any
/// unknown path (what reaches that port, clients and a public load balancer, never reads the
/// metrics), the metrics listener serves nothing else, and it stops with the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_on_their_own_listener_only() {
    let mut live = Live::start(Backend::Sqlite, Mode::Session, &[]).await;
    let metrics_addr = live.metrics_addr().expect("metrics are on by default");
    assert_ne!(metrics_addr, live.addr, "a listener of its own");
    let on_main = reqwest::get(format!("{}/metrics", live.base_url())).await.unwrap();
    assert_eq!(on_main.status(), StatusCode::NOT_FOUND, "not on the gateway's port");
    let body = on_main.text().await.unwrap();
    assert!(!body.contains("scopegate_"), "{body}");
    let scraped = reqwest::get(live.metrics_url()).await.unwrap();
    assert_eq!(scraped.status(), StatusCode::OK);
    assert!(scraped.text().await.unwrap().contains("scopegate_db_pool_connections"));
    let other = reqwest::get(format!("http://{metrics_addr}/readyz")).await.unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND, "the metrics listener serves /metrics alone");

    live.stop().await;
    let after = reqwest::Client::new().get(live.metrics_url()).timeout(Duration::from_secs(2)).send().await;
    assert!(after.is_err(), "the metrics listener stopped with the gateway: {after:?}");
}

/// With metrics off nothing is bound for them; a `metrics.listen` that can't be bound stops
/// start-up with an error naming the key.
#[tokio::test]
async fn metrics_listener_is_bound_only_when_on_and_its_failure_names_the_key() {
    let live = Live::start(Backend::Sqlite, Mode::Session, &[("metrics.enabled", json!(false))]).await;
    assert_eq!(live.metrics_addr(), None);
    let on_main = reqwest::get(format!("{}/metrics", live.base_url())).await.unwrap();
    assert_eq!(on_main.status(), StatusCode::NOT_FOUND);

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let config = config_with(live.config.database.url.expose(), &[("metrics.listen", json!(addr))]);
    let Err(err) = scopegate::Gateway::build(config).await else {
        panic!("a gateway whose metrics.listen is taken must not start");
    };
    let err = err.to_string();
    assert!(err.contains("metrics.listen") && err.contains(&addr), "{err}");
}

/// A stream opened with a token ends when that token expires.
async fn stream_ends_at_token_expiry(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[("auth.leeway_secs", json!(0))]).await;
    let mut c = claims(&live.config, "acme", "olivia@acme.test");
    c["exp"] = json!(now() + 3);
    let token = Signer::dev().sign(&c);
    let session = open_session(&live, &token).await.unwrap();
    let started = std::time::Instant::now();
    let response = open_stream(&live, &token, &session).await;
    // Reading to the end returns only because the stream is closed at expiry.
    let read = tokio::time::timeout(Duration::from_secs(10), response.bytes()).await;
    assert!(read.is_ok(), "the stream outlived its token");
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(6), "{elapsed:?}");
}
both_dbs!(mcp_stream_ends_at_token_expiry, stream_ends_at_token_expiry);
