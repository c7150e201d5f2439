//! A forwarded call in the audit chain: its record, committed while the upstream works, and
//! its outcome, appended after the answer and naming the record (issue 51). The answer is
//! released only once the record committed (never the upstream's answer when it could not),
//! a tenant with write-ahead has no call forwarded before its record is durable, a gateway
//! killed mid-call leaves the call as "outcome unknown" (not a broken chain), and replicas
//! appending calls and outcomes of one tenant keep one chain.

use reqwest::StatusCode;
use scopegate::audit::digest::{canonical_json, sha256_hex};
use serde_json::{Value, json};

use crate::support::*;

/// The digest an outcome records of the result the caller was given: the SHA-256 of its
/// canonical JSON, without the 2026-07-28 `resultType` member (it names only the kind).
fn digest_of(result: &Value) -> String {
    let mut result = result.clone();
    if let Some(object) = result.as_object_mut() {
        object.remove("resultType");
    }
    sha256_hex(canonical_json(&result).as_bytes())
}

/// An event of the chain: seq, id, outcome, call_id, result_digest.
type EventRow = (i64, String, String, Option<String>, Option<String>);

/// One call that ran, as the chain holds it.
#[derive(Debug)]
struct Pair {
    record_seq: i64,
    outcome_seq: i64,
    outcome: String,
    result_digest: Option<String>,
}

/// The calls of `tool` in `acme`'s chain with text `text`-digested arguments, each record with
/// its outcome; every record has exactly one, after it.
async fn calls_of(live: &Live, tool: &str) -> Vec<Pair> {
    live.settle_audit().await;
    let mut tx = live.db.begin().await.unwrap();
    let rows: Vec<EventRow> = sqlx::query_as(
        "SELECT e.seq, e.id, e.outcome, e.call_id, e.result_digest FROM audit_events e \
         JOIN tenants t ON t.id = e.tenant_id WHERE t.slug = 'acme' AND e.tool = $1 ORDER BY e.seq",
    )
    .bind(tool)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let mut out = Vec::new();
    for (seq, id, outcome, call, _) in rows.iter().filter(|r| r.2 == "started") {
        assert!(call.is_none(), "a record names no call");
        let outcomes: Vec<_> = rows.iter().filter(|r| r.3.as_deref() == Some(id.as_str())).collect();
        assert_eq!(outcomes.len(), 1, "the record at seq {seq} ({outcome}) has one outcome: {rows:?}");
        let (outcome_seq, _, outcome, _, digest) = outcomes[0];
        assert!(outcome_seq > seq, "the outcome follows its record");
        out.push(Pair {
            record_seq: *seq,
            outcome_seq: *outcome_seq,
            outcome: outcome.clone(),
            result_digest: digest.clone(),
        });
    }
    let singles = rows.iter().filter(|r| r.2 != "started" && r.3.is_none()).count();
    assert_eq!(singles, 0, "a forwarded call is a record and an outcome, never one event: {rows:?}");
    out
}

/// The admin API's answer to a GET of `path` with `token`, as JSON.
async fn admin_get(live: &Live, token: &str, path: &str) -> Value {
    let request = reqwest::Client::new().get(format!("{}{path}", live.base_url())).bearer_auth(token);
    request.send().await.unwrap().json().await.unwrap()
}

/// `acme`'s chain verifies, with the calls whose outcome is unknown it reports.
async fn verified(live: &Live) -> Vec<scopegate::audit::verify::UnknownOutcome> {
    live.settle_audit().await;
    let chains = scopegate::audit::verify::verify(&live.db, Some("acme")).await.unwrap();
    assert!(chains[0].broken.is_none(), "{chains:?}");
    chains[0].outcome_unknown.clone()
}

/// Every leg of a forwarded call leaves its record and then its outcome, which names the record
/// and the digest of the result the caller got: the lean relay (a session's call, and a
/// 2026-07-28 call standing alone) and rmcp's path (the relay turned off). The admin API shows
/// each call as one row.
async fn record_and_outcome(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session(live, &olivia).await.unwrap();
    // The relay takes a session's calls once its `initialized` was handled: until then rmcp's
    // path serves them, which is audited alike.
    let mut results = Vec::new();
    for i in 0..3 {
        let reply =
            post(live, &olivia, Some(&session), &tool_call(10 + i, "fx__echo", json!({"text": "lean"})), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.message);
        results.push(reply.message["result"].clone());
    }
    let alone = post(
        live,
        &olivia,
        None,
        &json!({"jsonrpc": "2.0", "id": 20, "method": "tools/call", "params": {
            "name": "fx__echo", "arguments": {"text": "alone"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}})
        .to_string(),
        &alone_headers("fx__echo"),
    )
    .await;
    assert_eq!(alone.status, StatusCode::OK, "{:?}", alone.message);
    results.push(alone.message["result"].clone());
    let error = post(live, &olivia, Some(&session), &tool_call(30, "fx__echo", json!({})), &[]).await;
    assert!(error.message.get("error").is_some() || error.message["result"]["isError"] == true, "{:?}", error.message);

    let pairs = calls_of(live, "fx__echo").await;
    assert_eq!(pairs.len(), 5, "{pairs:?}");
    for (pair, result) in pairs.iter().zip(&results) {
        assert_eq!(pair.outcome, "ok");
        assert_eq!(pair.result_digest.as_deref(), Some(digest_of(result).as_str()), "{result}");
    }
    assert_eq!(pairs[4].outcome, "failed", "a call answered with an error has a failed outcome");
    assert!(verified(live).await.is_empty(), "every call has its outcome");

    // The admin API: one row per call, with its outcome's place; filtered by outcome.
    let auditor = live.token_for("audrey@acme.test");
    let events = admin_get(live, &auditor, "/admin/v1/tenants/acme/audit/events?tool=fx__echo").await;
    let items = events["items"].as_array().unwrap();
    assert_eq!(items.len(), 5, "{events}");
    for (item, pair) in items.iter().rev().zip(&pairs) {
        assert_eq!(
            (item["seq"].as_i64(), item["outcome_seq"].as_i64()),
            (Some(pair.record_seq), Some(pair.outcome_seq))
        );
        assert_eq!(item["outcome"], pair.outcome.as_str());
    }
    assert_eq!(items[0]["error_class"], "tool_error", "the outcome's class is the row's: {}", items[0]);
    let failed = admin_get(live, &auditor, "/admin/v1/tenants/acme/audit/events?tool=fx__echo&outcome=failed").await;
    assert_eq!(failed["items"].as_array().map(Vec::len), Some(1), "{failed}");

    // rmcp's path: the relay off.
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[("mcp.lean_relay", json!(false))], Over::Http).await;
    let live = &proxy.live;
    let client = live.client("olivia@acme.test").await;
    let result = call(&client, "fx__echo", json!({"text": "rmcp"})).await.unwrap();
    let modern = modern_client(&live.url(), &live.token_for("olivia@acme.test"), false).await;
    let alone = call(&modern, "fx__echo", json!({"text": "modern"})).await.unwrap();
    let pairs = calls_of(live, "fx__echo").await;
    assert_eq!(pairs.len(), 2, "{pairs:?}");
    for (pair, result) in pairs.iter().zip([&result, &alone]) {
        assert_eq!(pair.outcome, "ok");
        let given = serde_json::to_value(result).unwrap();
        assert_eq!(pair.result_digest.as_deref(), Some(digest_of(&given).as_str()), "{given}");
    }
    assert!(verified(live).await.is_empty());
    client.cancel().await.ok();
    modern.cancel().await.ok();
}
both_dbs!(audit_every_forwarded_call_is_a_record_then_its_outcome, record_and_outcome);

/// Fail closed: a call whose record cannot commit is answered with an internal error, never
/// with the upstream's answer, though the upstream answered (its record commits while it
/// works: here the commit waits on a lock the test holds, the upstream answers, and then the
/// database refuses the record). Under the tenant's write-ahead, the upstream never sees a call
/// whose record did not commit.
async fn record_fails_mid_call(backend: Backend) {
    // The tenant's flag is read on every request (the identity cache would keep it a poll
    // interval longer).
    let settings =
        [("auth.identity_cache_ms", json!(0)), ("admin.platform_subjects", json!([crate::admin_api::PLATFORM]))];
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &settings, Over::Http).await;
    let live = &proxy.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session(live, &olivia).await.unwrap();
    let marks = proxy.marks();
    let seen = move |text: &str| {
        let line = format!("echo {text}");
        std::fs::read_to_string(&marks).unwrap_or_default().lines().any(|l| l == line)
    };
    let echo = |id: i64, text: &str| tool_call(id, "fx__echo", json!({ "text": text }));
    let reply = post(live, &olivia, Some(&session), &echo(2, "warm"), &[]).await;
    assert_eq!(reply.message["result"]["content"][0]["text"], "warm", "{:?}", reply.message);
    // Its outcome is in before the database is made to fail.
    live.settle_audit().await;

    // The audit's writes wait on the test's transaction, which makes them fail once it commits.
    let mut held = live.db.begin().await.unwrap();
    // `begin` takes SQLite's write lock (BEGIN IMMEDIATE); on PostgreSQL, the heads' table is
    // locked.
    if backend == Backend::Postgres {
        sqlx::query("LOCK TABLE audit_heads IN EXCLUSIVE MODE").execute(&mut *held).await.unwrap();
    }
    sabotage_audit_in(&mut held, backend).await;
    let call = {
        let (url, token, session, body) = (live.url(), olivia.clone(), session.clone(), echo(3, "mid"));
        tokio::spawn(async move { raw_post(&url, &token, &session, &body).await })
    };
    eventually("the upstream answers while the record waits", || async { seen("mid") }).await;
    held.commit().await.unwrap();
    let reply = call.await.unwrap();
    assert_eq!(reply["error"]["message"], "internal error", "never the upstream's answer: {reply}");
    assert!(reply.get("result").is_none(), "{reply}");
    restore_audit(&live.db, backend).await;
    assert!(verified(live).await.is_empty(), "the call that was not recorded left nothing behind");
    assert_eq!(calls_of(live, "fx__echo").await.len(), 1, "only the warm call is recorded");

    // Write-ahead: the record first, then the call; a record that cannot commit stops it.
    let ops = crate::admin_api::platform(live);
    let tenant = "/admin/v1/tenants/acme";
    let patched =
        crate::admin_api::send(live, reqwest::Method::PATCH, tenant, &ops, json!({"audit_write_ahead": true}));
    let patched = patched.await;
    assert_eq!((patched.status, patched.body["audit_write_ahead"].clone()), (200, json!(true)), "{}", patched.body);
    let session = open_session(live, &olivia).await.unwrap();
    let reply = post(live, &olivia, Some(&session), &echo(2, "ahead"), &[]).await;
    assert_eq!(reply.message["result"]["content"][0]["text"], "ahead", "{:?}", reply.message);
    live.settle_audit().await;
    sabotage_audit(&live.db, backend).await;
    let reply = post(live, &olivia, Some(&session), &echo(3, "never"), &[]).await;
    assert_eq!(reply.message["error"]["message"], "internal error", "{:?}", reply.message);
    // The calls before it were answered after their marks; this one reached nothing.
    assert!(seen("ahead") && !seen("never"), "the upstream saw a call whose record did not commit");
    restore_audit(&live.db, backend).await;
    assert_eq!(calls_of(live, "fx__echo").await.len(), 2);
    assert!(verified(live).await.is_empty());
}
both_dbs!(audit_a_record_that_cannot_commit_withholds_the_answer, record_fails_mid_call);

/// A session's `tools/call` posted as a raw client would, its JSON-RPC answer (plain JSON or
/// the last event of a stream).
async fn raw_post(url: &str, token: &str, session: &str, body: &str) -> Value {
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-06-18")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let json = text.lines().filter_map(|l| l.strip_prefix("data:")).rfind(|d| d.contains("\"id\""));
    serde_json::from_str(json.unwrap_or(&text).trim()).unwrap_or_else(|_| panic!("not JSON-RPC: {text}"))
}

/// `scopegate serve` on the database at `url`, started off the runtime's workers: it waits for
/// the process to listen, and the gateway in this process must go on serving meanwhile.
async fn start_process(dir: &std::path::Path, url: &str, public: &str) -> Replica {
    let (dir, url, public) = (dir.to_owned(), url.to_owned(), public.to_owned());
    tokio::task::spawn_blocking(move || Replica::start(&dir, &url, &public)).await.unwrap()
}

/// Two replicas append calls and outcomes of one tenant at once: one chain, every call with its
/// outcome. Then a gateway process killed (SIGKILL) while a call is at its upstream: its record
/// stands without an outcome, which `scopegate audit verify` (after a new gateway served on the
/// same database), the admin API and the console show as "outcome unknown", and the chain
/// verifies.
async fn replicas_and_a_kill(backend: Backend) {
    // The console's forms are posted from the gateway's own origin.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let console = [
        ("server.listen", json!(format!("127.0.0.1:{port}"))),
        ("server.allowed_origins", json!([format!("http://127.0.0.1:{port}")])),
    ];
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &console, Over::Http).await;
    let live = &proxy.live;
    let other = live.replica().await;
    let olivia = "olivia@acme.test";
    let mut tasks = Vec::new();
    for i in 0..6 {
        let base = if i % 2 == 0 { live.base_url() } else { format!("http://{}", other.addr) };
        let client = live.client_at(&base, olivia).await;
        tasks.push(tokio::spawn(async move {
            for n in 0..15 {
                let text = format!("{i}-{n}");
                let result = call(&client, "fx__echo", json!({ "text": text })).await.unwrap();
                assert_ne!(result.is_error, Some(true));
            }
            client.cancel().await.ok();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    other.state().audit.flush().await;
    assert_eq!(calls_of(live, "fx__echo").await.len(), 90, "every call of both replicas has its outcome");
    assert!(verified(live).await.is_empty());
    drop(other);

    // A gateway process on the same database, killed while a call hangs at the upstream.
    let dir = tempfile::tempdir().unwrap();
    let url = live.config.database.url.expose().to_owned();
    let public = live.config.public_url();
    let mut process = start_process(dir.path(), &url, &public).await;
    let client = live.client_at(&format!("http://{}", process.addr), olivia).await;
    let hanging =
        tokio::spawn(async move { client.peer().call_tool(rmcp::model::CallToolRequestParams::new("fx__hang")).await });
    let started = "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__hang' AND outcome = 'started'";
    eventually("the hanging call's record is committed", || async { live.count(started).await == 1 }).await;
    process.child.kill().unwrap();
    process.child.wait().unwrap();
    // The client may try to resume its stream from the dead gateway for a while: not under test.
    hanging.abort();

    // A new gateway serves on the database; the chain holds, with the call's outcome unknown.
    // Stopped as a service is stopped (SIGTERM), it records the outcome of its last call
    // before it exits.
    let mut process = start_process(dir.path(), &url, &public).await;
    let client = live.client_at(&format!("http://{}", process.addr), olivia).await;
    call(&client, "fx__echo", json!({"text": "after"})).await.unwrap();
    client.cancel().await.ok();
    let pid = process.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    assert!(process.child.wait().unwrap().success(), "the gateway stops cleanly");
    let out = scopegate(dir.path())
        .args(["audit", "verify", "--tenant", "acme"])
        .env("SCOPEGATE_DATABASE__URL", &url)
        .output()
        .unwrap();
    let (ok, stdout, stderr) = outcome(&out);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.starts_with("acme: ok ("), "{stdout}");
    assert!(stdout.contains("outcome unknown: the call of `fx__hang` recorded at seq"), "{stdout}");
    let unknown = verified(live).await;
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert_eq!(unknown[0].tool.as_deref(), Some("fx__hang"));

    let auditor = live.token_for("audrey@acme.test");
    let status = admin_get(live, &auditor, "/admin/v1/tenants/acme/audit/verification").await;
    assert_eq!(status["verified"], true, "{status}");
    assert_eq!(status["outcome_unknown"][0]["seq"].as_i64(), Some(unknown[0].seq), "{status}");
    let events = admin_get(live, &auditor, "/admin/v1/tenants/acme/audit/events?outcome=unknown").await;
    let items = events["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{events}");
    assert_eq!((items[0]["tool"].as_str(), items[0]["outcome_seq"].as_i64()), (Some("fx__hang"), None));

    // The console's audit page, in the browser.
    let browser = Browser::start().await;
    browser.goto(&format!("{}/console", live.base_url())).await;
    browser.type_into("#token", &auditor).await;
    browser.click("#sign-in").await;
    // An auditor's console opens on the tenant's audit trail.
    browser.wait_for_url("/console/tenants/acme/audit").await;
    let text = browser.text("#outcome-unknown").await;
    assert!(text.contains("1 call(s) have a record and no outcome") && text.contains("fx__hang"), "{text}");
    let rows = browser.text("#events").await;
    assert!(rows.contains("outcome unknown"), "{rows}");
    browser.quit().await;
}
both_dbs!(audit_replicas_share_one_chain_and_a_killed_call_is_outcome_unknown, replicas_and_a_kill);
