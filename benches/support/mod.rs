//! What the bench binaries share (each uses a part of it).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use figment::Figment;
use figment::providers::{Format, Toml};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientConfig, JsonObject};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

/// The test fixture upstream (an MCP server on stdio or Streamable HTTP).
pub const FIXTURE: &str = env!("CARGO_BIN_EXE_scopegate-fixture-upstream");

/// The fixture on Streamable HTTP on a loopback port, with `env` set: the child (killed when
/// dropped) and its `/mcp` URL.
pub async fn fixture_http(env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(FIXTURE)
        .args(["http", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the fixture starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next_line().await.unwrap().expect("the fixture prints its address");
    let addr = first.strip_prefix("listening on ").expect("listening on ADDR").to_owned();
    (child, format!("http://{addr}/mcp"))
}

/// An rmcp client of one of the benches.
pub type Client = RunningService<RoleClient, ClientConfig>;

/// An rmcp client of the Streamable HTTP endpoint at `url` (TCP_NODELAY), with `token` as its
/// bearer token when given, declaring no capabilities.
pub async fn connect(url: &str, token: Option<&str>) -> Client {
    connect_as(url, token, ClientConfig::default()).await
}

/// [`connect`], declaring what `info` says.
pub async fn connect_as(url: &str, token: Option<&str>, info: ClientConfig) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(token) = token {
        config = config.auth_header(token.to_owned());
    }
    let client = reqwest::Client::builder().tcp_nodelay(true).build().unwrap();
    info.serve(StreamableHttpClientTransport::with_client(client, config)).await.expect("client connects")
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

/// The load generator's own runtime (threads named `bench-client`), so the clients don't run
/// on the gateway's worker threads and a profile can tell the two apart.
pub fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()
        .expect("the client runtime")
}

/// Runs `work` on the clients' runtime.
pub async fn on_clients<T: Send + 'static>(
    clients_rt: &tokio::runtime::Runtime,
    work: impl Future<Output = T> + Send + 'static,
) -> T {
    clients_rt.spawn(work).await.expect("client work")
}

/// `auth.identity_cache_ms` for a bench's gateway: IDENTITY_CACHE_MS, or the shipped default.
pub fn identity_cache_ms() -> u64 {
    std::env::var("IDENTITY_CACHE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        Figment::from(Toml::string(scopegate::config::DEFAULT_TOML))
            .extract_inner("auth.identity_cache_ms")
            .expect("the shipped default")
    })
}

pub type Peers = Vec<Arc<Client>>;

/// `clients` clients of `url`, connected one after another.
pub async fn connect_all(url: &str, token: Option<&str>, clients: usize) -> Peers {
    connect_all_as(url, token, clients, ClientConfig::default()).await
}

/// [`connect_all`], each client declaring what `info` says.
pub async fn connect_all_as(url: &str, token: Option<&str>, clients: usize, info: ClientConfig) -> Peers {
    let mut peers = Vec::new();
    for _ in 0..clients {
        peers.push(Arc::new(connect_as(url, token, info.clone()).await));
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
    /// CPU time per call of the serving side (this process less its clients' threads, plus
    /// the `extra` processes of the target) and of the upstream processes, in microseconds.
    pub gateway_us: f64,
    pub upstream_us: f64,
}

/// Clock ticks per second of `/proc`'s CPU times (USER_HZ, 100 on every Linux the bench runs on).
const TICKS_PER_SEC: f64 = 100.0;

/// User plus system CPU ticks in a `/proc/.../stat` line (fields 14 and 15).
fn stat_ticks(stat: &str) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

fn process_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| stat_ticks(&s)).unwrap_or(0)
}

/// CPU ticks of this process's load-generator threads (named `bench-client`).
fn client_ticks() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "bench-client"))
        .map(|t| std::fs::read_to_string(t.path().join("stat")).map(|s| stat_ticks(&s)).unwrap_or(0))
        .sum()
}

/// CPU used so far: by the serving side of this process (all of it but its clients' threads)
/// and the `extra` processes, and by the `upstream` processes.
#[derive(Clone, Copy, Default)]
struct CpuSample {
    serving: u64,
    upstream: u64,
}

fn cpu_sample(extra: &[u32], upstream: &[u32]) -> CpuSample {
    let own = process_ticks(std::process::id()).saturating_sub(client_ticks());
    CpuSample {
        serving: own + extra.iter().map(|p| process_ticks(*p)).sum::<u64>(),
        upstream: upstream.iter().map(|p| process_ticks(*p)).sum(),
    }
}

/// One server (or path) under load: its clients, what they call, and the calls measured so far.
pub struct Target {
    pub name: &'static str,
    pub peers: Peers,
    pub tool: &'static str,
    pub args: JsonObject,
    pub lat: Vec<Duration>,
    pub secs: f64,
    /// Processes whose CPU counts as the serving side's (an executor agent) and as the
    /// upstream's.
    pub extra_pids: Vec<u32>,
    pub upstream_pids: Vec<u32>,
    cpu: CpuSample,
}

impl Target {
    pub fn new(name: &'static str, peers: Peers, tool: &'static str, args: JsonObject) -> Self {
        Self {
            name,
            peers,
            tool,
            args,
            lat: Vec::new(),
            secs: 0.0,
            extra_pids: Vec::new(),
            upstream_pids: Vec::new(),
            cpu: CpuSample::default(),
        }
    }

    /// Counts the CPU of `extra` processes as the serving side's and of `upstream` as the
    /// upstream's.
    pub fn with_pids(mut self, extra: Vec<u32>, upstream: Vec<u32>) -> Self {
        (self.extra_pids, self.upstream_pids) = (extra, upstream);
        self
    }

    /// Calls for half a second, not counted.
    pub async fn warm_up(&self) {
        run(&self.peers, self.tool, &self.args, Duration::from_millis(500)).await;
    }

    /// Calls for `dur`, counted.
    pub async fn measure(&mut self, dur: Duration) {
        let started = Instant::now();
        let before = cpu_sample(&self.extra_pids, &self.upstream_pids);
        let lat = run(&self.peers, self.tool, &self.args, dur).await;
        let after = cpu_sample(&self.extra_pids, &self.upstream_pids);
        self.secs += started.elapsed().as_secs_f64();
        self.cpu.serving += after.serving.saturating_sub(before.serving);
        self.cpu.upstream += after.upstream.saturating_sub(before.upstream);
        self.lat.extend(lat);
    }

    pub fn row(&mut self) -> Row {
        self.lat.sort();
        let lat = &self.lat;
        if lat.is_empty() {
            return Row {
                calls_per_sec: 0.0,
                p50: Duration::ZERO,
                p99: Duration::ZERO,
                gateway_us: 0.0,
                upstream_us: 0.0,
            };
        }
        let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
        let per_call = |ticks: u64| ticks as f64 / TICKS_PER_SEC * 1e6 / lat.len() as f64;
        Row {
            calls_per_sec: lat.len() as f64 / self.secs,
            p50: at(0.5),
            p99: at(0.99),
            gateway_us: per_call(self.cpu.serving),
            upstream_us: per_call(self.cpu.upstream),
        }
    }
}
