//! The `scopegate` binary as a child process (clean of the caller's `SCOPEGATE_*`
//! environment), its outcome, whether a process still runs, and `scopegate serve` processes
//! (replicas on one database).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use super::wait::eventually;

/// The gateway's binary.
pub const SCOPEGATE: &str = env!("CARGO_BIN_EXE_scopegate");

/// `scopegate` run in `dir`, without the caller's `SCOPEGATE_*` variables, logging warnings.
pub fn scopegate(dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(SCOPEGATE);
    cmd.current_dir(dir);
    for (key, _) in std::env::vars() {
        if key.starts_with("SCOPEGATE_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_LOG", "warn");
    // Every gateway a test starts scrapes on a port of its own, never the shared default.
    cmd.env("SCOPEGATE_METRICS__LISTEN", "127.0.0.1:0");
    // The tests' own secret: the shipped one is refused wherever others could reach the gateway.
    cmd.env("SCOPEGATE_AUTH__HS256_SECRET", super::tokens::TEST_SECRET);
    cmd
}

/// Runs `scopegate migrate` on the database at `url`, in `dir`: it creates a missing SQLite
/// database, which the admin commands refuse to do.
pub fn migrate(dir: &std::path::Path, url: &str) {
    let out = scopegate(dir).env("SCOPEGATE_DATABASE__URL", url).arg("migrate").output().unwrap();
    assert!(out.status.success(), "migrate: {}", String::from_utf8_lossy(&out.stderr));
}

/// Runs `scopegate admin ARGS` against the database at `url`, in `dir`: (success, stdout, stderr).
pub fn admin(dir: &std::path::Path, url: &str, args: &[&str]) -> (bool, String, String) {
    let out = scopegate(dir).env("SCOPEGATE_DATABASE__URL", url).arg("admin").args(args).output().unwrap();
    outcome(&out)
}

/// Whether a command succeeded, and its stdout and stderr.
pub fn outcome(out: &std::process::Output) -> (bool, String, String) {
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether process `pid` runs (a zombie, which only waits to be reaped, does not).
pub fn pid_alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

/// Waits until process `pid` (`what`) no longer runs.
pub async fn wait_gone(pid: u64, what: &str) {
    eventually(format!("{what} (pid {pid}) is still running"), || async { !pid_alive(pid) }).await
}

/// A `scopegate serve` process; killed when dropped. Its stderr is drained on a thread (a
/// full pipe would stall the gateway) and kept for failure messages.
pub struct Replica {
    pub child: Child,
    /// `HOST:PORT` it listens on.
    pub addr: String,
    /// `http://HOST:PORT/metrics` of its metrics listener, when metrics are on.
    pub metrics_url: Option<String>,
    pub log: Arc<std::sync::Mutex<String>>,
}

impl Replica {
    /// `scopegate serve` in `dir` on the database at `db_url`, its public URL (the tokens'
    /// audience) `public_url`.
    pub fn start(dir: &std::path::Path, db_url: &str, public_url: &str) -> Self {
        Self::start_with(dir, db_url, public_url, &[])
    }

    /// A replica with further `SCOPEGATE_*` settings (after the defaults below, so they win).
    pub fn start_with(dir: &std::path::Path, db_url: &str, public_url: &str, env: &[(&str, &str)]) -> Self {
        Self::start_on(dir, db_url, public_url, "127.0.0.1:0", env)
    }

    /// `scopegate serve --demo` as the quick start runs it (its own address its public URL),
    /// on the database at `db_url`, on a free loopback port.
    pub fn demo(dir: &std::path::Path, db_url: &str) -> Self {
        let mut command = scopegate(dir);
        // As written: the shipped development secret, which a loopback-only gateway keeps.
        command
            .args(["serve", "--demo", "--listen", "127.0.0.1:0"])
            .env("SCOPEGATE_DATABASE__URL", db_url)
            .env_remove("SCOPEGATE_AUTH__HS256_SECRET");
        Self::spawn(command)
    }

    /// [`Replica::start_with`] listening on `listen` (a replica restarted where it was).
    pub fn start_on(dir: &std::path::Path, db_url: &str, public_url: &str, listen: &str, env: &[(&str, &str)]) -> Self {
        let mut command = scopegate(dir);
        command
            .args(["serve", "--listen", listen])
            .env("SCOPEGATE_DATABASE__URL", db_url)
            .env("SCOPEGATE_SERVER__PUBLIC_URL", public_url)
            // The replicas take the whole load of one tenant; the rate limits are not under test.
            .env("SCOPEGATE_LIMITS__TENANT_PER_SEC", "0")
            .env("SCOPEGATE_LIMITS__USER_PER_SEC", "0");
        for (name, value) in env {
            command.env(name, value);
        }
        Self::spawn(command)
    }

    fn spawn(mut command: std::process::Command) -> Self {
        let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn scopegate serve");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut seen = String::new();
        let mut metrics_url = None;
        let addr = loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap() == 0 {
                panic!("the gateway exited before listening: {seen}");
            }
            if let Some(rest) = line.strip_prefix("scopegate listening on http://") {
                break rest.trim().to_owned();
            }
            if let Some(rest) = line.strip_prefix("scopegate metrics on ") {
                metrics_url = Some(rest.trim().to_owned());
            }
            seen.push_str(&line);
        };
        let log = Arc::new(std::sync::Mutex::new(seen));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
            sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&rest);
        });
        Self { child, addr, metrics_url, log }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
