//! The `scopegate` binary as a child process (clean of the caller's `SCOPEGATE_*`
//! environment), its outcome, and whether a process still runs.

use std::process::Command;

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
    cmd
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
