//! The identity-scoped proxy, end to end: rmcp's client over real HTTP against the gateway,
//! which launches the fixture upstream (a real child process over stdio) or dials it (a real
//! Streamable HTTP server), on SQLite and PostgreSQL.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rmcp::ClientHandler;
use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
use rmcp::service::{PeerRequestOptions, RoleClient, RunningService};
use scopegate::model::Role;
use serde_json::{Value, json};

use crate::support::*;

async fn tool_names(client: &RunningService<RoleClient, impl ClientHandler>) -> Vec<String> {
    client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect()
}

fn upstream_names(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).filter(|n| n.contains("__")).collect()
}

async fn unknown(client: &RunningService<RoleClient, ()>, tool: &str) {
    let err = call(client, tool, json!({})).await.expect_err(tool);
    assert_eq!(err.message, "tool not found", "{tool} must answer as an unknown tool");
}

async fn lists_and_calls(backend: Backend, mode: Mode) {
    let proxy = Proxy::with_fx(backend, mode, &[]).await;
    // A server bound to a remote executor is not served (remote executors do not exist yet).
    proxy.declare("acme", "far", &proxy.stdio("far", "x"), "build-01").await;
    proxy.grant("acme", "far", Role::Owner, "*").await;
    let live = &proxy.live;

    let olivia = live.client("olivia@acme.test").await;
    let names = tool_names(&olivia).await;
    assert_eq!(
        upstream_names(&names),
        ["fx__crash", "fx__echo", "fx__hang", "fx__progress", "fx__whoami_upstream"],
        "the owner's grant is `*`: {names:?}"
    );
    assert!(names.iter().any(|n| n == "whoami"), "native tools are listed beside upstream ones");

    let me = ok(&olivia, "fx__whoami_upstream", json!({})).await;
    assert_eq!(me["tenant"], "acme");
    assert_eq!(me["user"], "olivia@acme.test");
    assert_eq!(me["roles"], json!(["owner"]));
    assert_eq!(me["flocks"], "all");
    assert_eq!(me["declared_value"], "from-the-declaration", "a value only the declaration supplies");
    assert_eq!(me["assertion_source"], "meta", "a stdio upstream reads the assertion from `_meta`");
    let cwd = std::path::PathBuf::from(me["cwd"].as_str().unwrap());
    assert_eq!(cwd.canonicalize().unwrap(), proxy.root.path().join("work").canonicalize().unwrap());
    let inherited: Vec<&str> = me["env_keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
    assert!(
        inherited.iter().all(|k| !k.starts_with("CARGO") && !k.starts_with("SCOPEGATE")),
        "the gateway's own environment is not inherited: {inherited:?}"
    );
    let echoed = call(&olivia, "fx__echo", json!({"text": "hello"})).await.unwrap();
    assert_eq!(serde_json::to_value(&echoed.content).unwrap()[0]["text"], "hello");

    // The worker's grant names one tool; everything else is as if it did not exist.
    let wanda = live.client("wanda@acme.test").await;
    assert_eq!(upstream_names(&tool_names(&wanda).await), ["fx__whoami_upstream"]);
    let me = ok(&wanda, "fx__whoami_upstream", json!({})).await;
    assert_eq!(me["user"], "wanda@acme.test");
    assert_eq!(me["flocks"], json!([live.flock_id("north-barn").await]), "the worker's flock scope");
    unknown(&wanda, "fx__echo").await;

    // No grant for the auditor; globex never bound `fx`; nobody sees `far`.
    let audrey = live.client("audrey@acme.test").await;
    assert!(upstream_names(&tool_names(&audrey).await).is_empty());
    unknown(&audrey, "fx__whoami_upstream").await;
    let gary = live.client("gary@globex.test").await;
    assert!(upstream_names(&tool_names(&gary).await).is_empty());
    unknown(&gary, "fx__whoami_upstream").await;
    unknown(&olivia, "far__whoami_upstream").await;
    unknown(&olivia, "fx__no_such_tool").await;

    // Audited like native calls: allowed, denied and unknown.
    let ok_calls =
        live.count("SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__whoami_upstream' AND outcome = 'ok'").await;
    assert_eq!(ok_calls, 2);
    let denied = live.count("SELECT COUNT(*) FROM audit_events WHERE tool LIKE 'fx__%' AND outcome = 'denied'").await;
    assert_eq!(denied, 4, "wanda's echo, audrey's and gary's whoami, olivia's unknown tool");
}
all_modes!(proxy_lists_and_calls_a_stdio_upstream, lists_and_calls);

async fn http_upstream(backend: Backend) {
    let header = ("upstream.assertion_header", json!("x-acme-caller"));
    let proxy = Proxy::start(backend, Mode::Session, &[header]).await;
    let mut fixture = HttpFixture::start(&proxy.live, "web").await;
    let declaration = json!({"type": "http", "url": fixture.url, "headers": {"x-declared": "from-the-declaration"}});
    proxy.declare("acme", "web", &declaration, "local").await;
    proxy.grant("acme", "web", Role::Owner, "*").await;
    proxy.grant("acme", "web", Role::Worker, "*").await;

    for user in ["olivia@acme.test", "wanda@acme.test"] {
        let client = proxy.live.client(user).await;
        assert!(tool_names(&client).await.contains(&"web__whoami_upstream".to_owned()));
        let me = ok(&client, "web__whoami_upstream", json!({})).await;
        assert_eq!(me["tenant"], "acme");
        assert_eq!(me["user"], user, "the assertion names the caller of this call");
        assert_eq!(me["authorization"], Value::Null, "the client's token never goes upstream");
        assert_eq!(me["assertion_source"], "header", "over HTTP, the assertion travels in the configured header");
        assert_eq!(me["declared_header"], "from-the-declaration", "upstream credentials come from the declaration");
    }
    fixture.child.kill().await.ok();
}
both_dbs!(proxy_calls_a_streamable_http_upstream, http_upstream);

/// HTTPS upstreams: verified against the platform's roots plus `upstream.ca_file`. Without
/// the CA that signed the upstream's certificate the gateway refuses the connection (the
/// server's tools are not listed, a call fails as unavailable); there is no insecure fallback.
async fn https_upstream(backend: Backend) {
    let trusting =
        Proxy::start(backend, Mode::Session, &[("upstream.ca_file", json!(tls_file("upstream-ca.pem")))]).await;
    let mut fixture = HttpFixture::start_with(&trusting.live, "sec", true).await;
    assert!(fixture.url.starts_with("https://127.0.0.1:"), "{}", fixture.url);
    let declaration = json!({"type": "http", "url": fixture.url});
    trusting.declare("acme", "sec", &declaration, "local").await;
    trusting.grant("acme", "sec", Role::Owner, "*").await;
    let olivia = trusting.live.client("olivia@acme.test").await;
    assert!(tool_names(&olivia).await.contains(&"sec__whoami_upstream".to_owned()));
    let me = ok(&olivia, "sec__whoami_upstream", json!({})).await;
    assert_eq!(me["user"], "olivia@acme.test", "the fixture verified the assertion over TLS");
    assert_eq!(me["assertion_source"], "header");

    // Another gateway, same upstream, without the CA: the certificate is not trusted.
    let refusing = Proxy::start(backend, Mode::Session, &[]).await;
    refusing.declare("acme", "sec", &declaration, "local").await;
    refusing.grant("acme", "sec", Role::Owner, "*").await;
    let olivia = refusing.live.client("olivia@acme.test").await;
    assert!(upstream_names(&tool_names(&olivia).await).is_empty(), "an untrusted upstream lists nothing");
    let err = call(&olivia, "sec__whoami_upstream", json!({})).await.expect_err("untrusted certificate");
    assert_eq!(err.message, "upstream server unavailable");
    fixture.child.kill().await.ok();
}
both_dbs!(proxy_calls_an_https_upstream_only_with_a_trusted_certificate, https_upstream);

/// A CA file that is missing or holds no certificate stops the gateway at start-up, naming
/// the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_bad_ca_file_is_a_clear_start_error() {
    let test_db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    for (file, expect) in [
        (dir.path().join("missing.pem").display().to_string(), "reading"),
        (empty.display().to_string(), "no PEM certificate"),
    ] {
        let config = config_with(&test_db.url, &[("upstream.ca_file", json!(file))]);
        let err = scopegate::Gateway::build(config).await.err().expect("a bad CA file must stop the gateway");
        let message = err.to_string();
        assert!(message.contains("upstream.ca_file") && message.contains(expect), "{message}");
    }
}

async fn crash_restarts(backend: Backend) {
    let proxy = Proxy::with_fx(backend, Mode::Session, &[]).await;
    let olivia = proxy.live.client("olivia@acme.test").await;
    let before = ok(&olivia, "fx__whoami_upstream", json!({})).await["pid"].clone();

    let err = call(&olivia, "fx__crash", json!({})).await.expect_err("a crash fails the call");
    assert_eq!(err.message, "upstream server unavailable");
    assert_eq!(
        proxy
            .live
            .count(
                "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__crash' AND error_class = 'upstream_unavailable'"
            )
            .await,
        1
    );
    // The gateway stays up, and the next call restarts the upstream.
    ok(&olivia, "whoami", json!({})).await;
    let after = ok(&olivia, "fx__whoami_upstream", json!({})).await["pid"].clone();
    assert_ne!(before, after, "a new process answers");
}
both_dbs!(proxy_upstream_crash_fails_the_call_and_restarts, crash_restarts);

async fn hang_times_out(backend: Backend) {
    hang_times_out_over(backend, Over::Stdio).await;
}

/// Over Streamable HTTP, in a session: the calls take the lean relay.
async fn hang_times_out_on_the_lean_relay(backend: Backend) {
    hang_times_out_over(backend, Over::Http).await;
}
both_dbs!(proxy_hanging_http_upstream_times_out_and_is_cancelled, hang_times_out_on_the_lean_relay);

/// How long the tasks of an answered call may take to end before the live tasks are counted
/// as the baseline no later count may exceed: each ends as soon as it sees the answer, within
/// milliseconds, so a baseline taken after this holds none of them.
const SETTLED: Duration = Duration::from_millis(200);

/// How long a call takes at most to reach the local upstream (one hop over loopback or
/// stdio), so that a cancellation sent after it finds the call there.
const REACHES_UPSTREAM: Duration = Duration::from_millis(300);

async fn hang_times_out_over(backend: Backend, over: Over) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[("mcp.call_timeout_secs", json!(1))], over).await;
    let olivia = proxy.live.client("olivia@acme.test").await;
    ok(&olivia, "fx__whoami_upstream", json!({})).await;
    tokio::time::sleep(SETTLED).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();

    for _ in 0..3 {
        let started = Instant::now();
        let err = call(&olivia, "fx__hang", json!({})).await.expect_err("a hanging call times out");
        assert_eq!(err.message, "tool call timed out");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
    // The upstream was told to cancel each call.
    let marks = proxy.marks();
    let cancellations = |want: usize| {
        let marks = marks.clone();
        async move {
            eventually(format!("the upstream sees {want} cancellations"), || async {
                let text = std::fs::read_to_string(&marks).unwrap_or_default();
                let seen = text.lines().filter(|l| *l == "cancelled").count();
                if seen == want { Ok(()) } else { Err(format!("the upstream saw {seen} of {want} cancellations")) }
            })
            .await
        }
    };
    cancellations(3).await;
    // No task outlives its call (the last ones may take a moment to wind down).
    eventually("no task outlives its call", || async {
        let alive = metrics.num_alive_tasks();
        if alive <= baseline {
            Ok(())
        } else {
            Err(format!("{alive} tasks alive after the timeouts, {baseline} before"))
        }
    })
    .await;
    // The client gives up on a fourth call: the cancellation reaches the upstream too.
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new("fx__hang")));
    let handle = olivia.peer().send_cancellable_request(request, PeerRequestOptions::no_options()).await.unwrap();
    tokio::time::sleep(REACHES_UPSTREAM).await;
    handle.cancel(Some("the user gave up".to_owned())).await.unwrap();

    cancellations(4).await;
    assert_eq!(
        proxy.live.count("SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__hang' AND error_class = 'timeout'").await,
        3
    );
    let cancelled = "SELECT COUNT(*) FROM audit_events WHERE tool = 'fx__hang' AND error_class = 'cancelled'";
    eventually("the cancelled call is audited", || async { proxy.live.count(cancelled).await != 0 }).await;
    assert_eq!(proxy.live.count(cancelled).await, 1, "the cancelled call is audited as such");
    ok(&olivia, "fx__whoami_upstream", json!({})).await;
}
both_dbs!(proxy_hanging_upstream_times_out_without_leaking, hang_times_out);

async fn garbage_isolated(backend: Backend) {
    let proxy = Proxy::with_fx(backend, Mode::Session, &[]).await;
    let mut junk = proxy.stdio("junk", "x");
    junk["args"] = json!(["garbage"]);
    proxy.declare("acme", "junk", &junk, "local").await;
    proxy.grant("acme", "junk", Role::Owner, "*").await;

    let olivia = proxy.live.client("olivia@acme.test").await;
    let names = tool_names(&olivia).await;
    assert!(names.contains(&"fx__whoami_upstream".to_owned()), "the good upstream is listed: {names:?}");
    assert!(!names.iter().any(|n| n.starts_with("junk__")), "{names:?}");
    let err = call(&olivia, "junk__anything", json!({})).await.expect_err("garbage gives an error");
    assert_eq!(err.message, "upstream server unavailable");
    ok(&olivia, "fx__whoami_upstream", json!({})).await;
    ok(&olivia, "whoami", json!({})).await;
}
both_dbs!(proxy_garbage_speaking_upstream_is_an_isolated_error, garbage_isolated);

async fn snapshot_frozen(backend: Backend) {
    let proxy = Proxy::with_fx(backend, Mode::Session, &[]).await;
    proxy.declare("globex", "fx", &proxy.stdio("fx", "from-the-declaration"), "local").await;
    proxy.grant("globex", "fx", Role::Owner, "*").await;

    let first = proxy.live.client("olivia@acme.test").await;
    let a = ok(&first, "fx__whoami_upstream", json!({})).await;
    assert_eq!(a["declared_value"], "from-the-declaration");

    proxy.redeclare("acme", "fx", &proxy.stdio("fx", "changed")).await;
    let again = ok(&first, "fx__whoami_upstream", json!({})).await;
    assert_eq!(again["declared_value"], "from-the-declaration", "a session keeps its snapshot");
    assert_eq!(again["pid"], a["pid"], "and its runtime");

    let second = proxy.live.client("olivia@acme.test").await;
    let b = ok(&second, "fx__whoami_upstream", json!({})).await;
    assert_eq!(b["declared_value"], "changed", "a new session sees the new declaration");
    assert_ne!(b["pid"], a["pid"]);
    let third = proxy.live.client("wanda@acme.test").await;
    assert_eq!(ok(&third, "fx__whoami_upstream", json!({})).await["pid"], b["pid"], "same resolved set, same runtime");

    let gary = proxy.live.client("gary@globex.test").await;
    let g = ok(&gary, "fx__whoami_upstream", json!({})).await;
    assert_eq!(g["tenant"], "globex");
    assert_ne!(g["pid"], a["pid"], "tenants never share a runtime, even for identical declarations");
    assert_ne!(g["pid"], b["pid"]);
}
both_dbs!(proxy_session_snapshot_is_frozen_and_per_tenant, snapshot_frozen);

async fn progress_and_logs(backend: Backend, mode: Mode, over: Over) {
    let proxy = Proxy::with_fx_over(backend, mode, &[], over).await;
    let listener = Listener::default();
    let client = listener.client(&proxy.live, "olivia@acme.test").await;
    // Paced, then as a burst with the answer right behind it: every message sent before the
    // answer reaches the session, however the gateway's tasks are scheduled. (The calls are
    // spaced: a log line names no call, and for half a second after a call of another owner
    // ended, as each stateless request is, a log line is not attributed at all.)
    let mut expected = 0;
    for (steps, gap_ms) in [(3, 20), (20, 0), (20, 0)] {
        if expected > 0 {
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        expected += steps;
        let args = json!({"steps": steps, "gap_ms": gap_ms});
        let params = CallToolRequestParams::new("fx__progress").with_arguments(args.as_object().cloned().unwrap());
        let result = client.call_tool(params).await.unwrap();
        assert_ne!(result.is_error, Some(true), "{result:?}");
        // The test client, too, handles notifications in tasks of their own: give them time.
        eventually("every notification reaches the session", || async { listener.heard(expected) }).await;
        assert_eq!(
            listener.progress.load(Ordering::SeqCst),
            expected,
            "every progress notification reaches the session ({steps} steps, {gap_ms} ms apart)"
        );
        assert_eq!(listener.logs.load(Ordering::SeqCst), expected, "every log message reaches the session");
    }
}
async fn progress_and_logs_in_a_session(backend: Backend) {
    progress_and_logs(backend, Mode::Session, Over::Stdio).await;
}

/// Over Streamable HTTP, in a session: the calls take the lean relay, whose answers carry the
/// notifications before them.
async fn progress_and_logs_on_the_lean_relay(backend: Backend) {
    progress_and_logs(backend, Mode::Session, Over::Http).await;
}
both_dbs!(proxy_progress_and_logs_reach_the_session_over_http, progress_and_logs_on_the_lean_relay);
both_dbs!(proxy_progress_and_logs_reach_the_calling_session, progress_and_logs_in_a_session);

/// Stateless, where a call's answer is plain JSON unless something comes before it: the
/// progress and log messages still arrive (the answer falls back to SSE).
async fn progress_and_logs_stateless(backend: Backend) {
    progress_and_logs(backend, Mode::Stateless, Over::Stdio).await;
}
both_dbs!(proxy_progress_and_logs_reach_a_stateless_caller, progress_and_logs_stateless);

/// A log line an upstream sends after its answer, on its own event stream (where rmcp's
/// servers send every log line), within the linger of the call that caused it: on the lean
/// relay the call's answer is gone by then, and the line reaches the session through its rmcp
/// stream instead of being lost with the answer.
async fn a_late_log_line_on_the_lean_relay(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let listener = Listener::default();
    let client = listener.client(&proxy.live, "olivia@acme.test").await;
    let args = json!({"steps": 1, "gap_ms": 0, "late_log_ms": 100});
    let params = CallToolRequestParams::new("fx__progress").with_arguments(args.as_object().cloned().unwrap());
    let result = client.call_tool(params).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    eventually("the late log line reaches the session", || async { listener.logs.load(Ordering::SeqCst) >= 2 }).await;
    assert_eq!(listener.logs.load(Ordering::SeqCst), 2, "the step's log line and the late one reach the session");
}
both_dbs!(proxy_a_late_log_line_reaches_the_session_over_http, a_late_log_line_on_the_lean_relay);

/// A log line an upstream (stdio: no line names its call) writes about one user's call after
/// that call's linger, while another user of the tenant calls on the same connection, reaches
/// nobody: the connection has served two principals, so the line can't be attributed with
/// certainty. The second user's progress, which names its call, still reaches it.
async fn a_late_line_never_reaches_another_user(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Stdio).await;
    proxy.grant("acme", "fx", Role::Worker, "progress").await;
    let (olivia_hears, wanda_hears) = (Listener::default(), Listener::default());
    let olivia = olivia_hears.client(&proxy.live, "olivia@acme.test").await;
    let wanda = wanda_hears.client(&proxy.live, "wanda@acme.test").await;
    let call =
        |args: Value| CallToolRequestParams::new("fx__progress").with_arguments(args.as_object().cloned().unwrap());
    // Olivia's call ends at once; its line comes 800 ms later, past the 500 ms linger.
    let secret = json!({"steps": 1, "gap_ms": 0, "late_log_ms": 800, "late_text": "olivia's balance is 4242"});
    olivia.call_tool(call(secret)).await.unwrap();
    // Wanda's call is in flight from then until well after the line came.
    let slow = json!({"steps": 15, "gap_ms": 100});
    let result = wanda.call_tool(call(slow)).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    eventually("wanda's progress reaches her", || async { wanda_hears.progress.load(Ordering::SeqCst) >= 15 }).await;
    let heard = wanda_hears.lines.lock().unwrap().clone();
    assert!(heard.iter().all(|l| !l.contains("4242")), "olivia's line reached wanda: {heard:?}");
    let heard = olivia_hears.lines.lock().unwrap().clone();
    assert!(heard.iter().all(|l| !l.contains("4242")), "a line after its linger is nobody's: {heard:?}");
}
both_dbs!(proxy_a_late_line_never_reaches_another_user, a_late_line_never_reaches_another_user);

/// A native tool set that tries to take an upstream-style name.
#[derive(Clone)]
struct Shadowing;

#[rmcp::tool_router]
impl Shadowing {
    #[rmcp::tool(name = "fx__whoami_upstream", description = "Pretends to be an upstream tool.")]
    async fn shadow(&self) -> String {
        String::new()
    }
}

#[test]
fn proxy_native_tool_names_cannot_collide_with_upstream_tools() {
    use scopegate::mcp::{RegistryError, ToolSet};
    use scopegate::tools::{NoArguments, ToolSpec, arguments};
    const SPECS: &[ToolSpec] =
        &[ToolSpec { name: "fx__whoami_upstream", roles: &[Role::Owner], validate: arguments::<NoArguments> }];
    let refused = ToolSet::native().with(Shadowing, Shadowing::tool_router(), SPECS);
    assert!(
        matches!(refused, Err(RegistryError::ReservedName(ref name)) if name == "fx__whoami_upstream"),
        "a native name with `__` is refused"
    );
}

/// An identity assertion is reused for the same caller within `upstream.assertion_reuse_ms`,
/// and never beyond a change of what it asserts: a worker's flock, withdrawn between two
/// calls well inside the reuse period, is gone from the next call's assertion.
async fn assertion_reuse_follows_identity(backend: Backend) {
    let reuse = [("upstream.assertion_reuse_ms", json!(15_000))];
    let proxy = Proxy::with_fx(backend, Mode::Session, &reuse).await;
    let live = &proxy.live;
    let wanda = live.client("wanda@acme.test").await;
    let first = ok(&wanda, "fx__whoami_upstream", json!({})).await;
    assert_eq!(first["flocks"], json!([live.flock_id("north-barn").await]));
    let again = ok(&wanda, "fx__whoami_upstream", json!({})).await;
    assert_eq!(again["jti"], first["jti"], "the same claims: the assertion is reused");
    let olivia = live.client("olivia@acme.test").await;
    let other = ok(&olivia, "fx__whoami_upstream", json!({})).await;
    assert_eq!(other["user"], "olivia@acme.test", "another caller never gets wanda's assertion");
    assert_ne!(other["jti"], first["jti"]);

    admin_tx!(live.db, |tx| admin_fns::unassign_flock(&mut tx, "acme", "wanda@acme.test", "north-barn")).unwrap();
    // Once the gateway sees the change (the identity cache polls for it)...
    eventually("the unassignment never reached the gateway", || async {
        ok(&wanda, "whoami", json!({})).await["flock_scope"] == json!([])
    })
    .await;
    // ...the upstream is told the new scope, though the old assertion is still reusable.
    let after = ok(&wanda, "fx__whoami_upstream", json!({})).await;
    assert_eq!(after["flocks"], json!([]), "the withdrawn flock is no longer asserted");
    assert_ne!(after["jti"], first["jti"]);
}
both_dbs!(proxy_assertion_reuse_follows_identity, assertion_reuse_follows_identity);

async fn idle_closes(backend: Backend) {
    let proxy = Proxy::with_fx(backend, Mode::Session, &[("upstream.idle_secs", json!(1))]).await;
    let olivia = proxy.live.client("olivia@acme.test").await;
    let first = ok(&olivia, "fx__whoami_upstream", json!({})).await["pid"].clone();
    assert_eq!(ok(&olivia, "fx__whoami_upstream", json!({})).await["pid"], first, "in use: kept");
    let pid = first.as_u64().unwrap();
    // Gone, or a zombie waiting to be reaped: either way it no longer runs.
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_or(true, |status| status.lines().any(|l| l.starts_with("State:") && l.contains('Z')))
    };
    eventually("an idle upstream process is stopped", || async { gone() }).await;
    let next = ok(&olivia, "fx__whoami_upstream", json!({})).await["pid"].clone();
    assert_ne!(next, first, "the next call starts it again");
}
both_dbs!(proxy_idle_connection_is_closed_and_restarted_on_next_use, idle_closes);
