//! Remote executors, end to end: the gateway (in this process) and real `scopegate executor`
//! agents (child processes) on loopback, on SQLite and PostgreSQL. A server bound to a remote
//! executor runs on the agent's side, with the agent's environment, inside the agent's root;
//! the faults of the agent, the gateway and the secrets are each exercised.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use scopegate::decl::{ExecutorId, PathStyle, PathUri};
use scopegate::executor::remote::ReadFileError;
use scopegate::store::entities;
use serde_json::{Value, json};

use crate::support::*;

/// How long a call or a read takes at most to be under way at the agent (a hop over loopback
/// to a connected agent), so that what the test then does to the agent meets it there.
const UNDER_WAY: Duration = Duration::from_millis(300);

/// The standard set-up: executor `build-01` (machine `build-01`, user `ci`) owned by acme,
/// acme's server `far` bound to it, declared to report the agent-only variable.
async fn with_far(backend: Backend, overrides: &[(&str, Value)]) -> (Site, PathBuf) {
    let site = Site::start(backend, overrides).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    site.serve("acme", "far", &site.stdio("far", &format!("${{{AGENT_ONLY}}}")), "build-01").await;
    (site, secret)
}

async fn runs_on_the_executor(backend: Backend) {
    let (site, secret) = with_far(backend, &[]).await;
    assert!(std::env::var(AGENT_ONLY).is_err(), "the gateway's own environment lacks the variable");
    let _agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;

    let olivia = site.live.client("olivia@acme.test").await;
    let me = ok(&olivia, "far__whoami_upstream", json!({})).await;
    assert_eq!(me["declared_value"], "ran-on-build-01", "the reference resolved on the executor: it ran there");
    assert_eq!(me["tenant"], "acme");
    assert_eq!(me["user"], "olivia@acme.test", "the identity assertion travels through the executor");
    assert_eq!(me["assertion_source"], "meta", "a stdio server reads the assertion from _meta");
    let cwd = me["cwd"].as_str().unwrap();
    assert_eq!(Path::new(cwd), site.root.path().canonicalize().unwrap().join("work"), "cwd under the agent's root");
    let keys: Vec<&str> = me["env_keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
    let allowed = ["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];
    for key in &keys {
        assert!(
            allowed.contains(key) || key.starts_with("FIXTURE_"),
            "{key}: a server on an executor sees only its declaration and the agent's inherit_env"
        );
    }
    assert!(!keys.contains(&AGENT_ONLY), "the agent's other variables do not leak into the server");
    assert_eq!(
        site.live
            .count("SELECT COUNT(*) FROM audit_events WHERE tool = 'far__whoami_upstream' AND outcome = 'ok'")
            .await,
        1,
        "audited like a local call"
    );
    // Other tenants see nothing of it.
    let gary = site.live.client("gary@globex.test").await;
    let tools = gary.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| !t.name.starts_with("far__")));
}
both_dbs!(remote_stdio_server_runs_on_the_executor, runs_on_the_executor);

/// Entities under the gateway host's machine name, the executor's machine, its user and the
/// defaults: the executor's machine profile wins, through the remote host handler.
async fn machine_prefix_first(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    for (name, value) in [
        ("machines/gw-host/profile/mcp-servers/far", "gateway-host"),
        ("machines/build-01/profile/mcp-servers/far", "executor-machine"),
        ("users/ci/mcp-servers/far", "executor-user"),
        ("defaults/mcp-servers/far", "defaults"),
    ] {
        site.entity("acme", name, &site.stdio("far", value)).await;
    }
    site.bind("acme", "far", "build-01").await;
    let _agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    let olivia = site.live.client("olivia@acme.test").await;
    let me = ok(&olivia, "far__whoami_upstream", json!({})).await;
    assert_eq!(me["declared_value"], "executor-machine");

    // Without the machine profile, the executor's user comes next; the gateway host's own
    // machine name never counts.
    let mut tx = site.live.db.begin().await.unwrap();
    entities::delete_entity(&mut tx, "acme", "machines/build-01/profile/mcp-servers/far").await.unwrap();
    tx.commit().await.unwrap();
    let olivia = site.live.client("olivia@acme.test").await;
    assert_eq!(ok(&olivia, "far__whoami_upstream", json!({})).await["declared_value"], "executor-user");
}
both_dbs!(resolve_via_remote_host_handler_uses_machine_prefix_first, machine_prefix_first);

/// The agent is killed in the middle of a call: the call fails at once (not at the call
/// timeout), audited as failed; the server the agent ran dies with it; a new agent serves the
/// next call.
async fn agent_killed_mid_call(backend: Backend) {
    let (site, secret) = with_far(backend, &[("mcp.call_timeout_secs", json!(60))]).await;
    let mut agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__hang").await;
    let olivia = site.live.client("olivia@acme.test").await;
    let server_pid = ok(&olivia, "far__whoami_upstream", json!({})).await["pid"].as_u64().unwrap();

    let hanging = {
        let peer = olivia.peer().clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (call(&peer, "far__hang", json!({})).await, started)
        })
    };
    tokio::time::sleep(UNDER_WAY).await;
    let killed = Instant::now();
    agent.kill();
    let (result, _) = tokio::time::timeout(Duration::from_secs(10), hanging).await.expect("the call ends").unwrap();
    let err = result.expect_err("the call fails");
    assert_eq!(err.message, "upstream server unavailable");
    assert!(killed.elapsed() < Duration::from_secs(3), "failed within seconds, not at the call timeout");
    wait_gone(server_pid, "the server the killed agent ran").await;
    assert_eq!(
        site.live
            .count(
                "SELECT COUNT(*) FROM audit_events WHERE tool = 'far__hang' AND error_class = 'upstream_unavailable'"
            )
            .await,
        1
    );

    let _again = site.agent("build-01", &secret);
    eventually("the reconnected agent never served the call", || async {
        call(olivia.peer(), "far__whoami_upstream", json!({})).await.is_ok_and(|result| result.is_error != Some(true))
    })
    .await;
}
both_dbs!(remote_agent_killed_mid_call_fails_fast_and_recovers, agent_killed_mid_call);

/// The gateway restarts: the agent reconnects by itself, and new sessions reach its servers.
async fn gateway_restart(backend: Backend) {
    // On an address of its own (the host side of a network namespace): the restarted gateway
    // binds the port it had, which another test could take on the shared loopback meanwhile.
    let netns = Netns::create();
    let mut site = Site::start_for(backend, &netns, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    site.serve("acme", "far", &site.stdio("far", &format!("${{{AGENT_ONLY}}}")), "build-01").await;
    let agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    site.live.stop().await;
    site.live.restart().await;
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    let olivia = site.live.client("olivia@acme.test").await;
    assert_eq!(ok(&olivia, "far__whoami_upstream", json!({})).await["declared_value"], "ran-on-build-01");
    drop(agent);
}
both_dbs!(remote_agent_reconnects_after_a_gateway_restart, gateway_restart);

/// A second agent presenting a connected executor's name is refused (409) while the first is
/// connected, and takes over when the first goes away.
async fn second_agent(backend: Backend) {
    let (site, secret) = with_far(backend, &[]).await;
    let mut first = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    let second = site.agent("build-01", &secret);
    second.wait_log("409").await;
    let olivia = site.live.client("olivia@acme.test").await;
    let served_by = ok(&olivia, "far__whoami_upstream", json!({})).await["pid"].clone();
    assert!(served_by.is_u64());
    first.kill();
    // The second agent, retrying, takes the name.
    eventually("the second agent never took over", || async {
        let client = site.live.client("olivia@acme.test").await;
        match call(client.peer(), "far__whoami_upstream", json!({})).await {
            Ok(result) if result.is_error != Some(true) => Ok(()),
            _ => Err(format!("its log:\n{}", second.log())),
        }
    })
    .await;
    assert!(site.live.metrics().await.contains("scopegate_executor_refusals_total{reason=\"name_in_use\"}"));
}
both_dbs!(remote_second_agent_with_the_same_name_waits_its_turn, second_agent);

/// Wrong, revoked and other-tenant secrets are refused at connect (401), logged and counted;
/// rotating the secret drops the connected agent at once; an executor of another tenant is
/// refused at binding time.
async fn secrets(backend: Backend) {
    let (site, secret) = with_far(backend, &[]).await;
    let globex = site.remote_executor("globex-box", "globex-box", "ci", &["globex"]).await;

    // Another tenant's executor: binding refused, naming the field.
    let mut tx = site.live.db.begin().await.unwrap();
    let err = entities::bind_server(&mut tx, "acme", "stolen", "globex-box").await.expect_err("not acme's executor");
    assert!(err.to_string().contains("executor"), "{err}");
    drop(tx);

    // Another executor's secret under build-01's name; a made-up secret.
    let wrong = site.files.path().join("wrong.secret");
    std::fs::write(&wrong, "sgx_not-the-secret").unwrap();
    for file in [&globex, &wrong] {
        let agent = site.agent("build-01", file);
        agent.wait_log("401").await;
    }
    let olivia = site.live.client("olivia@acme.test").await;
    let tools = olivia.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| !t.name.starts_with("far__")), "no agent, no tools");
    assert!(site.live.metrics().await.contains("scopegate_executor_refusals_total{reason=\"wrong_secret\"}"));

    // The right secret connects; rotating it drops the agent within the recheck period, and
    // its old secret is refused from then on.
    let agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    let mut tx = site.live.db.begin().await.unwrap();
    let _new = entities::rotate_executor_secret(&mut tx, "build-01").await.unwrap();
    tx.commit().await.unwrap();
    agent.wait_log("401").await;
    // The agent's refused reconnect can be logged a moment before the gateway has let go of
    // everything its old link carried: the rotated-out agent serves nothing within 2 s (ten
    // recheck periods).
    eventually_within(Duration::from_secs(2), "the rotated-out agent serves nothing", || async {
        let olivia = site.live.client("olivia@acme.test").await;
        let err = call(olivia.peer(), "far__whoami_upstream", json!({})).await;
        if err.is_err() || err.as_ref().is_ok_and(|r| r.is_error == Some(true)) {
            Ok(())
        } else {
            Err(format!("{err:?}"))
        }
    })
    .await;
    assert!(site.live.metrics().await.contains("scopegate_executor_drops_total{reason=\"secret_rotated\"}"));
}
both_dbs!(remote_agent_secrets_are_checked_at_connect_and_rotation_drops_it, secrets);

/// `/executors/connect` answers an unknown name, a local executor's name and a wrong secret
/// alike (status, headers, body), so it tells no one which executors exist; the refusal
/// metric still tells them apart.
async fn connect_refusals_look_alike(backend: Backend) {
    let live = Live::start(backend, Mode::Stateless, &[]).await;
    let mut tx = live.db.begin().await.unwrap();
    entities::create_executor(&mut tx, "build-01", "build-01", "ci", "remote", &["acme"]).await.unwrap();
    entities::create_executor(&mut tx, "gw-local", "gw-host", "gateway", "local", &[]).await.unwrap();
    tx.commit().await.unwrap();
    let client = reqwest::Client::new();
    let mut answers = Vec::new();
    for name in ["nobody-by-this-name", "build-01", "gw-local"] {
        let response = client
            .get(format!("{}/executors/connect", live.base_url()))
            .header("scopegate-executor", name)
            .header("authorization", "Bearer sgx_not-the-secret")
            .header("scopegate-executor-root", "file:///srv/mcp")
            .send()
            .await
            .unwrap();
        let status = response.status();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(k, _)| !["date", "x-request-id"].contains(&k.as_str()))
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        let body = response.bytes().await.unwrap();
        answers.push((name, status, headers, body));
    }
    let (_, status, headers, body) = &answers[0];
    assert_eq!(*status, http::StatusCode::UNAUTHORIZED);
    for (name, other_status, other_headers, other_body) in &answers[1..] {
        assert_eq!((other_status, other_headers), (status, headers), "{name}: answered otherwise");
        assert_eq!(other_body, body, "{name}: another body");
    }
    let metrics = live.metrics().await;
    for reason in ["unknown", "wrong_secret", "not_remote"] {
        let counted = format!("scopegate_executor_refusals_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&counted), "{counted} missing");
    }
    // The gateway host's own name, `local`, with no row of that name: not a remote executor
    // either (never counted `unknown`).
    let not_remote = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("scopegate_executor_refusals_total{reason=\"not_remote\"} "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = not_remote(&metrics);
    let refused = client
        .get(format!("{}/executors/connect", live.base_url()))
        .header("scopegate-executor", "local")
        .header("authorization", "Bearer sgx_not-the-secret")
        .header("scopegate-executor-root", "file:///srv/mcp")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), http::StatusCode::UNAUTHORIZED);
    assert!(not_remote(&live.metrics().await) > before, "`local` is counted not_remote");
}
both_dbs!(remote_connect_refusals_look_alike, connect_refusals_look_alike);

/// One agent stopped mid-call (SIGSTOP) does not slow calls to another executor.
async fn slow_agent(backend: Backend) {
    let (site, secret) = with_far(backend, &[("mcp.call_timeout_secs", json!(30))]).await;
    let other = site.remote_executor("build-02", "build-02", "ci", &["acme"]).await;
    site.serve("acme", "near", &site.stdio("near", "x"), "build-02").await;
    let stuck = site.agent("build-01", &secret);
    let _fine = site.agent("build-02", &other);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    site.wait_for_tool("olivia@acme.test", "near__whoami_upstream").await;
    let olivia = site.live.client("olivia@acme.test").await;
    ok(&olivia, "far__whoami_upstream", json!({})).await;
    ok(&olivia, "near__whoami_upstream", json!({})).await;

    stuck.signal("-STOP");
    let blocked = {
        let peer = olivia.peer().clone();
        tokio::spawn(async move { call(&peer, "far__whoami_upstream", json!({})).await })
    };
    tokio::time::sleep(UNDER_WAY).await;
    let started = Instant::now();
    for _ in 0..20 {
        ok(&olivia, "near__whoami_upstream", json!({})).await;
    }
    assert!(started.elapsed() < Duration::from_secs(5), "calls to the other executor went on");
    if blocked.is_finished() {
        panic!("the stopped agent's call ended: {:?}", blocked.await);
    }
    stuck.signal("-CONT");
    blocked.abort();
}
both_dbs!(remote_slow_agent_blocks_no_other_executor, slow_agent);

/// A declaration whose `cwd` escapes the root is refused by the gateway (the server is not
/// served); the agent refuses one too, even when asked directly over its tunnel.
async fn escaping_root(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let mut escaping = site.stdio("esc", "x");
    escaping["cwd"] = json!("../../etc");
    site.serve("acme", "esc", &escaping, "build-01").await;
    site.serve("acme", "far", &site.stdio("far", "x"), "build-01").await;
    let _agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    let olivia = site.live.client("olivia@acme.test").await;
    let tools = olivia.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| !t.name.starts_with("esc__")), "the gateway refused the placement");

    // A call of its tool answers as an unknown tool does, and is audited for what it is: a
    // server outside its root (for a caller with a grant on it; without one, an unknown tool).
    let refused = call(olivia.peer(), "esc__whoami_upstream", json!({})).await.expect_err("not served");
    let unknown = call(olivia.peer(), "nope__whoami_upstream", json!({})).await.expect_err("no such tool");
    assert_eq!(refused, unknown, "answered as an unknown tool");
    let wanda = site.live.client("wanda@acme.test").await;
    assert_eq!(call(wanda.peer(), "esc__whoami_upstream", json!({})).await.expect_err("no grant"), unknown);
    let mut tx = site.live.db.begin().await.unwrap();
    let audited: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT tool, outcome, error_class FROM audit_events \
         WHERE tool IN ('esc__whoami_upstream', 'nope__whoami_upstream') ORDER BY seq",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    drop(tx);
    let row = |tool: &str, class: &str| (tool.to_owned(), "denied".to_owned(), Some(class.to_owned()));
    assert_eq!(
        audited,
        [
            row("esc__whoami_upstream", "outside_root"),
            row("nope__whoami_upstream", "unknown_tool"),
            row("esc__whoami_upstream", "unknown_tool"),
        ]
    );
}
both_dbs!(remote_declaration_escaping_the_root_is_refused, escaping_root);

/// A server placed under its agent's root, then opened after the agent came back with another
/// root: the gateway refuses to open it there, and the session's next call answers as an
/// unknown tool, audited as `outside_root`.
async fn root_changed_under_a_session(backend: Backend) {
    let (site, secret) = with_far(backend, &[]).await;
    let mut agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    let olivia = site.live.client("olivia@acme.test").await;
    ok(&olivia, "far__whoami_upstream", json!({})).await;

    agent.kill();
    site.wait_connected("build-01", false).await;
    let elsewhere = tempfile::tempdir().unwrap();
    let _moved = site.agent_mapped("build-01", &secret, "file:///srv/elsewhere", elsewhere.path());
    site.wait_connected("build-01", true).await;

    let refused = call(olivia.peer(), "far__whoami_upstream", json!({})).await.expect_err("not opened there");
    let unknown = call(olivia.peer(), "nope__whoami_upstream", json!({})).await.expect_err("no such tool");
    assert_eq!(refused, unknown, "answered as an unknown tool");
    let classes = site
        .live
        .count("SELECT COUNT(*) FROM audit_events WHERE tool = 'far__whoami_upstream' AND error_class = 'outside_root'")
        .await;
    assert_eq!(classes, 1, "audited as outside its root");
}
both_dbs!(remote_server_opened_outside_a_new_root, root_changed_under_a_session);

/// A Windows-convention root handled lexically end to end: the agent (on this Linux host)
/// serves `file:///C:/plugins` from a test folder (`--root-dir`) and reports only the URI. The
/// gateway places declarations under that URI in its convention (a relative `cwd` written with
/// `\`, an absolute `file:///C:/...` one) without ever making a host path of it; the agent maps
/// what it is sent onto its folder, and still refuses a link inside it that leads out.
async fn windows_root_mapped(backend: Backend) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("win-01", "win-01", "ci", &["acme"]).await;
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let (plugins, outside) = (base.join("plugins"), base.join("outside"));
    std::fs::create_dir_all(plugins.join("demo").join("work")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, plugins.join("leak")).unwrap();
    let declare = |server: &str, cwd: &str| {
        let mut declaration = site.stdio(server, &format!("${{{AGENT_ONLY}}}"));
        declaration["cwd"] = json!(cwd);
        declaration
    };
    site.serve("acme", "rel", &declare("rel", "demo\\work"), "win-01").await;
    site.serve("acme", "abs", &declare("abs", "file:///C:/plugins/demo/work"), "win-01").await;
    // Refused by the gateway (another drive), and by the agent (a link out of its folder).
    site.serve("acme", "drive", &declare("drive", "file:///D:/plugins"), "win-01").await;
    site.serve("acme", "leak", &declare("leak", "leak"), "win-01").await;
    let agent = site.agent_mapped("win-01", &secret, "file:///C:/plugins", &plugins);
    site.wait_for_tool("olivia@acme.test", "rel__whoami_upstream").await;

    let olivia = site.live.client("olivia@acme.test").await;
    for tool in ["rel__whoami_upstream", "abs__whoami_upstream"] {
        let me = ok(&olivia, tool, json!({})).await;
        assert_eq!(me["declared_value"], "ran-on-win-01", "{tool}: ran on the agent");
        let cwd = me["cwd"].as_str().unwrap();
        assert_eq!(Path::new(cwd), plugins.join("demo").join("work"), "{tool}: file:///C:/plugins/demo/work, mapped");
    }
    let tools = olivia.list_all_tools().await.unwrap();
    for refused in ["drive__", "leak__"] {
        assert!(tools.iter().all(|t| !t.name.starts_with(refused)), "{refused} was served");
    }
    agent.wait_log("outside the executor's root file:///C:/plugins").await;
    assert!(
        site.live
            .count("SELECT COUNT(*) FROM audit_events WHERE tool = 'rel__whoami_upstream' AND outcome = 'ok'")
            .await
            == 1,
        "audited like any call"
    );
}
both_dbs!(remote_windows_root_mapped_onto_an_agent_folder, windows_root_mapped);

/// An HTTP upstream only the executor can reach: it listens on the loopback of a network
/// namespace, where the agent runs. The gateway host cannot reach it (a server bound to the
/// local executor with the same URL is not served), yet through the agent it works, and
/// the assertion travels in its header.
async fn http_only_the_executor_reaches(backend: Backend) {
    let netns = Netns::create();
    let site = Site::start_for(backend, &netns, &[]).await;
    let secret_file = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;

    let (mut upstream, addr) = http_fixture_in(&netns, &site, "web").await;
    let url = format!("http://{addr}/mcp");
    let declaration = json!({"type": "http", "url": url, "headers": {"x-declared": "a literal header"}});
    site.serve("acme", "web", &declaration, "build-01").await;
    site.serve("acme", "direct", &declaration, "local").await;
    // A header read from an environment is refused for an executor-hosted server (its login
    // through the executor replaces it): that server is not served.
    let from_env = json!({"type": "http", "url": url, "headers": {"x-declared": "${SCOPEGATE_TEST_AGENT_ONLY}"}});
    site.serve("acme", "webenv", &from_env, "build-01").await;

    let agent = site.agent_in(Some(&netns.name), "build-01", &secret_file, &[site.live.base_url()]);
    site.wait_for_tool("olivia@acme.test", "web__whoami_upstream").await;
    let olivia = site.live.client("olivia@acme.test").await;
    let me = ok(&olivia, "web__whoami_upstream", json!({})).await;
    assert_eq!(me["user"], "olivia@acme.test");
    assert_eq!(me["assertion_source"], "header", "the agent moved the assertion into the header");
    assert_eq!(me["declared_header"], "a literal header", "declared headers travel through the executor");
    assert_eq!(me["authorization"], Value::Null, "the client's token never reaches the executor");
    let tools = olivia.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| !t.name.starts_with("direct__")), "the gateway host itself cannot reach the upstream");
    assert!(tools.iter().all(|t| !t.name.starts_with("webenv__")), "a header from an environment is refused");
    // rmcp's HTTP worker on the agent quits for good when the handshake's messages reach it
    // out of order; it must never have had to.
    assert!(!agent.log().contains("fatal"), "the agent's HTTP client failed:\n{}", agent.log());
    upstream.kill().await.ok();
}
both_dbs!(remote_http_upstream_reached_over_the_executors_network, http_only_the_executor_reaches);

/// The agent refuses paths outside its own root even when the gateway asks for them: a test
/// gateway (the tunnel's own accept path, no checks of the gateway's) opens escaping servers
/// and files directly on a real agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_refuses_paths_outside_its_root_even_when_asked() {
    use scopegate::tunnel::{self, Open, Settings, Side};
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("work")).unwrap();
    std::fs::write(root.path().join("work/inside.txt"), "inside").unwrap();
    let root_uri = format!("file://{}", root.path().canonicalize().unwrap().display());
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let app = axum::Router::new().route(
        tunnel::CONNECT_PATH,
        axum::routing::get(move |mut request: axum::extract::Request| {
            let tx = tx.clone();
            async move {
                let (response, upgrading) = tunnel::accept_upgrade(&mut request, &Settings::default()).unwrap();
                tokio::spawn(async move {
                    let ws = upgrading.ready().await.unwrap();
                    let (handle, _incoming) = tunnel::start(ws, Side::Gateway, Settings::default());
                    let _ = tx.send(handle).await;
                });
                response
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let secret = root.path().join("secret");
    std::fs::write(&secret, "sgx_anything").unwrap();
    let mut agent = std::process::Command::new(SCOPEGATE)
        .args(["executor", "--gateway", &format!("http://{addr}"), "--name", "box", "--secret-file"])
        .arg(&secret)
        .args(["--root", &root_uri])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let handle = tokio::time::timeout(Duration::from_secs(15), rx.recv()).await.expect("the agent dials in").unwrap();

    let stdio = |cwd: String| Open::Stdio {
        server: "esc".to_owned(),
        command: FIXTURE.to_owned(),
        args: vec!["stdio".to_owned()],
        env: Default::default(),
        cwd,
    };
    for cwd in
        ["file:///etc".to_owned(), format!("{root_uri}/../"), format!("{root_uri}/work/../../x"), "/etc".to_owned()]
    {
        match handle.open(&stdio(cwd.clone()), Duration::from_secs(5)).await {
            Err(tunnel::TunnelError::Refused(reason)) => {
                assert!(reason.contains("root") || reason.contains("not a file: URI"), "{cwd}: {reason}")
            }
            Err(other) => panic!("{cwd}: refused for the wrong reason: {other}"),
            Ok(_) => panic!("{cwd}: the agent opened a server outside its root"),
        }
    }
    for uri in [
        "file:///etc/hostname".to_owned(),
        format!("{root_uri}/../secret"),
        format!("{root_uri}/work/%2e%2e/../secret"),
    ] {
        let open = Open::ReadFile { uri: uri.clone(), max_bytes: 1024 };
        match handle.open(&open, Duration::from_secs(5)).await {
            Err(tunnel::TunnelError::Refused(reason)) => {
                let (class, _) = tunnel::Refusal::split(&reason);
                assert_eq!(class, Some(tunnel::Refusal::OutsideRoot), "{uri}: {reason}");
            }
            Err(other) => panic!("{uri}: refused for the wrong reason: {other}"),
            Ok(_) => panic!("{uri}: the agent read a file outside its root"),
        }
    }
    // Inside the root both work: the refusals are about the paths.
    handle.open(&stdio(format!("{root_uri}/work")), Duration::from_secs(5)).await.expect("inside the root");
    let open = Open::ReadFile { uri: format!("{root_uri}/work/inside.txt"), max_bytes: 1024 };
    let (_tx, mut file) = handle.open(&open, Duration::from_secs(5)).await.expect("a file inside the root").split();
    let mut read = Vec::new();
    while let Some(chunk) = file.recv().await {
        read.extend_from_slice(&chunk);
    }
    assert_eq!(read, b"inside");
    let _ = agent.kill();
    let _ = agent.wait();
}

/// Two replicas on one database. An agent connected to the first only is reached from the
/// second through the first (a link between them), and the second's assertions verify against
/// the first's JWKS (one key set). An agent given both URLs keeps a connection to each, and
/// each replica serves the executor's servers over its own.
async fn replicas(backend: Backend) {
    let (site, secret) = with_far(backend, &[]).await;
    let mut second = site.live.replica().await;
    let second_url = second.base_url();

    let first_only = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    site.wait_for_tool_at(&second_url, "olivia@acme.test", "far__whoami_upstream").await;
    let olivia = site.live.client_at(&second_url, "olivia@acme.test").await;
    let me = ok(olivia.peer(), "far__whoami_upstream", json!({})).await;
    assert_eq!(me["user"], "olivia@acme.test", "through the first replica, asserted by the second: {me}");
    drop(first_only);

    let _both = site.agent_to("build-01", &secret, &[site.live.base_url(), second_url.clone()]);
    site.wait_for_tool("olivia@acme.test", "far__whoami_upstream").await;
    site.wait_for_tool_at(&second_url, "olivia@acme.test", "far__whoami_upstream").await;
    for replica in [site.live.base_url(), second_url.clone()] {
        let olivia = site.live.client_at(&replica, "olivia@acme.test").await;
        let me = ok(olivia.peer(), "far__whoami_upstream", json!({})).await;
        assert_eq!(me["user"], "olivia@acme.test", "{replica}: {me}");
    }
    second.stop().await;
}
both_dbs!(remote_agent_serves_every_replica_through_one_or_each, replicas);

// ---- files read through an executor ----

/// A file under the site's agent root, as the executor's URI.
fn in_root(site: &Site, relative: &str) -> PathUri {
    PathUri::parse(&site.root_uri(), PathStyle::Posix).unwrap().join(relative).unwrap()
}

/// Executor `build-01` with its agent connected.
async fn with_agent(backend: Backend) -> (Site, Agent) {
    let site = Site::start(backend, &[]).await;
    let secret = site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    let agent = site.agent("build-01", &secret);
    site.wait_connected("build-01", true).await;
    (site, agent)
}

const READ_WAIT: Duration = Duration::from_secs(10);

/// Files come back byte for byte through the agent, a plugin's `.mcp.json` among them, one
/// larger than the tunnel's whole window too (credit flows back as the gateway reads). They
/// come from the executor, not from the gateway's disk: with the agent gone, the same file
/// (still on this shared disk) can't be read.
async fn file_reads(backend: Backend) {
    let (site, mut agent) = with_agent(backend).await;
    let id = ExecutorId::new("build-01");
    let root = site.root.path();
    let manifest = json!({
        "mcpServers": {
            "demo": {"command": "node", "args": ["server.js", "--name=démo ✓"], "env": {"TOKEN": "${TOKEN}"}},
            "web": {"type": "http", "url": "https://example.test/mcp"}
        }
    });
    std::fs::create_dir_all(root.join("plugins/demo")).unwrap();
    std::fs::write(root.join("plugins/demo/.mcp.json"), serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    let small: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    std::fs::write(root.join("work/small.bin"), &small).unwrap();
    std::fs::write(root.join("work/empty"), b"").unwrap();
    // Over 64 frames of 64 KiB: more than one window.
    let big: Vec<u8> = (0..5 * 1024 * 1024 + 7).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(root.join("work/big.bin"), &big).unwrap();

    let read = |relative: &'static str, max_bytes: u64| {
        let (site, id) = (&site, &id);
        async move { site.live.agents().read_file(id, &in_root(site, relative), max_bytes, READ_WAIT).await }
    };
    let bytes = read("plugins/demo/.mcp.json", 64 * 1024).await.expect("the plugin's .mcp.json");
    assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), manifest, "the JSON round trip");
    assert_eq!(read("work/small.bin", 1000).await.unwrap(), small, "a file of exactly max_bytes");
    assert_eq!(read("work/empty", 0).await.unwrap(), b"", "an empty file");
    assert_eq!(read("work/big.bin", 8 * 1024 * 1024).await.unwrap(), big, "a file over many windows");
    assert_eq!(site.live.agents().link("build-01").unwrap().channels_open(), 0, "every read's channel closed");
    let metrics = site.live.metrics().await;
    assert!(metrics.contains("scopegate_executor_file_reads_total{outcome=\"ok\"}"), "counted");

    agent.kill();
    site.wait_connected("build-01", false).await;
    let started = Instant::now();
    let err = read("plugins/demo/.mcp.json", 64 * 1024).await.unwrap_err();
    assert_eq!(err, ReadFileError::NotConnected("build-01".to_owned()));
    assert!(root.join("plugins/demo/.mcp.json").is_file(), "the file is there, but not the executor");
    assert!(started.elapsed() < Duration::from_secs(1), "refused at once");
}
both_dbs!(remote_file_reads_come_through_the_executor, file_reads);

/// Each refusal is typed and keeps its reason: outside the root as written (the gateway
/// refuses before asking; a `..` is resolved lexically first) or through a symlink (the agent
/// refuses once it resolves it), missing, a folder, a named pipe (refused, not waited on), too
/// large. The agent still serves afterwards. Reading touches no database: SQLite only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_file_read_refusals_are_typed() {
    let (site, _agent) = with_agent(Backend::Sqlite).await;
    let id = ExecutorId::new("build-01");
    let root = site.root.path().canonicalize().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.json"), b"{\"secret\": true}").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.json"), root.join("work/escape")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("work/escape-dir")).unwrap();
    std::fs::write(root.join("work/inside.json"), b"{}").unwrap();
    std::os::unix::fs::symlink(root.join("work/inside.json"), root.join("work/inner-link")).unwrap();
    std::fs::write(root.join("work/big.json"), vec![b' '; 2000]).unwrap();
    let fifo = std::process::Command::new("mkfifo").arg(root.join("work/fifo")).status().unwrap();
    assert!(fifo.success());
    let root_uri = site.root_uri();
    let parse = |text: String| PathUri::parse(&text, PathStyle::Posix).unwrap();

    let gateway_refuses = "outside the root";
    let agent_refuses = "outside the executor's root";
    let rows: Vec<(&str, PathUri, &str, &str)> = vec![
        ("another folder", parse("file:///etc/hostname".to_owned()), "outside_root", gateway_refuses),
        (
            "`..` out of the root",
            parse(format!("{root_uri}/work/../../x/secret.json")),
            "outside_root",
            gateway_refuses,
        ),
        ("a symlink to a file outside", in_root(&site, "work/escape"), "outside_root", agent_refuses),
        ("through a symlinked folder", in_root(&site, "work/escape-dir/secret.json"), "outside_root", agent_refuses),
        ("a missing file", in_root(&site, "work/nope.json"), "not_found", "No such file"),
        ("a missing folder", in_root(&site, "nope/.mcp.json"), "not_found", "No such file"),
        ("a file taken for a folder", in_root(&site, "work/inside.json/x"), "not_found", "inside.json/x"),
        ("a folder", in_root(&site, "work"), "not_a_file", "not a regular file"),
        ("the root itself", in_root(&site, ""), "not_a_file", "not a regular file"),
        ("a named pipe", in_root(&site, "work/fifo"), "not_a_file", "not a regular file"),
        ("over max_bytes", in_root(&site, "work/big.json"), "too_large", "2000 bytes, over the limit of 1000"),
    ];
    for (what, uri, outcome, reason) in rows {
        let started = Instant::now();
        let err = site.live.agents().read_file(&id, &uri, 1000, READ_WAIT).await.expect_err(what);
        assert_eq!(err.outcome(), outcome, "{what}: {err}");
        assert!(err.to_string().contains(reason), "{what}: {err}");
        assert!(!err.to_string().starts_with('['), "{what}: the class code is not part of the reason: {err}");
        assert!(started.elapsed() < Duration::from_secs(2), "{what}: took {:?}", started.elapsed());
    }
    // A link that stays inside is fine, and the agent serves on after every refusal.
    let bytes = site.live.agents().read_file(&id, &in_root(&site, "work/inner-link"), 1000, READ_WAIT).await.unwrap();
    assert_eq!(bytes, b"{}");
    let metrics = site.live.metrics().await;
    for outcome in ["outside_root", "not_found", "not_a_file", "too_large"] {
        let line = format!("scopegate_executor_file_reads_total{{outcome=\"{outcome}\"}}");
        assert!(metrics.contains(&line), "{line}");
    }
}

/// An executor without a connected agent, or no executor at all: refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_file_read_without_an_agent_fails_at_once() {
    let site = Site::start(Backend::Sqlite, &[]).await;
    site.remote_executor("build-01", "build-01", "ci", &["acme"]).await;
    for name in ["build-01", "no-such-executor", "local"] {
        let started = Instant::now();
        let uri = in_root(&site, "work/x.json");
        let err = site.live.agents().read_file(&ExecutorId::new(name), &uri, 10, READ_WAIT).await.unwrap_err();
        assert_eq!(err, ReadFileError::NotConnected(name.to_owned()));
        assert!(started.elapsed() < Duration::from_secs(1), "{name}");
    }
}

/// An agent that stops answering is bounded by the timeout; one killed while a read waits on
/// it, or in the middle of sending a file, ends the read at once with a disconnection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_file_read_with_a_stopped_or_killed_agent_does_not_hang() {
    let (site, mut agent) = with_agent(Backend::Sqlite).await;
    let id = ExecutorId::new("build-01");
    std::fs::write(site.root.path().join("work/small.json"), b"{}").unwrap();
    let small = in_root(&site, "work/small.json");

    agent.signal("-STOP");
    let short = Duration::from_millis(500);
    let started = Instant::now();
    let err = site.live.agents().read_file(&id, &small, 10, short).await.unwrap_err();
    assert_eq!(err, ReadFileError::Timeout(short));
    assert!(started.elapsed() < Duration::from_secs(2), "bounded by the timeout: {:?}", started.elapsed());
    agent.signal("-CONT");
    let bytes = site.live.agents().read_file(&id, &small, 10, READ_WAIT).await.expect("the agent answers again");
    assert_eq!(bytes, b"{}");

    // Killed while the open waits on it.
    agent.signal("-STOP");
    let waiting = {
        let (agents, id, small) = (Arc::clone(site.live.agents()), id.clone(), small.clone());
        tokio::spawn(async move { agents.read_file(&id, &small, 10, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(UNDER_WAY).await;
    let killed = Instant::now();
    agent.kill();
    let err = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("no hang").unwrap().unwrap_err();
    assert_eq!(err.outcome(), "disconnected", "{err}");
    assert!(killed.elapsed() < Duration::from_secs(3), "ended with the connection: {:?}", killed.elapsed());

    // Killed while sending: a sparse file of 1 GiB takes the agent seconds to send.
    let secret = site.files.path().join("build-01.secret");
    let mut agent = site.agent("build-01", &secret);
    site.wait_connected("build-01", true).await;
    let huge = std::fs::File::create(site.root.path().join("work/huge.bin")).unwrap();
    huge.set_len(1 << 30).unwrap();
    let sending = {
        let (agents, id, uri) = (Arc::clone(site.live.agents()), id.clone(), in_root(&site, "work/huge.bin"));
        tokio::spawn(async move { agents.read_file(&id, &uri, 1 << 30, Duration::from_secs(60)).await })
    };
    eventually("the read is under way", || async {
        site.live.agents().link("build-01").is_some_and(|link| link.channels_open() == 1)
    })
    .await;
    let killed = Instant::now();
    agent.kill();
    let err = tokio::time::timeout(Duration::from_secs(5), sending).await.expect("no hang").unwrap().unwrap_err();
    assert!(matches!(err, ReadFileError::Disconnected(_)), "{err}");
    assert!(killed.elapsed() < Duration::from_secs(3), "ended with the connection: {:?}", killed.elapsed());
    assert!(site.live.metrics().await.contains("scopegate_executor_file_reads_total{outcome=\"disconnected\"}"));
}

/// A caller without a session (2026-07-28) that called before the executor's agent connected,
/// when its server was not served, is served once the agent connects, although no change moved
/// the change counter: a resolution that left a server out for an agent not connected is not
/// reused for the caller's next requests.
async fn agent_connects_for_callers_alone(backend: Backend) {
    let (site, secret) = with_far(backend, &[]).await;
    let olivia = site.live.token_for("olivia@acme.test");
    let tool = "far__whoami_upstream";
    let headers = alone_headers(tool);
    let call = |id: i64| {
        let body = modern_call(id, tool, None).to_string();
        let (live, olivia) = (&site.live, &olivia);
        async move { post(live, olivia, None, &body, &headers).await }
    };
    assert_eq!(call(1).await.message["error"]["code"], -32602, "not served before its agent connects");
    // More than two reads of the counter (100 ms apart): a resolution could be reused by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(call(2).await.message["error"]["code"], -32602);
    let _agent = site.agent("build-01", &secret);
    site.wait_for_tool("olivia@acme.test", tool).await;
    let served = call(3).await;
    assert_eq!(served.message["result"]["resultType"], "complete", "{:?}", served.message);
}
both_dbs!(remote_agent_connecting_serves_callers_alone, agent_connects_for_callers_alone);
