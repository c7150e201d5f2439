//! Reading one file on a remote executor through its agent (a selected plugin root's
//! `.mcp.json`): a ReadFile channel on the agent's tunnel, its bytes collected under the
//! caller's limit and deadline, every outcome a [`ReadFileError`]. Never touches the gateway's
//! own filesystem and never turns the URI into a host path: the path is the executor's, and
//! only its agent reads it.
//!
//! The agent checks the path on its own terms (inside its root once symlinks are resolved, a
//! regular file, no larger than `max_bytes`); the gateway checks too, without trusting it: the
//! URI must lie inside the root the agent reports, and more than `max_bytes` received ends the
//! read with an error rather than a longer buffer.

use std::time::Duration;

use crate::decl::ExecutorId;
use crate::decl::PathUri;
use crate::executor::agents::Agents;
use crate::telemetry::metrics;
use crate::tunnel::{Open, Refusal, TunnelError, TunnelHandle};

/// Why a file could not be read through an executor. The refusals keep the agent's reason
/// (without its class code); [`ReadFileError::OutsideRoot`] may also be the gateway's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadFileError {
    /// No agent of the executor is connected to this gateway replica now.
    #[error("executor `{0}` is not connected to this gateway")]
    NotConnected(String),
    /// The path lies outside the agent's root: as written (checked by the gateway before
    /// asking) or once the agent resolved its symlinks.
    #[error("{0}")]
    OutsideRoot(String),
    /// Nothing is at the path on the executor.
    #[error("{0}")]
    NotFound(String),
    /// A folder, a pipe, a device: not a regular file.
    #[error("{0}")]
    NotAFile(String),
    /// The agent found the file larger than `max_bytes` (at open, or as it grew while read).
    #[error("{0}")]
    TooLarge(String),
    /// Any other refusal: the file is unreadable, the request is not understood (an older
    /// agent), the agent is too busy; its reason as given.
    #[error("the executor refused to read the file: {0}")]
    Refused(String),
    /// The agent sent more than `max_bytes`, which it had promised not to: the gateway ended
    /// the read and dropped what had arrived.
    #[error("the executor sent more than the limit of {max_bytes} bytes")]
    OverLimit { max_bytes: u64 },
    /// The agent accepted the read, then ended it with an error.
    #[error("the executor failed while reading the file: {0}")]
    Failed(String),
    /// The executor's connection ended before the whole file arrived.
    #[error("the executor's connection ended during the read: {0}")]
    Disconnected(String),
    /// The whole file did not arrive within the caller's timeout.
    #[error("the executor did not deliver the file within {0:?}")]
    Timeout(Duration),
}

impl ReadFileError {
    /// The metric label and log field of this outcome.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::NotConnected(_) => "not_connected",
            Self::OutsideRoot(_) => "outside_root",
            Self::NotFound(_) => "not_found",
            Self::NotAFile(_) => "not_a_file",
            Self::TooLarge(_) => "too_large",
            Self::Refused(_) => "refused",
            Self::OverLimit { .. } => "over_limit",
            Self::Failed(_) => "failed",
            Self::Disconnected(_) => "disconnected",
            Self::Timeout(_) => "timeout",
        }
    }
}

impl Agents {
    /// Reads the file at `uri` on `executor`'s machine, through its connected agent: at most
    /// `max_bytes`, all of it within `timeout` (the open included). `uri` is sent as its
    /// canonical `file:` string, in the executor's own convention; it must lie inside the root
    /// the agent reports (checked lexically here, and again by the agent on its filesystem).
    pub async fn read_file(
        &self,
        executor: &ExecutorId,
        uri: &PathUri,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, ReadFileError> {
        let started = tokio::time::Instant::now();
        let result = match self.reach(executor.as_str()).await {
            None => Err(ReadFileError::NotConnected(executor.to_string())),
            Some(link) if !link.root.contains(uri) => Err(ReadFileError::OutsideRoot(format!(
                "{uri} is outside the root {} of executor `{executor}`",
                link.root
            ))),
            Some(link) => {
                let read = read(link.tunnel(), uri, max_bytes, timeout).await;
                link.counted();
                read
            }
        };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(bytes) => {
                metrics::executor_file_read("ok");
                tracing::debug!(%executor, %uri, bytes = bytes.len(), elapsed_ms, "read a file through the executor");
            }
            Err(e) => {
                let outcome = e.outcome();
                metrics::executor_file_read(outcome);
                match e {
                    // The agent broke its word or the read broke down: worth an operator's look.
                    ReadFileError::OverLimit { .. }
                    | ReadFileError::Failed(_)
                    | ReadFileError::Disconnected(_)
                    | ReadFileError::Timeout(_) => {
                        tracing::warn!(%executor, %uri, outcome, elapsed_ms, error = %e, "a file read through the executor failed")
                    }
                    ReadFileError::NotConnected(_)
                    | ReadFileError::OutsideRoot(_)
                    | ReadFileError::NotFound(_)
                    | ReadFileError::NotAFile(_)
                    | ReadFileError::TooLarge(_)
                    | ReadFileError::Refused(_) => {
                        tracing::info!(%executor, %uri, outcome, elapsed_ms, error = %e, "a file read through the executor was refused")
                    }
                }
            }
        }
        result
    }
}

/// One read over `tunnel`: opens the channel, collects Data frames (reading them is what grants
/// the agent more credit) until the agent closes it, and maps how it ended.
async fn read(
    tunnel: &TunnelHandle,
    uri: &PathUri,
    max_bytes: u64,
    timeout: Duration,
) -> Result<Vec<u8>, ReadFileError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let open = Open::ReadFile { uri: uri.to_string(), max_bytes };
    let channel = tunnel.open(&open, timeout).await.map_err(|e| match e {
        TunnelError::Refused(reason) => classified(&reason, ReadFileError::Refused),
        TunnelError::Closed(reason) => ReadFileError::Disconnected(reason),
        TunnelError::Timeout(_) => ReadFileError::Timeout(timeout),
        too_large @ TunnelError::TooLarge { .. } => ReadFileError::Failed(too_large.to_string()),
    })?;
    let (tx, mut rx) = channel.split();
    let mut bytes = Vec::new();
    loop {
        let chunk = match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(_) => {
                tx.close("the gateway stopped waiting for the file");
                return Err(ReadFileError::Timeout(timeout));
            }
        };
        // Checked before the chunk is kept: the buffer never holds more than `max_bytes`.
        if (bytes.len() as u64).saturating_add(chunk.len() as u64) > max_bytes {
            tx.close(&format!("the file is over the gateway's limit of {max_bytes} bytes"));
            return Err(ReadFileError::OverLimit { max_bytes });
        }
        bytes.extend_from_slice(&chunk);
    }
    // The reason is set before the end is seen; its absence would be a broken tunnel, and a
    // read is complete only when the agent says so.
    let Some(reason) = rx.close_reason() else {
        return Err(ReadFileError::Disconnected("the channel ended without a reason".to_owned()));
    };
    if reason.is_empty() {
        return Ok(bytes);
    }
    // A tunnel's own end never carries a class: a classified reason is the agent's.
    if Refusal::split(&reason).0.is_none() && tunnel.is_closed() {
        return Err(ReadFileError::Disconnected(reason));
    }
    Err(classified(&reason, ReadFileError::Failed))
}

/// The error for an agent's reason, by its class; `otherwise` takes the reasons of no class
/// this API names.
fn classified(reason: &str, otherwise: fn(String) -> ReadFileError) -> ReadFileError {
    let (class, text) = Refusal::split(reason);
    let text = text.to_owned();
    match class {
        Some(Refusal::OutsideRoot) => ReadFileError::OutsideRoot(text),
        Some(Refusal::NotFound) => ReadFileError::NotFound(text),
        Some(Refusal::NotAFile) => ReadFileError::NotAFile(text),
        Some(Refusal::TooLarge) => ReadFileError::TooLarge(text),
        Some(Refusal::Invalid | Refusal::Unreadable | Refusal::Unreachable | Refusal::TimedOut) | None => {
            otherwise(text)
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::future::Future;

    use bytes::Bytes;
    use tokio::io::DuplexStream;
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::protocol::Role;

    use super::*;
    use crate::decl::PathStyle;
    use crate::store::entities::Executor as ExecutorRow;
    use crate::tunnel::{self, Incoming, PendingOpen, Settings, Side};

    pub(in crate::executor) const WAIT: Duration = Duration::from_secs(5);

    pub(in crate::executor) fn settings() -> Settings {
        Settings { max_frame: 64 * 1024, window: 4, heartbeat: Duration::from_secs(30) }
    }

    pub(in crate::executor) async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
        tokio::time::timeout(WAIT, future).await.unwrap_or_else(|_| panic!("{what}: not within {WAIT:?}"))
    }

    /// The gateway's end and a scripted agent's end of one real tunnel, over memory.
    pub(in crate::executor) struct Pair {
        pub gateway: TunnelHandle,
        _gateway_incoming: Incoming,
        pub agent: TunnelHandle,
        pub incoming: Incoming,
    }

    pub(in crate::executor) async fn pair() -> Pair {
        let settings = settings();
        let (a, b) = tokio::io::duplex(256 * 1024);
        let config = Some(tunnel::ws_config(&settings));
        let server = WebSocketStream::<DuplexStream>::from_raw_socket(a, Role::Server, config).await;
        let client = WebSocketStream::<DuplexStream>::from_raw_socket(b, Role::Client, config).await;
        let (gateway, gateway_incoming) = tunnel::start(server, Side::Gateway, settings.clone());
        let (agent, incoming) = tunnel::start(client, Side::Agent, settings);
        Pair { gateway, _gateway_incoming: gateway_incoming, agent, incoming }
    }

    fn uri(text: &str) -> PathUri {
        PathUri::parse(text, PathStyle::Posix).unwrap()
    }

    /// The uri and limit of a ReadFile request.
    fn asked(pending: &PendingOpen) -> (String, u64) {
        match &pending.open {
            Open::ReadFile { uri, max_bytes } => (uri.clone(), *max_bytes),
            other => panic!("not a ReadFile: {other:?}"),
        }
    }

    #[tokio::test]
    async fn every_refusal_class_becomes_its_own_error_keeping_the_reason() {
        let mut pair = pair().await;
        let rows: [(&str, &str, ReadFileError); 8] = [
            ("[outside_root] p is outside", "outside_root", ReadFileError::OutsideRoot("p is outside".into())),
            ("[not_found] p: No such file", "not_found", ReadFileError::NotFound("p: No such file".into())),
            ("[not_a_file] p is a folder", "not_a_file", ReadFileError::NotAFile("p is a folder".into())),
            ("[too_large] p has 9 bytes", "too_large", ReadFileError::TooLarge("p has 9 bytes".into())),
            ("[unreadable] p: denied", "refused", ReadFileError::Refused("p: denied".into())),
            ("[invalid] p: bad uri", "refused", ReadFileError::Refused("p: bad uri".into())),
            // An older agent sends no class; an unknown class is no class.
            ("no such file", "refused", ReadFileError::Refused("no such file".into())),
            ("[new_kind] x", "refused", ReadFileError::Refused("[new_kind] x".into())),
        ];
        for (reason, outcome, expected) in rows {
            let gateway = pair.gateway.clone();
            let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/p"), 10, WAIT).await });
            let pending = within("the request", pair.incoming.next()).await.unwrap();
            assert_eq!(asked(&pending), ("file:///r/p".to_owned(), 10), "sent as the canonical URI with the limit");
            pending.refuse(reason);
            let err = within("the refusal", reading).await.unwrap().unwrap_err();
            assert_eq!(err, expected, "{reason}");
            assert_eq!(err.outcome(), outcome, "{reason}");
        }
        assert_eq!(pair.gateway.channels_open(), 0);
    }

    /// The gateway does not trust the agent's bound: more than `max_bytes` ends the read, and
    /// the agent's channel is closed with the reason (it can't keep sending).
    #[tokio::test]
    async fn an_agent_sending_past_the_limit_is_stopped() {
        let mut pair = pair().await;
        let gateway = pair.gateway.clone();
        let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/p"), 10, WAIT).await });
        let (tx, mut rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
        let flood = tokio::spawn(async move {
            let mut sent = 0u64;
            while tx.send(Bytes::from_static(b"12345678")).await.is_ok() {
                sent += 8;
            }
            sent
        });
        assert_eq!(within("the read", reading).await.unwrap(), Err(ReadFileError::OverLimit { max_bytes: 10 }));
        let sent = within("the agent is stopped", flood).await.unwrap();
        assert!(sent <= 8 * 8, "the agent could send {sent} bytes after the limit");
        assert_eq!(within("the close", rx.recv()).await, None);
        let reason = rx.close_reason().unwrap();
        assert!(reason.contains("limit of 10 bytes"), "{reason}");

        // Exactly the limit, over several frames, is a whole file.
        let gateway = pair.gateway.clone();
        let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/p"), 10, WAIT).await });
        let (tx, _rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
        for part in [&b"1234"[..], b"567", b"890"] {
            tx.send(Bytes::copy_from_slice(part)).await.unwrap();
        }
        tx.close("");
        assert_eq!(within("the read", reading).await.unwrap().unwrap(), b"1234567890");
    }

    /// Many more frames than a window: credit comes back as the gateway reads, all arrive, in
    /// order.
    #[tokio::test]
    async fn a_file_of_many_windows_arrives_whole_and_in_order() {
        let mut pair = pair().await;
        let content: Vec<u8> = (0..200 * 1000).map(|i| (i % 253) as u8).collect();
        let gateway = pair.gateway.clone();
        let max = content.len() as u64;
        let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/big"), max, WAIT).await });
        let (tx, _rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
        for chunk in content.chunks(1000) {
            within("credit", tx.send(Bytes::copy_from_slice(chunk))).await.unwrap();
        }
        tx.close("");
        assert_eq!(within("the read", reading).await.unwrap().unwrap(), content);
        assert_eq!(pair.gateway.channels_open(), 0);
    }

    #[tokio::test]
    async fn a_silent_agent_times_out_and_its_channel_is_closed() {
        let mut pair = pair().await;
        let short = Duration::from_millis(200);
        // Never answering the open.
        let gateway = pair.gateway.clone();
        let started = tokio::time::Instant::now();
        let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/p"), 10, short).await });
        let unanswered = within("the request", pair.incoming.next()).await.unwrap();
        assert_eq!(within("the read", reading).await.unwrap(), Err(ReadFileError::Timeout(short)));
        drop(unanswered);
        // Answering, sending part of the file, then nothing.
        let gateway = pair.gateway.clone();
        let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/p"), 10, short).await });
        let (tx, mut rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
        tx.send(Bytes::from_static(b"12")).await.unwrap();
        assert_eq!(within("the read", reading).await.unwrap(), Err(ReadFileError::Timeout(short)));
        assert!(started.elapsed() < Duration::from_secs(2), "bounded by the timeout: {:?}", started.elapsed());
        assert_eq!(within("the close", rx.recv()).await, None);
        assert!(rx.close_reason().unwrap().contains("stopped waiting"), "{:?}", rx.close_reason());
        assert_eq!(pair.gateway.channels_open(), 0);
    }

    #[tokio::test]
    async fn an_end_after_opening_is_told_apart_from_a_whole_file() {
        let mut pair = pair().await;
        let rows = [
            ("[too_large] p grew over the limit", ReadFileError::TooLarge("p grew over the limit".into())),
            ("[unreadable] reading p: I/O error", ReadFileError::Failed("reading p: I/O error".into())),
            ("the executor is stopping", ReadFileError::Failed("the executor is stopping".into())),
        ];
        for (reason, expected) in rows {
            let gateway = pair.gateway.clone();
            let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/p"), 100, WAIT).await });
            let (tx, _rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
            tx.send(Bytes::from_static(b"part")).await.unwrap();
            tx.close(reason);
            assert_eq!(within("the read", reading).await.unwrap(), Err(expected), "{reason}");
        }
        // The tunnel ending mid-read: one frame past the window is sent only once the gateway
        // has read some, so the read is under way when the tunnel ends.
        let gateway = pair.gateway.clone();
        let reading = tokio::spawn(async move { read(&gateway, &uri("file:///r/p"), 100, WAIT).await });
        let (tx, _rx) = within("the request", pair.incoming.next()).await.unwrap().accept().split();
        for _ in 0..=settings().window {
            within("credit", tx.send(Bytes::from_static(b"part"))).await.unwrap();
        }
        pair.agent.close("the agent went away");
        let err = within("the read", reading).await.unwrap().unwrap_err();
        assert!(matches!(&err, ReadFileError::Disconnected(r) if r.contains("the agent went away")), "{err:?}");
        // And before the open was answered: the tunnel is gone.
        let err = read(&pair.gateway, &uri("file:///r/p"), 100, WAIT).await.unwrap_err();
        assert_eq!(err.outcome(), "disconnected", "{err:?}");
    }

    /// The registry: an executor with no agent is refused at once; a URI outside the root the
    /// agent reports, or in another convention, never reaches the agent.
    #[tokio::test]
    async fn the_registry_checks_the_executor_and_the_root_before_asking() {
        let mut pair = pair().await;
        let agents = Agents::new();
        let id = ExecutorId::new("build-01");
        let started = tokio::time::Instant::now();
        let err = agents.read_file(&id, &uri("file:///r/p"), 10, WAIT).await.unwrap_err();
        assert_eq!(err, ReadFileError::NotConnected("build-01".into()));
        assert!(started.elapsed() < Duration::from_secs(1));

        let row = ExecutorRow {
            id: "e1".into(),
            name: "build-01".into(),
            machine: "build-01".into(),
            run_as: "ci".into(),
            kind: "remote".into(),
        };
        let reservation = agents.reserve(row, uri("file:///r"), "hash".into()).unwrap();
        let tunnel = pair.gateway.clone();
        let _live = tokio::spawn(reservation.live(tunnel));
        within("the agent is live", async {
            while agents.link("build-01").is_none() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        let windows = PathUri::parse("file:///C:/r/p", PathStyle::Windows).unwrap();
        for outside in [uri("file:///etc/passwd"), uri("file:///r/../etc/passwd"), uri("file:///rx/p"), windows] {
            let err = agents.read_file(&id, &outside, 10, WAIT).await.unwrap_err();
            assert!(
                matches!(&err, ReadFileError::OutsideRoot(r) if r.contains("outside the root file:///r")),
                "{err:?}"
            );
        }
        let nothing = tokio::time::timeout(Duration::from_millis(100), pair.incoming.next()).await;
        assert!(nothing.is_err(), "a request outside the root reached the agent");

        // Inside the root, the agent is asked.
        let reading = {
            let agents = std::sync::Arc::clone(&agents);
            let id = id.clone();
            tokio::spawn(async move { agents.read_file(&id, &uri("file:///r/plugin/.mcp.json"), 10, WAIT).await })
        };
        let pending = within("the request", pair.incoming.next()).await.unwrap();
        assert_eq!(asked(&pending).0, "file:///r/plugin/.mcp.json");
        let (tx, _rx) = pending.accept().split();
        tx.send(Bytes::from_static(b"{}")).await.unwrap();
        tx.close("");
        assert_eq!(within("the read", reading).await.unwrap().unwrap(), b"{}");
    }
}
