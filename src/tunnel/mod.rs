//! The executor tunnel: one WebSocket between the gateway and an executor agent, carrying many
//! logical channels, each with its own flow control. It moves bytes; it never interprets what a
//! channel carries and never decides who may open one (the gateway's route authenticates the
//! agent before the tunnel starts).
//!
//! # Wire format
//!
//! Every WebSocket message is one binary frame (a text message is a protocol error):
//!
//! ```text
//! byte 0       kind: 1 Open, 2 Opened, 3 Refused, 4 Data, 5 Credit, 6 Close
//! bytes 1..5   channel id, u32 big-endian (0 is never a channel)
//! bytes 5..    payload:
//!                Open      the JSON of an [`Open`]
//!                Opened    empty
//!                Refused   UTF-8 reason
//!                Data      one message of the channel (one JSON-RPC message, a file chunk, a
//!                          fetch's response head or a chunk of its body)
//!                Credit    u32 big-endian: that many more Data frames may be sent
//!                Close     UTF-8 reason (empty: a normal end)
//! ```
//!
//! Only the gateway opens channels; it numbers them from 1 and never reuses a number within a
//! tunnel. A channel starts with a window of [`Settings::window`] Data frames in each direction;
//! the receiver grants credit back as its reader consumes them, so a slow reader stops its
//! writer and nothing queues without bound. A peer that sends past its window, an unknown
//! kind, an oversized frame or a frame for a channel that was never opened ends the tunnel (a
//! frame for a channel already closed is dropped: the peer may not have heard the Close yet).
//! Close is final for the channel on both sides. Both sides send a WebSocket ping every
//! [`Settings::heartbeat`]; a side that hears nothing for three heartbeats ends the tunnel.
//! When the tunnel ends, every channel ends with it: readers see the end, writers an error.
//!
//! A Refused reason, and a Close reason that is not empty, may start with a class in square
//! brackets and a space, `[not_found] file:///srv/p/.mcp.json: No such file or directory`, so
//! the gateway can tell refusals apart without reading prose (see [`Refusal`] for the codes;
//! the agent classifies its refusals about paths and files). The text after it is for people.
//! The class is optional and the payload is still one UTF-8 reason: a peer that does not know
//! a code, or meets a reason without one, treats the whole text as an unclassified reason, so
//! agents and gateways of either age understand each other.
//!
//! # Fetch channels
//!
//! An [`Open::Fetch`] is one HTTP exchange the agent performs over its own network (an OAuth
//! request for a server only the executor reaches). The whole request travels in the Open: its
//! body base64 in the JSON, at most [`FETCH_MAX_BODY`] bytes, so no Data frame goes to the
//! agent. The agent sends the request (following at most [`FETCH_MAX_REDIRECTS`] redirects
//! itself when asked, otherwise returning a redirect as it came), waits for the response head
//! and only then answers: Refused with a class when it could not (`[invalid]`,
//! `[unreachable]`, `[timed_out]`, `[too_large]` for a declared length over `max_bytes`), or
//! Opened. The first Data frame after Opened is the JSON of a [`FetchHead`]; the body follows
//! in Data frames of at most 64 KiB, never more than `max_bytes` in all, then a Close with an
//! empty reason. A body that grows past `max_bytes` is cut with `[too_large]`, a body that
//! breaks off with `[unreachable]`, one that takes past the timeout with `[timed_out]`.

mod fetch;
mod frame;
mod mux;
#[cfg(test)]
mod tests;
mod ws;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use fetch::{FETCH_MAX_BODY, FETCH_MAX_REDIRECTS, FetchHead, header_from_wire, header_to_wire};
pub use ws::ws_config;

/// Limits and timing of one tunnel (both sides use the same defaults).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The largest payload of one frame, in bytes.
    pub max_frame: usize,
    /// Data frames a channel may have in flight in each direction before credit comes back.
    pub window: u32,
    /// The ping interval; silence for three of them ends the tunnel.
    pub heartbeat: Duration,
}

impl Settings {
    /// The gateway's settings, for its agents' tunnels and its links to other replicas.
    pub fn configured(upstream: &crate::config::UpstreamConfig) -> Self {
        Self {
            max_frame: upstream.executor_max_frame_bytes,
            heartbeat: Duration::from_secs(upstream.executor_heartbeat_secs),
            ..Self::default()
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self { max_frame: 16 * 1024 * 1024, window: 64, heartbeat: Duration::from_secs(10) }
    }
}

/// What the gateway asks an agent to open. Values of `args`, `env` and `headers` may hold
/// `${NAME}` references, which the agent resolves on its own environment
/// (`decl::declaration::expand`); `cwd` and `uri` are `file:` URIs the agent checks
/// against its own root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Open {
    /// Launch a stdio server; each Data frame is one JSON-RPC message to its stdin or from its
    /// stdout (one line, without the newline).
    Stdio { server: String, command: String, args: Vec<String>, env: BTreeMap<String, String>, cwd: String },
    /// Reach a Streamable HTTP server over the agent's network; each Data frame is one
    /// JSON-RPC message. The agent moves a call's identity assertion from `_meta` into
    /// `assertion_header`, as the gateway does for the local executor.
    Http { server: String, url: String, headers: BTreeMap<String, String>, assertion_header: String },
    /// Read one file under the agent's root: Data frames carry its bytes, then the agent
    /// closes the channel (reason empty when the whole file was sent).
    ReadFile { uri: String, max_bytes: u64 },
    /// Perform one HTTP exchange over the agent's network (see the module docs): `url` an
    /// absolute `http:` or `https:` URL; `headers` in order, a name repeated as often as sent,
    /// each value as ISO-8859-1 text ([`header_to_wire`]); `body` base64 (standard, padded),
    /// at most [`FETCH_MAX_BODY`] bytes once decoded; at most [`FETCH_MAX_REDIRECTS`]
    /// redirects followed when `follow_redirects`, none otherwise; the whole exchange within
    /// `timeout_ms`; at most `max_bytes` of response body.
    Fetch {
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: String,
        follow_redirects: bool,
        timeout_ms: u64,
        max_bytes: u64,
    },
}

/// The class of a refusal, written at the start of a Refused or Close reason as `[code] `.
/// Codes are lower-case words; new ones may be added, and an unknown one is no class at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `outside_root`: the path lies outside the agent's root, as written or once its
    /// symlinks are resolved.
    OutsideRoot,
    /// `not_found`: nothing is at the path (or a folder on the way is missing).
    NotFound,
    /// `not_a_file`: a folder, a device, a pipe or a socket, not a regular file.
    NotAFile,
    /// `too_large`: the file is larger than the request's `max_bytes` (or grew past it while
    /// it was being read); a fetch's response body is (or declares it is).
    TooLarge,
    /// `invalid`: the request is malformed for this agent (a URI it cannot parse).
    Invalid,
    /// `unreadable`: the path is there but could not be read (permissions, an I/O error).
    Unreadable,
    /// `unreachable`: a fetch could not be completed over the agent's network (no route,
    /// refused, a TLS failure, the connection broke, too many redirects).
    Unreachable,
    /// `timed_out`: a fetch did not complete within its timeout.
    TimedOut,
}

impl Refusal {
    const ALL: [Refusal; 8] = [
        Self::OutsideRoot,
        Self::NotFound,
        Self::NotAFile,
        Self::TooLarge,
        Self::Invalid,
        Self::Unreadable,
        Self::Unreachable,
        Self::TimedOut,
    ];

    pub fn code(self) -> &'static str {
        match self {
            Self::OutsideRoot => "outside_root",
            Self::NotFound => "not_found",
            Self::NotAFile => "not_a_file",
            Self::TooLarge => "too_large",
            Self::Invalid => "invalid",
            Self::Unreadable => "unreadable",
            Self::Unreachable => "unreachable",
            Self::TimedOut => "timed_out",
        }
    }

    /// `reason` with this class in front, as it goes on the wire.
    pub fn tag(self, reason: &str) -> String {
        format!("[{}] {reason}", self.code())
    }

    /// A reason as read from the wire: its class, when it starts with a known one, and the
    /// text after it; otherwise no class and the whole reason.
    pub fn split(reason: &str) -> (Option<Refusal>, &str) {
        let classified = reason.strip_prefix('[').and_then(|rest| {
            let (code, text) = rest.split_once("] ")?;
            Self::ALL.into_iter().find(|r| r.code() == code).map(|r| (Some(r), text))
        });
        classified.unwrap_or((None, reason))
    }
}

/// Why a tunnel or channel operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TunnelError {
    #[error("the executor connection is closed: {0}")]
    Closed(String),
    #[error("the executor refused: {0}")]
    Refused(String),
    #[error("a message of {size} bytes is over the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("the executor did not answer within {0:?}")]
    Timeout(Duration),
}

pub use crate::vocab::routes::CONNECT_PATH;
/// The upgrade request header naming the executor the agent runs as.
pub const EXECUTOR_HEADER: &str = "scopegate-executor";
/// The upgrade request header with the agent's root, a `file:` URI.
pub const ROOT_HEADER: &str = "scopegate-executor-root";
// The secret travels as `Authorization: Bearer <secret>`.

/// Which end of the tunnel this is: only the gateway opens channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Gateway,
    Agent,
}

/// Starts driving `ws` (already upgraded and, on the gateway, already authenticated): spawns
/// the reader, writer and heartbeat tasks, which end when the socket closes, three heartbeats
/// pass in silence, the peer breaks the protocol, or [`TunnelHandle::close`] is called.
/// On the agent side, [`Incoming`] yields the gateway's open requests; on the gateway side it
/// yields nothing. Dropping every [`TunnelHandle`] and the [`Incoming`] ends the tunnel too.
/// Call it inside a Tokio runtime.
pub fn start<S>(ws: tokio_tungstenite::WebSocketStream<S>, side: Side, settings: Settings) -> (TunnelHandle, Incoming)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (inner, owner, rx) = mux::start(ws, side, settings);
    (TunnelHandle { inner: Arc::clone(&inner), _owner: Arc::clone(&owner) }, Incoming { inner, rx, _owner: owner })
}

/// A handle on a running tunnel; clones share it.
#[derive(Clone)]
pub struct TunnelHandle {
    inner: Arc<mux::Inner>,
    _owner: Arc<mux::Owner>,
}

impl TunnelHandle {
    /// Opens a channel (gateway side): sends `open` and waits up to `timeout` for the agent's
    /// Opened or Refused.
    pub async fn open(&self, open: &Open, timeout: Duration) -> Result<Channel, TunnelError> {
        self.inner.open(open, timeout).await
    }

    /// Ends the tunnel and every channel on it, telling the peer `reason` (a WebSocket close).
    pub fn close(&self, reason: &str) {
        self.inner
            .shutdown(tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal, reason.to_owned());
    }

    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// When the peer was last heard from (any message, heartbeats included), Unix milliseconds.
    pub fn last_heard_ms(&self) -> i64 {
        self.inner.last_heard_ms()
    }

    /// Resolves when the tunnel has ended, with why.
    pub async fn closed(&self) -> String {
        self.inner.closed().await
    }

    /// Channels open now.
    pub fn channels_open(&self) -> usize {
        self.inner.channels_open()
    }
}

/// The gateway's open requests, as the agent receives them.
pub struct Incoming {
    inner: Arc<mux::Inner>,
    rx: tokio::sync::mpsc::Receiver<PendingOpen>,
    _owner: Arc<mux::Owner>,
}

impl Incoming {
    /// The next open request; `None` once the tunnel has ended.
    pub async fn next(&mut self) -> Option<PendingOpen> {
        if self.inner.is_closed() {
            return None;
        }
        tokio::select! {
            biased;
            _ = self.inner.closed() => None,
            pending = self.rx.recv() => pending,
        }
    }
}

/// One open request, to be accepted or refused (dropping it refuses it).
pub struct PendingOpen {
    pub open: Open,
    pending: mux::Pending,
}

impl PendingOpen {
    pub fn accept(mut self) -> Channel {
        self.pending.accept()
    }

    pub fn refuse(mut self, reason: &str) {
        self.pending.refuse(reason);
    }
}

/// One open channel. Dropping both halves closes it (reason empty).
pub struct Channel {
    sender: ChannelSender,
    receiver: ChannelReceiver,
}

impl Channel {
    pub fn id(&self) -> u32 {
        self.sender.handle.id()
    }

    pub fn split(self) -> (ChannelSender, ChannelReceiver) {
        (self.sender, self.receiver)
    }
}

/// The sending half: waits for credit, so a slow peer slows the sender and nothing else.
#[derive(Clone)]
pub struct ChannelSender {
    handle: Arc<mux::ChanHandle>,
}

impl ChannelSender {
    /// Sends one message; fails once the channel or tunnel has ended, or when `data` is larger
    /// than the frame limit (the channel stays open then).
    pub async fn send(&self, data: Bytes) -> Result<(), TunnelError> {
        self.handle.send(data).await
    }

    /// Closes the channel for both sides, telling the peer `reason` (empty: a normal end).
    pub fn close(&self, reason: &str) {
        self.handle.close(reason);
    }
}

/// The receiving half: reading grants credit back to the peer.
pub struct ChannelReceiver {
    reader: mux::Reader,
}

impl ChannelReceiver {
    /// The next message; `None` once the channel has ended (see [`Self::close_reason`]).
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.reader.recv().await
    }

    /// Why the channel ended, once it has (empty: a normal end by the peer).
    pub fn close_reason(&self) -> Option<String> {
        self.reader.handle().shared().reason()
    }
}

/// Accepts a WebSocket upgrade on the gateway: checks the request is one (GET, `Upgrade:
/// websocket`, `Connection: upgrade`, version 13, a key) and returns the `101` answer to send,
/// and a future of the WebSocket once hyper hands the connection over. Not an upgrade: `Err`
/// with the reason, for a `400`.
pub fn accept_upgrade(
    request: &mut http::Request<axum::body::Body>,
    settings: &Settings,
) -> Result<(http::Response<axum::body::Body>, Upgrading), String> {
    ws::accept_upgrade(request, settings)
}

/// The gateway's side of an upgrade in progress.
pub struct Upgrading {
    on_upgrade: hyper::upgrade::OnUpgrade,
    config: tokio_tungstenite::tungstenite::protocol::WebSocketConfig,
}

impl Upgrading {
    pub async fn ready(
        self,
    ) -> Result<tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>, String> {
        ws::ready(self).await
    }
}

/// Why the agent could not connect.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The gateway answered, but not with a WebSocket (`401`: bad secret; `409`: the name is
    /// already connected; ...): its status and body.
    #[error("the gateway answered {status}: {body}")]
    Refused { status: u16, body: String },
    #[error("{0}")]
    Network(String),
}

/// Dials the gateway's [`CONNECT_PATH`] under `base` (an `http:` or `https:` URL; TLS verified
/// by `client`, built with the same `ca_file` rules as the gateway's upstream client),
/// presenting `headers`, and completes the WebSocket handshake.
pub async fn dial(
    client: &reqwest::Client,
    base: &str,
    headers: http::HeaderMap,
    settings: &Settings,
) -> Result<tokio_tungstenite::WebSocketStream<reqwest::Upgraded>, DialError> {
    ws::dial(client, base, headers, settings).await
}

/// [`dial`] for another path under `base` (a replica dialing another replica's link route).
pub async fn dial_at(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    headers: http::HeaderMap,
    settings: &Settings,
) -> Result<tokio_tungstenite::WebSocketStream<reqwest::Upgraded>, DialError> {
    ws::dial_at(client, base, path, headers, settings).await
}
