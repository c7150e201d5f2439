//! The executor agent's channel servers over in-memory channels (the tunnel is tested on its
//! own): containment, environment isolation, process-group kills, the child guard, file reads,
//! and the `scopegate executor` command line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use scopegate::agent::io::{Sent, memory_channel};
use scopegate::agent::{AgentClients, AgentEnv, AgentRoot, Host, Prepared, prepare};
use scopegate::decl::{PathStyle, PathUri};
use scopegate::tunnel::{Open, Refusal};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::support::{FIXTURE, SCOPEGATE, eventually, fixture_http, pid_alive};

const WAIT: Duration = Duration::from_secs(15);

/// A root folder (symlinks resolved, so its URI is its real path) and a sibling outside it.
struct Dirs {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(tmp.path()).unwrap();
    let (root, outside) = (base.join("root"), base.join("outside"));
    std::fs::create_dir_all(root.join("work")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    Dirs { _tmp: tmp, root, outside }
}

fn uri(path: &Path) -> String {
    format!("file://{}", path.display())
}

fn path_var() -> String {
    std::env::var("PATH").unwrap()
}

/// The agent as the tests run it: its environment is `vars` (not the test process's), its
/// children go through the real binary's child guard.
fn host_with(root: &Path, vars: &[(&str, &str)], inherit: &[&str], max_frame: usize) -> Host {
    let env = AgentEnv::from_vars(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let root = AgentRoot::new(PathUri::parse(&uri(root), PathStyle::Posix).unwrap(), None).unwrap();
    Host::new(
        "build-box",
        root,
        env,
        inherit.iter().map(|s| (*s).to_owned()).collect(),
        AgentClients::new(None).unwrap(),
        max_frame,
        Some(PathBuf::from(SCOPEGATE)),
    )
}

fn host(root: &Path) -> Host {
    host_with(root, &[("PATH", &path_var())], &["PATH"], 16 * 1024 * 1024)
}

fn stdio(command: &str, args: &[&str], env: &[(&str, &str)], cwd: &Path) -> Open {
    Open::Stdio {
        server: "demo".into(),
        command: command.into(),
        args: args.iter().map(|s| (*s).to_owned()).collect(),
        env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        cwd: uri(cwd),
    }
}

/// A served channel: the peer's ends, the stop token, and the server's task.
struct Served {
    to_agent: Option<mpsc::Sender<Bytes>>,
    from_agent: mpsc::UnboundedReceiver<Sent>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    pid: Option<u32>,
}

async fn serve(host: Host, open: Open) -> Served {
    let prepared = prepare(&host, open).await.unwrap_or_else(|e| panic!("refused: {e}"));
    let pid = match &prepared {
        Prepared::Stdio(server) => server.pid(),
        _ => None,
    };
    let (sink, source, to_agent, from_agent) = memory_channel();
    let stop = CancellationToken::new();
    let task = tokio::spawn(prepared.run(sink, source, stop.clone()));
    Served { to_agent: Some(to_agent), from_agent, stop, task, pid }
}

impl Served {
    async fn send(&self, message: Value) {
        self.to_agent.as_ref().unwrap().send(Bytes::from(message.to_string())).await.unwrap();
    }

    async fn next(&mut self) -> Sent {
        tokio::time::timeout(WAIT, self.from_agent.recv()).await.expect("the agent answers in time").expect("open")
    }

    /// The next JSON-RPC message with `id`, skipping notifications.
    async fn answer(&mut self, id: i64) -> Value {
        loop {
            match self.next().await {
                Sent::Data(data) => {
                    let message: Value = serde_json::from_slice(&data).unwrap();
                    if message["id"] == id {
                        return message;
                    }
                }
                Sent::Close(reason) => panic!("closed before answering {id}: {reason:?}"),
            }
        }
    }

    /// Every message until the close, and its reason.
    async fn until_close(&mut self) -> (Vec<Bytes>, String) {
        let mut data = Vec::new();
        loop {
            match self.next().await {
                Sent::Data(d) => data.push(d),
                Sent::Close(reason) => return (data, reason),
            }
        }
    }
}

/// Whether `pid` is a live process (a zombie is dead: it only waits to be reaped).
fn alive(pid: u32) -> bool {
    pid_alive(pid.into())
}

/// Waits until `pid` is dead; fails with `what` if it lives on.
async fn dies(pid: u32, what: &str) {
    eventually(what, || async { !alive(pid) }).await
}

fn initialize(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "agent-test", "version": "0"}}})
}

#[tokio::test]
async fn a_stdio_server_answers_initialize_over_the_channel_and_dies_with_it() {
    let d = dirs();
    let mut served = serve(host(&d.root), stdio(FIXTURE, &["stdio"], &[], &d.root.join("work"))).await;
    served.send(initialize(1)).await;
    let answer = served.answer(1).await;
    assert!(answer["result"]["serverInfo"].is_object(), "{answer}");
    served.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    served
        .send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "through the agent"}}}))
        .await;
    assert_eq!(served.answer(2).await["result"]["content"][0]["text"], "through the agent");

    let pid = served.pid.unwrap();
    assert!(alive(pid));
    // The gateway closes the channel: the server goes with it.
    served.to_agent = None;
    let (_, reason) = served.until_close().await;
    assert_eq!(reason, "", "a channel the peer closed ends without a reason");
    dies(pid, "the server outlived its channel").await;
    served.task.await.unwrap();
}

#[tokio::test]
async fn a_child_sees_the_agents_references_and_nothing_else_of_its_environment() {
    let d = dirs();
    let vars = [("PATH", path_var()), ("AGENT_ONLY_TOKEN", "s3cret-on-the-agent".into()), ("AGENT_OTHER", "x".into())];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let host = host_with(&d.root, &vars, &["PATH", "HOME"], 1 << 20);
    let open = stdio(
        "env",
        &[],
        &[("SEEN", "token=${AGENT_ONLY_TOKEN}"), ("LITERAL", "plain"), ("ESCAPED", "$${AGENT_OTHER}")],
        &d.root,
    );
    let mut served = serve(host, open).await;
    let (lines, reason) = served.until_close().await;
    assert!(reason.contains("exited") && reason.contains('0'), "{reason}");
    let env: BTreeMap<String, String> = lines
        .iter()
        .map(|l| {
            let (k, v) = std::str::from_utf8(l).unwrap().split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert_eq!(env.get("SEEN").map(String::as_str), Some("token=s3cret-on-the-agent"));
    assert_eq!(env.get("PATH"), Some(&path_var()), "inherited");
    assert_eq!(env.get("ESCAPED").map(String::as_str), Some("${AGENT_OTHER}"), "`$${{` is a literal");
    // HOME is inherited by name but the agent has none; the test process's own variables
    // (CARGO_*, HOME...) and the agent's other ones never reach the child.
    let keys: BTreeSet<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(keys, BTreeSet::from(["ESCAPED", "LITERAL", "PATH", "SEEN"]), "{env:?}");
}

#[tokio::test]
async fn references_the_agent_cannot_resolve_are_refused() {
    let d = dirs();
    let host = host(&d.root);
    let cases = [
        (stdio("env", &[], &[("X", "${env:HOME}")], &d.root), "gateway's own environment"),
        (stdio("env", &["${env:HOME}"], &[], &d.root), "gateway's own environment"),
        (stdio("env", &[], &[("X", "${NOT_ON_THE_AGENT}")], &d.root), "NOT_ON_THE_AGENT"),
        (
            Open::Http {
                server: "h".into(),
                url: "http://127.0.0.1:9/mcp".into(),
                headers: BTreeMap::from([("x-k".into(), "${env:PATH}".into())]),
                assertion_header: "x-scopegate-identity".into(),
            },
            "gateway's own environment",
        ),
    ];
    for (open, expected) in cases {
        let reason = prepare(&host, open.clone()).await.err().unwrap_or_else(|| panic!("{open:?} was accepted"));
        assert!(reason.contains(expected), "{open:?}: {reason}");
    }
}

#[tokio::test]
async fn paths_outside_the_root_are_refused_however_they_are_written() {
    let d = dirs();
    std::os::unix::fs::symlink(&d.outside, d.root.join("escape")).unwrap();
    std::os::unix::fs::symlink(d.root.join("work"), d.root.join("inner-link")).unwrap();
    std::os::unix::fs::symlink(&d.root, d.outside.join("into-root")).unwrap();
    std::fs::write(d.outside.join("secret.json"), "{}").unwrap();
    let host = host(&d.root);
    let root = uri(&d.root);
    let refused = [
        uri(&d.outside),
        format!("{root}/../outside"),
        format!("{root}/%2e%2e/outside"),
        format!("{root}/work/../../outside"),
        // A link inside the root that leads out of it.
        format!("{root}/escape"),
        // A name outside the root, even one that leads back into it.
        uri(&d.outside.join("into-root")),
        d.root.display().to_string(),
        "work".to_owned(),
        "file://otherhost/srv".to_owned(),
    ];
    for cwd in &refused {
        let open = Open::Stdio {
            server: "s".into(),
            command: "true".into(),
            args: vec![],
            env: BTreeMap::new(),
            cwd: cwd.clone(),
        };
        let reason = prepare(&host, open).await.err().unwrap_or_else(|| panic!("cwd {cwd} was accepted"));
        assert!(reason.contains(cwd.as_str()), "{cwd}: {reason}");
    }
    for file in [uri(&d.outside.join("secret.json")), format!("{root}/escape/secret.json")] {
        let reason = prepare(&host, Open::ReadFile { uri: file.clone(), max_bytes: 1024 }).await.err();
        assert!(reason.is_some_and(|r| r.contains("outside the executor's root")), "{file}");
    }
    // Inside, through a link that stays inside, is fine.
    let ok = stdio("true", &[], &[], &d.root.join("inner-link"));
    assert!(prepare(&host, ok).await.is_ok());
    let reason = prepare(&host, stdio("true", &[], &[], &d.outside)).await.err().unwrap();
    assert!(reason.contains("outside the executor's root"), "{reason}");
}

#[tokio::test]
async fn ending_the_channel_kills_the_childs_whole_process_group() {
    let d = dirs();
    for how in ["channel closed", "agent stopping"] {
        let script = "sleep 30 & echo $!; wait";
        let mut served = serve(host(&d.root), stdio("sh", &["-c", script], &[], &d.root)).await;
        let Sent::Data(line) = served.next().await else { panic!("no pid") };
        let grandchild: u32 = std::str::from_utf8(&line).unwrap().parse().unwrap();
        let child = served.pid.unwrap();
        assert!(alive(grandchild) && alive(child));
        match how {
            "channel closed" => served.to_agent = None,
            _ => served.stop.cancel(),
        }
        served.task.await.unwrap();
        dies(child, &format!("{how}: the child survived")).await;
        dies(grandchild, &format!("{how}: the child's own child survived")).await;
    }
}

#[tokio::test]
async fn the_childs_exit_and_overlong_lines_close_the_channel_with_a_reason() {
    let d = dirs();
    let mut served = serve(host(&d.root), stdio("sh", &["-c", "echo bye; exit 3"], &[], &d.root)).await;
    let (lines, reason) = served.until_close().await;
    assert_eq!(lines, [Bytes::from("bye")]);
    assert!(reason.contains("exited") && reason.contains('3'), "{reason}");

    let host = host_with(&d.root, &[("PATH", &path_var())], &["PATH"], 1000);
    let script = "echo short; head -c 5000 /dev/zero | tr '\\0' a; echo; sleep 30";
    let mut served = serve(host, stdio("sh", &["-c", script], &[], &d.root)).await;
    let (lines, reason) = served.until_close().await;
    assert_eq!(lines, [Bytes::from("short")]);
    assert!(reason.contains("frame limit of 1000"), "{reason}");
    dies(served.pid.unwrap(), "the server outlived its closed channel").await;
}

#[tokio::test]
async fn a_command_that_cannot_run_closes_the_channel_saying_why() {
    let d = dirs();
    // The guard starts, then can't become the command: its exit and its reason close the channel.
    let mut served = serve(host(&d.root), stdio("no-such-command-here", &[], &[], &d.root)).await;
    let (lines, reason) = served.until_close().await;
    assert!(lines.is_empty());
    assert!(reason.contains("127") && reason.contains("no-such-command-here"), "{reason}");
    // Without the guard, the launch itself fails and the channel is refused.
    let mut direct = host(&d.root);
    direct.set_guard(None);
    let reason = prepare(&direct, stdio("no-such-command-here", &[], &[], &d.root)).await.err().unwrap();
    assert!(reason.contains("no-such-command-here"), "{reason}");
}

/// `scopegate __child-guard` under a parent that is then SIGKILLed: the command it became dies.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_child_guard_takes_its_command_down_with_a_killed_parent() {
    let script = format!("\"{SCOPEGATE}\" __child-guard $$ -- sleep 30 & echo $!; wait");
    let mut parent = tokio::process::Command::new("sh")
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(parent.stdout.take().unwrap()).lines();
    let pid: u32 = lines.next_line().await.unwrap().unwrap().parse().unwrap();
    eventually("the guard never became `sleep`", || async {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
    })
    .await;
    parent.start_kill().unwrap(); // SIGKILL: the parent can't clean up.
    parent.wait().await.unwrap();
    dies(pid, "the command outlived its killed parent").await;
}

#[test]
fn the_child_guard_refuses_to_run_for_a_parent_that_is_not_its_own() {
    let out = std::process::Command::new(SCOPEGATE).args(["__child-guard", "1", "--", "echo", "ran"]).output().unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "the command ran");
    assert!(String::from_utf8_lossy(&out.stderr).contains("already gone"));
}

#[tokio::test]
async fn files_are_read_inside_the_root_in_bounded_chunks() {
    let d = dirs();
    let content: Vec<u8> = (0..150 * 1024).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.root.join("work/.mcp.json"), &content).unwrap();
    let host = host(&d.root);
    let file = format!("{}/work/.mcp.json", uri(&d.root));
    let mut served = serve(host, Open::ReadFile { uri: file.clone(), max_bytes: 200 * 1024 }).await;
    let (chunks, reason) = served.until_close().await;
    assert_eq!(reason, "");
    assert!(chunks.len() >= 3 && chunks.iter().all(|c| c.len() <= 64 * 1024), "{}", chunks.len());
    assert_eq!(chunks.concat(), content);

    // Each refusal carries its class for the gateway, and its reason for people.
    let fifo = std::process::Command::new("mkfifo").arg(d.root.join("work/fifo")).status().unwrap();
    assert!(fifo.success());
    std::os::unix::fs::symlink(d.outside.join("secret.json"), d.root.join("work/escape")).unwrap();
    std::fs::write(d.outside.join("secret.json"), b"{}").unwrap();
    let host = host_with(&d.root, &[], &[], 1 << 20);
    let root = uri(&d.root);
    let rows = [
        ("over the limit", file.clone(), 100 * 1024, Refusal::TooLarge, "over the limit"),
        ("a folder", format!("{root}/work"), 1 << 20, Refusal::NotAFile, "not a regular file"),
        ("a named pipe, not waited on", format!("{root}/work/fifo"), 1 << 20, Refusal::NotAFile, "not a regular file"),
        ("missing", format!("{root}/nope"), 1, Refusal::NotFound, "No such file"),
        ("a link out of the root", format!("{root}/work/escape"), 1 << 20, Refusal::OutsideRoot, "outside"),
        ("outside as written", uri(&d.outside.join("secret.json")), 1 << 20, Refusal::OutsideRoot, "outside"),
        ("not a file: URI", "work/.mcp.json".to_owned(), 1 << 20, Refusal::Invalid, "not a file: URI"),
    ];
    for (what, file, max_bytes, class, text) in rows {
        let Ok(opened) = tokio::time::timeout(WAIT, prepare(&host, Open::ReadFile { uri: file, max_bytes })).await
        else {
            // Opening the pipe waits for a writer: be one, so the blocked thread ends and the
            // test fails rather than hangs.
            let _ = std::fs::OpenOptions::new().write(true).open(d.root.join("work/fifo"));
            panic!("{what}: no answer within {WAIT:?}");
        };
        let reason = opened.err().unwrap_or_else(|| panic!("{what}: opened"));
        assert_eq!(Refusal::split(&reason).0, Some(class), "{what}: {reason}");
        assert!(Refusal::split(&reason).1.contains(text), "{what}: {reason}");
    }
}

#[tokio::test]
async fn an_http_server_is_bridged_with_declared_headers() {
    let d = dirs();
    let (_fixture, addr) = fixture_http(&["http", "127.0.0.1:0"], &[]).await;
    let host = host_with(&d.root, &[("AGENT_KEY", "k-1")], &[], 1 << 20);
    let open = Open::Http {
        server: "web".into(),
        url: format!("http://{addr}/mcp"),
        headers: BTreeMap::from([("x-declared".into(), "key ${AGENT_KEY}".into())]),
        assertion_header: "x-scopegate-identity".into(),
    };
    let mut served = serve(host, open).await;
    served.send(initialize(1)).await;
    assert!(served.answer(1).await["result"]["serverInfo"].is_object());
    served.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    served
        .send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "over http"}}}))
        .await;
    assert_eq!(served.answer(2).await["result"]["content"][0]["text"], "over http");
    // Something that is not a client message closes the channel with a reason.
    served.to_agent.as_ref().unwrap().send(Bytes::from_static(b"not json")).await.unwrap();
    let (_, reason) = served.until_close().await;
    assert!(reason.contains("not a JSON-RPC client message"), "{reason}");
}

fn executor(args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(SCOPEGATE);
    cmd.arg("executor").args(args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("SCOPEGATE_") {
            cmd.env_remove(key);
        }
    }
    // No config file and no database: run where there is neither.
    cmd.current_dir(std::env::temp_dir()).output().unwrap()
}

#[test]
fn bad_executor_arguments_are_refused_clearly() {
    let d = dirs();
    let secret = d.outside.join("secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let secret = secret.to_str().unwrap();
    let root = uri(&d.root);
    let (g, dir) = ("http://127.0.0.1:9", d.root.display().to_string());
    let missing = d.root.join("missing").display().to_string();
    let base = ["--name", "build-box", "--secret-file", secret];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|s| (*s).to_owned()).collect() };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (with(&["--gateway", "http://127.0.0.1:9"]), "--root"),
        (with(&["--gateway", "http://127.0.0.1:9", "--root", "some/dir"]), "--root"),
        (with(&["--gateway", "http://127.0.0.1:9", "--root", d.root.to_str().unwrap()]), "native path"),
        (with(&["--gateway", "http://127.0.0.1:9", "--root", &format!("{root}/missing")]), "--root"),
        (with(&["--gateway", "http://127.0.0.1:9", "--root", &uri(Path::new(secret))]), "not a directory"),
        (with(&["--root", &root]), "--gateway"),
        (with(&["--gateway", "ftp://127.0.0.1:9", "--root", &root]), "--gateway"),
        (
            vec!["--gateway", "http://127.0.0.1:9", "--name", "b", "--secret-file", "/nonexistent/s", "--root", &root]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            "--secret-file",
        ),
        (with(&["--gateway", "http://127.0.0.1:9", "--root", &root, "--ca-file", secret]), "--ca-file"),
        (with(&["--gateway", "http://127.0.0.1:9", "--root", &root, "--backoff-max-secs", "0"]), "backoff-max-secs"),
        (with(&["--gateway", g, "--root", "file:///C:/plugins", "--root-dir", &missing]), "--root-dir"),
        (with(&["--gateway", g, "--root", "file:///C:/plugins", "--root-dir", secret]), "not a directory"),
        (with(&["--gateway", g, "--root", "file:///C:/plugins"]), "--root-dir"),
        (with(&["--gateway", g, "--root", "file:///C:plugins", "--root-dir", &dir]), "drive-relative"),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = executor(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let help = std::process::Command::new(SCOPEGATE).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("executor") && !help.contains("child-guard"), "{help}");
    let help = executor(&["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("--root-dir <DIR>"), "the mapping is documented");
}
