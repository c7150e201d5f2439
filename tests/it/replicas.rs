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

use rmcp::model::{CallToolResponse, CancelTaskParams, ClientConfig, GetTaskParams, TaskStatus};
use scopegate::model::Role;
use scopegate::store::entities;
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
    // Stopped as a service is stopped (SIGTERM): each records the outcomes it still holds.
    for mut replica in replicas {
        let pid = replica.child.id().to_string();
        assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        assert!(replica.child.wait().unwrap().success(), "the replica stops cleanly");
    }

    let out = scopegate(dir.path())
        .args(["audit", "verify", "--tenant", "acme"])
        .env("SCOPEGATE_DATABASE__URL", &test_db.url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    // Every call ran: its record and its outcome.
    assert_eq!(stdout.trim(), format!("acme: ok ({} events)", 2 * calls), "every call left its two events");
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
                    // Every request is logged to stderr (kept in `log`), with how it ended: a
                    // failure message names what HAProxy saw.
                    match word {
                        "global" => config.push_str("    log stderr format raw local0 info\n"),
                        "defaults" => config.push_str("    log global\n    option httplog\n"),
                        _ => {}
                    }
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
        let url = self.metrics_url.as_deref().expect("the replica serves metrics");
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
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

/// Three replicas on a database of their own (PostgreSQL unless said) with the demo data and the settings
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
        Self::start_on(Backend::Postgres, env).await
    }

    async fn start_on(backend: Backend, env: &[(&str, &str)]) -> Self {
        let Prepared { config, db, test_db, .. } = TestGateway::new(backend).prepare().await;
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

/// `scopegate audit verify --tenant acme`: the chain holds (calls whose outcome is unknown, in
/// flight at a kill, are listed after the verdict); returns how many events it has.
fn verified_events(dir: &std::path::Path, db_url: &str) -> usize {
    let out = scopegate(dir)
        .args(["audit", "verify", "--tenant", "acme"])
        .env("SCOPEGATE_DATABASE__URL", db_url)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let verdict = stdout.lines().next().unwrap_or_default();
    let count = verdict.strip_prefix("acme: ok (").and_then(|r| r.strip_suffix(" events)"));
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
    // A write is its record (with the raw arguments) and its outcome, committed with the write.
    let rows: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT e.session_id, e.args_raw FROM audit_events e JOIN tenants t ON t.id = e.tenant_id \
         WHERE t.slug = 'acme' AND e.tool = 'record_egg_count' AND e.outcome = 'started' AND EXISTS \
         (SELECT 1 FROM audit_events o WHERE o.tenant_id = e.tenant_id AND o.call_id = e.id AND o.outcome = 'ok')",
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

    // Then another replica vanishes, as a stopped container does.
    let (vanish_calls, vanish_lost) = vanish_under_load(&mut cluster, 2).await;

    cluster.stop();
    // The chain holds. Every answered call is in it (a record and its outcome, or one event); a
    // call in flight at the kill may have its record without its answer reaching the client
    // (its outcome then unknown), never the other way round.
    verified_events(cluster.dir.path(), &cluster.test_db.url);
    let calls: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM audit_events e JOIN tenants t ON t.id = e.tenant_id \
         WHERE t.slug = 'acme' AND e.call_id IS NULL",
    )
    .fetch_one(&mut *cluster.db.begin_read().await.unwrap())
    .await
    .unwrap();
    let calls = calls as usize;
    // A call lost with a replica may have had its record committed before it went (the
    // record commits while the tool runs), in either loss.
    let lost: usize = failed.iter().map(|(_, f)| f.len()).sum::<usize>() + vanish_lost;
    let stateless_calls = 9 + vanish_calls;
    assert!(
        (answered + stateless_calls..=answered + stateless_calls + lost).contains(&calls),
        "{calls} calls audited for {answered} answered calls, {lost} in flight at the kills"
    );
    cluster.db.close().await;
}

/// A policy written and deleted (`scopegate admin policy`), and a revocation made in the shared
/// database (`scopegate admin user disable`), as any replica's operator would, apply on every
/// replica within the identity cache's poll interval
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

    // A policy written applies on every replica within the same bound, and its deletion too.
    let policy = cluster.dir.path().join("no-whoami.cedar");
    std::fs::write(&policy, "forbid (principal, action == Action::\"whoami\", resource);").unwrap();
    let admin = |args: &[&str]| {
        let out = scopegate(cluster.dir.path())
            .arg("admin")
            .args(args)
            .env("SCOPEGATE_DATABASE__URL", &cluster.test_db.url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    for (put, refused) in [(true, true), (false, false)] {
        let policy = policy.display().to_string();
        match put {
            true => admin(&["policy", "put", "--tenant", "acme", "no-whoami", "--file", &policy]),
            false => admin(&["policy", "delete", "--tenant", "acme", "no-whoami"]),
        }
        let written = std::time::Instant::now();
        for (at, client) in &clients {
            let left = std::time::Duration::from_secs(5).saturating_sub(written.elapsed());
            eventually_within(
                left,
                format!("{at}: the policy's change (refused: {refused}) did not apply"),
                || async {
                    let result = try_call(client, "whoami", json!({})).await;
                    (result.as_ref().is_ok_and(|r| r.is_error != Some(true)) != refused).then_some(())
                },
            )
            .await;
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

// ---- any replica serves anything: one key set, agents and continuations that travel ----

/// rmcp's client on 2026-07-28 (no session: each request may reach another replica), able to
/// answer elicitation and declaring the tasks extension.
async fn stateless_client(url: &str, token: &str) -> rmcp::service::RunningService<rmcp::RoleClient, ClientConfig> {
    modern_client(url, token, true).await
}

/// The gateway host as executor `local`.
async fn local_executor(db: &scopegate::store::Db) {
    let mut tx = db.begin().await.unwrap();
    entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
    tx.commit().await.unwrap();
}

/// acme's server `server` (under `defaults/`), bound to `executor`, every tool granted to owners.
async fn declare(db: &scopegate::store::Db, server: &str, declaration: &serde_json::Value, executor: &str) {
    let mut tx = db.begin().await.unwrap();
    entities::create_entity(&mut tx, "acme", &format!("defaults/mcp-servers/{server}"), declaration).await.unwrap();
    entities::bind_server(&mut tx, "acme", server, executor).await.unwrap();
    entities::grant_tool(&mut tx, "acme", server, Role::Owner, "*").await.unwrap();
    tx.commit().await.unwrap();
}

/// One number from the database.
async fn count(db: &scopegate::store::Db, sql: &'static str) -> i64 {
    let mut tx = db.begin().await.unwrap();
    let n: i64 = sqlx::query_scalar(sql).fetch_one(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    n
}

/// `n` calls of `tool`, each of which must succeed (`what` says when, for the failure).
async fn calls_ok<H: rmcp::ClientHandler>(
    client: &rmcp::service::RunningService<rmcp::RoleClient, H>,
    tool: &str,
    args: serde_json::Value,
    n: usize,
    what: &str,
) {
    for i in 0..n {
        let params = rmcp::model::CallToolRequestParams::new(tool.to_owned())
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        match tokio::time::timeout(patience(std::time::Duration::from_secs(20)), client.peer().call_tool(params)).await
        {
            Ok(Ok(result)) if result.is_error != Some(true) => {}
            other => panic!("{what}: call {i} of {n} to {tool} failed: {other:?}"),
        }
    }
}

/// The key ids `/.well-known/jwks.json` at `base` lists, sorted.
async fn published_kids(base: &str) -> Vec<String> {
    let jwks: serde_json::Value =
        reqwest::get(format!("{base}/.well-known/jwks.json")).await.unwrap().json().await.unwrap();
    let mut kids: Vec<String> =
        jwks["keys"].as_array().unwrap().iter().map(|k| k["kid"].as_str().unwrap().to_owned()).collect();
    kids.sort();
    kids
}

const WHO: &str = "who__whoami_upstream";
const WHO_OK: [&str; 2] = ["tool=\"who__whoami_upstream\"", "outcome=\"ok\""];

/// Identity assertions verify through the balancer whichever replica signed them. An upstream
/// that fetches `<balancer>/.well-known/jwks.json` (once, then again for an unknown key id)
/// verifies every assertion of 200 calls spread over the three replicas; again after one
/// replica restarts with a new key, and after that replica rotates its key (every two seconds);
/// and every replica publishes the same key set, the restarted replica's old key included
/// (assertions it signed before the restart are still valid).
async fn one_key_set(backend: Backend) {
    let mut cluster = Cluster::start_on(backend, &[]).await;
    let jwks = format!("{}/.well-known/jwks.json", cluster.balancer.url);
    let env = [("FIXTURE_JWKS_URL", jwks.as_str()), ("FIXTURE_SERVER_ID", "who"), ("FIXTURE_ISSUER", PUBLIC_URL)];
    let (_upstream, addr) = fixture_http(&["http", "127.0.0.1:0"], &env).await;
    local_executor(&cluster.db).await;
    declare(&cluster.db, "who", &json!({"type": "http", "url": format!("http://{addr}/mcp")}), "local").await;
    let client = stateless_client(&cluster.balancer.mcp(), &cluster.token).await;
    calls_ok(&client, WHO, json!({}), 200, "three replicas").await;
    for (i, r) in cluster.replicas.iter().enumerate() {
        assert!(r.counter("scopegate_tool_calls_total", &WHO_OK).await >= 1.0, "replica {i} signed no assertion");
    }
    let before = published_kids(&cluster.balancer.url).await;
    assert_eq!(before.len(), 3, "one key per replica: {before:?}");

    // Replica 1 restarts where it was, with a new key that it rotates every two seconds.
    let addr1 = cluster.replicas[1].addr.clone();
    cluster.replicas[1].kill();
    let fast = [("SCOPEGATE_UPSTREAM__ASSERTION_TTL_SECS", "2"), ("SCOPEGATE_UPSTREAM__KEY_ROTATION_SECS", "2")];
    cluster.replicas[1] = Replica::start_on(cluster.dir.path(), &cluster.test_db.url, PUBLIC_URL, &addr1, &fast);
    eventually("the restarted replica rotates its key", || async {
        count(&cluster.db, "SELECT COUNT(*) FROM signing_keys").await >= 5
    })
    .await;
    // Until the balancer sends it work again (two health checks), every call still verifies.
    let restarted = &cluster.replicas[1];
    eventually("the restarted replica is sent calls", || async {
        calls_ok(&client, WHO, json!({}), 10, "while the replica comes back").await;
        restarted.counter("scopegate_tool_calls_total", &WHO_OK).await >= 1.0
    })
    .await;
    let served_before = restarted.counter("scopegate_tool_calls_total", &WHO_OK).await;
    calls_ok(&client, WHO, json!({}), 200, "after a restart and rotations").await;
    let served = restarted.counter("scopegate_tool_calls_total", &WHO_OK).await - served_before;
    assert!(served >= 20.0, "the restarted replica signed {served} of 200 assertions");

    // One key set, from every replica: the old key of the restarted replica is still in it.
    // The restarted replica rotates every two seconds, so three reads can straddle a rotation:
    // the sets must agree once they are read between two rotations.
    let everywhere: Vec<Vec<String>> = eventually("every replica publishes the same key set", || async {
        let sets = futures_util::future::join_all(cluster.replicas.iter().map(|r| published_kids_of(&r.addr))).await;
        if sets.windows(2).all(|w| w[0] == w[1]) { Ok(sets) } else { Err(format!("{sets:?}")) }
    })
    .await;
    assert!(before.iter().all(|kid| everywhere[0].contains(kid)), "{before:?} not all in {:?}", everywhere[0]);
    assert!(everywhere[0].len() >= 5, "the new key and a rotated one: {:?}", everywhere[0]);
    client.cancel().await.ok();
    cluster.stop();
    cluster.db.close().await;
}
both_dbs!(every_replica_publishes_every_replicas_keys, one_key_set);

async fn published_kids_of(addr: &str) -> Vec<String> {
    published_kids(&format!("http://{addr}")).await
}

/// An executor agent that dials the balancer (and so reaches one replica) serves calls that
/// arrive on every replica: the replica holding its tunnel carries the others' channels over
/// links. When that replica is killed, the agent reconnects through the balancer and calls are
/// served again within seconds.
async fn agent_behind_the_balancer(backend: Backend) {
    let mut cluster = Cluster::start_on(backend, &[("SCOPEGATE_CLUSTER__HEARTBEAT_MS", "500")]).await;
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("work")).unwrap();
    let mut tx = cluster.db.begin().await.unwrap();
    let secret = entities::create_executor(&mut tx, "build-01", "build-host", "builder", "remote", &["acme"])
        .await
        .unwrap()
        .expect("a remote executor gets a secret");
    tx.commit().await.unwrap();
    let secret_file = cluster.dir.path().join("build-01.secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    declare(&cluster.db, "far", &json!({"command": FIXTURE, "args": ["stdio"], "cwd": "work"}), "build-01").await;
    let root_uri = format!("file://{}", root.path().canonicalize().unwrap().display());
    let _agent = agent_process(
        cluster.dir.path(),
        None,
        "build-01",
        &secret_file,
        std::slice::from_ref(&cluster.balancer.url),
        &["--root".into(), root_uri.into()],
    );
    eventually("the agent connects through the balancer", || async {
        count(&cluster.db, "SELECT COUNT(*) FROM replica_agents WHERE executor = 'build-01'").await == 1
    })
    .await;

    let client = stateless_client(&cluster.balancer.mcp(), &cluster.token).await;
    let echo_ok = ["tool=\"far__echo\"", "outcome=\"ok\""];
    calls_ok(&client, "far__echo", json!({"text": "anywhere"}), 60, "one agent, three replicas").await;
    let mut served = Vec::new();
    for r in &cluster.replicas {
        let calls = r.counter("scopegate_tool_calls_total", &echo_ok).await;
        let relayed = r.counter("scopegate_executor_channels_total", &["route=\"relayed\""]).await;
        let carried = r.counter("scopegate_executor_channels_total", &["route=\"served\""]).await;
        served.push((r.addr.clone(), calls, relayed, carried));
    }
    println!("per replica (address, calls, channels relayed, channels carried for others): {served:?}");
    assert!(served.iter().all(|(_, calls, ..)| *calls >= 1.0), "a replica served no call: {served:?}");
    assert!(served.iter().filter(|(_, _, relayed, _)| *relayed >= 1.0).count() >= 2, "{served:?}");
    assert!(served.iter().any(|(.., carried)| *carried >= 1.0), "{served:?}");

    // The replica holding the agent dies; the agent comes back through the balancer.
    let mut tx = cluster.db.begin().await.unwrap();
    let holder: String = sqlx::query_scalar(
        "SELECT r.internal_url FROM replica_agents a JOIN replicas r ON r.id = a.replica_id WHERE a.executor = 'build-01'",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let holder = cluster.replicas.iter().position(|r| holder.ends_with(&r.addr)).expect("the holder is a replica");
    cluster.replicas[holder].kill();
    let killed = std::time::Instant::now();
    let params = || {
        rmcp::model::CallToolRequestParams::new("far__echo")
            .with_arguments(json!({"text": "again"}).as_object().cloned().unwrap())
    };
    loop {
        let answer =
            tokio::time::timeout(patience(std::time::Duration::from_secs(5)), client.peer().call_tool(params())).await;
        if matches!(&answer, Ok(Ok(r)) if r.is_error != Some(true)) {
            break;
        }
        assert!(killed.elapsed() < patience(std::time::Duration::from_secs(30)), "not served again: {answer:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let back = killed.elapsed();
    println!("served again {back:?} after the agent's replica was killed");
    assert!(back < patience(std::time::Duration::from_secs(15)), "served again only after {back:?}");
    // Once the balancer has marked the dead replica down, nothing fails.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    calls_ok(&client, "far__echo", json!({"text": "after"}), 30, "after the agent moved").await;
    client.cancel().await.ok();
    cluster.stop();
    cluster.db.close().await;
}
both_dbs!(an_agent_behind_the_balancer_serves_every_replica, agent_behind_the_balancer);

/// A 2026-07-28 caller's continuations may land on any replica. Its multi round-trip retry
/// sent to another replica than the one whose upstream call waits for the answer is forwarded
/// there and completes; its polls and cancel of a task that lives in one replica's stdio
/// upstream are too.
async fn continuations_travel(backend: Backend) {
    let Prepared { config, db, test_db, .. } = TestGateway::new(backend).prepare().await;
    local_executor(&db).await;
    // Pinned to 2025-11-25, the upstream asks with a request in the middle of the call: the
    // exchange waits in the replica that holds that call.
    let everything = json!({"command": FIXTURE, "args": ["everything", "stdio"], "protocolVersion": "2025-11-25"});
    declare(&db, "ev", &everything, "local").await;
    let tasks = json!({"command": FIXTURE, "args": ["tasks", "stdio"], "protocolVersion": "2026-07-28"});
    declare(&db, "tk", &tasks, "local").await;
    let dir = tempfile::tempdir().unwrap();
    let replicas =
        [Replica::start(dir.path(), &test_db.url, PUBLIC_URL), Replica::start(dir.path(), &test_db.url, PUBLIC_URL)];
    let token = Signer::dev().sign(&claims(&config, "acme", "olivia@acme.test"));
    let here = stateless_client(&format!("http://{}/mcp", replicas[0].addr), &token).await;
    let there = stateless_client(&format!("http://{}/mcp", replicas[1].addr), &token).await;

    let ask = |state: Option<String>| {
        let mut p = rmcp::model::CallToolRequestParams::new("ev__test_elicitation")
            .with_arguments(json!({"message": "who is there?"}).as_object().cloned().unwrap());
        if let Some(state) = state {
            p.request_state = Some(state);
            let answer = json!({"action": "accept", "content": {"username": "olivia", "email": "olivia@acme.test"}});
            p.input_responses = Some([("input".to_owned(), answer)].into_iter().collect());
        }
        p
    };
    for (first, retry) in [(&here, &there), (&there, &here)] {
        let asked = first.call_tool_once(ask(None)).await.unwrap();
        let CallToolResponse::InputRequired(asked) = asked else { panic!("input_required expected: {asked:?}") };
        let state = asked.request_state.expect("a requestState");
        let done = retry.call_tool_once(ask(Some(state.clone()))).await.unwrap();
        let CallToolResponse::Complete(done) = done else { panic!("the call's result expected: {done:?}") };
        assert!(serde_json::to_string(&done).unwrap().contains("olivia"), "{done:?}");
        // Used once, wherever it is presented again.
        let again = first.call_tool_once(ask(Some(state))).await;
        assert!(
            matches!(&again, Err(rmcp::ServiceError::McpError(e)) if e.message.contains("requestState")),
            "{again:?}"
        );
    }

    let task = |client| async move {
        let params = rmcp::model::CallToolRequestParams::new("tk__slow_compute")
            .with_arguments(json!({"seconds": 1, "label": "pinned"}).as_object().cloned().unwrap());
        match rmcp::service::RunningService::call_tool_once(client, params).await.unwrap() {
            CallToolResponse::Task(task) => task.task.task_id,
            other => panic!("a task expected: {other:?}"),
        }
    };
    let made_here = task(&here).await;
    let deadline = std::time::Instant::now() + patience(std::time::Duration::from_secs(20));
    loop {
        let got = there.get_task(GetTaskParams::new(&made_here)).await.unwrap();
        if got.task.task.status == TaskStatus::Completed {
            assert!(serde_json::to_string(&got).unwrap().contains("computed pinned after 1s"), "{got:?}");
            break;
        }
        assert!(!got.task.task.status.is_terminal() && std::time::Instant::now() < deadline, "{got:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let made_there = task(&there).await;
    here.cancel_task(CancelTaskParams::new(&made_there)).await.unwrap();
    let got = there.get_task(GetTaskParams::new(&made_there)).await.unwrap();
    assert_eq!(got.task.task.status, TaskStatus::Cancelled, "{got:?}");
    for r in &replicas {
        assert!(r.counter("scopegate_forwarded_requests_total", &["outcome=\"ok\""]).await >= 2.0, "{}", r.addr);
    }
    // Kept from going on (a caller may set the mark), the poll reaches this replica's own
    // upstream process, which knows no such task: answered as an unknown task, without the
    // upstream's own id.
    let poll = json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"taskId": made_here, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    }}});
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!("http://{}/mcp", replicas[1].addr))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tasks/get")
        .header("mcp-name", made_here.as_str())
        .header("scopegate-forwarded", "the caller")
        .body(poll.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["error"]["message"], "Failed to retrieve task: Task not found", "{answer}");
    assert!(answer["error"].get("data").is_none(), "{answer}");
    here.cancel().await.ok();
    there.cancel().await.ok();
    drop(replicas);
    db.close().await;
}
both_dbs!(continuations_are_served_by_the_replica_they_wait_in, continuations_travel);

/// The link route serves only one of the database's replicas, once per authorization, for the
/// executor it was authorized for, and only while the agent is connected to it: anything else
/// is refused (401), and a link for an agent that is elsewhere is 404.
async fn link_route(backend: Backend) {
    use scopegate::cluster::Cluster as Replicas;
    let live = TestGateway::new(backend).start().await;
    let here = live.state().cluster.id().to_owned();
    // Another replica of the same database (it shares the key), and an authorization of its.
    let signer = Arc::new(
        scopegate::auth::assertion::AssertionSigner::new(PUBLIC_URL, std::time::Duration::from_secs(30)).unwrap(),
    );
    let other = Replicas::join(&live.config, &live.db, signer).await.unwrap();
    let purpose = scopegate::executor::link::purpose("build-01");
    let http = reqwest::Client::new();
    let url = format!("{}/internal/agent-link", live.base_url());
    let ask = |executor: &'static str, auth: Option<String>| {
        let mut request = http
            .get(&url)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("scopegate-executor", executor);
        if let Some(auth) = auth {
            request = request.header("scopegate-replica", auth);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
    };
    let (status, body) = ask("build-01", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"unauthorized\""), "the gateway's JSON error body: {body}");
    assert_eq!(ask("build-01", Some("garbage".into())).await.0, 401);
    assert_eq!(ask("other-executor", Some(other.authorize(&here, &purpose))).await.0, 401, "another executor");
    assert_eq!(ask("build-01", Some(other.authorize("some-other-replica", &purpose))).await.0, 401, "not for us");
    let valid = other.authorize(&here, &purpose);
    let (status, body) = ask("build-01", Some(valid.clone())).await;
    assert_eq!(status, 404, "a replica's authorization, but the agent is not here: {body}");
    assert_eq!(ask("build-01", Some(valid)).await.0, 401, "an authorization is used once");
    // A key of another database: refused.
    let foreign = TestGateway::new(backend).start().await;
    let stranger = Replicas::join(
        &foreign.config,
        &foreign.db,
        Arc::new(
            scopegate::auth::assertion::AssertionSigner::new(PUBLIC_URL, std::time::Duration::from_secs(30)).unwrap(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(ask("build-01", Some(stranger.authorize(&here, &purpose))).await.0, 401, "another database's replica");
}
both_dbs!(the_link_route_serves_only_the_replicas_of_its_database, link_route);

/// Replica `victim` vanishes under load, as a stopped container does: its address drops
/// connection attempts rather than refusing them (here its port becomes a listener whose accept
/// queue is full, so the kernel drops new connection attempts). Stateless calls keep going
/// through HAProxy from several clients. A call the victim was serving when it went may fail
/// (its answer is gone with it); every call started after that succeeds: HAProxy gives up on a
/// connection to the victim after `timeout connect` and sends the call to another replica
/// (nothing reached the first, so nothing ran twice). The waits are printed. Returns the calls
/// answered and the calls lost.
async fn vanish_under_load(cluster: &mut Cluster, victim: usize) -> (usize, usize) {
    const CLIENTS: usize = 6;
    const CALLS: usize = 30;
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (url, token, done) = (cluster.balancer.mcp(), cluster.token.clone(), Arc::clone(&done));
        let (gone, log) = (Arc::clone(&gone), Arc::clone(&cluster.balancer.log));
        tasks.push(tokio::spawn(async move {
            let lifecycle = rmcp::ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            };
            let client =
                rmcp::ClientServiceExt::serve_with_lifecycle((), transport(&url, &token), lifecycle).await.unwrap();
            let (mut waits, mut lost, mut just_lost) = (Vec::new(), 0, false);
            for i in 0..CALLS {
                let (started, after) = (std::time::Instant::now(), gone.load(std::sync::atomic::Ordering::SeqCst));
                match try_call(&client, "whoami", json!({})).await {
                    Ok(result) if result.is_error != Some(true) => {
                        waits.push(started.elapsed());
                        just_lost = false;
                    }
                    // The call right after a lost one may be sent on the client's kept-alive
                    // connection that HAProxy is closing after that loss (the balancer cut it,
                    // not a replica): lost with it, once.
                    other if after && !just_lost => {
                        let log = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        let tail: Vec<&str> = log.lines().rev().take(40).collect();
                        panic!(
                            "stateless call {i}, after a replica vanished, failed: {other:?}\nHAProxy's last lines:\n{}",
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        )
                    }
                    _ => {
                        lost += 1;
                        just_lost = !just_lost;
                    }
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            client.cancel().await.ok();
            (waits, lost)
        }));
    }
    eventually_within(std::time::Duration::from_secs(60), "the stateless load did not get going", || async {
        done.load(std::sync::atomic::Ordering::Relaxed) >= CLIENTS * CALLS / 3
    })
    .await;
    let addr: std::net::SocketAddr = cluster.replicas[victim].addr.parse().unwrap();
    cluster.replicas[victim].kill();
    // Calls started from now on were never in flight on the victim.
    gone.store(true, std::sync::atomic::Ordering::SeqCst);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    let hole = socket.listen(0).unwrap();
    let mut queued = Vec::new();
    for _ in 0..3 {
        let attempt = tokio::time::timeout(std::time::Duration::from_millis(200), tokio::net::TcpStream::connect(addr));
        if let Ok(Ok(stream)) = attempt.await {
            queued.push(stream);
        }
    }
    let probe = tokio::time::timeout(std::time::Duration::from_millis(300), tokio::net::TcpStream::connect(addr)).await;
    assert!(probe.is_err(), "the vanished replica's port drops connection attempts");
    let (mut waits, mut lost) = (Vec::new(), 0);
    for task in tasks {
        let task = tokio::time::timeout(std::time::Duration::from_secs(120), task);
        let (w, l) = task.await.expect("the stateless load finishes").unwrap();
        waits.extend(w);
        lost += l;
    }
    drop((hole, queued));
    waits.sort();
    let slow = waits.iter().filter(|w| w.as_millis() >= 500).count();
    println!(
        "a replica vanished under load: {} stateless calls through HAProxy answered, {lost} in \
         flight on it lost; median {:?}, longest {:?}, {slow} waited 500 ms or more",
        waits.len(),
        waits[waits.len() / 2],
        waits[waits.len() - 1],
    );
    (waits.len(), lost)
}
