//! What the bench binaries share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use figment::Figment;
use figment::providers::{Format, Toml};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

/// An rmcp client of the Streamable HTTP endpoint at `url` (TCP_NODELAY), with `token` as its
/// bearer token when given.
pub async fn connect(url: &str, token: Option<&str>) -> RunningService<RoleClient, ()> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    let client = reqwest::Client::builder().tcp_nodelay(true).build().unwrap();
    ().serve(StreamableHttpClientTransport::with_client(client, config)).await.expect("client connects")
}

/// Serves `app` on a port of its own on loopback (TCP_NODELAY, like the gateway); returns the
/// URL of its `/mcp` endpoint.
pub async fn serve_on_loopback(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// `auth.identity_cache_ms` for a bench's gateway: IDENTITY_CACHE_MS, or the shipped default.
pub fn identity_cache_ms() -> u64 {
    std::env::var("IDENTITY_CACHE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        Figment::from(Toml::string(scopegate::config::DEFAULT_TOML))
            .extract_inner("auth.identity_cache_ms")
            .expect("the shipped default")
    })
}

pub type Peers = Vec<Arc<RunningService<RoleClient, ()>>>;

/// `clients` clients of `url`, connected one after another.
pub async fn connect_all(url: &str, token: Option<&str>, clients: usize) -> Peers {
    let mut peers = Vec::new();
    for _ in 0..clients {
        peers.push(Arc::new(connect(url, token).await));
    }
    peers
}

/// Every peer calls `tool` with `args` in a loop for `dur`; returns the latency of every call.
pub async fn run(peers: &Peers, tool: &'static str, args: &JsonObject, dur: Duration) -> Vec<Duration> {
    let deadline = Instant::now() + dur;
    let mut tasks = Vec::new();
    for peer in peers {
        let (peer, args) = (Arc::clone(peer), args.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let start = Instant::now();
                let params = CallToolRequestParams::new(tool).with_arguments(args.clone());
                let result = peer.call_tool(params).await.expect("call");
                assert_ne!(result.is_error, Some(true), "{result:?}");
                lat.push(start.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

pub async fn close(peers: Peers) {
    for p in peers {
        if let Ok(p) = Arc::try_unwrap(p) {
            let _ = p.cancel().await;
        }
    }
}

pub struct Row {
    pub calls_per_sec: f64,
    pub p50: Duration,
    pub p99: Duration,
}

/// One server (or path) under load: its clients, what they call, and the calls measured so far.
pub struct Target {
    pub name: &'static str,
    pub peers: Peers,
    pub tool: &'static str,
    pub args: JsonObject,
    pub lat: Vec<Duration>,
    pub secs: f64,
}

impl Target {
    pub fn new(name: &'static str, peers: Peers, tool: &'static str, args: JsonObject) -> Self {
        Self { name, peers, tool, args, lat: Vec::new(), secs: 0.0 }
    }

    /// Calls for half a second, not counted.
    pub async fn warm_up(&self) {
        run(&self.peers, self.tool, &self.args, Duration::from_millis(500)).await;
    }

    /// Calls for `dur`, counted.
    pub async fn measure(&mut self, dur: Duration) {
        let started = Instant::now();
        let lat = run(&self.peers, self.tool, &self.args, dur).await;
        self.secs += started.elapsed().as_secs_f64();
        self.lat.extend(lat);
    }

    pub fn row(&mut self) -> Row {
        self.lat.sort();
        let lat = &self.lat;
        if lat.is_empty() {
            return Row { calls_per_sec: 0.0, p50: Duration::ZERO, p99: Duration::ZERO };
        }
        let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
        Row { calls_per_sec: lat.len() as f64 / self.secs, p50: at(0.5), p99: at(0.99) }
    }
}
