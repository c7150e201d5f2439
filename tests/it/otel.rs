//! Traces over OTLP, end to end: `scopegate serve` as a process exporting to a real OTLP/HTTP
//! receiver (below), rmcp's client over real HTTP with a W3C trace context, proxied calls to a
//! Streamable HTTP upstream (on the lean relay, and on rmcp's path) and to a stdio upstream,
//! on SQLite and PostgreSQL. Checks the span tree, that no identity leaves in a span, and that
//! each upstream was sent the trace context, and nothing else of the caller's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderName, HeaderValue, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use rmcp::ServiceExt;
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use scopegate::model::Role;
use scopegate::store::entities;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::support::*;

/// How long the gateway runs on after the last call before it stops: a span that a call left
/// open ends only with the gateway, so it then ends at least this long after its call, twice
/// the 500 ms [`check_call`] allows a tool span past its last child.
const HELD_OPEN_SHOWS: Duration = Duration::from_secs(1);

/// The client's trace: its trace id and the id of its own (remote) span.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "vendor=opaque";

/// One exported span and the resource it came with.
struct Exported {
    span: Span,
    resource: Vec<KeyValue>,
}

/// A small OTLP/HTTP receiver: POST /v1/traces takes an `ExportTraceServiceRequest` in
/// protobuf and keeps its spans.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Exported>>>,
}

async fn receive(
    State(spans): State<Arc<Mutex<Vec<Exported>>>>,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1]) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, [("content-type", "text/plain")]);
    };
    let mut kept = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| r.attributes).unwrap_or_default();
        for scope in resource_spans.scope_spans {
            kept.extend(scope.spans.into_iter().map(|span| Exported { span, resource: resource.clone() }));
        }
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    (StatusCode::OK, [("content-type", "application/x-protobuf")])
}

impl Receiver {
    async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new().route("/v1/traces", post(receive)).with_state(Arc::clone(&spans));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, spans }
    }
}

/// `scopegate serve` with traces on; killed when dropped.
struct Served {
    child: tokio::process::Child,
    addr: String,
}

impl Served {
    async fn start(db_url: &str, root_uri: &str, receiver: &Receiver, folder: &std::path::Path) -> Self {
        let mut command = tokio::process::Command::new(SCOPEGATE);
        for (key, _) in std::env::vars() {
            if key.starts_with("SCOPEGATE_") || key.starts_with("OTEL_") {
                command.env_remove(key);
            }
        }
        let mut child = command
            .arg("serve")
            .current_dir(folder)
            // The log is held at warn: the trace spans are exported whatever the log's level.
            .env("RUST_LOG", "warn")
            .env("SCOPEGATE_DATABASE__URL", db_url)
            .env("SCOPEGATE_SERVER__LISTEN", "127.0.0.1:0")
            .env("SCOPEGATE_METRICS__LISTEN", "127.0.0.1:0")
            .env("SCOPEGATE_SERVER__PUBLIC_URL", PUBLIC_URL)
            .env("SCOPEGATE_AUTH__HS256_SECRET", TEST_SECRET)
            .env("SCOPEGATE_SERVER__SHUTDOWN_GRACE_SECS", "2")
            .env("SCOPEGATE_UPSTREAM__LOCAL_ROOT", root_uri)
            .env("SCOPEGATE_TELEMETRY__OTLP_ENDPOINT", format!("http://{}", receiver.addr))
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next_line().await.unwrap().expect("the gateway says where it listens");
            if let Some(addr) = line.strip_prefix("scopegate listening on http://") {
                break addr.to_owned();
            }
        };
        // Keep reading, so the log never fills the pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { child, addr }
    }

    /// SIGTERM, and the exit that follows (the spans still buffered are sent before it).
    async fn stop(mut self) {
        let pid = self.child.id().expect("running") as i32;
        let pid = rustix::process::Pid::from_raw(pid).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
        assert!(status.expect("the gateway stops").unwrap().success(), "the gateway exits cleanly");
    }
}

fn trace_headers() -> HashMap<HeaderName, HeaderValue> {
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    HashMap::from([
        (HeaderName::from_static("traceparent"), HeaderValue::from_str(&traceparent).unwrap()),
        (HeaderName::from_static("tracestate"), HeaderValue::from_static(TRACESTATE)),
        // W3C baggage is never read: nothing in it may reach an upstream.
        (HeaderName::from_static("baggage"), HeaderValue::from_static("user=olivia%40acme.test")),
    ])
}

fn plain_info() -> ClientConfig {
    ClientConfig::new(ClientCapabilities::default(), Implementation::new("it", "1"))
}

/// rmcp's client with `headers` on every request; `info` says what it declares.
async fn client(
    addr: &str,
    token: &str,
    info: ClientConfig,
    headers: HashMap<HeaderName, HeaderValue>,
) -> RunningService<RoleClient, ClientConfig> {
    let transport = StreamableHttpClientTransport::with_client(
        reqwest::Client::builder().tcp_nodelay(true).build().unwrap(),
        StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"))
            .auth_header(token.to_owned())
            .custom_headers(headers),
    );
    info.serve(transport).await.expect("the client connects")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &Option<AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(n)) => n.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key == key).map(|kv| text(&kv.value))
}

/// Every text an exported span carries: names, attribute keys and values, events, links,
/// status, trace state, and its resource.
fn texts(exported: &Exported) -> Vec<String> {
    let span = &exported.span;
    let mut all = vec![span.name.clone(), span.trace_state.clone()];
    for kv in span.attributes.iter().chain(&exported.resource) {
        all.push(kv.key.clone());
        all.push(text(&kv.value));
    }
    for event in &span.events {
        all.push(event.name.clone());
        all.extend(event.attributes.iter().flat_map(|kv| [kv.key.clone(), text(&kv.value)]));
    }
    for link in &span.links {
        all.extend(link.attributes.iter().flat_map(|kv| [kv.key.clone(), text(&kv.value)]));
    }
    all.extend(span.status.as_ref().map(|s| s.message.clone()));
    all
}

/// The span tree of one trace, by span id.
struct Tree<'a> {
    spans: HashMap<String, &'a Span>,
}

impl<'a> Tree<'a> {
    fn parent(&self, span: &Span) -> Option<&'a Span> {
        self.spans.get(&hex(&span.parent_span_id)).copied()
    }

    /// `span`'s ancestors, nearest first.
    fn ancestors(&self, span: &Span) -> Vec<&'a Span> {
        let mut chain = Vec::new();
        let mut at = self.parent(span);
        while let Some(parent) = at {
            chain.push(parent);
            at = self.parent(parent);
        }
        chain
    }

    /// The spans named `name` whose ancestors include `ancestor`.
    fn under(&self, ancestor: &Span, name: &str) -> Vec<&'a Span> {
        self.spans
            .values()
            .filter(|s| s.name == name && self.ancestors(s).iter().any(|a| a.span_id == ancestor.span_id))
            .copied()
            .collect()
    }
}

/// The checks of one proxied call's spans: its tool span `tool.call` of `tool`, under a
/// request span whose parent is the client's span, with authentication and identity beside
/// it, and the upstream call (`relay`) and the audit commit under it. Returns the id of the
/// upstream span (what the upstream's `traceparent` must name).
fn check_call(tree: &Tree<'_>, tool: &str, relay: &str) -> String {
    let relayed = |call: &Span| {
        tree.under(call, "upstream.call").iter().any(|u| attribute(u, "mcp.relay").as_deref() == Some(relay))
    };
    let calls: Vec<&Span> = tree
        .spans
        .values()
        .filter(|s| s.name == "tool.call" && attribute(s, "mcp.tool.name").as_deref() == Some(tool) && relayed(s))
        .copied()
        .collect();
    assert_eq!(calls.len(), 1, "one tool span for {tool} on the {relay} relay");
    let call = calls[0];
    assert_eq!(attribute(call, "mcp.call.kind").as_deref(), Some("proxied"), "{tool}");
    let request = tree.parent(call).unwrap_or_else(|| panic!("{tool}: the tool span has an exported parent"));
    assert_eq!(request.name, "POST /mcp", "{tool}: the tool span's parent is its HTTP request's span");
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN, "{tool}: the request span is a child of the client's span");
    assert_eq!(attribute(request, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(attribute(request, "http.route").as_deref(), Some("/mcp"));
    assert_eq!(attribute(request, "http.response.status_code").as_deref(), Some("200"));
    for name in ["auth.verify", "identity.resolve"] {
        let found = tree.under(request, name);
        assert_eq!(found.len(), 1, "{tool}: one {name} span under its request span");
        assert_eq!(found[0].parent_span_id, request.span_id, "{tool}: {name} is a child of the request span");
    }
    let upstream = tree.under(call, "upstream.call");
    assert_eq!(upstream.len(), 1, "{tool}: one upstream span under the tool span");
    let (server, name) = tool.split_once("__").unwrap();
    assert_eq!(attribute(upstream[0], "mcp.server.name").as_deref(), Some(server));
    assert_eq!(attribute(upstream[0], "mcp.tool.name").as_deref(), Some(name));
    assert_eq!(attribute(upstream[0], "mcp.relay").as_deref(), Some(relay), "{tool}");
    let audit = tree.under(call, "audit.commit");
    // The wait for the call's record (committed while the upstream worked); its outcome
    // follows without a wait.
    assert_eq!(audit.len(), 1, "{tool}: one audit span under the tool span");
    assert_eq!(attribute(audit[0], "audit.outcome").as_deref(), Some("started"));
    // The tool span ends with its call: nothing the call started (an upstream connection)
    // holds it open (the gateway runs a second longer before it stops).
    let last_child = upstream[0].end_time_unix_nano.max(audit[0].end_time_unix_nano);
    let held = Duration::from_nanos(call.end_time_unix_nano.saturating_sub(last_child));
    assert!(held < Duration::from_millis(500), "{tool} on {relay}: the tool span ended {held:?} after its call");
    hex(&upstream[0].span_id)
}

/// What the upstream says it was sent: the traceparent (`header` or `meta`), which must name
/// the client's trace and the gateway's upstream span; the client's tracestate; no baggage.
fn check_sent(me: &Value, by: &str, upstream_span: &str) {
    let (used, unused) = if by == "header" {
        ("traceparent_header", "traceparent_meta")
    } else {
        ("traceparent_meta", "traceparent_header")
    };
    let traceparent = me[used].as_str().unwrap_or_else(|| panic!("the upstream got a traceparent by {by}: {me}"));
    assert_eq!(
        traceparent,
        format!("00-{TRACE_ID}-{upstream_span}-01"),
        "the gateway's upstream span, in the client's trace"
    );
    assert_eq!(me[unused], Value::Null, "the traceparent travels one way only: {me}");
    assert_eq!(me["tracestate"], TRACESTATE, "the client's tracestate is passed on");
    assert_eq!(me["baggage"], Value::Null, "baggage never travels: {me}");
}

async fn spans_of_proxied_calls(backend: Backend) {
    let receiver = Receiver::start().await;
    let Prepared { config, db, test_db, .. } = TestGateway::new(backend).prepare().await;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("work")).unwrap();
    let root_uri = format!("file://{}", root.path().canonicalize().unwrap().display());

    let served = Served::start(&test_db.url, &root_uri, &receiver, root.path()).await;
    let fixture_env = |server: &str| {
        vec![
            ("FIXTURE_JWKS_URL".to_owned(), format!("http://{}/.well-known/jwks.json", served.addr)),
            ("FIXTURE_SERVER_ID".to_owned(), server.to_owned()),
            ("FIXTURE_ISSUER".to_owned(), PUBLIC_URL.to_owned()),
        ]
    };
    let web_env = fixture_env("web");
    let web_env: Vec<(&str, &str)> = web_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (_web, web_addr) = fixture_http(&["http", "127.0.0.1:0"], &web_env).await;
    let stdio_env: serde_json::Map<String, Value> = fixture_env("fx").into_iter().map(|(k, v)| (k, json!(v))).collect();
    let mut tx = db.begin().await.unwrap();
    entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    for (server, declaration) in [
        ("web", json!({"type": "http", "url": format!("http://{web_addr}/mcp")})),
        ("fx", json!({"command": FIXTURE, "args": ["stdio"], "cwd": "work", "env": stdio_env})),
    ] {
        entities::create_entity(&mut tx, "acme", &format!("defaults/mcp-servers/{server}"), &declaration)
            .await
            .unwrap();
        entities::bind_server(&mut tx, "acme", server, "local").await.unwrap();
        entities::grant_tool(&mut tx, "acme", server, Role::Owner, "*").await.unwrap();
    }
    tx.commit().await.unwrap();

    let token = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));
    let plain = plain_info();
    // A first call, outside the client's trace, starts `web`: the lean relay serves a session's
    // calls once rmcp's client has spoken to the upstream.
    let warm = client(&served.addr, &token, plain.clone(), HashMap::new()).await;
    ok(&warm, "web__whoami_upstream", json!({})).await;
    warm.cancel().await.ok();
    let olivia = client(&served.addr, &token, plain, trace_headers()).await;
    // The relay takes a session's calls once its `initialized` has been handled (rmcp answers
    // the notification first): a listing, behind it, leaves it time to be.
    olivia.list_all_tools().await.unwrap();
    let over_lean = ok(&olivia, "web__whoami_upstream", json!({})).await;
    let over_stdio = ok(&olivia, "fx__whoami_upstream", json!({})).await;
    olivia.cancel().await.ok();
    // A client whose requests carry an `Origin` (a browser's page, here the gateway's own) is
    // served on rmcp's path, which judges the header, not the lean relay.
    let mut browser = trace_headers();
    browser.insert(HeaderName::from_static("origin"), HeaderValue::from_static(PUBLIC_URL));
    let olivia = client(&served.addr, &token, plain_info(), browser).await;
    let over_rmcp = ok(&olivia, "web__whoami_upstream", json!({})).await;
    olivia.cancel().await.ok();
    // A malformed traceparent is ignored: the call is served, in a trace of its own.
    let garbled = HashMap::from([(HeaderName::from_static("traceparent"), HeaderValue::from_static("00-zz-01"))]);
    let olivia = client(&served.addr, &token, plain_info(), garbled).await;
    let over_garbled = ok(&olivia, "web__whoami_upstream", json!({})).await;
    olivia.cancel().await.ok();
    for me in [&over_lean, &over_stdio, &over_rmcp, &over_garbled] {
        assert_eq!(me["user"], "olivia@acme.test", "the calls were made as olivia");
    }
    // Time for anything a call left open to show: it would end only with the gateway.
    tokio::time::sleep(HELD_OPEN_SHOWS).await;
    served.stop().await;

    let spans = std::mem::take(&mut *receiver.spans.lock().unwrap());
    assert!(!spans.is_empty(), "the gateway exported its spans before it exited");
    // The client's trace: every span below has it (the warm-up call and the upstream fetching
    // the gateway's keys have traces of their own).
    let traced = spans.iter().filter(|e| hex(&e.span.trace_id) == TRACE_ID);
    let tree = Tree { spans: traced.map(|e| (hex(&e.span.span_id), &e.span)).collect() };
    check_sent(&over_lean, "header", &check_call(&tree, "web__whoami_upstream", "lean"));
    check_sent(&over_stdio, "meta", &check_call(&tree, "fx__whoami_upstream", "rmcp"));
    check_sent(&over_rmcp, "header", &check_call(&tree, "web__whoami_upstream", "rmcp"));

    // The garbled call's own trace: a root request span, the upstream told of that trace.
    let sent = over_garbled["traceparent_header"].as_str().expect("a traceparent of the gateway's own");
    let fields: Vec<&str> = sent.split('-').collect();
    assert_eq!(fields.len(), 4, "{sent}");
    assert_ne!(fields[1], TRACE_ID, "a new trace");
    let own: HashMap<String, &Span> =
        spans.iter().filter(|e| hex(&e.span.trace_id) == fields[1]).map(|e| (hex(&e.span.span_id), &e.span)).collect();
    let own = Tree { spans: own };
    let upstream = own.spans.get(fields[2]).expect("the upstream's parent span is exported");
    assert_eq!(upstream.name, "upstream.call");
    let root = *own.ancestors(upstream).last().expect("under a request span");
    assert_eq!(root.name, "POST /mcp", "the trace starts at the request");
    assert!(root.parent_span_id.is_empty(), "the request span has no parent: the garbled context was dropped");

    // No identity in anything exported: not the subject, the user's or the tenant's id, the
    // tenant's slug, nor the token.
    let mut tx = db.begin().await.unwrap();
    let tenant_id: String =
        sqlx::query_scalar("SELECT id FROM tenants WHERE slug = 'acme'").fetch_one(&mut *tx).await.unwrap();
    let user_id: String = sqlx::query_scalar("SELECT id FROM users WHERE subject = 'olivia@acme.test'")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    drop(tx);
    let identity = ["olivia", "acme", &tenant_id, &user_id, &token];
    for exported in spans.iter() {
        for text in texts(exported) {
            for held in identity {
                assert!(!text.contains(held), "span {} carries {held:?} in {text:?}", exported.span.name);
            }
        }
    }
}
both_dbs!(otel_spans_of_proxied_calls_carry_the_trace_and_no_identity, spans_of_proxied_calls);
