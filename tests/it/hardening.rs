//! Findings of an adversarial run, each pinned: hostile text (U+0000) answered alike on both
//! databases and audited in a safe rendering; rate-limited calls audited without amplifying a
//! flood; a request id already in flight refused at once; bodies the transport can't read
//! answered as JSON-RPC errors; one expiry rule for requests and streams.

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

async fn rows(live: &Live, sql: &str) -> Vec<(String, Option<String>, Option<String>, Option<String>, i64)> {
    let mut tx = live.db.begin().await.unwrap();
    sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned())).fetch_all(&mut *tx).await.unwrap()
}

async fn chain_ok(live: &Live) {
    let reports = scopegate::audit::verify::verify(&live.db, None).await.unwrap();
    assert!(reports.iter().all(|r| r.broken.is_none()), "{reports:?}");
}

/// U+0000 in a flock key, a client name, a tool name, a token's `sub` or `tid`: the same clean
/// answer on both databases, and every call audited with the character rendered as U+FFFD.
async fn hostile_text(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[]).await;
    let token = live.token_for("olivia@acme.test");

    // A client whose name holds U+0000: its session works and its calls are audited.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "evil\u{0}client", "version": "1\u{0}"}}})
    .to_string();
    let reply = post(&live, &token, None, &init, &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.message);
    let session = reply.headers["mcp-session-id"].to_str().unwrap().to_owned();
    assert!(post(&live, &token, Some(&session), INITIALIZED, &[]).await.status.is_success());
    let whoami = post(&live, &token, Some(&session), &tool_call(2, "whoami", json!({})), &[]).await;
    assert_eq!(whoami.message["result"]["structuredContent"]["user"], "olivia@acme.test", "{:?}", whoami.message);

    // A flock key holding U+0000 does not exist, on either database (not an internal error).
    for (id, tool) in [(3, "get_flock"), (4, "query_egg_counts")] {
        let args = if tool == "get_flock" {
            json!({"flock": "north\u{0}barn"})
        } else {
            json!({"flock": "north\u{0}barn", "from": "2026-01-01", "to": "2026-01-02"})
        };
        let reply = post(&live, &token, Some(&session), &tool_call(id, tool, args), &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.message["result"]["isError"], true, "{tool}: {:?}", reply.message);
        let text = reply.message["result"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("not found"), "{tool}: {:?}", reply.message);
    }
    // A tool name holding U+0000: unknown, and audited.
    let unknown = post(&live, &token, Some(&session), &tool_call(5, "who\u{0}ami", json!({})), &[]).await;
    assert_eq!(unknown.message["error"]["message"], "tool not found", "{:?}", unknown.message);

    live.settle_audit().await;
    let sql = format!("SELECT outcome, tool, client_name, client_version, calls FROM {AUDITED_CALLS} e ORDER BY seq");
    let calls = rows(&live, &sql).await;
    assert_eq!(calls.len(), 4, "every call audited: {calls:?}");
    assert_eq!(calls[3].1.as_deref(), Some("who\u{FFFD}ami"));
    assert_eq!(calls[3].0, "denied");
    // Every event of them (three calls that ran, a record and an outcome each; the refusal) in
    // the safe rendering.
    let events =
        rows(&live, "SELECT outcome, tool, client_name, client_version, calls FROM audit_events ORDER BY seq").await;
    assert_eq!(events.len(), 7, "{events:?}");
    for (_, _, name, version, _) in &events {
        assert_eq!(name.as_deref(), Some("evil\u{FFFD}client"));
        assert_eq!(version.as_deref(), Some("1\u{FFFD}"));
    }
    chain_ok(&live).await;

    // A validly signed token whose `sub` or `tid` holds U+0000: 403, as any unknown principal.
    for (tenant, subject) in [("acme", "olivia\u{0}@acme.test"), ("ac\u{0}me", "olivia@acme.test")] {
        let token = Signer::dev().sign(&claims(&live.config, tenant, subject));
        let reply = post(&live, &token, None, INIT, &[]).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{tenant:?} {subject:?}: {:?}", reply.message);
    }
}
both_dbs!(hardening_hostile_text, hostile_text);

/// Rate-limited `tools/call` requests are audited (denied, `rate_limited`), a user's flood
/// gathered into one event per window that counts the calls it stands for.
async fn rate_limited_calls_are_audited(backend: Backend) {
    let live = Live::start(
        backend,
        Mode::Stateless,
        &[("limits.user_per_sec", json!(0.2)), ("limits.user_burst", json!(2.0))],
    )
    .await;
    let token = live.token_for("wanda@acme.test");
    let mut refused = 0;
    for i in 0..40 {
        let reply = post(&live, &token, None, &tool_call(i, "whoami", json!({})), &[]).await;
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            refused += 1;
        }
    }
    // A refused request that is not a tools/call is not a call: not audited.
    let list = json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list"}).to_string();
    assert_eq!(post(&live, &token, None, &list, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(refused >= 37, "the burst passes, the rest is refused: {refused}");

    // Windows close after a second; give the writer time to commit.
    let counted = eventually("every refused call is counted in an event", || async {
        let counted = live
            .count(
                "SELECT COALESCE(CAST(SUM(calls) AS BIGINT), 0) FROM audit_events WHERE error_class = 'rate_limited'",
            )
            .await;
        if counted >= refused { Ok(counted) } else { Err(format!("{counted} of {refused} counted")) }
    })
    .await;
    assert_eq!(counted, refused, "every refused call is counted in an event");
    let events = rows(
        &live,
        "SELECT outcome, tool, error_class, request_id, calls FROM audit_events \
         WHERE error_class = 'rate_limited' ORDER BY seq",
    )
    .await;
    // 40 calls in well under a few seconds: a handful of windows, not one write per call.
    assert!(!events.is_empty() && events.len() <= 5, "{events:?}");
    for (outcome, tool, _, request_id, _) in &events {
        assert_eq!((outcome.as_str(), tool.as_deref()), ("denied", Some("whoami")));
        assert!(request_id.is_some());
    }
    let admitted = live.count("SELECT COUNT(*) FROM audit_events WHERE outcome = 'ok'").await;
    assert_eq!(admitted, 40 - refused);
    chain_ok(&live).await;

    // The audit tool shows how many calls each event stands for.
    let olivia = live.token_for("olivia@acme.test");
    let listed = post(&live, &olivia, None, &tool_call(1, "recent_audit_events", json!({"limit": 200})), &[]).await;
    let shown: i64 = listed.message["result"]["structuredContent"]["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["error_class"] == "rate_limited")
        .map(|e| e["calls"].as_i64().unwrap())
        .sum();
    assert_eq!(shown, refused);
}
both_dbs!(hardening_rate_limited_calls_are_audited, rate_limited_calls_are_audited);

/// A second request of a session with an id already in flight there is refused at once with
/// a JSON-RPC error; nothing of it runs; the id is free again once the first is answered.
async fn duplicate_request_id(backend: Backend) {
    let tools = scopegate::mcp::ToolSet::native()
        .with(slow_tools::Slow, slow_tools::Slow::tool_router(), slow_tools::SPECS)
        .unwrap();
    let live = Live::start_with_tools(backend, Mode::Session, &[("mcp.call_timeout_secs", json!(2))], tools).await;
    let token = live.token_for("olivia@acme.test");
    let session = open_session(&live, &token).await.unwrap();

    let first = {
        let (live_url, token, session) = (live.url(), token.clone(), session.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let body = tool_call(7, "slow_report", json!({}));
            let response = reqwest::Client::new()
                .post(live_url)
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-06-18")
                .header("mcp-session-id", session)
                .body(body)
                .send()
                .await
                .unwrap();
            let text = response.text().await.unwrap();
            (text, started.elapsed())
        })
    };
    // Wait until the first call is running: its record is committed as it starts.
    eventually("the slow call is under way", || async {
        live.count("SELECT COUNT(*) FROM audit_events WHERE tool = 'slow_report' AND outcome = 'started'").await == 1
    })
    .await;
    let eggs_before = live.count("SELECT COUNT(*) FROM egg_counts").await;
    let write = tool_call(7, "record_egg_count", json!({"flock": "north-barn", "day": yesterday(), "eggs": 5}));
    let started = Instant::now();
    let duplicate = post(&live, &token, Some(&session), &write, &[]).await;
    let waited = started.elapsed();
    assert_eq!(duplicate.status, StatusCode::BAD_REQUEST, "{:?}", duplicate.message);
    assert_eq!(duplicate.message["id"], 7);
    assert_eq!(duplicate.message["error"]["code"], -32600, "{:?}", duplicate.message);
    assert!(waited < Duration::from_secs(2), "refused at once, not held: {waited:?}");
    assert_eq!(live.count("SELECT COUNT(*) FROM egg_counts").await, eggs_before, "the duplicate never ran");

    // The first call gets its own answer (the timeout of the slow tool).
    let (text, _) = tokio::time::timeout(Duration::from_secs(15), first).await.unwrap().unwrap();
    assert!(text.contains("tool call timed out"), "{text}");
    // Its id is free again.
    let again = post(&live, &token, Some(&session), &tool_call(7, "whoami", json!({})), &[]).await;
    assert_eq!(again.message["result"]["structuredContent"]["user"], "olivia@acme.test", "{:?}", again.message);

    // The calls, each as one row (its record's place): the slow call began first.
    live.settle_audit().await;
    let sql = format!("SELECT outcome, tool, error_class, request_id, calls FROM {AUDITED_CALLS} e ORDER BY seq");
    let calls = rows(&live, &sql).await;
    let classes: Vec<_> = calls.iter().map(|e| (e.0.as_str(), e.1.as_deref(), e.2.as_deref())).collect();
    assert_eq!(
        classes,
        [
            ("failed", Some("slow_report"), Some("timeout")),
            ("denied", Some("record_egg_count"), Some("duplicate_request_id")),
            ("ok", Some("whoami"), None),
        ]
    );
    // In the chain, the duplicate is one event, between the slow call's record and outcome.
    let events =
        rows(&live, "SELECT outcome, tool, error_class, request_id, calls FROM audit_events ORDER BY seq").await;
    let chain: Vec<_> = events.iter().map(|e| (e.0.as_str(), e.1.as_deref())).collect();
    assert_eq!(
        chain,
        [
            ("started", Some("slow_report")),
            ("denied", Some("record_egg_count")),
            ("failed", Some("slow_report")),
            ("started", Some("whoami")),
            ("ok", Some("whoami")),
        ]
    );
    chain_ok(&live).await;
}
both_dbs!(hardening_duplicate_request_id, duplicate_request_id);

/// Bodies that pass the envelope check but that the transport can't read, and `tools/call`
/// requests whose params don't fit: JSON-RPC errors with the right code, nothing run.
async fn error_shapes(backend: Backend, mode: Mode) {
    let live = Live::start(backend, mode, &[]).await;
    let token = live.token_for("olivia@acme.test");
    let session = open_session(&live, &token).await;
    let s = session.as_deref();
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"whoami","arguments":{{"a":{}{}}}}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let bodies: Vec<(Vec<u8>, i64, Value, &str)> = vec![
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":\"whoami\",\"arguments\":{\"a\":\"\xff\"}}}".to_vec(),
            -32700,
            Value::Null,
            "invalid UTF-8",
        ),
        (
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{"a":"\ud800"}}}"#.to_vec(),
            -32700,
            Value::Null,
            "a lone surrogate",
        ),
        (deep.into_bytes(), -32700, Value::Null, "100,000 nested arrays"),
        (br#"{"jsonrpc":"2.0","id":4,"method":42}"#.to_vec(), -32600, Value::Null, "a numeric method"),
        (br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{}}"#.to_vec(), -32602, json!(5), "no name"),
        (
            br#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":42}}"#.to_vec(),
            -32602,
            json!(6),
            "a numeric name",
        ),
        (
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"whoami","arguments":[1]}}"#.to_vec(),
            -32602,
            json!(7),
            "arguments not an object",
        ),
        (br#"{"jsonrpc":"2.0","id":8,"method":"no/such/method"}"#.to_vec(), -32601, json!(8), "an unknown method"),
    ];
    for (body, code, id, why) in bodies {
        let reply = post_bytes(&live, &token, s, body, &[]).await;
        assert_ne!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{why}");
        assert_eq!(reply.message["jsonrpc"], "2.0", "{why}: a JSON-RPC answer: {:?}", reply.message);
        assert_eq!(reply.message["error"]["code"], code, "{why}: {:?}", reply.message);
        assert_eq!(reply.message["id"], id, "{why}: {:?}", reply.message);
    }
    // The malformed tools/call requests never ran a tool, and each is audited as a failed call.
    let events =
        rows(&live, "SELECT outcome, tool, error_class, request_id, calls FROM audit_events ORDER BY seq").await;
    let seen: Vec<_> = events.iter().map(|e| (e.0.as_str(), e.1.as_deref(), e.2.as_deref(), e.3.as_deref())).collect();
    assert_eq!(
        seen,
        [
            ("failed", Some("(invalid)"), Some("invalid_params"), Some("5")),
            ("failed", Some("(invalid)"), Some("invalid_params"), Some("6")),
            ("failed", Some("whoami"), Some("invalid_params"), Some("7")),
        ]
    );
    chain_ok(&live).await;
}
all_modes!(hardening_error_shapes, error_shapes);

/// Refusals made before a message is read carry the gateway's error body, with the right
/// status: a chunked body (no declared length) over `server.body_limit_bytes` gets 413 like
/// one whose declared length is over it; a body not declared JSON 415; a POST whose `Accept`
/// lacks the types the transport needs, or a GET whose `Accept` lacks `text/event-stream`, 406.
async fn http_refusals_in_our_body(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[("server.body_limit_bytes", json!(65536))]).await;
    let token = live.token_for("olivia@acme.test");
    let session = open_session(&live, &token).await.expect("session mode issues a session id");
    // A connection per request: one refused before its body was read is closed by the server.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let request = |method: reqwest::Method, content_type: &str, accept: &str| {
        client
            .request(method, live.url())
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", content_type)
            .header("accept", accept)
            .header("mcp-protocol-version", "2025-06-18")
            .header("mcp-session-id", &session)
    };
    let both = "application/json, text/event-stream";
    let padded = tool_call(2, "whoami", json!({"pad": "x".repeat(100_000)})).into_bytes();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = padded.chunks(16 * 1024).map(|c| Ok(c.to_vec())).collect();
    let cases: Vec<(&str, reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            "a chunked body over the limit",
            request(reqwest::Method::POST, "application/json", both)
                .body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            "a declared length over the limit",
            request(reqwest::Method::POST, "application/json", both).body(padded.clone()),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            "a body not declared JSON",
            request(reqwest::Method::POST, "text/plain", both).body(tool_call(3, "whoami", json!({}))),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            "a POST that does not accept SSE",
            request(reqwest::Method::POST, "application/json", "application/json").body(tool_call(
                4,
                "whoami",
                json!({}),
            )),
            StatusCode::NOT_ACCEPTABLE,
            "not_acceptable",
        ),
        (
            "a GET that does not accept SSE",
            request(reqwest::Method::GET, "application/json", "application/json"),
            StatusCode::NOT_ACCEPTABLE,
            "not_acceptable",
        ),
    ];
    for (why, request, status, code) in cases {
        let response = request.send().await.unwrap_or_else(|e| panic!("{why}: {e}"));
        assert_eq!(response.status(), status, "{why}");
        let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(content_type.as_deref(), Some("application/json"), "{why}");
        let body: Value = response.json().await.unwrap_or_else(|e| panic!("{why}: not JSON: {e}"));
        assert_eq!(body["error"], code, "{why}: {body}");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()), "{why}: {body}");
    }
    assert_eq!(live.count("SELECT COUNT(*) FROM audit_events WHERE tool = 'whoami'").await, 0, "nothing ran");
}
both_dbs!(hardening_http_refusals_in_our_body, http_refusals_in_our_body);

/// One rule: a token is honoured until the instant `exp` + `auth.leeway_secs`. Its POSTs are
/// accepted until then and refused from then on, and a stream it opened lives exactly as long.
async fn one_expiry_rule(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[("auth.leeway_secs", json!(2))]).await;
    let mut c = claims(&live.config, "acme", "olivia@acme.test");
    let exp = now() + 2;
    c["exp"] = json!(exp);
    let token = Signer::dev().sign(&c);
    let honoured_until = std::time::UNIX_EPOCH + Duration::from_secs((exp + 2) as u64);
    let session = open_session(&live, &token).await.unwrap();
    let stream = open_stream(&live, &token, &session).await;
    let stream = tokio::spawn(async move {
        let _ = stream.bytes().await;
        std::time::SystemTime::now()
    });

    // Past `exp`, inside the leeway: accepted, and the stream is still open.
    let inside = honoured_until - Duration::from_millis(900);
    tokio::time::sleep(inside.duration_since(std::time::SystemTime::now()).unwrap_or_default()).await;
    let accepted = post(&live, &token, Some(&session), &tool_call(2, "whoami", json!({})), &[]).await;
    assert_eq!(accepted.status, StatusCode::OK, "inside the leeway: {:?}", accepted.message);
    assert!(!stream.is_finished(), "the stream ended before its token stopped being honoured");

    let ended =
        tokio::time::timeout(Duration::from_secs(10), stream).await.expect("the stream outlived its token").unwrap();
    assert!(ended + Duration::from_millis(50) >= honoured_until, "the stream ended early");
    // From the instant the stream ended, the token's POSTs are refused.
    let refused = post(&live, &token, Some(&session), &tool_call(3, "whoami", json!({})), &[]).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
}
both_dbs!(hardening_one_expiry_rule, one_expiry_rule);

/// The head of the answer to `request` (written whole, then `body_part`), read off a fresh
/// connection to `addr`, lower-cased: status line and headers.
async fn answer_head(addr: std::net::SocketAddr, request: &str, body_part: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    socket.write_all(body_part).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(socket.read(&mut byte).await.unwrap(), 1, "closed before the answer: {head:?}");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_lowercase()
}

/// A request refused before its body was read (no token on /mcp or the admin API, a foreign
/// Origin, a declared length over the limit) is answered with `Connection: close`: the server
/// can't reuse the connection, and says so instead of closing it silently under a client's
/// pool. A request whose body was read keeps its connection. Then the pool of a real client:
/// refusals and health checks interleaved on one idle connection, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_before_the_body_says_connection_close() {
    let live = Live::start(Backend::Sqlite, Mode::Session, &[("server.body_limit_bytes", json!(65536))]).await;
    let post = |path: &str, extra: &str, length: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\n{extra}content-length: {length}\r\n\r\n"
        )
    };
    let cases = [
        ("/mcp without a token", post("/mcp", "", 4000), "401"),
        ("the admin API without a token", post("/admin/v1/tenants", "", 4000), "401"),
        ("a foreign Origin", post("/mcp", "origin: https://evil.example\r\n", 4000), "403"),
        ("a declared length over the limit", post("/mcp", "", 100_000), "413"),
    ];
    for (why, request, status) in cases {
        let head = answer_head(live.addr, &request, &[b'{'; 16]).await;
        assert!(head.starts_with(&format!("http/1.1 {status}")), "{why}: {head}");
        assert!(head.contains("\r\nconnection: close\r\n"), "{why}: no Connection: close in {head}");
    }
    let head = answer_head(live.addr, "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n", b"").await;
    assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close"), "{head}");

    let client = reqwest::Client::builder().pool_max_idle_per_host(1).build().unwrap();
    let body = tool_call(1, "whoami", json!({"pad": "x".repeat(2000)}));
    for round in 0..100 {
        let refused = client
            .post(live.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("round {round}: the refusal was lost: {e}"));
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let health = client
            .get(format!("{}/healthz", live.base_url()))
            .send()
            .await
            .unwrap_or_else(|e| panic!("round {round}: a pooled connection was closed silently: {e}"));
        assert_eq!(health.status(), StatusCode::OK);
    }
}

/// `audit verify` holds each chain against the head row the gateway keeps for it: the newest
/// events removed (the rest still links up) or the newest one swapped for a forged one is
/// broken, not "ok".
async fn verify_reaches_the_head(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[]).await;
    let client = live.client("olivia@acme.test").await;
    for _ in 0..3 {
        client.peer().call_tool(rmcp::model::CallToolRequestParams::new("whoami")).await.unwrap();
    }
    client.cancel().await.unwrap();
    // Three calls, each its record and its outcome: six events.
    eventually("three calls audited", || async { live.count("SELECT COUNT(*) FROM audit_events").await == 6 }).await;
    assert_eq!(live.count("SELECT COUNT(*) FROM audit_events WHERE call_id IS NULL").await, 3);
    chain_ok(&live).await;
    let acme = |reports: Vec<scopegate::audit::verify::ChainReport>| {
        reports.into_iter().find(|r| r.tenant == "acme").and_then(|r| r.broken).map(|b| b.reason).unwrap_or_default()
    };
    live.execute("DELETE FROM audit_events WHERE seq = 6").await;
    let reason = acme(scopegate::audit::verify::verify(&live.db, None).await.unwrap());
    assert!(reason.contains("events at its end were removed"), "{reason}");
    // A chain rebuilt to end in another event: the head row names another hash.
    live.execute("UPDATE audit_heads SET seq = 5").await;
    let reason = acme(scopegate::audit::verify::verify(&live.db, None).await.unwrap());
    assert!(reason.contains("is not the one the chain's head row names"), "{reason}");
}
both_dbs!(hardening_verify_reaches_the_head, verify_reaches_the_head);
