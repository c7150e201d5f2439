//! Remote executors in tests: a [`Site`] is a gateway with the executors' secrets and an
//! agent root holding `work/`; an [`Agent`] is a real `scopegate executor` process (inside a
//! network namespace when asked), killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use scopegate::model::Role;
use scopegate::store::entities;
use serde_json::{Value, json};

use super::db::Backend;
use super::fixtures::{spawn_fixture, stdio_declaration};
use super::gateway::{Live, TestGateway};
use super::netns::Netns;
use super::process::SCOPEGATE;
use super::wait::{eventually, eventually_within};

/// A variable only the agents' environment has: a server that reports it ran there.
pub const AGENT_ONLY: &str = "SCOPEGATE_TEST_AGENT_ONLY";

/// How long an agent may take to connect, or to log what it did: agents are processes that
/// dial the gateway and back off between tries, and a loaded 2-core CI machine runs several.
/// A passing test never waits it out.
const AGENT_PATIENCE: Duration = Duration::from_secs(40);

/// A gateway (restartable on the same address and database), the executors' secrets, and an
/// agent root holding `work/`.
pub struct Site {
    pub live: Live,
    pub root: tempfile::TempDir,
    /// The executors' secret files and the agents' logs.
    pub files: tempfile::TempDir,
}

impl Site {
    pub async fn start(backend: Backend, overrides: &[(&str, Value)]) -> Self {
        let live = TestGateway::new(backend)
            .set("upstream.connect_timeout_secs", json!(5))
            .set("upstream.executor_recheck_ms", json!(200))
            .set("server.shutdown_grace_secs", json!(1))
            .overrides(overrides)
            .start()
            .await;
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("work")).unwrap();
        let mut tx = live.db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
        tx.commit().await.unwrap();
        Self { live, root, files: tempfile::tempdir().unwrap() }
    }

    /// A site an agent inside `netns` can reach: the gateway listens on the host's end of its
    /// veth pair.
    pub async fn start_for(backend: Backend, netns: &Netns, overrides: &[(&str, Value)]) -> Self {
        let mut all = vec![
            ("server.listen", json!(format!("{}:0", netns.host_ip))),
            ("server.allowed_hosts", json!([netns.host_ip])),
            ("auth.hs256_secret", json!("executor-netns-test-secret-0123456789abcdef")),
        ];
        all.extend(overrides.iter().cloned());
        Self::start(backend, &all).await
    }

    /// Waits until executor `name`'s agent is connected, or gone.
    pub async fn wait_connected(&self, name: &str, connected: bool) {
        let what = format!("executor {name} never became connected={connected}");
        eventually(what, || async { self.live.agents().link(name).is_some() == connected }).await
    }

    /// A remote executor owned by `tenants`; returns the file holding its secret.
    pub async fn remote_executor(&self, name: &str, machine: &str, user: &str, tenants: &[&str]) -> PathBuf {
        let mut tx = self.live.db.begin().await.unwrap();
        let secret = entities::create_executor(&mut tx, name, machine, user, "remote", tenants)
            .await
            .unwrap()
            .expect("a remote executor gets a secret");
        tx.commit().await.unwrap();
        let file = self.files.path().join(format!("{name}.secret"));
        std::fs::write(&file, format!("{secret}\n")).unwrap();
        file
    }

    pub fn root_uri(&self) -> String {
        format!("file://{}", self.root.path().canonicalize().unwrap().display())
    }

    /// A stdio declaration of the fixture as server `server`: its declared value comes from
    /// `value`, which may be a `${NAME}` reference.
    pub fn stdio(&self, server: &str, value: &str) -> Value {
        stdio_declaration(&self.live, server, value)
    }

    pub async fn entity(&self, tenant: &str, name: &str, declaration: &Value) {
        let mut tx = self.live.db.begin().await.unwrap();
        entities::create_entity(&mut tx, tenant, name, declaration).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// Declares `server` under `defaults/`, binds it to `executor`, grants the owner role
    /// every tool.
    pub async fn serve(&self, tenant: &str, server: &str, declaration: &Value, executor: &str) {
        self.entity(tenant, &format!("defaults/mcp-servers/{server}"), declaration).await;
        self.bind(tenant, server, executor).await;
    }

    pub async fn bind(&self, tenant: &str, server: &str, executor: &str) {
        let mut tx = self.live.db.begin().await.unwrap();
        entities::bind_server(&mut tx, tenant, server, executor).await.unwrap();
        entities::grant_tool(&mut tx, tenant, server, Role::Owner, "*").await.unwrap();
        tx.commit().await.unwrap();
    }

    /// Starts `scopegate executor` for `name` with `secret_file`, against this gateway.
    pub fn agent(&self, name: &str, secret_file: &Path) -> Agent {
        self.agent_to(name, secret_file, &[self.live.base_url()])
    }

    pub fn agent_to(&self, name: &str, secret_file: &Path, gateways: &[String]) -> Agent {
        self.agent_in(None, name, secret_file, gateways)
    }

    /// An agent, inside network namespace `netns` when given.
    pub fn agent_in(&self, netns: Option<&str>, name: &str, secret_file: &Path, gateways: &[String]) -> Agent {
        agent_process(self.files.path(), netns, name, secret_file, gateways, &["--root".into(), self.root_uri().into()])
    }

    /// An agent whose root is `root` standing for `dir` on this machine (`--root-dir`).
    pub fn agent_mapped(&self, name: &str, secret_file: &Path, root: &str, dir: &Path) -> Agent {
        let root_args = ["--root".into(), root.into(), "--root-dir".into(), dir.into()];
        agent_process(self.files.path(), None, name, secret_file, &[self.live.base_url()], &root_args)
    }

    /// Waits until a new session of `subject` lists `tool`: the agent is connected.
    pub async fn wait_for_tool(&self, subject: &str, tool: &str) {
        self.wait_for_tool_at(&self.live.base_url(), subject, tool).await
    }

    /// [`Site::wait_for_tool`], on the replica at `base`.
    pub async fn wait_for_tool_at(&self, base: &str, subject: &str, tool: &str) {
        eventually_within(AGENT_PATIENCE, format!("{tool} never appeared for {subject}"), || async {
            let client = self.live.client_at(base, subject).await;
            client.list_all_tools().await.unwrap().iter().any(|t| t.name == tool)
        })
        .await
    }
}

/// Starts `scopegate executor` for `name` with `secret_file` against `gateways` (inside network
/// namespace `netns` when given), logging into a file under `log_dir`.
pub fn agent_process(
    log_dir: &Path,
    netns: Option<&str>,
    name: &str,
    secret_file: &Path,
    gateways: &[String],
    root_args: &[std::ffi::OsString],
) -> Agent {
    let log = log_dir.join(format!("{name}-{}.log", uuid::Uuid::new_v4().simple()));
    let mut command = match netns {
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns, SCOPEGATE]);
            c
        }
        None => std::process::Command::new(SCOPEGATE),
    };
    command.arg("executor");
    for gateway in gateways {
        command.args(["--gateway", gateway]);
    }
    command
        .args(["--name", name, "--secret-file"])
        .arg(secret_file)
        .args(root_args)
        .args(["--backoff-max-secs", "1", "--heartbeat-secs", "1"])
        .env(AGENT_ONLY, format!("ran-on-{name}"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    Agent { child: command.spawn().expect("scopegate executor starts"), log }
}

/// A running agent process; killed when dropped.
pub struct Agent {
    pub child: std::process::Child,
    log: PathBuf,
}

impl Agent {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the agent's log holds `text`.
    pub async fn wait_log(&self, text: &str) {
        let what = format!("the agent never logged {text:?}");
        eventually_within(AGENT_PATIENCE, what, || async {
            let log = self.log();
            if log.contains(text) { Ok(()) } else { Err(format!("its log:\n{log}")) }
        })
        .await
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` to the agent; for `-STOP`, returns once every thread of it is stopped
    /// (`kill` returns when the signal is queued, and a busy machine may run the agent a
    /// little longer).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id();
        let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
        assert!(status.success());
        if signal != "-STOP" {
            return;
        }
        let stopped = || {
            let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
            threads.flatten().all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // The state follows the command's closing parenthesis.
                stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
            })
        };
        let started = std::time::Instant::now();
        while !stopped() {
            assert!(started.elapsed() < std::time::Duration::from_secs(5), "the agent did not stop");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fixture as a Streamable HTTP server `server_id` on the loopback of `netns` (only what
/// runs in the namespace reaches it): the process (killed when dropped) and its address.
pub async fn http_fixture_in(netns: &Netns, site: &Site, server_id: &str) -> (tokio::process::Child, String) {
    let jwks = format!("{}/.well-known/jwks.json", site.live.base_url());
    let issuer = site.live.config.public_url();
    let env = [
        ("FIXTURE_ASSERTION_HEADER", site.live.config.upstream.assertion_header.as_str()),
        ("FIXTURE_JWKS_URL", &jwks),
        ("FIXTURE_SERVER_ID", server_id),
        ("FIXTURE_ISSUER", &issuer),
    ];
    spawn_fixture(Some(&netns.name), &["http", "127.0.0.1:0"], &env).await
}
