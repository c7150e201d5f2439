//! OpenTelemetry traces over OTLP/HTTP (protobuf), and W3C trace context in and out. Owns the
//! spans made for traces and what leaves the process in them; never exports an identity.
//!
//! Off unless `telemetry.otlp_endpoint` is set: then no exporter runs, no trace context is read
//! from a request or sent upstream, and the trace spans below are disabled at their call sites.
//!
//! What is exported is decided twice, so that an identity needs two mistakes to leave:
//! 1. The bridge takes only spans of target [`TARGET`], made by the functions of this module,
//!    and no events at all (log lines name tenants and carry error texts). The log's own
//!    `request` span records tenant and user: it is never a trace span.
//! 2. The exporter keeps only the attribute keys of [`ATTRIBUTES`], none of them an identity,
//!    and drops events, links and error descriptions.
//!
//! The trace context sent upstream is the current span's `traceparent` and `tracestate`
//! alone (no baggage is read or sent), as headers to HTTP upstreams and in the request's
//! `_meta` to stdio ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::{BoxFuture, Either};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Status, TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::LookupSpan;

use crate::config::TelemetryConfig;

/// The target of every span made for traces, and of nothing else.
pub const TARGET: &str = "scopegate::trace";

/// The only attribute keys an exported span keeps. None names, or may hold, who is calling.
pub const ATTRIBUTES: &[&str] = &[
    "http.request.method",
    "http.route",
    "http.response.status_code",
    "mcp.tool.name",
    "mcp.call.kind",
    "mcp.server.name",
    "mcp.relay",
    "audit.outcome",
];

/// Where the OTLP/HTTP receiver takes traces, under the configured endpoint.
const TRACES_PATH: &str = "/v1/traces";

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether traces are being exported (the subscriber with the bridge is installed).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(super) fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

#[derive(Debug, thiserror::Error)]
pub enum TraceSetupError {
    #[error("traces: the OTLP exporter sends on the async runtime; start it inside one")]
    NoRuntime,
    #[error("traces: the OTLP exporter's HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("traces: the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The exporting half: the provider (flushed at shutdown) and the tracer the bridge feeds.
pub(super) struct Pipeline {
    pub tracer: SdkTracer,
    pub provider: SdkTracerProvider,
}

impl Pipeline {
    /// `None` when no endpoint is configured (traces off).
    pub(super) fn from_config(config: &TelemetryConfig) -> Result<Option<Self>, TraceSetupError> {
        if config.otlp_endpoint.is_empty() {
            return Ok(None);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| TraceSetupError::NoRuntime)?;
        crate::tls::install_provider();
        let client = reqwest::Client::builder().timeout(EXPORT_TIMEOUT).tcp_nodelay(true).build()?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(traces_url(&config.otlp_endpoint))
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(Sender { client, runtime })
            .build()?;
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
        let resource = opentelemetry_sdk::Resource::builder().with_service_name(config.service_name.clone()).build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(OnlyAllowed(exporter))
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("scopegate");
        Ok(Some(Self { tracer, provider }))
    }
}

/// `endpoint` (the receiver's base URL) with the traces path.
fn traces_url(endpoint: &str) -> String {
    format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'))
}

/// The bridge from `tracing`: the trace spans only (never an event, never another span).
pub(super) fn layer<S>(tracer: SdkTracer) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(filter_fn(|meta| meta.is_span() && meta.target() == TARGET))
}

/// The OTLP exporter behind the attribute allowlist.
#[derive(Debug)]
struct OnlyAllowed<E>(E);

impl<E: SpanExporter> SpanExporter for OnlyAllowed<E> {
    fn export(&self, mut batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        batch.retain(|span| span.name != DETACHED);
        batch.iter_mut().for_each(scrub);
        self.0.export(batch)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// Leaves a span only what may leave: the allowed attributes, no events, no links, and an
/// error status without its text.
fn scrub(span: &mut SpanData) {
    span.attributes.retain(|kv| ATTRIBUTES.contains(&kv.key.as_str()));
    span.dropped_attributes_count = 0;
    span.events = Default::default();
    span.links = Default::default();
    if matches!(span.status, Status::Error { .. }) {
        span.status = Status::error("");
    }
}

/// The exporter's HTTP client: the project's reqwest client, on the gateway's runtime. (The
/// batch processor exports from a thread of its own, outside the runtime: the request is
/// spawned on it and awaited from there.)
#[derive(Debug)]
struct Sender {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Sender {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let request = reqwest::Request::try_from(request)?;
        let sent = self.runtime.spawn(async move {
            let response = client.execute(request).await?;
            let (status, headers) = (response.status(), response.headers().clone());
            let body = response.bytes().await?;
            let mut answer = http::Response::new(body);
            *answer.status_mut() = status;
            *answer.headers_mut() = headers;
            Ok::<_, reqwest::Error>(answer)
        });
        Ok(sent.await??)
    }
}

/// The trace context of an HTTP request's span, in the request's extensions: the parent of
/// what is done for the request (authentication, identity, the tool call, which rmcp runs on
/// a task of its own). The span itself is never the current span: the log's spans and what
/// is recorded on them stay as they are.
#[derive(Clone)]
pub(crate) struct TraceParent(opentelemetry::Context);

/// A tower layer that, when traces are on, opens each request's trace span for as long as the
/// request is served, a child of the caller's W3C trace context when the request carries a
/// valid one (a malformed `traceparent` is ignored: the request starts a trace of its own).
/// Off, it only forwards.
#[derive(Clone, Copy, Default)]
pub struct RequestTraceLayer;

impl<S> tower::Layer<S> for RequestTraceLayer {
    type Service = RequestTrace<S>;

    fn layer(&self, inner: S) -> RequestTrace<S> {
        RequestTrace { inner }
    }
}

#[derive(Clone)]
pub struct RequestTrace<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for RequestTrace<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<BoxFuture<'static, Result<S::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if !enabled() {
            return Either::Right(self.inner.call(request));
        }
        let span = request_span(&request);
        request.extensions_mut().insert(TraceParent(span.context()));
        let response = self.inner.call(request);
        Either::Left(Box::pin(async move {
            let response = response.await;
            if let Ok(response) = &response {
                span.record("http.response.status_code", response.status().as_u16());
            }
            response
        }))
    }
}

fn request_span<B>(request: &http::Request<B>) -> tracing::Span {
    let method = request.method().as_str();
    let route = route(request.uri().path());
    let name = format!("{method} {route}");
    let span = tracing::info_span!(
        target: TARGET,
        "http.request",
        otel.name = name.as_str(),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(request.headers()));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}

/// The route of an OAuth start link, whose path is its secret.
const START_ROUTE: &str = "/oauth/start/{secret}";

/// A request's path as the log may hold it: an OAuth start link's path names its route, never
/// its secret; any other path as it came.
pub(crate) fn loggable_path(path: &str) -> &str {
    match path.strip_prefix(crate::vocab::routes::START_PATH) {
        Some(rest) if rest.starts_with('/') => START_ROUTE,
        _ => path,
    }
}

/// The route of a path, from a fixed set (a path can hold a secret: the OAuth start links do).
fn route(path: &str) -> &'static str {
    use crate::vocab::routes::CALLBACK_PATH;
    const FIXED: &[&str] = &[
        "/mcp",
        "/healthz",
        "/readyz",
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/jwks.json",
        crate::vocab::routes::CONNECT_PATH,
        crate::vocab::routes::AGENT_LINK_PATH,
        CALLBACK_PATH,
    ];
    match loggable_path(path) {
        START_ROUTE => START_ROUTE,
        path => FIXED.iter().find(|fixed| **fixed == path).copied().unwrap_or("(other)"),
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// `span` as a child of the request's trace span, when there is one.
fn child_of(span: tracing::Span, request: Option<&TraceParent>) -> tracing::Span {
    if let Some(TraceParent(parent)) = request {
        let _ = span.set_parent(parent.clone());
    }
    span
}

/// The request's trace parent, found in its extensions (none when traces are off).
pub(crate) fn parent_in(extensions: &http::Extensions) -> Option<&TraceParent> {
    if enabled() { extensions.get::<TraceParent>() } else { None }
}

/// Authentication: the bearer token checked.
pub(crate) fn auth_span(request: Option<&TraceParent>) -> tracing::Span {
    child_of(tracing::info_span!(target: TARGET, "auth.verify"), request)
}

/// Identity resolution: tenant, user and flock scope.
pub(crate) fn identity_span(request: Option<&TraceParent>) -> tracing::Span {
    child_of(tracing::info_span!(target: TARGET, "identity.resolve"), request)
}

/// A `tools/call`, a child of the trace span of the HTTP request that carried it. Its tool
/// name and kind are recorded with [`record_tool`] once the gateway knows the tool.
pub(crate) fn tool_span(request: Option<&TraceParent>) -> tracing::Span {
    let span = tracing::info_span!(
        target: TARGET,
        "tool.call",
        mcp.tool.name = tracing::field::Empty,
        mcp.call.kind = tracing::field::Empty,
    );
    child_of(span, request)
}

/// Names the tool of the current tool span: `tool` when the gateway knows it (a name the
/// caller chose is never recorded), and whether it is native or proxied.
pub(crate) fn record_tool(tool: Option<&str>, proxied: bool) {
    if !enabled() {
        return;
    }
    let span = tracing::Span::current();
    span.record("mcp.tool.name", tool.unwrap_or("(unknown)"));
    span.record("mcp.call.kind", if proxied { "proxied" } else { "native" });
}

/// The span of work that outlives the call that starts it (an upstream connection: rmcp's
/// service keeps the span current at its start for its whole life, and a span is held open
/// by its children). With traces on, a root span of its own, never exported, so that no
/// call's span is held open; off, none (the current span stays current, as ever).
pub(crate) fn lasting() -> tracing::Span {
    if enabled() { tracing::info_span!(target: TARGET, parent: None, "detached") } else { tracing::Span::none() }
}

/// The name of the spans [`lasting`] makes.
const DETACHED: &str = "detached";

/// A call sent to an upstream server (`relay`: `rmcp` or `lean`).
pub(crate) fn upstream_span(server: &str, tool: &str, relay: &'static str) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "upstream.call",
        otel.kind = "client",
        mcp.server.name = server,
        mcp.tool.name = tool,
        mcp.relay = relay,
    )
}

/// The wait for a call's audit event to commit.
pub(crate) fn audit_span(outcome: &str) -> tracing::Span {
    tracing::info_span!(target: TARGET, "audit.commit", audit.outcome = outcome)
}

/// The current span's W3C trace context, `traceparent` and `tracestate`, as (name, value)
/// pairs to send upstream; none when traces are off or there is no trace.
pub(crate) fn outgoing() -> Vec<(&'static str, String)> {
    let mut fields = Outgoing(Vec::new());
    if enabled() {
        let context = tracing::Span::current().context();
        TraceContextPropagator::new().inject_context(&context, &mut fields);
    }
    fields.0
}

/// Puts the current trace context in a request's `_meta` (stdio upstreams read it there; the
/// HTTP client moves it into headers).
pub(crate) fn inject_meta(meta: &mut serde_json::Map<String, serde_json::Value>) {
    for (name, value) in outgoing() {
        meta.insert(name.to_owned(), serde_json::Value::String(value));
    }
}

/// The `_meta` keys and header names the trace context travels in.
pub const CONTEXT_FIELDS: [&str; 2] = ["traceparent", "tracestate"];

struct Outgoing(Vec<(&'static str, String)>);

impl Injector for Outgoing {
    fn set(&mut self, key: &str, value: String) {
        // Only the W3C fields, whatever else a propagator might offer.
        if let Some(name) = CONTEXT_FIELDS.iter().find(|name| **name == key) {
            self.0.push((*name, value));
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::KeyValue;
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceFlags, TraceId, TraceState};

    use super::*;

    fn span(attributes: Vec<KeyValue>) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(1u128),
                SpanId::from(1u64),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "tool.call".into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::error("user olivia@acme.test refused"),
            instrumentation_scope: Default::default(),
        }
    }

    #[test]
    fn only_allowed_attributes_and_no_error_text_leave() {
        let mut data = span(vec![
            KeyValue::new("mcp.tool.name", "fx__echo"),
            KeyValue::new("user", "olivia@acme.test"),
            KeyValue::new("tenant", "acme"),
            KeyValue::new("enduser.id", "0192"),
        ]);
        data.events.events.push(opentelemetry::trace::Event::new(
            "identity refused",
            std::time::SystemTime::now(),
            vec![KeyValue::new("tenant", "acme")],
            0,
        ));
        scrub(&mut data);
        let keys: Vec<&str> = data.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["mcp.tool.name"], "only allowlisted keys stay");
        assert!(data.events.events.is_empty(), "events never leave");
        assert_eq!(data.status, Status::error(""), "an error keeps its status, not its text");
    }

    /// An exporter that keeps what it is given.
    #[derive(Debug, Clone, Default)]
    struct Kept(std::sync::Arc<std::sync::Mutex<Vec<SpanData>>>);

    impl SpanExporter for Kept {
        fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            self.0.lock().unwrap().extend(batch);
            std::future::ready(Ok(()))
        }
    }

    #[test]
    fn the_bridge_takes_trace_spans_only_and_never_an_event() {
        use tracing_subscriber::layer::SubscriberExt;
        let kept = Kept::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(kept.clone()).build();
        let subscriber = tracing_subscriber::registry().with(layer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            // The log's request span records the caller; a log line names the tenant.
            let log = tracing::info_span!("request", tenant = "acme", user = "0192-olivia");
            let _log = log.enter();
            let traced = tool_span(None);
            let _traced = traced.enter();
            tracing::info!(tenant = "acme", "identity refused");
        });
        let spans = kept.0.lock().unwrap();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["tool.call"], "only the trace span is exported, not the log's");
        assert!(spans[0].events.events.is_empty(), "a log line never becomes a span event");
        assert!(spans[0].attributes.iter().all(|kv| !kv.value.as_str().contains("acme")));
    }

    #[test]
    fn paths_become_fixed_routes_and_secrets_stay_out() {
        for (path, expected, why) in [
            ("/mcp", "/mcp", "a fixed route"),
            ("/oauth/start/s3cr3t", "/oauth/start/{secret}", "a start link holds a secret"),
            ("/oauth/startle", "(other)", "a prefix alone is no route"),
            ("/users/olivia@acme.test", "(other)", "anything else"),
        ] {
            assert_eq!(route(path), expected, "{path}: {why}");
        }
    }

    #[test]
    fn the_endpoint_is_a_base_url() {
        assert_eq!(traces_url("http://localhost:4318"), "http://localhost:4318/v1/traces");
        assert_eq!(traces_url("https://otel.example.com/"), "https://otel.example.com/v1/traces");
    }
}
