//! The side-by-side harness, inside the project: the set-up by which the gateway's speed is
//! judged from outside, so the ratio the project reports is that one. Separate processes, as
//! deployed: the fixture upstream on Streamable HTTP (its `echo` tool) and `scopegate serve
//! --demo` (release build, SQLite or PostgreSQL, configured with the CLI: the upstream declared,
//! bound and granted, rate limits off, JWT, identity, grants, the identity assertion and a
//! durable audit commit per call all on) pinned together to one CPU (SERVER_CPU, default 1);
//! this process, the load, pinned to another (LOAD_CPU, default 0). The load is a closed loop
//! of plain HTTP requests (no MCP SDK: `initialize`, `notifications/initialized`, then C
//! workers calling `tools/call` on that one session, each answer checked for the text sent),
//! so a ratio to `direct` (the same loop against the upstream itself) is CPU per call on one
//! core.
//!
//! Rows: `direct`; `scopegate-<db>` (a session that declares no capability); `desktop-<db>`
//! (a session that declares `roots` and `sampling`, as desktop clients do); and `stdio-<db>`
//! (that desktop-like session calling the same fixture run by the gateway over stdio); and
//! `remote-<db>` (the same, the fixture run by an executor agent connected to the gateway over
//! the loopback, pinned beside it: its added p50 over `stdio-<db>` is the remote hop); and
//! `modern-<db>` (a 2026-07-28 caller: no session, each `tools/call` standing alone with its
//! `_meta` (the revision, `roots` and `sampling` declared, the client's name) and the
//! revision's `Mcp-Method`/`Mcp-Name` headers; the gateway speaks 2026-07-28 to the fixture,
//! which serves both revisions); and `modern-old-<db>` (the same caller, the same fixture
//! declared on 2025-11-25). ROWS (default all) keeps only the gateway rows whose label starts
//! with one of its comma-separated prefixes.
//! Each row runs SECONDS (default 5) per turn, ROUNDS turns (default 2, the rows taking turns
//! so a change of the machine's load falls on all of them), medians reported, at each of
//! CLIENTS (default `16,1`); DATABASES default `sqlite,postgres` (PostgreSQL at
//! SCOPEGATE_BENCH_PG_URL or postgres://postgres@127.0.0.1:5432; a database of its own is
//! made and dropped). Sends traffic to 127.0.0.1 only; every run is bounded. Prints figures;
//! asserts nothing. Needs `taskset` (util-linux) for the pinning; without it nothing is pinned.
//!
//! `cargo bench --bench harness`

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const SCOPEGATE: &str = env!("CARGO_BIN_EXE_scopegate");
const FIXTURE: &str = env!("CARGO_BIN_EXE_scopegate-fixture-upstream");
const TEXT: &str = "hello from the harness";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// `command` pinned to `cpu` when `taskset` is there.
fn pinned(cpu: &str, program: &str) -> Command {
    if Command::new("taskset").arg("-V").stdout(Stdio::null()).status().is_ok_and(|s| s.success()) {
        let mut command = Command::new("taskset");
        command.args(["-c", cpu, program]);
        command
    } else {
        Command::new(program)
    }
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One endpoint the load is run against.
struct Target {
    label: String,
    url: String,
    token: Option<String>,
    tool: String,
    caps: Value,
    /// A 2026-07-28 caller: no session, each request with its own `_meta` and headers.
    modern: bool,
}

/// The fixture upstream on Streamable HTTP, pinned: the process and its `/mcp` URL.
fn upstream(cpu: &str) -> (Process, String) {
    use std::io::BufRead as _;
    let mut child = pinned(cpu, FIXTURE)
        .args(["http", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the fixture upstream starts");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").expect("the fixture prints its address").to_owned();
    (Process(child), format!("http://{addr}/mcp"))
}

/// A free loopback port (bound and let go: the gateway binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `scopegate` with `args` in the gateway's environment; its standard output.
fn cli(env: &[(String, String)], args: &[&str]) -> String {
    let out = Command::new(SCOPEGATE).args(args).envs(env.iter().cloned()).output().expect("scopegate runs");
    assert!(out.status.success(), "scopegate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A gateway on `database_url` in front of `upstream`, set up as an operator would: the
/// process, its `/mcp` URL and a token of olivia@acme.test (an owner of acme).
fn gateway(cpu: &str, database_url: &str, upstream: &str, work: &std::path::Path) -> (Vec<Process>, String, String) {
    let port = free_port();
    let public = format!("http://127.0.0.1:{port}");
    let env: Vec<(String, String)> = [
        ("SCOPEGATE_DATABASE__URL", database_url),
        ("SCOPEGATE_LIMITS__TENANT_PER_SEC", "0"),
        ("SCOPEGATE_LIMITS__USER_PER_SEC", "0"),
        ("SCOPEGATE_TELEMETRY__FILTER", "warn"),
        ("SCOPEGATE_SERVER__PUBLIC_URL", &public),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    cli(&env, &["migrate"]);
    cli(
        &env,
        &["admin", "executor", "create", "local", "--machine", "bench-host", "--user", "bench", "--kind", "local"],
    );
    let listen = format!("127.0.0.1:{port}");
    let child = pinned(cpu, SCOPEGATE)
        .args(["serve", "--demo", "--listen", &listen])
        .envs(env.iter().cloned())
        .stdout(Stdio::null())
        .spawn()
        .expect("the gateway starts");
    let gateway = Process(child);
    let health = format!("{public}/healthz");
    let started = Instant::now();
    while !is_up(&health) {
        assert!(started.elapsed() < Duration::from_secs(60), "the gateway did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The demo tenants exist once `serve --demo` seeded them: declare, bind and grant now.
    let far = ["admin", "executor", "create", "far", "--machine", "bench-far", "--user", "bench", "--kind", "remote"];
    let secret = cli(&env, &[&far[..], &["--tenant", "acme"]].concat());
    let secret_file = work.join("far.secret");
    std::fs::write(&secret_file, secret.lines().rev().find(|l| !l.trim().is_empty()).expect("a secret")).unwrap();
    let file = work.join("mcp.json");
    let servers = json!({"mcpServers": {
        "echo": {"url": upstream},
        "echo-old": {"url": upstream, "protocolVersion": "2025-11-25"},
        "echo-stdio": {"command": FIXTURE, "args": ["stdio"]},
        "echo-far": {"command": FIXTURE, "args": ["stdio"]},
    }});
    std::fs::write(&file, servers.to_string()).unwrap();
    cli(
        &env,
        &["admin", "entity", "import", "--tenant", "acme", "--under", "defaults", "--file", file.to_str().unwrap()],
    );
    for (server, executor) in [("echo", "local"), ("echo-old", "local"), ("echo-stdio", "local"), ("echo-far", "far")] {
        cli(&env, &["admin", "binding", "set", "--tenant", "acme", server, executor]);
        cli(&env, &["admin", "grant", "add", "--tenant", "acme", "--server", server, "--role", "owner", "--tool", "*"]);
    }
    let token = cli(&env, &["token", "--tenant", "acme", "--user", "olivia@acme.test"]);
    let token = token.lines().rev().find(|l| !l.trim().is_empty()).expect("a token").trim().to_owned();
    // The executor agent of `far`, on the loopback beside the gateway, on the same CPU.
    let root = format!("file://{}", work.canonicalize().unwrap().display());
    let agent = pinned(cpu, SCOPEGATE)
        .args(["executor", "--gateway", &public, "--name", "far", "--secret-file"])
        .arg(&secret_file)
        .args(["--root", &root])
        .env("SCOPEGATE_TELEMETRY__FILTER", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the executor agent starts");
    (vec![gateway, Process(agent)], format!("{public}/mcp"), token)
}

/// Whether `url` answers a GET with a success (on a throwaway runtime).
fn is_up(url: &str) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { reqwest::get(url).await.is_ok_and(|r| r.status().is_success()) })
}

/// The JSON-RPC message answering `id` in a reply (a JSON body, or an event stream's events).
fn answer_in(body: &[u8], sse: bool, id: u64) -> Option<Value> {
    let text = std::str::from_utf8(body).ok()?;
    if !sse {
        return serde_json::from_str(text).ok();
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|m| m["id"] == id)
}

struct Session {
    client: reqwest::Client,
    url: String,
    token: Option<String>,
    id: Option<String>,
    version: String,
    /// On 2026-07-28: what every request's `_meta` says of the client.
    meta: Option<Value>,
}

impl Session {
    async fn post(&self, body: &Value) -> Result<reqwest::Response, String> {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", &self.version)
            .body(body.to_string());
        if self.meta.is_some() {
            // 2026-07-28's standard headers.
            request = request.header("mcp-method", body["method"].as_str().unwrap_or_default());
            if let Some(name) = body["params"]["name"].as_str() {
                request = request.header("mcp-name", name);
            }
        }
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(id) = &self.id {
            request = request.header("mcp-session-id", id);
        }
        request.send().await.map_err(|e| e.to_string())
    }

    async fn open(target: &Target) -> Session {
        let client = reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(1024).build().unwrap();
        let mut session = Session {
            client,
            url: target.url.clone(),
            token: target.token.clone(),
            id: None,
            version: "2025-11-25".into(),
            meta: None,
        };
        if target.modern {
            session.version = "2026-07-28".into();
            session.meta = Some(json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": target.caps,
                "io.modelcontextprotocol/clientInfo": {"name": "scopegate-harness", "version": "1"},
            }));
            return session;
        }
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": target.caps,
            "clientInfo": {"name": "scopegate-harness", "version": "1"}}});
        let response = session.post(&init).await.expect("initialize");
        assert!(response.status().is_success(), "{}: initialize answered {}", target.label, response.status());
        session.id = response.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
        let sse =
            response.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let body = response.bytes().await.unwrap();
        let answer = answer_in(&body, sse, 0).expect("an answer to initialize");
        if let Some(version) = answer["result"]["protocolVersion"].as_str() {
            session.version = version.to_owned();
        }
        let done = session.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await.unwrap();
        assert!(done.status().is_success(), "{}: initialized answered {}", target.label, done.status());
        session
    }

    /// One call of the tool, checked: its latency.
    async fn call(&self, tool: &str, id: u64) -> Result<Duration, String> {
        let started = Instant::now();
        let mut body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                              "params": {"name": tool, "arguments": {"text": TEXT}}});
        if let Some(meta) = &self.meta {
            body["params"]["_meta"] = meta.clone();
        }
        let response = self.post(&body).await?;
        let status = response.status();
        let sse =
            response.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let bytes = response.bytes().await.map_err(|e| e.to_string())?;
        let answer = answer_in(&bytes, sse, id).ok_or_else(|| format!("HTTP {status}: no answer"))?;
        match answer["result"]["content"][0]["text"].as_str() {
            Some(TEXT) if answer["result"]["isError"] != true => Ok(started.elapsed()),
            _ => Err(format!("unexpected answer: {answer}")),
        }
    }
}

/// One turn of a row: C workers for `warmup` then `seconds`: calls/s, p50 and p99 (ms), errors.
async fn turn(target: &Target, clients: usize, warmup: Duration, seconds: Duration) -> (f64, f64, f64, u64) {
    let session = std::rc::Rc::new(Session::open(target).await);
    let start = Instant::now();
    let (measure_from, end) = (start + warmup, start + warmup + seconds);
    let next_id = std::rc::Rc::new(std::cell::Cell::new(1u64));
    let workers = (0..clients).map(|_| {
        let (session, next_id, tool) = (session.clone(), next_id.clone(), target.tool.clone());
        async move {
            let (mut latencies, mut errors) = (Vec::new(), 0u64);
            while Instant::now() < end {
                let id = next_id.get();
                next_id.set(id + 1);
                let sent = Instant::now();
                let call = tokio::time::timeout(Duration::from_secs(30), session.call(&tool, id)).await;
                if sent < measure_from {
                    continue;
                }
                match call {
                    Ok(Ok(latency)) => latencies.push(latency.as_micros() as u32),
                    _ => errors += 1,
                }
            }
            (latencies, errors)
        }
    });
    let results = futures_util::future::join_all(workers).await;
    let mut latencies: Vec<u32> = results.iter().flat_map(|(l, _)| l.iter().copied()).collect();
    let errors = results.iter().map(|(_, e)| e).sum();
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies.get(((latencies.len() as f64 - 1.0) * q) as usize).map_or(f64::NAN, |us| *us as f64 / 1000.0)
    };
    (latencies.len() as f64 / seconds.as_secs_f64(), at(0.5), at(0.99), errors)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    scopegate::tls::install_provider();
    let (load_cpu, server_cpu) = (env_or("LOAD_CPU", "0"), env_or("SERVER_CPU", "1"));
    let seconds = Duration::from_secs_f64(env_or("SECONDS", "5").parse().expect("SECONDS"));
    let rounds: usize = env_or("ROUNDS", "2").parse().expect("ROUNDS");
    let clients: Vec<usize> =
        env_or("CLIENTS", "16,1").split(',').map(|c| c.trim().parse().expect("CLIENTS")).collect();
    let databases = env_or("DATABASES", "sqlite,postgres");
    let rows = env_or("ROWS", "");
    // The load: this process, every thread of it, on its own CPU.
    let _ = Command::new("taskset")
        .args(["-a", "-cp", &load_cpu, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status();
    let work = tempfile::tempdir().unwrap();
    let (_upstream, upstream_url) = upstream(&server_cpu);
    let mut processes = Vec::new();
    let mut targets = vec![Target {
        label: "direct".into(),
        url: upstream_url.clone(),
        token: None,
        tool: "echo".into(),
        caps: json!({}),
        modern: false,
    }];
    let mut dropped_pg = None;
    for db in databases.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let url = match db {
            "sqlite" => format!("sqlite://{}", work.path().join("harness.db").display()),
            "postgres" => {
                let admin = env_or("SCOPEGATE_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432");
                let name = format!("sg_harness_{}", std::process::id());
                let (drop, create) = (format!("DROP DATABASE IF EXISTS {name}"), format!("CREATE DATABASE {name}"));
                let psql = Command::new("psql").args([&admin, "-q", "-c", &drop, "-c", &create]).status();
                let ok = psql.is_ok_and(|s| s.success());
                assert!(ok, "psql could not make the bench database at {admin}");
                dropped_pg = Some((admin.clone(), name.clone()));
                format!("{}/{name}", admin.trim_end_matches('/'))
            }
            other => panic!("DATABASES: sqlite or postgres, not {other}"),
        };
        let (running, mcp, token) = gateway(&server_cpu, &url, &upstream_url, work.path());
        processes.extend(running);
        let desktop = json!({"roots": {"listChanged": true}, "sampling": {}});
        for (label, tool, caps, modern) in [
            (format!("scopegate-{db}"), "echo__echo", json!({}), false),
            (format!("desktop-{db}"), "echo__echo", desktop.clone(), false),
            (format!("stdio-{db}"), "echo-stdio__echo", desktop.clone(), false),
            (format!("remote-{db}"), "echo-far__echo", desktop.clone(), false),
            (format!("modern-{db}"), "echo__echo", desktop.clone(), true),
            (format!("modern-old-{db}"), "echo-old__echo", desktop, true),
        ] {
            if !rows.is_empty() && !rows.split(',').any(|r| label.starts_with(r.trim())) {
                continue;
            }
            let token = Some(token.clone());
            targets.push(Target { label, url: mcp.clone(), token, tool: tool.into(), caps, modern });
        }
    }

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // The remote rows wait for their agent to connect.
    for target in targets.iter().filter(|t| t.label.starts_with("remote-")) {
        let started = Instant::now();
        runtime.block_on(async {
            while Session::open(target).await.call(&target.tool, 1).await.is_err() {
                assert!(started.elapsed() < Duration::from_secs(60), "{}: the agent never connected", target.label);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
    println!(
        "harness: {} s x {rounds} turns per row, load on CPU {load_cpu}, upstream and gateways on CPU {server_cpu}",
        seconds.as_secs_f64()
    );
    println!("| row | C | calls/s | vs direct | p50 ms | added p50 | p99 ms | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for &c in &clients {
        let mut figures: Vec<Vec<(f64, f64, f64, u64)>> = vec![Vec::new(); targets.len()];
        for _ in 0..rounds {
            for (i, target) in targets.iter().enumerate() {
                let warmup = Duration::from_secs(1);
                figures[i].push(runtime.block_on(turn(target, c, warmup, seconds)));
            }
        }
        let summary: Vec<(f64, f64, f64, u64)> = figures
            .iter()
            .map(|runs| {
                let pick = |f: fn(&(f64, f64, f64, u64)) -> f64| median(runs.iter().map(f).collect());
                (pick(|r| r.0), pick(|r| r.1), pick(|r| r.2), runs.iter().map(|r| r.3).sum())
            })
            .collect();
        let (direct_rate, direct_p50) = (summary[0].0, summary[0].1);
        for (target, (rate, p50, p99, errors)) in targets.iter().zip(&summary) {
            println!(
                "| {} | {c} | {rate:.0} | {:.3} | {p50:.3} | {:+.3} ms | {p99:.3} | {errors} |",
                target.label,
                rate / direct_rate,
                p50 - direct_p50,
            );
        }
    }
    drop(processes);
    if let Some((admin, name)) = dropped_pg {
        let _ = Command::new("psql")
            .args([&admin, "-qc", &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")])
            .status();
    }
}
