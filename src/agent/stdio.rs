//! Stdio servers on the agent's machine: launched clean (only the inherited and declared
//! environment), each in its own process group, bridged line by line; a child never outlives
//! its channel, its connection or its agent.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

use super::Host;
use super::io::{MessageSink, MessageSource};

/// A launched stdio server, ready to be bridged.
pub struct StdioServer {
    server: String,
    child: Child,
    /// The child's pid, which is also its process group's id (kept: `Child::id` forgets it
    /// once the child is reaped, and the group may outlive it).
    pid: Option<u32>,
    stdin: ChildStdin,
    stdout: ChildStdout,
    max_frame: usize,
    /// The child's last stderr line, for the close reason when it exits (a guard that could
    /// not run the command says why there).
    last_stderr: Arc<Mutex<String>>,
    stderr_done: tokio::task::JoinHandle<()>,
}

/// Why the bridge of a stdio server ended.
enum End {
    /// The channel (or the whole tunnel) ended, or the agent is stopping.
    ChannelGone,
    Exited(std::io::Result<ExitStatus>),
    Failed(String),
}

impl StdioServer {
    pub(super) fn launch(
        host: &Host,
        server: &str,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: &Path,
    ) -> Result<Self, String> {
        let mut cmd = match &host.guard {
            Some(guard) => {
                let mut cmd = tokio::process::Command::new(guard);
                cmd.arg(super::guard::SUBCOMMAND).arg(std::process::id().to_string()).arg("--").arg(command);
                cmd
            }
            None => tokio::process::Command::new(command),
        };
        cmd.args(args).current_dir(cwd).env_clear();
        for name in &host.inherit_env {
            if let Some(value) = host.env.get(name) {
                cmd.env(name, value);
            }
        }
        cmd.envs(env).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        // Its own group, so the whole tree it starts can be killed with it.
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd.spawn().map_err(|e| format!("launching {command:?}: {e}"))?;
        let pid = child.id();
        let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill_tree(pid, &mut child);
            return Err(format!("launching {command:?}: no pipes"));
        };
        let name = server.to_owned();
        let last_stderr = Arc::new(Mutex::new(String::new()));
        let last = Arc::clone(&last_stderr);
        // The child's stderr is its log: into ours, line by line, so a full pipe never blocks it.
        let stderr_done = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(server = %name, "stdio server stderr: {line}");
                let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
                last.clear();
                last.extend(line.chars().take(512));
            }
        });
        tracing::info!(server, pid, "launched a stdio server");
        Ok(Self {
            server: server.to_owned(),
            child,
            pid,
            stdin,
            stdout,
            max_frame: host.max_frame,
            last_stderr,
            stderr_done,
        })
    }

    /// The launched process's id (for tests: its process group has the same id).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    pub(super) async fn run(self, sink: impl MessageSink, mut source: impl MessageSource, stop: CancellationToken) {
        let Self { server, mut child, pid, mut stdin, stdout, max_frame, last_stderr, stderr_done } = self;
        let to_child = async {
            let mut writable = true;
            while let Some(message) = source.recv().await {
                // A child that closed its stdin still gets to answer; its exit ends the channel.
                if writable {
                    let written = async {
                        stdin.write_all(&message).await?;
                        stdin.write_all(b"\n").await?;
                        stdin.flush().await
                    };
                    writable = written.await.is_ok();
                }
            }
            End::ChannelGone
        };
        let from_child = async {
            let mut stdout = BufReader::new(stdout);
            loop {
                match read_line(&mut stdout, max_frame).await {
                    Ok(Some(line)) => {
                        if sink.send(Bytes::from(line)).await.is_err() {
                            return End::ChannelGone;
                        }
                    }
                    Ok(None) => return End::Exited(child.wait().await),
                    Err(e) => return End::Failed(e),
                }
            }
        };
        let end = tokio::select! {
            end = to_child => end,
            end = from_child => end,
            () = stop.cancelled() => End::ChannelGone,
        };
        kill_tree(pid, &mut child);
        let _ = child.wait().await;
        let reason = match end {
            End::ChannelGone => String::new(),
            End::Exited(Ok(status)) => {
                // Its stderr may lag its exit: give it a moment (a grandchild may hold it open).
                let _ = tokio::time::timeout(std::time::Duration::from_millis(500), stderr_done).await;
                let last = last_stderr.lock().unwrap_or_else(PoisonError::into_inner).clone();
                if last.is_empty() {
                    format!("the server exited: {status}")
                } else {
                    format!("the server exited: {status} (its last stderr line: {last})")
                }
            }
            End::Exited(Err(e)) => format!("the server's exit status is unknown: {e}"),
            End::Failed(reason) => reason,
        };
        tracing::info!(%server, "stdio server ended: {}", if reason.is_empty() { "the channel closed" } else { &reason });
        sink.close(&reason);
    }
}

/// Kills the child's whole process group (it leads it), then the child itself.
fn kill_tree(pid: Option<u32>, child: &mut Child) {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|id| i32::try_from(id).ok()).and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let _ = child.start_kill();
}

/// One line of `reader` without its `\n`; `None` at the end. A line longer than `max` is an
/// error, found without buffering more than `max` bytes of it.
async fn read_line(reader: &mut (impl AsyncBufRead + Unpin), max: usize) -> Result<Option<Vec<u8>>, String> {
    let mut line = Vec::new();
    loop {
        let buf = reader.fill_buf().await.map_err(|e| format!("reading the server's output: {e}"))?;
        if buf.is_empty() {
            // A last line without its newline still counts.
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            return Err(format!("the server wrote a line over the frame limit of {max} bytes"));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(take + usize::from(done));
        if done {
            return Ok(Some(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_split_and_bounded() {
        let mut r = BufReader::with_capacity(4, &b"ab\n\ncdef\nlast"[..]);
        assert_eq!(read_line(&mut r, 10).await.unwrap().as_deref(), Some(&b"ab"[..]));
        assert_eq!(read_line(&mut r, 10).await.unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(read_line(&mut r, 10).await.unwrap().as_deref(), Some(&b"cdef"[..]));
        assert_eq!(read_line(&mut r, 10).await.unwrap().as_deref(), Some(&b"last"[..]));
        assert_eq!(read_line(&mut r, 10).await.unwrap(), None);
        let mut r = BufReader::with_capacity(4, &b"abcdefghijk\n"[..]);
        assert!(read_line(&mut r, 10).await.unwrap_err().contains("frame limit of 10"));
        let mut r = BufReader::with_capacity(4, &b"abcdefghij\n"[..]);
        assert_eq!(read_line(&mut r, 10).await.unwrap().map(|l| l.len()), Some(10), "exactly the limit fits");
    }
}
