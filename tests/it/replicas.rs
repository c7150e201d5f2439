//! Gateway processes on one database. Two replicas, reached directly: concurrent writes and
//! reads of one tenant from both all succeed, and the tenant's audit chain verifies afterwards.
//! Three replicas on PostgreSQL behind HAProxy (Debian's package, run with the shipped
//! `deploy/haproxy.cfg`): session affinity learned from `Mcp-Session-Id`, stateless calls
//! spread over every replica, a replica killed under load (only its own sessions are lost, and
//! no audit event), a revocation applied by every replica, and rate limits that hold for the
//! cluster.

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::Arc;

use serde_json::json;

use crate::support::*;

const CLIENTS_PER_REPLICA: usize = 4;
const ROUNDS: usize = 15;

async fn two_replicas_append_to_one_chain(backend: Backend) {
    let Prepared { config, db, test_db, .. } = TestGateway::new(backend).prepare().await;
    let dir = tempfile::tempdir().unwrap();
    let replicas =
        [Replica::start(dir.path(), &test_db.url, PUBLIC_URL), Replica::start(dir.path(), &test_db.url, PUBLIC_URL)];
    let token = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));

    let mut tasks = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        for c in 0..CLIENTS_PER_REPLICA {
            let client = session_client(&format!("http://{}/mcp", replica.addr), &token).await;
            let writer = r * CLIENTS_PER_REPLICA + c;
            tasks.push(tokio::spawn(async move {
                let mut failures = Vec::new();
                for i in 0..ROUNDS {
                    // A day of its own per write, so every write is valid on its own.
                    let back = 1 + (writer * ROUNDS + i) as i64;
                    let day = (time::OffsetDateTime::now_utc().date() - time::Duration::days(back)).to_string();
                    let calls = [
                        ("record_egg_count", json!({"flock": "north-barn", "day": day, "eggs": i})),
                        ("list_flocks", json!({})),
                    ];
                    for (tool, args) in calls {
                        match call(&client, tool, args).await {
                            Ok(result) if result.is_error != Some(true) => {}
                            other => failures.push(format!("{tool}: {other:?}")),
                        }
                    }
                }
                client.cancel().await.ok();
                failures
            }));
        }
    }
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.unwrap());
    }
    let calls = 2 * CLIENTS_PER_REPLICA * ROUNDS * 2;
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed, e.g. {:?}\nreplica logs: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)],
        replicas.iter().map(|r| r.log.lock().unwrap_or_else(|p| p.into_inner()).clone()).collect::<Vec<_>>()
    );
    drop(replicas);

    let out = scopegate(dir.path())
        .args(["audit", "verify", "--tenant", "acme"])
        .env("SCOPEGATE_DATABASE__URL", &test_db.url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim(), format!("acme: ok ({calls} events)"), "every call left one event");
    db.close().await;
}
both_dbs!(replicas_append_to_one_chain, two_replicas_append_to_one_chain);

// ---- three replicas behind HAProxy ----

/// HAProxy running the shipped `deploy/haproxy.cfg`, with its `bind` address and its `server`
/// lines replaced by a loopback port and the given replicas; everything else (affinity, health
/// checks, redispatch, timeouts) as shipped. Killed when dropped.
struct Balancer {
    child: Child,
    url: String,
    log: Arc<std::sync::Mutex<String>>,
}

impl Balancer {
    async fn start(dir: &std::path::Path, replicas: &[&Replica]) -> Self {
        let shipped =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy.cfg"))
                .expect("deploy/haproxy.cfg");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (mut config, mut binds, mut servers) = (String::new(), 0, 0);
        for line in shipped.lines() {
            let word = line.split_whitespace().next().unwrap_or("");
            match word {
                "bind" => {
                    config.push_str(&format!("    bind 127.0.0.1:{port}\n"));
                    binds += 1;
                }
                "server" | "server-template" => {
                    if servers == 0 {
                        for (i, r) in replicas.iter().enumerate() {
                            config.push_str(&format!("    server replica{i} {}\n", r.addr));
                        }
                    }
                    servers += 1;
                }
                _ => {
                    config.push_str(line);
                    config.push('\n');
                }
            }
        }
        assert_eq!((binds, servers > 0), (1, true), "the shipped configuration has one bind and its servers");
        let path = dir.join(format!("haproxy-{port}.cfg"));
        std::fs::write(&path, config).unwrap();
        // Debian installs it in /usr/sbin, which a test's PATH may lack.
        let binary = if std::path::Path::new("/usr/sbin/haproxy").exists() { "/usr/sbin/haproxy" } else { "haproxy" };
        let mut child = std::process::Command::new(binary)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("haproxy (Debian's package `haproxy`; .ci/run installs it)");
        let mut stderr = child.stderr.take().unwrap();
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let balancer = Self { child, url: format!("http://127.0.0.1:{port}"), log };
        // Ready when every replica has answered `/readyz` through it, one after the other.
        let http = reqwest::Client::new();
        let ready = std::cell::Cell::new(0);
        let balancer = std::cell::RefCell::new(balancer);
        eventually("HAProxy did not come up", || async {
            let url = format!("{}/readyz", balancer.borrow().url);
            let ok = http.get(url).send().await.is_ok_and(|r| r.status() == http::StatusCode::OK);
            ready.set(if ok { ready.get() + 1 } else { 0 });
            let mut balancer = balancer.borrow_mut();
            let exited = balancer.child.try_wait().ok().flatten();
            assert!(exited.is_none(), "HAProxy exited ({exited:?}): {}", balancer.log());
            if ready.get() == replicas.len() { Ok(()) } else { Err(balancer.log()) }
        })
        .await;
        balancer.into_inner()
    }

    fn mcp(&self) -> String {
        format!("{}/mcp", self.url)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Balancer {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Replica {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn logs(replicas: &[Replica]) -> Vec<String> {
        replicas.iter().map(|r| r.log.lock().unwrap_or_else(|p| p.into_inner()).clone()).collect()
    }

    /// The sum of a Prometheus counter's series whose labels include every one of `labels`.
    async fn counter(&self, name: &str, labels: &[&str]) -> f64 {
        let text = reqwest::get(format!("http://{}/metrics", self.addr)).await.unwrap().text().await.unwrap();
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|label| l.contains(label)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// rmcp's client in a session (it starts a new session by itself when one answers 404).
async fn session_client(url: &str, token: &str) -> Client {
    connect(url, token, ()).await
}

/// A call whose transport failure is a value, not a panic.
async fn try_call(client: &Client, tool: &str, args: serde_json::Value) -> Result<rmcp::model::CallToolResult, String> {
    let params = rmcp::model::CallToolRequestParams::new(tool.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    match tokio::time::timeout(std::time::Duration::from_secs(10), client.peer().call_tool(params)).await {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err("no answer in 10 s".into()),
    }
}

/// Three replicas on a PostgreSQL database of their own with the demo data and the settings
/// given, HAProxy in front of them, and olivia's token.
struct Cluster {
    replicas: Vec<Replica>,
    balancer: Balancer,
    db: scopegate::store::Db,
    token: String,
    test_db: TestDb,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(env: &[(&str, &str)]) -> Self {
        let Prepared { config, db, test_db, .. } = TestGateway::new(Backend::Postgres).prepare().await;
        let dir = tempfile::tempdir().unwrap();
        let replicas: Vec<Replica> =
            (0..3).map(|_| Replica::start_with(dir.path(), &test_db.url, PUBLIC_URL, env)).collect();
        let balancer = Balancer::start(dir.path(), &replicas.iter().collect::<Vec<_>>()).await;
        let token = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));
        Self { replicas, balancer, db, token, test_db, dir }
    }

    /// Stops the balancer and every replica; the database stays.
    fn stop(&mut self) {
        self.balancer.kill();
        self.replicas.iter_mut().for_each(Replica::kill);
    }
}

/// `scopegate audit verify --tenant acme`: the chain holds; returns how many events it has.
fn verified_events(dir: &std::path::Path, db_url: &str) -> usize {
    let out = scopegate(dir)
        .args(["audit", "verify", "--tenant", "acme"])
        .env("SCOPEGATE_DATABASE__URL", db_url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let count = stdout.trim().strip_prefix("acme: ok (").and_then(|r| r.strip_suffix(" events)"));
    count.and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("unexpected verdict: {stdout}"))
}

const LB_CLIENTS: usize = 12;
const LB_ROUNDS: usize = 20;

/// The writer and round a `record_egg_count` day stands for (see the load below).
fn day_of(writer: usize, round: usize) -> String {
    let back = 1 + (writer * LB_ROUNDS + round) as i64;
    (time::OffsetDateTime::now_utc().date() - time::Duration::days(back)).to_string()
}

/// Three replicas behind HAProxy. Stateless (2026-07-28) calls reach every replica. Twelve
/// session clients write and read through it; a third of the way in, one replica is killed.
/// Its clients' next requests reach another replica, which answers 404 for the unknown
/// session, and they start new sessions; no other client changes session, every call that was
/// not in flight on the killed replica succeeds, and the audit chain is intact with an event
/// for every answered call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn haproxy_keeps_sessions_on_their_replica_and_a_killed_replica_loses_only_its_own() {
    // Raw arguments in the audit tell which writer made each event, and so in which
    // sessions each client worked.
    let mut cluster = Cluster::start(&[("SCOPEGATE_AUDIT__RECORD_RAW_ARGUMENTS", "true")]).await;
    let (balancer, token) = (&cluster.balancer, cluster.token.clone());

    // Stateless calls go anywhere: rmcp's client on 2026-07-28 through the balancer.
    let lifecycle =
        rmcp::ClientLifecycleMode::Discover { preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28] };
    let transport = transport(&balancer.mcp(), &token);
    let stateless = rmcp::ClientServiceExt::serve_with_lifecycle((), transport, lifecycle).await.unwrap();
    for _ in 0..9 {
        let result = call(stateless.peer(), "whoami", json!({})).await.unwrap();
        assert_ne!(result.is_error, Some(true), "{result:?}");
    }
    stateless.cancel().await.ok();
    for (i, r) in cluster.replicas.iter().enumerate() {
        let served = r.counter("scopegate_tool_calls_total", &["tool=\"whoami\"", "outcome=\"ok\""]).await;
        assert!(served >= 1.0, "replica {i} served no stateless call: HAProxy sent them all elsewhere");
    }

    // Sessions, opened one after another: round robin puts four on each replica.
    let mut clients = Vec::new();
    for _ in 0..LB_CLIENTS {
        clients.push(session_client(&balancer.mcp(), &token).await);
    }
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (writer, client) in clients.into_iter().enumerate() {
        let done = Arc::clone(&done);
        let killed = Arc::clone(&killed);
        tasks.push(tokio::spawn(async move {
            let (mut answered, mut failures, mut recovered) = (0, Vec::new(), false);
            for round in 0..LB_ROUNDS {
                let calls = [
                    ("record_egg_count", json!({"flock": "north-barn", "day": day_of(writer, round), "eggs": round})),
                    ("list_flocks", json!({})),
                ];
                for (tool, args) in calls {
                    match try_call(&client, tool, args).await {
                        // Once a client is served after a failure, it has its new session: no
                        // later call of it may fail.
                        Ok(result) if result.is_error != Some(true) && !failures.is_empty() => {
                            answered += 1;
                            recovered = true;
                        }
                        Ok(result) if result.is_error != Some(true) => answered += 1,
                        Ok(result) => panic!("writer {writer}: {tool} answered an error: {result:?}"),
                        // Before the kill, under the load of all three replicas, no call fails.
                        Err(e) if !killed.load(std::sync::atomic::Ordering::SeqCst) => {
                            panic!("writer {writer}, round {round}, {tool} failed before any replica was killed: {e}")
                        }
                        Err(e) if recovered => {
                            panic!("writer {writer}, round {round}, {tool} failed after recovering: {e}")
                        }
                        Err(e) => failures.push(format!("round {round} {tool}: {e}")),
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            client.cancel().await.ok();
            (writer, answered, failures)
        }));
    }
    let total = LB_CLIENTS * LB_ROUNDS * 2;
    eventually_within(std::time::Duration::from_secs(60), "the load did not get going", || async {
        done.load(std::sync::atomic::Ordering::Relaxed) >= total / 3
    })
    .await;
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    cluster.replicas[1].kill();
    let mut answered = 0;
    let mut failed: Vec<(usize, Vec<String>)> = Vec::new();
    for task in tasks {
        let (writer, a, failures) =
            tokio::time::timeout(std::time::Duration::from_secs(120), task).await.expect("the load finishes").unwrap();
        answered += a;
        if !failures.is_empty() {
            failed.push((writer, failures));
        }
    }

    // In which sessions each writer's writes were audited.
    let rows: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT e.session_id, e.args_raw FROM audit_events e JOIN tenants t ON t.id = e.tenant_id \
         WHERE t.slug = 'acme' AND e.tool = 'record_egg_count' AND e.outcome = 'ok'",
    )
    .fetch_all(&mut *cluster.db.begin_read().await.unwrap())
    .await
    .unwrap();
    let mut sessions: Vec<std::collections::BTreeSet<String>> = vec![Default::default(); LB_CLIENTS];
    for (session, raw) in rows {
        let raw: serde_json::Value = serde_json::from_str(&raw.expect("raw arguments are recorded")).unwrap();
        let day = raw["day"].as_str().unwrap();
        let writer = (0..LB_CLIENTS)
            .find(|w| (0..LB_ROUNDS).any(|r| day_of(*w, r) == day))
            .unwrap_or_else(|| panic!("a write of no writer: {raw}"));
        sessions[writer].insert(session.expect("a session's call names its session"));
    }
    let moved: Vec<usize> = (0..LB_CLIENTS).filter(|w| sessions[*w].len() > 1).collect();
    let logs = || format!("replicas: {:?}\nhaproxy: {}", Replica::logs(&cluster.replicas), balancer.log());
    assert!(sessions.iter().all(|s| !s.is_empty() && s.len() <= 2), "sessions per writer: {sessions:?}");
    assert_eq!(
        moved.len(),
        LB_CLIENTS / 3,
        "the killed replica's clients, and only they, moved: {moved:?}\n{}",
        logs()
    );
    // Only the killed replica's clients lose calls, and only until they are in a new session
    // (checked as they ran): the call in flight when it died, and any sent to it before HAProxy
    // marked it down (502 on a connection HAProxy had kept open to it).
    for (writer, failures) in &failed {
        assert!(moved.contains(writer), "writer {writer} lost calls: {failures:?}\n{}", logs());
    }

    // A session of the killed replica, sent through the balancer: 404 from a live replica.
    let dead = sessions[moved[0]].iter().find(|s| sessions.iter().filter(|w| w.contains(*s)).count() == 1).unwrap();
    let mut gone = None;
    for s in &sessions[moved[0]] {
        let status = reqwest::Client::new()
            .post(balancer.mcp())
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-11-25")
            .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string())
            .send()
            .await
            .unwrap()
            .status();
        if status == http::StatusCode::NOT_FOUND {
            gone = Some(s.clone());
        }
    }
    assert!(gone.is_some(), "one of {:?} (e.g. {dead}) was the killed replica's and answers 404", sessions[moved[0]]);

    cluster.stop();
    // Every answered call has its event; a call in flight at the kill may have committed its
    // event without its answer reaching the client, never the other way round.
    let events = verified_events(cluster.dir.path(), &cluster.test_db.url);
    let lost: usize = failed.iter().map(|(_, f)| f.len()).sum();
    let stateless_calls = 9;
    assert!(
        (answered + stateless_calls..=answered + stateless_calls + lost).contains(&events),
        "{events} events for {answered} answered calls, {lost} in flight at the kill"
    );
    cluster.db.close().await;
}

/// A revocation made in the shared database (`scopegate admin user disable`, as any replica's
/// operator would) applies on every replica within the identity cache's poll interval
/// (`auth.identity_cache_ms`, 100 ms by default): each replica had the user's identity cached
/// from calls a moment before, and each refuses the next calls and a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_applies_on_every_replica() {
    let mut cluster = Cluster::start(&[]).await;
    let token = cluster.token.clone();

    // A session on each replica, opened directly, and one through the balancer.
    let mut clients = Vec::new();
    for r in &cluster.replicas {
        clients.push((r.addr.clone(), session_client(&format!("http://{}/mcp", r.addr), &token).await));
    }
    clients.push(("haproxy".into(), session_client(&cluster.balancer.mcp(), &token).await));
    for (at, client) in &clients {
        for _ in 0..3 {
            let result = try_call(client, "whoami", json!({})).await;
            assert!(result.as_ref().is_ok_and(|r| r.is_error != Some(true)), "{at}: {result:?}");
        }
    }

    let out = scopegate(cluster.dir.path())
        .args(["admin", "user", "disable", "--tenant", "acme", "olivia@acme.test"])
        .env("SCOPEGATE_DATABASE__URL", &cluster.test_db.url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let revoked = std::time::Instant::now();

    // Each session is refused within the bound (with room for a loaded machine).
    let bound = std::time::Duration::from_secs(5);
    for (at, client) in &clients {
        let left = bound.saturating_sub(revoked.elapsed());
        let sent = eventually_within(left, format!("{at} still serves a disabled user after {bound:?}"), || async {
            let sent = revoked.elapsed();
            match try_call(client, "whoami", json!({})).await {
                Ok(result) if result.is_error != Some(true) => None,
                _ => Some(sent),
            }
        })
        .await;
        eprintln!("{at}: the first refused call was sent {sent:?} after the revocation command returned");
    }
    // And a new session is refused by every replica, at the HTTP layer.
    for r in &cluster.replicas {
        let status = reqwest::Client::new()
            .post(format!("http://{}/mcp", r.addr))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(INIT)
            .send()
            .await
            .unwrap()
            .status();
        assert!(
            status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN,
            "{}: {status}",
            r.addr
        );
    }
    cluster.stop();
    cluster.db.close().await;
}

/// `limits.replicas`: three replicas each enforce a third of the tenant's budget, so the
/// cluster admits no more than the budget however HAProxy spreads the calls. Stateless calls go
/// round robin, twenty to each replica; a third of the burst each admits ten of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limits_hold_for_the_cluster() {
    const BURST: usize = 30;
    const RATE: f64 = 1.0;
    let mut cluster = Cluster::start(&[
        ("SCOPEGATE_LIMITS__REPLICAS", "3"),
        ("SCOPEGATE_LIMITS__TENANT_PER_SEC", "1"),
        ("SCOPEGATE_LIMITS__TENANT_BURST", "30"),
    ])
    .await;
    let token = cluster.token.clone();
    let http = reqwest::Client::new();
    let started = std::time::Instant::now();
    let (mut admitted, mut limited) = (0, 0);
    for id in 0..2 * BURST {
        let body = modern_call(id as i64, "whoami", None);
        let response = http
            .post(cluster.balancer.mcp())
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "whoami")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        match response.status() {
            http::StatusCode::OK => admitted += 1,
            http::StatusCode::TOO_MANY_REQUESTS => {
                assert!(response.headers().contains_key("retry-after"));
                limited += 1;
            }
            other => panic!("{other}: {}", response.text().await.unwrap_or_default()),
        }
    }
    // What the whole budget allows in the time taken: the burst and the refill since.
    let allowed = BURST + (started.elapsed().as_secs_f64() * RATE).ceil() as usize;
    assert!(
        (BURST..=allowed).contains(&admitted),
        "{admitted} admitted ({limited} refused); the cluster's budget allows {BURST} to {allowed}"
    );
    for (i, r) in cluster.replicas.iter().enumerate() {
        let served = r.counter("scopegate_tool_calls_total", &["tool=\"whoami\"", "outcome=\"ok\""]).await;
        assert!(served >= 1.0, "replica {i} served none: the calls were not spread");
    }
    cluster.stop();
    cluster.db.close().await;
}
