//! The upstream test fixture itself, as the proxy tests rely on it: `echo`, `progress` with its
//! notifications, `hang` leaving a mark when cancelled, and in HTTP mode the headers it reports
//! and the JWKS it fetches once and again only for an unknown key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ClientConfig, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use scopegate::auth::assertion::{AssertedCaller, AssertionSigner};
use serde_json::{Value, json};

use crate::support::{FIXTURE, eventually, fixture_http};

/// How long a call must go unanswered to count as hanging: the fixture answers its other
/// tools over stdio within milliseconds, and `hang` answering would be as quick.
const NO_ANSWER: Duration = Duration::from_millis(300);

/// The logger and data of each log message received.
type Logs = Arc<Mutex<Vec<(Option<String>, Value)>>>;

/// Records the notifications the fixture sends.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    logs: Logs,
}

#[allow(deprecated)] // MCP logging (SEP-2577) is deprecated in rmcp, and still what we relay.
impl ClientHandler for Recorder {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.progress.lock().unwrap().push(params);
    }

    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        assert_eq!(params.level, rmcp::model::LoggingLevel::Info);
        self.logs.lock().unwrap().push((params.logger, params.data));
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

impl Recorder {
    /// Waits until `n` log messages arrived (notifications are handled beside responses).
    async fn wait_for_logs(&self, n: usize) {
        eventually(format!("{n} log messages"), || async {
            let got = self.logs.lock().unwrap().len();
            if got >= n { Ok(()) } else { Err(format!("only {got} of {n}")) }
        })
        .await
    }
}

async fn stdio(recorder: Recorder, env: &[(&str, &str)]) -> RunningService<RoleClient, Recorder> {
    let mut cmd = tokio::process::Command::new(FIXTURE);
    cmd.arg("stdio");
    for (k, v) in env {
        cmd.env(k, v);
    }
    recorder.serve(TokioChildProcess::new(cmd).unwrap()).await.expect("fixture starts")
}

fn args(value: Value) -> CallToolRequestParams {
    let (name, arguments) = (value["name"].as_str().unwrap().to_owned(), value["arguments"].clone());
    CallToolRequestParams::new(name).with_arguments(arguments.as_object().unwrap().clone())
}

fn text(result: &rmcp::model::CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect()
}

/// FIXTURE_TOOLS=N (the catalog bench's upstreams): its own tools, then generated ones up to
/// N in all, each answering its text; unset or at most its own count, its own tools only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_tools_pads_the_list_with_generated_tools() {
    let names =
        |tools: Vec<rmcp::model::Tool>| -> Vec<String> { tools.into_iter().map(|t| t.name.into_owned()).collect() };
    for (why, setting, listed) in [("unset", None, 5), ("fewer than its own", Some("3"), 5), ("twenty", Some("20"), 20)]
    {
        let env: Vec<(&str, &str)> = setting.map(|n| ("FIXTURE_TOOLS", n)).into_iter().collect();
        let client = stdio(Recorder::default(), &env).await;
        let tools = names(client.list_all_tools().await.unwrap());
        assert_eq!(tools.len(), listed, "{why}: {tools:?}");
        assert!(tools.iter().any(|t| t == "echo"), "{why}: its own tools stay: {tools:?}");
        let generated: Vec<&String> = tools.iter().filter(|t| t.starts_with("generated_")).collect();
        assert_eq!(generated.len(), listed - 5, "{why}: {tools:?}");
        if listed > 5 {
            let last = format!("generated_{}", listed - 5);
            let call = json!({"name": last, "arguments": {"text": "ab", "repeat": 2}});
            let result = client.call_tool(args(call)).await.unwrap();
            assert_eq!(text(&result), "abab", "{why}");
        }
        let _ = client.cancel().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_echo_and_progress_over_stdio() {
    let recorder = Recorder::default();
    let client = stdio(recorder.clone(), &[]).await;
    let tools: Vec<String> = client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.into_owned()).collect();
    for tool in ["whoami_upstream", "echo", "progress", "crash", "hang"] {
        assert!(tools.iter().any(|t| t == tool), "{tool} in {tools:?}");
    }

    let result =
        client.call_tool(args(json!({"name": "echo", "arguments": {"text": "hello, upstream"}}))).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(text(&result), "hello, upstream");

    // One progress notification and one log message per step. The rmcp client puts its own
    // progress token on every request (it replaces ours): every notification carries that one.
    let result = client.call_tool(args(json!({"name": "progress", "arguments": {"steps": 3}}))).await.unwrap();
    assert_eq!(text(&result), "done");
    recorder.wait_for_logs(3).await;
    let recorded = recorder.progress.lock().unwrap().clone();
    assert!(recorded.iter().all(|p| p.progress_token == recorded[0].progress_token), "{recorded:?}");
    let progress: Vec<(f64, Option<f64>, Option<String>)> =
        recorded.iter().map(|p| (p.progress, p.total, p.message.clone())).collect();
    assert_eq!(progress, (1..=3).map(|i| (f64::from(i), Some(3.0), Some(format!("step {i}")))).collect::<Vec<_>>());
    assert_eq!(
        *recorder.logs.lock().unwrap(),
        (1..=3).map(|i| (Some("fixture".to_owned()), json!(format!("fixture log: step {i}")))).collect::<Vec<_>>()
    );

    for steps in [0, 21] {
        let refused = client.call_tool(args(json!({"name": "progress", "arguments": {"steps": steps}}))).await;
        assert!(refused.is_err(), "steps {steps} must be refused: {refused:?}");
    }
    client.cancel().await.ok();
}

/// Raw JSON-RPC over stdio, to send a request without a progress token (the rmcp client
/// always adds one): the log messages come, the progress notifications do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_progress_without_a_token_only_logs() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    let mut child = tokio::process::Command::new(FIXTURE)
        .arg("stdio")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "progress", "arguments": {"steps": 2}}});
    let mut methods = Vec::new();
    for message in [init, initialized, call] {
        stdin.write_all(format!("{message}\n").as_bytes()).await.unwrap();
    }
    let result = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let line = lines.next_line().await.unwrap().expect("the fixture answers");
            let message: Value = serde_json::from_str(&line).unwrap();
            match message["method"].as_str() {
                Some(method) => methods.push(method.to_owned()),
                None if message["id"] == 2 => return message,
                None => {}
            }
        }
    })
    .await
    .expect("the call completes");
    assert_eq!(result["result"]["content"][0]["text"], "done", "{result}");
    assert_eq!(methods, ["notifications/message", "notifications/message"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_hang_marks_its_cancellation() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("mark");
    let client = stdio(Recorder::default(), &[("FIXTURE_MARK_FILE", mark.to_str().unwrap())]).await;
    // Dropping the call future sends `notifications/cancelled`.
    let call = client.call_tool(CallToolRequestParams::new("hang"));
    assert!(tokio::time::timeout(NO_ANSWER, call).await.is_err(), "hang never answers");
    eventually("no mark after the cancellation", || async {
        std::fs::read_to_string(&mark).unwrap_or_default() == "cancelled\n"
    })
    .await;
    // The fixture still answers other calls.
    let result = client.call_tool(args(json!({"name": "echo", "arguments": {"text": "still here"}}))).await.unwrap();
    assert_eq!(text(&result), "still here");
    client.cancel().await.ok();
}

/// A JWKS endpoint that counts its requests and serves the signer's current key set.
async fn jwks_server(signer: Arc<AssertionSigner>) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    let app = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let set = signer.jwks();
            async move { axum::Json(set) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_http_reports_headers_and_caches_the_jwks() {
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    scopegate::http::install_tls_provider();
    let issuer = "http://gateway.test";
    let signer = Arc::new(AssertionSigner::new(issuer, Duration::from_secs(60)).unwrap());
    let (jwks_url, hits) = jwks_server(Arc::clone(&signer)).await;

    let env = [("FIXTURE_JWKS_URL", jwks_url.as_str()), ("FIXTURE_SERVER_ID", "notes"), ("FIXTURE_ISSUER", issuer)];
    let (mut child, addr) = fixture_http(&["http", "127.0.0.1:0"], &env).await;

    let caller = AssertedCaller {
        tenant: "acme".into(),
        tenant_id: "t-1".into(),
        user: "wanda@acme.test".into(),
        user_id: "u-1".into(),
        roles: vec!["worker".into()],
        flocks: json!("all"),
    };
    // One client per assertion: the transport's headers are fixed for its life.
    let connect = |assertion: String| {
        let headers = HashMap::from([
            (http::HeaderName::from_static("x-scopegate-identity"), assertion.parse().unwrap()),
            (http::HeaderName::from_static("x-declared"), http::HeaderValue::from_static("from-the-declaration")),
        ]);
        let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"))
            .auth_header("upstream-credential")
            .custom_headers(headers);
        ().serve(StreamableHttpClientTransport::with_client(reqwest::Client::new(), config))
    };
    let whoami = || CallToolRequestParams::new("whoami_upstream");

    let client = connect(signer.sign(&caller, "notes").unwrap()).await.unwrap();
    for _ in 0..2 {
        let result = client.call_tool(whoami()).await.unwrap();
        assert_ne!(result.is_error, Some(true), "{result:?}");
        let echoed = result.structured_content.unwrap();
        assert_eq!((echoed["tenant"].as_str(), echoed["user"].as_str()), (Some("acme"), Some("wanda@acme.test")));
        assert_eq!(echoed["authorization"], "Bearer upstream-credential");
        assert_eq!(echoed["declared_header"], "from-the-declaration");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 1, "the key set is fetched once");
    let result = client.call_tool(args(json!({"name": "echo", "arguments": {"text": "x"}}))).await.unwrap();
    assert_eq!(text(&result), "x");
    client.cancel().await.ok();

    // A rotated key is unknown to the cache: one more fetch finds it.
    signer.rotate().unwrap();
    let client = connect(signer.sign(&caller, "notes").unwrap()).await.unwrap();
    let result = client.call_tool(whoami()).await.unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    client.cancel().await.ok();

    // A key the gateway never published: refetched, still refused.
    let forger = AssertionSigner::new(issuer, Duration::from_secs(60)).unwrap();
    let client = connect(forger.sign(&caller, "notes").unwrap()).await.unwrap();
    let result = client.call_tool(whoami()).await.unwrap();
    assert_eq!(result.is_error, Some(true), "{result:?}");
    assert!(text(&result).contains("assertion refused"), "{}", text(&result));
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    client.cancel().await.ok();

    child.kill().await.ok();
}
