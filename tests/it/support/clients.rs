//! MCP clients of a test gateway: rmcp's own client over HTTP (with the call helpers the tests
//! share, and a handler that counts what the gateway forwards), and raw HTTP JSON-RPC for what
//! the client would hide.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::StatusCode;
#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig, ProgressNotificationParam};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ErrorData, ServiceExt};
use scopegate::tools::ERROR_CLASS_META;
use serde_json::{Value, json};

use super::gateway::Live;

/// rmcp's Streamable HTTP transport to the MCP endpoint `url`, with `token` as the bearer.
pub fn transport(url: &str, token: &str) -> StreamableHttpClientTransport<reqwest::Client> {
    StreamableHttpClientTransport::with_client(
        reqwest::Client::builder().tcp_nodelay(true).build().unwrap(),
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token.to_owned()),
    )
}

/// rmcp's client of the MCP endpoint `url` with `token` and `handler`, connected (the
/// `initialize` handshake done).
pub async fn connect<H: ClientHandler>(url: &str, token: &str, handler: H) -> RunningService<RoleClient, H> {
    handler.serve(transport(url, token)).await.unwrap_or_else(|e| panic!("a client of {url} connects: {e}"))
}

/// rmcp's client on 2026-07-28 at `url` (no session: each request stands alone), able to answer
/// elicitation, declaring the tasks extension when `tasks`.
pub async fn modern_client(url: &str, token: &str, tasks: bool) -> RunningService<RoleClient, ClientConfig> {
    use rmcp::model::{ClientCapabilities, Implementation, ProtocolVersion};
    let mut caps = ClientCapabilities::builder().enable_elicitation().build();
    if tasks {
        caps.extensions = ClientCapabilities::builder().enable_tasks().build().extensions;
    }
    let lifecycle = rmcp::ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
    rmcp::ClientServiceExt::serve_with_lifecycle(
        ClientConfig::new(caps, Implementation::new("it", "1.0")),
        transport(url, token),
        lifecycle,
    )
    .await
    .unwrap_or_else(|e| panic!("connects on 2026-07-28 at {url}: {e}"))
}

pub async fn call(client: &Peer<RoleClient>, tool: &str, args: Value) -> Result<CallToolResult, ErrorData> {
    let params =
        CallToolRequestParams::new(tool.to_owned()).with_arguments(args.as_object().cloned().unwrap_or_default());
    match client.call_tool(params).await {
        Ok(result) => Ok(result),
        Err(ServiceError::McpError(e)) => Err(e),
        Err(other) => panic!("{tool}: transport failure {other}"),
    }
}

/// The structured content of a successful call.
pub async fn ok(client: &Peer<RoleClient>, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args.clone()).await.unwrap_or_else(|e| panic!("{tool} {args}: {e:?}"));
    assert_ne!(result.is_error, Some(true), "{tool} {args}: {result:?}");
    result.structured_content.expect("structured output")
}

/// The tool error of a call that ran and failed (`isError: true`), as `{error, message}`: the
/// error class from the result's `_meta` and the message from its text. An error result never
/// carries structured content (it would have to match the tool's output schema).
pub async fn tool_error(client: &Peer<RoleClient>, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args.clone()).await.unwrap_or_else(|e| panic!("{tool} {args}: {e:?}"));
    error_of(tool, &args, &result)
}

/// `{error, message}` of a tool error result, which must carry no structured content.
pub fn error_of(tool: &str, args: &Value, result: &CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(true), "{tool} {args} should fail: {result:?}");
    assert_eq!(result.structured_content, None, "{tool} {args}: an error result has no structured content");
    let class = result.meta.as_ref().and_then(|m| m.get(ERROR_CLASS_META)).cloned();
    let message: String = result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect();
    assert!(!message.is_empty(), "{tool} {args}: the error is told in text: {result:?}");
    json!({ "error": class.unwrap_or(Value::Null), "message": message })
}

/// A client handler that counts the progress notifications and log messages the gateway
/// forwards to its session.
#[derive(Clone, Default)]
pub struct Listener {
    pub progress: Arc<AtomicUsize>,
    pub logs: Arc<AtomicUsize>,
    /// What each log message said.
    pub lines: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ClientHandler for Listener {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
    async fn on_progress(&self, _params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.progress.fetch_add(1, Ordering::SeqCst);
    }
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        assert!(params.data.as_str().is_some_and(|s| s.starts_with("fixture log")), "{params:?}");
        self.lines.lock().unwrap().push(params.data.as_str().unwrap_or_default().to_owned());
        self.logs.fetch_add(1, Ordering::SeqCst);
    }
}

impl Listener {
    /// An rmcp client of `live` for `user` that counts what reaches it in `self`.
    pub async fn client(&self, live: &Live, user: &str) -> RunningService<RoleClient, Listener> {
        live.client_with(user, self.clone()).await
    }

    /// Whether at least `n` progress notifications and `n` log messages have arrived.
    pub fn heard(&self, n: usize) -> bool {
        self.progress.load(Ordering::SeqCst) >= n && self.logs.load(Ordering::SeqCst) >= n
    }
}

/// An answer over raw HTTP.
pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    /// The JSON-RPC message (from a JSON body or the last SSE `data:` line with an id).
    pub message: Value,
}

pub const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw-test","version":"1.0"}}}"#;
pub const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// POSTs `body` to `live`'s MCP endpoint with `token`, in `session` if given, with the
/// `extra` headers.
pub async fn post(live: &Live, token: &str, session: Option<&str>, body: &str, extra: &[(&str, &str)]) -> Reply {
    post_bytes(live, token, session, body.as_bytes().to_vec(), extra).await
}

/// [`post`] with any bytes for a body (not necessarily UTF-8).
pub async fn post_bytes(
    live: &Live,
    token: &str,
    session: Option<&str>,
    body: Vec<u8>,
    extra: &[(&str, &str)],
) -> Reply {
    let response = send(live, token, session, body, extra).await;
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    Reply { status, headers, message: message_in(&text) }
}

/// [`post_bytes`]'s request, answered with its response unread (to read an event stream as
/// it comes).
pub async fn send(
    live: &Live,
    token: &str,
    session: Option<&str>,
    body: Vec<u8>,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let client = reqwest::Client::builder().tcp_nodelay(true).build().unwrap();
    let mut req = client
        .post(live.url())
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    // A version among `extra` takes the default's place.
    if !extra.iter().any(|(k, _)| k.eq_ignore_ascii_case("mcp-protocol-version")) {
        req = req.header("mcp-protocol-version", "2025-06-18");
    }
    if let Some(session) = session {
        req = req.header("mcp-session-id", session);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// The JSON-RPC message of a response body: the body itself, or the last SSE `data:` line
/// with an id.
fn message_in(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .rfind(|v| v.get("id").is_some())
            .unwrap_or(Value::Null)
    })
}

/// The JSON-RPC message of a response (a JSON body or the SSE `data:` line with an id).
pub async fn message(response: reqwest::Response) -> Value {
    message_in(&response.text().await.unwrap())
}

/// A bodiless request (GET, DELETE) of `session` with `token`.
pub async fn session_request(live: &Live, method: reqwest::Method, token: &str, session: &str) -> reqwest::Response {
    reqwest::Client::new()
        .request(method, live.url())
        .header("authorization", format!("Bearer {token}"))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap()
}

/// Opens the session's GET stream (SSE) with `token`.
pub async fn open_stream(live: &Live, token: &str, session: &str) -> reqwest::Response {
    let response = session_request(live, reqwest::Method::GET, token, session).await;
    assert_eq!(response.status(), StatusCode::OK);
    response
}

/// Initializes a session for `token`; returns its id (None in stateless mode).
pub async fn open_session(live: &Live, token: &str) -> Option<String> {
    let reply = post(live, token, None, INIT, &[]).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.message);
    let session = reply.headers.get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    let done = post(live, token, session.as_deref(), INITIALIZED, &[]).await;
    assert!(done.status.is_success(), "{}", done.status);
    session
}

/// Initializes a session whose client declares `capabilities` (and says it is initialized);
/// returns its id.
pub async fn open_session_declaring(live: &Live, token: &str, capabilities: Value) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": capabilities,
        "clientInfo": {"name": "raw-test", "version": "1.0"}}});
    let reply = post(live, token, None, &init.to_string(), &[]).await;
    let session = reply.headers.get("mcp-session-id").unwrap().to_str().unwrap().to_owned();
    post(live, token, Some(&session), INITIALIZED, &[]).await;
    session
}

pub fn tool_call(id: i64, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}).to_string()
}

/// The headers of a 2026-07-28 `tools/call` of `tool` standing alone (for [`post`]).
pub fn alone_headers(tool: &str) -> [(&'static str, &str); 3] {
    [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", tool)]
}

/// A self-contained `tools/call` of protocol 2026-07-28 (its client context in `_meta`),
/// naming the client when `client` is given.
pub fn modern_call(id: i64, tool: &str, client: Option<(&str, &str)>) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    if let Some((name, version)) = client {
        meta["io.modelcontextprotocol/clientInfo"] = json!({"name": name, "version": version});
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {}, "_meta": meta}})
}
