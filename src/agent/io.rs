//! The message I/O a channel server runs over: the tunnel's channel halves in production, an
//! in-memory pair in tests. It carries whole messages; it never looks inside them.

use std::future::Future;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::tunnel::{ChannelReceiver, ChannelSender};

/// Where a channel server's messages go.
pub trait MessageSink: Send + Sync + 'static {
    /// Sends one message; an error means the channel is gone (or the message is too large).
    fn send(&self, data: Bytes) -> impl Future<Output = Result<(), String>> + Send;
    /// Ends the channel for both sides with `reason` (empty: a normal end).
    fn close(&self, reason: &str);
}

/// Runs a one-way channel server (a file read, an HTTP exchange) until it has sent everything
/// or the executor stops, then ends the channel with the reason (empty: all of it was sent).
pub(super) async fn stream_until_stopped<S: MessageSink>(
    sink: S,
    stop: tokio_util::sync::CancellationToken,
    stream: impl AsyncFnOnce(&S) -> String,
) {
    let reason = tokio::select! {
        reason = stream(&sink) => reason,
        () = stop.cancelled() => "the executor is stopping".to_owned(),
    };
    sink.close(&reason);
}

/// Where a channel server's messages come from.
pub trait MessageSource: Send + 'static {
    /// The next message; `None` once the channel has ended.
    fn recv(&mut self) -> impl Future<Output = Option<Bytes>> + Send;
}

impl MessageSink for ChannelSender {
    async fn send(&self, data: Bytes) -> Result<(), String> {
        ChannelSender::send(self, data).await.map_err(|e| e.to_string())
    }
    fn close(&self, reason: &str) {
        ChannelSender::close(self, reason);
    }
}

impl MessageSource for ChannelReceiver {
    fn recv(&mut self) -> impl Future<Output = Option<Bytes>> + Send {
        ChannelReceiver::recv(self)
    }
}

/// What a server did on an in-memory channel, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    Data(Bytes),
    Close(String),
}

/// The server's half of an in-memory channel: what it sends lands in the peer's receiver.
pub struct MemorySink {
    tx: mpsc::UnboundedSender<Sent>,
}

/// The server's half of an in-memory channel: it reads what the peer's sender sends, and
/// sees the end when that sender is dropped.
pub struct MemorySource {
    rx: mpsc::Receiver<Bytes>,
}

/// An in-memory channel: the server's halves, and the peer's (a sender of messages to the
/// server, a receiver of what the server sent or closed with).
pub fn memory_channel() -> (MemorySink, MemorySource, mpsc::Sender<Bytes>, mpsc::UnboundedReceiver<Sent>) {
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (in_tx, in_rx) = mpsc::channel(64);
    (MemorySink { tx: out_tx }, MemorySource { rx: in_rx }, in_tx, out_rx)
}

impl MessageSink for MemorySink {
    fn send(&self, data: Bytes) -> impl Future<Output = Result<(), String>> + Send {
        let sent = self.tx.send(Sent::Data(data)).map_err(|_| "the channel is closed".to_owned());
        async move { sent }
    }
    fn close(&self, reason: &str) {
        let _ = self.tx.send(Sent::Close(reason.to_owned()));
    }
}

impl MessageSource for MemorySource {
    fn recv(&mut self) -> impl Future<Output = Option<Bytes>> + Send {
        self.rx.recv()
    }
}
