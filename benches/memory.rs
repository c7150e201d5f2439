//! Memory of the gateway process (its RSS, read from `/proc/PID/status`), in three parts:
//! (a) before, at the peak of and after `tools/call`s whose bodies are near the body limit,
//!     sent at once; (b) after warm-up and then along many small calls (the creep), on SQLite
//!     and PostgreSQL; (c) per idle session: RSS before and after opening many sessions
//!     (`initialize` and `notifications/initialized` over raw HTTP, then nothing), on SQLite
//!     and PostgreSQL. The gateway is the `scopegate` binary itself (`serve --demo`, default
//!     configuration, rate limits off), a process of its own, driven by rmcp clients (raw HTTP
//!     for the sessions) over real HTTP. Prints figures; asserts nothing but that the sessions
//!     it measured were all still held.
//!
//! `cargo bench --bench memory`. Environment:
//! - PARTS: any of `large`, `creep`, `sessions` (default `large,creep`; `sessions` takes a
//!   few minutes).
//! - LARGE: how many large calls are sent at once, per row (default `1,8`); BODY_BYTES, the
//!   size of each request body (default 4 MiB less 1 KiB; the limit is 4 MiB); LARGE_ROUNDS,
//!   rounds per row (default 3).
//! - CALLS: calls measured after warm-up (default 200,000); WARMUP (default 20,000); STEPS,
//!   RSS samples along the calls (default 10); CLIENTS (default 16); TOOL (`list_flocks` or
//!   `whoami`, default `list_flocks`); DATABASES (default `sqlite,postgres`; PostgreSQL at
//!   SCOPEGATE_BENCH_PG_URL or postgres://postgres@127.0.0.1:5432); STATELESS=1 for
//!   `mcp.stateless`.
//! - SESSIONS: idle sessions opened (default 10,000), by OPENERS at once (default 16), in
//!   SESSION_STEPS steps with an RSS reading after each (default 10), after 200 warm-up
//!   sessions that stay open (in the baseline); SETTLE_SECS before the baseline and the last
//!   reading (default 5). All are acme's owner's. The gateway runs with
//!   `mcp.session_idle_secs` raised to a day so that none expires during the run, and without
//!   the per-user session cap (`mcp.max_sessions_per_user = 0`). Every session is pinged after
//!   the last reading, and all must answer.
//! - WRAP: a command to run the gateway under, e.g. `heaptrack -o FILE` (the RSS is then the
//!   gateway's own process, found among the wrapper's descendants, heaptrack's preload
//!   included); STOP=kill ends it with SIGKILL rather than SIGTERM. The gateway inherits this process's environment, so allocator settings such as
//!   MALLOC_ARENA_MAX reach it. GATEWAY_BIN runs another `scopegate` binary (an older build, to
//!   compare) instead of the one built with the bench.

// Shared with the throughput benches; this one uses only the client helpers.
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, JsonObject};
use sqlx::Connection;
use support::{Peers, close, connect_all};

const MIB: f64 = 1024.0 * 1024.0;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name).unwrap_or_else(|_| default.to_owned()).split(',').map(|s| s.trim().to_owned()).collect()
}

/// A `serve --demo` gateway process on a port of its own, with its database.
struct GatewayProcess {
    child: Child,
    /// The gateway's own process (the child, or its descendant under WRAP).
    pid: u32,
    url: String,
    /// Olivia, acme's owner.
    token: String,
    _dir: tempfile::TempDir,
}

impl GatewayProcess {
    /// `env`: further settings (SCOPEGATE_... variables) of this part.
    fn start(db_url: Option<&str>, stateless: bool, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db_url =
            db_url.map_or_else(|| format!("sqlite://{}", dir.path().join("bench.db").display()), str::to_owned);
        let bin = std::env::var("GATEWAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_scopegate").to_owned());
        let wrap = std::env::var("WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let mut cmd = match words.next() {
            Some(program) => {
                let mut cmd = Command::new(program);
                cmd.args(words).arg(&bin);
                cmd
            }
            None => Command::new(&bin),
        };
        for (key, _) in std::env::vars() {
            if key.starts_with("SCOPEGATE_") {
                cmd.env_remove(key);
            }
        }
        cmd.current_dir(dir.path())
            .args(["serve", "--demo", "--listen", "127.0.0.1:0"])
            .env("SCOPEGATE_DATABASE__URL", &db_url)
            .env("SCOPEGATE_LIMITS__TENANT_PER_SEC", "0")
            .env("SCOPEGATE_LIMITS__USER_PER_SEC", "0")
            .env("SCOPEGATE_MCP__STATELESS", stateless.to_string())
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("the gateway starts");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = stderr.next().expect("the gateway announces its address").unwrap();
            if let Some(rest) = line.strip_prefix("scopegate listening on http://") {
                break rest.trim().to_owned();
            }
        };
        // The rest of its stderr (warnings) passes through; a full pipe would stall it.
        std::thread::spawn(move || {
            for line in stderr.map_while(Result::ok) {
                eprintln!("gateway: {line}");
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let token = loop {
            let line = stdout.next().expect("the gateway prints the demo tokens").unwrap();
            if line.contains("olivia@acme.test") {
                break line.split_whitespace().last().unwrap().to_owned();
            }
        };
        std::thread::spawn(move || stdout.for_each(drop));
        let pid = if wrap.is_empty() {
            child.id()
        } else {
            // The kernel keeps 15 bytes of a command name.
            let name = std::path::Path::new(&bin).file_name().unwrap().to_string_lossy();
            descendant_named(child.id(), &name[..name.len().min(15)])
        };
        Self { child, pid, url: format!("http://{addr}/mcp"), token, _dir: dir }
    }

    /// (VmRSS, VmHWM) in bytes.
    fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).expect("the gateway runs");
        let kb = |key: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (kb("VmRSS:") * 1024, kb("VmHWM:") * 1024)
    }

    /// Resets VmHWM to the current RSS (`clear_refs` 5), so the next peak is this part's own.
    fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5");
    }

    /// SIGTERM (a graceful shutdown), then waits. STOP=kill sends SIGKILL instead: a heap
    /// profiler's record then ends with the heap as the load left it (nothing freed on the
    /// way out), so what it reports as leaked is what was in use at the end.
    fn stop(mut self) {
        let signal = if std::env::var("STOP").as_deref() == Ok("kill") { "-KILL" } else { "-TERM" };
        let _ = Command::new("kill").args([signal, &self.pid.to_string()]).status();
        let _ = self.child.wait();
    }
}

/// The first descendant of `root` whose command name is `name` (waits for it to appear).
fn descendant_named(root: u32, name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let procs: Vec<(u32, u32, String)> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                let (head, tail) = stat.rsplit_once(')')?;
                let comm = head.split_once('(')?.1.to_owned();
                let ppid = tail.split_whitespace().nth(1)?.parse().ok()?;
                Some((pid, ppid, comm))
            })
            .collect();
        let mut tree = vec![root];
        let mut i = 0;
        while i < tree.len() {
            let parent = tree[i];
            tree.extend(procs.iter().filter(|p| p.1 == parent).map(|p| p.0));
            i += 1;
        }
        if let Some(found) = procs.iter().find(|p| p.2 == name && tree.contains(&p.0)) {
            return found.0;
        }
        assert!(Instant::now() < deadline, "no `{name}` process under the wrapper");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

/// `n` calls of `tool` shared out among the peers (each takes the next until none is left).
async fn run_calls(peers: &Peers, tool: &'static str, args: &JsonObject, n: usize) {
    let left = Arc::new(AtomicUsize::new(n));
    let mut tasks = Vec::new();
    for peer in peers {
        let (peer, args, left) = (Arc::clone(peer), args.clone(), Arc::clone(&left));
        tasks.push(tokio::spawn(async move {
            while left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1)).is_ok() {
                let params = CallToolRequestParams::new(tool).with_arguments(args.clone());
                let result = peer.call_tool(params).await.expect("call");
                assert_ne!(result.is_error, Some(true), "{result:?}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Part (a): RSS before, at the peak of and after `parallel` large calls sent at once.
async fn large(parallel_rows: &[usize], body_bytes: usize, rounds: usize) {
    // The envelope around the argument, measured rather than guessed.
    let overhead = serde_json::json!({
        "jsonrpc": "2.0", "id": 1000, "method": "tools/call",
        "params": {"name": "record_egg_count", "arguments": {"flock": "", "day": "2026-01-01", "eggs": 1}}
    })
    .to_string()
    .len();
    let flock = "x".repeat(body_bytes.saturating_sub(overhead));
    let mut big = JsonObject::new();
    big.insert("flock".into(), flock.into());
    big.insert("day".into(), time::OffsetDateTime::now_utc().date().to_string().into());
    big.insert("eggs".into(), 1.into());
    println!(
        "(a) large tools/call bodies: record_egg_count with a {:.2} MiB `flock` (an unknown flock: the tool \
         runs, looks it up and answers an error), body {} bytes, SQLite, {} mode",
        mib(body_bytes as u64),
        body_bytes,
        if env_or("STATELESS", 0) == 1 { "stateless" } else { "session" }
    );
    println!(
        "{:>8} {:>5} | {:>10} {:>10} {:>10} | {:>12} {:>16}",
        "at once", "round", "before MiB", "peak MiB", "after MiB", "growth MiB", "growth/body byte"
    );
    for &parallel in parallel_rows {
        let gw = GatewayProcess::start(None, env_or("STATELESS", 0) == 1, &[]);
        let peers = connect_all(&gw.url, Some(&gw.token), parallel).await;
        run_calls(&peers, "list_flocks", &JsonObject::new(), 2_000).await;
        for round in 1..=rounds {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (before, _) = gw.rss();
            gw.reset_peak();
            // Sampled as well as read from VmHWM: either alone could miss a peak (clear_refs
            // may be refused; a sample may fall between two allocations).
            let done = Arc::new(AtomicBool::new(false));
            let sampler = {
                let (done, pid) = (Arc::clone(&done), gw.pid);
                std::thread::spawn(move || {
                    let mut peak = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                            && let Some(kb) = status
                                .lines()
                                .find_map(|l| l.strip_prefix("VmRSS:"))
                                .and_then(|v| v.split_whitespace().next())
                                .and_then(|v| v.parse::<u64>().ok())
                        {
                            peak = peak.max(kb * 1024);
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    peak
                })
            };
            let mut calls = Vec::new();
            for peer in &peers {
                let (peer, args) = (Arc::clone(peer), big.clone());
                calls.push(tokio::spawn(async move {
                    let params = CallToolRequestParams::new("record_egg_count").with_arguments(args);
                    let result = peer.call_tool(params).await.expect("a large call is answered");
                    assert_eq!(result.is_error, Some(true), "the flock does not exist: {result:?}");
                }));
            }
            for c in calls {
                c.await.unwrap();
            }
            done.store(true, Ordering::Relaxed);
            let sampled = sampler.join().unwrap();
            let (_, hwm) = gw.rss();
            let peak = sampled.max(hwm);
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (after, _) = gw.rss();
            let growth = peak.saturating_sub(before);
            println!(
                "{parallel:>8} {round:>5} | {:>10.1} {:>10.1} {:>10.1} | {:>12.1} {:>16.2}",
                mib(before),
                mib(peak),
                mib(after),
                mib(growth),
                growth as f64 / (parallel * body_bytes) as f64
            );
        }
        close(peers).await;
        gw.stop();
    }
}

/// Part (b): RSS after warm-up, then every CALLS/STEPS calls, on one database.
async fn creep(backend: &str, db_url: Option<&str>) {
    let (calls, warmup, steps, clients) = (
        env_or("CALLS", 200_000usize),
        env_or("WARMUP", 20_000usize),
        env_or("STEPS", 10usize).max(1),
        env_or("CLIENTS", 16usize),
    );
    let tool: &'static str = if std::env::var("TOOL").as_deref() == Ok("whoami") { "whoami" } else { "list_flocks" };
    let gw = GatewayProcess::start(db_url, env_or("STATELESS", 0) == 1, &[]);
    let peers = connect_all(&gw.url, Some(&gw.token), clients).await;
    let started = Instant::now();
    run_calls(&peers, tool, &JsonObject::new(), warmup).await;
    let (base, _) = gw.rss();
    println!("{backend:<9} {:>9} calls | RSS {:>7.1} MiB (after warm-up)", warmup, mib(base));
    let mut points = vec![(0.0, mib(base))];
    let chunk = calls / steps;
    for step in 1..=steps {
        run_calls(&peers, tool, &JsonObject::new(), chunk).await;
        let (rss, _) = gw.rss();
        let done = step * chunk;
        points.push((done as f64, mib(rss)));
        println!(
            "{backend:<9} {:>9} calls | RSS {:>7.1} MiB | {:>+6.1} MiB since warm-up | {:.0} calls/s so far",
            warmup + done,
            mib(rss),
            mib(rss) - mib(base),
            (warmup + done) as f64 / started.elapsed().as_secs_f64()
        );
    }
    // Least-squares slope over the samples: steadier than last minus first.
    let slope = slope(&points) * 100_000.0;
    let last = points.last().map_or(0.0, |p| p.1);
    println!(
        "{backend:<9} after warm-up {:.1} MiB, after {} more calls {:.1} MiB: {:+.2} MiB per 100,000 calls \
         (least squares over the {} samples; last minus first: {:+.2})",
        mib(base),
        chunk * steps,
        last,
        slope,
        points.len(),
        (last - mib(base)) / (chunk * steps).max(1) as f64 * 100_000.0
    );
    close(peers).await;
    gw.stop();
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"memory-bench","version":"1.0"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const PING: &str = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;

/// MCP sessions opened over raw HTTP: what a client sends to start one, and nothing more (no
/// GET stream, no rmcp client behind it), so what is measured is the gateway's side of an idle
/// session.
#[derive(Clone)]
struct RawSessions {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl RawSessions {
    fn post(&self, session: Option<&str>, body: &'static str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .body(body);
        match session {
            Some(id) => request.header("mcp-session-id", id),
            None => request,
        }
    }

    /// `initialize`, then `notifications/initialized`; the session's id.
    async fn open(&self) -> String {
        let reply = self.post(None, INITIALIZE).send().await.expect("initialize is answered");
        assert_eq!(reply.status(), reqwest::StatusCode::OK, "initialize");
        let id = reply.headers().get("mcp-session-id").expect("a session id").to_str().unwrap().to_owned();
        let body = reply.text().await.expect("the initialize result");
        assert!(body.contains("\"result\""), "initialize: {body}");
        let done = self.post(Some(&id), INITIALIZED).send().await.expect("initialized is answered");
        assert!(done.status().is_success(), "notifications/initialized: {}", done.status());
        id
    }

    /// Whether `session` answers `body` with a result.
    async fn answers(&self, session: &str, body: &'static str) -> bool {
        let Ok(reply) = self.post(Some(session), body).send().await else { return false };
        reply.status() == reqwest::StatusCode::OK && reply.text().await.is_ok_and(|b| b.contains("\"result\""))
    }
}

/// Opens `n` sessions, `openers` at a time; their ids.
async fn open_sessions(raw: &RawSessions, n: usize, openers: usize) -> Vec<String> {
    let left = Arc::new(AtomicUsize::new(n));
    let mut tasks = Vec::new();
    for _ in 0..openers.max(1) {
        let (raw, left) = (raw.clone(), Arc::clone(&left));
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            while left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| l.checked_sub(1)).is_ok() {
                ids.push(raw.open().await);
            }
            ids
        }));
    }
    let mut ids = Vec::with_capacity(n);
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    ids
}

/// How many of `sessions` answer a ping, `openers` at a time.
async fn still_held(raw: &RawSessions, sessions: &[String], openers: usize) -> usize {
    let next = Arc::new(AtomicUsize::new(0));
    let sessions: Arc<[String]> = sessions.into();
    let mut tasks = Vec::new();
    for _ in 0..openers.max(1) {
        let (raw, next, sessions) = (raw.clone(), Arc::clone(&next), Arc::clone(&sessions));
        tasks.push(tokio::spawn(async move {
            let mut held = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = sessions.get(i) else { return held };
                held += usize::from(raw.answers(id, PING).await);
            }
        }));
    }
    let mut held = 0;
    for t in tasks {
        held += t.await.unwrap();
    }
    held
}

/// Least-squares slope of `points` (x, y).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) =
        points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + (x - mx) * (y - my), b + (x - mx) * (x - mx)));
    if den > 0.0 { num / den } else { 0.0 }
}

/// Part (c): RSS before and after opening SESSIONS idle sessions, on one database.
async fn idle_sessions(backend: &str, db_url: Option<&str>) {
    let (n, openers, steps, settle) = (
        env_or("SESSIONS", 10_000usize),
        env_or("OPENERS", 16usize),
        env_or("SESSION_STEPS", 10usize).max(1),
        env_or("SETTLE_SECS", 5u64),
    );
    let gw = GatewayProcess::start(
        db_url,
        false,
        &[("SCOPEGATE_MCP__SESSION_IDLE_SECS", "86400"), ("SCOPEGATE_MCP__MAX_SESSIONS_PER_USER", "0")],
    );
    // One keep-alive pool for the whole part: the connections it holds are there in the
    // baseline too, so the difference is the sessions'.
    let http = reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(openers).build().unwrap();
    let raw = RawSessions { http, url: gw.url.clone(), token: gw.token.clone() };
    // Warm-up: the gateway's first sessions (pools, caches, buffers) are not the sessions'
    // cost. They stay open, in the baseline.
    let warm = open_sessions(&raw, 200, openers).await;
    assert_eq!(still_held(&raw, &warm, openers).await, warm.len(), "the warm-up sessions answer");
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let (base, _) = gw.rss();
    println!("{backend:<9} {:>6} sessions | RSS {:>7.1} MiB (after warm-up)", 0, mib(base));
    let mut points = vec![(0.0, base as f64)];
    let mut sessions = Vec::with_capacity(n);
    let started = Instant::now();
    for step in 1..=steps {
        let chunk = n * step / steps - n * (step - 1) / steps;
        sessions.extend(open_sessions(&raw, chunk, openers).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (rss, _) = gw.rss();
        points.push((sessions.len() as f64, rss as f64));
        println!(
            "{backend:<9} {:>6} sessions | RSS {:>7.1} MiB | {:>+7.1} MiB | {:>6.0} bytes per session so far",
            sessions.len(),
            mib(rss),
            mib(rss) - mib(base),
            rss.saturating_sub(base) as f64 / sessions.len() as f64
        );
    }
    let opening = started.elapsed();
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let (after, _) = gw.rss();
    // Checked after the last reading, so the pings' own cost is not in it.
    let whoami = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"whoami","arguments":{}}}"#;
    let first_call = raw.answers(&sessions[0], whoami).await;
    let held = still_held(&raw, &sessions, openers).await;
    println!(
        "{backend:<9} {n} idle sessions (opened in {:.1} s, {:.0} per second): RSS {:.1} -> {:.1} MiB after {settle} s, \
         {:.0} bytes per idle session (least squares over the {} readings: {:.0}); held at the end: {held} of {n} \
         answer a ping, a tools/call in the first one {}",
        opening.as_secs_f64(),
        n as f64 / opening.as_secs_f64(),
        mib(base),
        mib(after),
        after.saturating_sub(base) as f64 / n as f64,
        points.len(),
        slope(&points),
        if first_call { "answered" } else { "FAILED" }
    );
    assert_eq!(held, n, "every session was still held");
    assert!(first_call, "the first session still serves calls");
    gw.stop();
}

/// A fresh database of `backend` for one part: SQLite (`None`: the gateway's own file in its
/// folder) or a new PostgreSQL database, dropped afterwards.
async fn on_fresh_database(backend: &str, part: impl AsyncFnOnce(Option<&str>)) {
    if backend != "postgres" {
        return part(None).await;
    }
    let pg_server =
        std::env::var("SCOPEGATE_BENCH_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned());
    sqlx::any::install_default_drivers();
    let name = format!("sg_bench_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&format!("{pg_server}/postgres")).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    part(Some(&format!("{pg_server}/{name}"))).await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)"))).execute(&mut conn).await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    scopegate::http::install_tls_provider();
    let parts = env_list("PARTS", "large,creep");
    let allocator: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("MALLOC_") || k == "GLIBC_TUNABLES")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "gateway: the scopegate binary (serve --demo, rate limits off){}; allocator environment: {}",
        std::env::var("WRAP").map(|w| format!(" under `{w}`")).unwrap_or_default(),
        if allocator.is_empty() { "none (glibc defaults)".to_owned() } else { allocator.join(" ") }
    );
    if parts.iter().any(|p| p == "large") {
        let rows: Vec<usize> = env_list("LARGE", "1,8").iter().filter_map(|v| v.parse().ok()).collect();
        large(&rows, env_or("BODY_BYTES", 4 * 1024 * 1024 - 1024), env_or("LARGE_ROUNDS", 3)).await;
    }
    if parts.iter().any(|p| p == "creep") {
        println!(
            "(b) RSS along many small calls: {} after {} warm-up calls, {} clients",
            env_or("CALLS", 200_000usize),
            env_or("WARMUP", 20_000usize),
            env_or("CLIENTS", 16usize)
        );
        for backend in env_list("DATABASES", "sqlite,postgres") {
            on_fresh_database(&backend, async |url| creep(&backend, url).await).await;
        }
    }
    if parts.iter().any(|p| p == "sessions") {
        println!(
            "(c) RSS per idle session: {} sessions (initialize + notifications/initialized over raw HTTP, then \
             idle; no GET stream), {} opened at a time, one user (acme's owner), mcp.session_idle_secs = 86400, \
             mcp.max_sessions_per_user = 0",
            env_or("SESSIONS", 10_000usize),
            env_or("OPENERS", 16usize)
        );
        for backend in env_list("DATABASES", "sqlite,postgres") {
            on_fresh_database(&backend, async |url| idle_sessions(&backend, url).await).await;
        }
    }
}
