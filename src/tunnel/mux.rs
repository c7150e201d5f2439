//! The multiplexer: the reader, writer and heartbeat tasks of one tunnel and the state of its
//! channels (ids, windows, buffers). Its reader never waits on one channel, and it never looks
//! inside a Data payload.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use super::frame::{self, Frame};
use super::{Channel, ChannelReceiver, ChannelSender, Open, PendingOpen, Settings, Side, TunnelError};

/// Data frames of all channels waiting for the writer at most; a sender past it waits.
const QUEUE: usize = 128;
/// Queued frames the writer hands to the socket before it flushes once.
const BATCH: usize = 64;
/// Open requests the agent has not taken yet; past that, new ones are refused.
const PENDING_OPENS: usize = 256;
/// How long the writer tries to say goodbye (a WebSocket Close) once the tunnel has ended.
const FAREWELL: Duration = Duration::from_secs(1);
/// Heartbeats in silence that end the tunnel.
const SILENT_HEARTBEATS: u32 = 3;
/// The longest reason sent in a Close or Refused frame.
const MAX_REASON: usize = 1024;
/// The longest reason a WebSocket Close frame holds (125 bytes of payload, 2 of them the code).
const MAX_WS_REASON: usize = 123;

/// What the writer sends.
enum Out {
    /// A Data frame: it holds one place of the queue's bound until written.
    Data(Bytes),
    /// Everything else: few, and bounded by the channels and the Data frames themselves, so
    /// they never wait (they are sent from `Drop` and from the reader).
    Control(Message),
}

pub(super) struct Inner {
    side: Side,
    settings: Settings,
    /// Consumed Data frames a reader gathers before it grants them back in one Credit.
    threshold: u32,
    out: mpsc::UnboundedSender<Out>,
    /// The queue's bound for Data frames (its permits are places in the queue).
    slots: Semaphore,
    channels: Mutex<Channels>,
    cancel: CancellationToken,
    /// How the tunnel ended; set once, before `cancel` fires.
    end: OnceLock<(CloseCode, String)>,
    /// Messages received of any kind; the heartbeat watches it move.
    received: AtomicU64,
    /// When the last message of any kind arrived (Unix milliseconds): the agent's last sign of
    /// life, shown by the admin API.
    last_heard_ms: std::sync::atomic::AtomicI64,
    /// `scopegate_executor_channels_open`, on the gateway only.
    gauge: Option<metrics::Gauge>,
}

struct Channels {
    map: HashMap<u32, Entry>,
    /// The highest channel id used so far: a frame for an id at or below it that is not in
    /// `map` belongs to a closed channel (the peer may not have seen the Close yet) and is
    /// dropped; above it, the channel was never opened and the peer is broken.
    highest: u32,
    ended: bool,
}

/// The reader's view of one channel.
struct Entry {
    data: mpsc::Sender<Bytes>,
    shared: Arc<ChanShared>,
    /// On the gateway, until the agent answers the Open.
    opening: Option<oneshot::Sender<Result<(), String>>>,
}

/// What the reader and a channel's halves share.
pub(super) struct ChanShared {
    /// Data frames this side may still send.
    credit: Semaphore,
    /// Data frames the peer may still send; the reader takes one per Data frame, the receiving
    /// half gives them back (before it sends the Credit, so the peer never gets ahead of it).
    peer_credit: AtomicU32,
    /// Why the channel ended; set once.
    reason: OnceLock<String>,
}

impl ChanShared {
    fn new(window: u32) -> Self {
        Self { credit: Semaphore::new(window as usize), peer_credit: AtomicU32::new(window), reason: OnceLock::new() }
    }

    fn finish(&self, reason: &str) {
        let _ = self.reason.set(reason.to_owned());
        self.credit.close();
    }

    fn is_closed(&self) -> bool {
        self.reason.get().is_some()
    }

    pub(super) fn reason(&self) -> Option<String> {
        self.reason.get().cloned()
    }
}

/// Keeps the tunnel running: held by every [`super::TunnelHandle`] and the [`super::Incoming`];
/// when the last goes, the tunnel ends (nobody could use or close it any more).
pub(super) struct Owner(Arc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.shutdown(CloseCode::Normal, "the tunnel's last handle was dropped".to_owned());
    }
}

pub(super) fn start<S>(
    ws: WebSocketStream<S>,
    side: Side,
    settings: Settings,
) -> (Arc<Inner>, Arc<Owner>, mpsc::Receiver<PendingOpen>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // A window of 0 would stop every channel, a heartbeat of 0 would spin.
    let settings = Settings {
        window: settings.window.max(1),
        heartbeat: settings.heartbeat.max(Duration::from_millis(1)),
        ..settings
    };
    let gateway = side == Side::Gateway;
    // Handles taken once here, so the hot path does no registry lookups.
    let gauge = gateway.then(|| metrics::gauge!("scopegate_executor_channels_open"));
    let sent = gateway.then(|| metrics::counter!("scopegate_executor_bytes_total", "direction" => "sent"));
    let received = gateway.then(|| metrics::counter!("scopegate_executor_bytes_total", "direction" => "received"));
    let (out, queue) = mpsc::unbounded_channel();
    let inner = Arc::new(Inner {
        side,
        threshold: (settings.window / 2).max(1),
        settings,
        out,
        slots: Semaphore::new(QUEUE),
        channels: Mutex::new(Channels { map: HashMap::new(), highest: 0, ended: false }),
        cancel: CancellationToken::new(),
        end: OnceLock::new(),
        received: AtomicU64::new(0),
        last_heard_ms: std::sync::atomic::AtomicI64::new(crate::store::now_millis()),
        gauge,
    });
    let (sink, stream) = ws.split();
    let (incoming_tx, incoming_rx) = mpsc::channel(PENDING_OPENS);
    tokio::spawn(write_loop(Arc::clone(&inner), sink, queue, sent));
    tokio::spawn(read_loop(Arc::clone(&inner), stream, incoming_tx, received));
    tokio::spawn(heartbeat(Arc::clone(&inner)));
    let owner = Arc::new(Owner(Arc::clone(&inner)));
    (inner, owner, incoming_rx)
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Channels> {
        // Nothing panics while holding it; if something did, the map is still consistent.
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails only once the writer has gone, that is once the tunnel has ended.
    fn push_frame(&self, kind: u8, id: u32, payload: &[u8]) {
        let _ = self.out.send(Out::Control(Message::Binary(frame::encode(kind, id, payload))));
    }

    fn new_channel(&self) -> (mpsc::Sender<Bytes>, mpsc::Receiver<Bytes>, Arc<ChanShared>) {
        let (tx, rx) = mpsc::channel(self.settings.window as usize);
        (tx, rx, Arc::new(ChanShared::new(self.settings.window)))
    }

    // The map changes only through `insert`, `remove` and `shutdown`, which keep the gauge.
    fn insert(&self, channels: &mut Channels, id: u32, entry: Entry) {
        channels.map.insert(id, entry);
        if let Some(gauge) = &self.gauge {
            gauge.increment(1.0);
        }
    }

    fn remove(&self, channels: &mut Channels, id: u32) -> Option<Entry> {
        let entry = channels.map.remove(&id)?;
        if let Some(gauge) = &self.gauge {
            gauge.decrement(1.0);
        }
        Some(entry)
    }

    /// Ends the channel on this side and tells the peer; nothing if it has already ended.
    pub(super) fn close_channel(&self, id: u32, reason: &str) {
        let removed = self.remove(&mut self.lock(), id);
        if let Some(entry) = removed {
            let reason = clip(reason, MAX_REASON);
            entry.shared.finish(reason);
            self.push_frame(frame::CLOSE, id, reason.as_bytes());
        }
    }

    /// Ends the tunnel: every channel ends with `reason`, then the tasks stop. The first call wins.
    pub(super) fn shutdown(&self, code: CloseCode, reason: String) {
        let reason = if reason.is_empty() { "the tunnel was closed".to_owned() } else { reason };
        if self.end.set((code, reason.clone())).is_err() {
            return;
        }
        let entries: Vec<Entry> = {
            let mut channels = self.lock();
            channels.ended = true;
            channels.map.drain().map(|(_, entry)| entry).collect()
        };
        for entry in entries {
            if let Some(gauge) = &self.gauge {
                gauge.decrement(1.0);
            }
            // Dropping `opening` tells a waiting `open` the tunnel has ended.
            entry.shared.finish(&reason);
        }
        self.slots.close();
        self.cancel.cancel();
        tracing::debug!(side = ?self.side, %reason, "executor tunnel ended");
    }

    /// When the last message from the peer arrived (Unix milliseconds).
    pub(super) fn last_heard_ms(&self) -> i64 {
        self.last_heard_ms.load(Ordering::Relaxed)
    }

    pub(super) fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    pub(super) async fn closed(&self) -> String {
        self.cancel.cancelled().await;
        self.reason()
    }

    pub(super) fn reason(&self) -> String {
        self.end.get().map(|(_, reason)| reason.clone()).unwrap_or_default()
    }

    pub(super) fn channels_open(&self) -> usize {
        self.lock().map.len()
    }

    /// Opens a channel (gateway side) and waits for the agent's answer.
    pub(super) async fn open(self: &Arc<Self>, open: &Open, timeout: Duration) -> Result<Channel, TunnelError> {
        if self.side != Side::Gateway {
            return Err(TunnelError::Refused("only the gateway opens channels".to_owned()));
        }
        let payload = serde_json::to_vec(open)
            .map_err(|e| TunnelError::Refused(format!("the open request cannot be encoded: {e}")))?;
        let max = self.settings.max_frame;
        if payload.len() > max {
            return Err(TunnelError::TooLarge { size: payload.len(), max });
        }
        let (data, rx, shared) = self.new_channel();
        let (reply_tx, reply_rx) = oneshot::channel();
        let id = {
            let mut channels = self.lock();
            if channels.ended {
                return Err(TunnelError::Closed(self.reason()));
            }
            let Some(id) = channels.highest.checked_add(1) else {
                return Err(TunnelError::Closed("every channel id of this tunnel has been used".to_owned()));
            };
            channels.highest = id;
            self.insert(&mut channels, id, Entry { data, shared: Arc::clone(&shared), opening: Some(reply_tx) });
            // Queued under the lock that chose the id, so Opens leave in the order of their
            // ids: the agent refuses an id not above one it has seen (and ends the tunnel).
            self.push_frame(frame::OPEN, id, &payload);
            id
        };
        // From here, dropping `handle` (an error, or this future dropped) closes the channel.
        let handle = ChanHandle { id, inner: Arc::clone(self), shared };
        match tokio::time::timeout(timeout, reply_rx).await {
            Ok(Ok(Ok(()))) => Ok(channel(handle, rx)),
            Ok(Ok(Err(reason))) => Err(TunnelError::Refused(reason)),
            Ok(Err(_)) => Err(TunnelError::Closed(self.reason())),
            Err(_) => {
                self.close_channel(id, "the gateway stopped waiting for the channel to open");
                Err(TunnelError::Timeout(timeout))
            }
        }
    }

    // ---- the reader's side ----

    fn dispatch(self: &Arc<Self>, message: Bytes, incoming: &mpsc::Sender<PendingOpen>) -> Result<(), String> {
        let limit = self.settings.max_frame + frame::HEADER;
        if message.len() > limit {
            return Err(format!("a frame of {} bytes is over the limit of {limit}", message.len()));
        }
        let Frame { kind, id, payload } = frame::decode(message)?;
        match kind {
            frame::DATA => self.on_data(id, payload),
            frame::CREDIT => self.on_credit(id, frame::credit(&payload)?),
            frame::CLOSE => self.on_close(id, text(&payload)),
            frame::OPEN => self.on_open(id, &payload, incoming),
            frame::OPENED => self.on_opened(id),
            frame::REFUSED => self.on_refused(id, text(&payload)),
            other => Err(format!("unknown frame kind {other} (channel {id})")),
        }
    }

    fn on_data(&self, id: u32, payload: Bytes) -> Result<(), String> {
        let channels = self.lock();
        let Some(entry) = channels.map.get(&id) else {
            return closed_or_unknown(&channels, id, "Data");
        };
        if entry.opening.is_some() {
            return Err(format!("Data on channel {id} before it was opened"));
        }
        let window = self.settings.window;
        let past_window = || format!("Data on channel {id} past its window of {window} frames");
        if entry.shared.peer_credit.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1)).is_err() {
            return Err(past_window());
        }
        match entry.data.try_send(payload) {
            Ok(()) => Ok(()),
            // The buffer holds a whole window, so only a miscount could fill it: fail closed.
            Err(TrySendError::Full(_)) => Err(past_window()),
            Err(TrySendError::Closed(_)) => {
                // The receiving half is gone while the sending half lives: the message has no
                // reader, and its credit goes straight back so the peer is not stalled.
                entry.shared.peer_credit.fetch_add(1, Ordering::AcqRel);
                self.push_frame(frame::CREDIT, id, &1u32.to_be_bytes());
                Ok(())
            }
        }
    }

    fn on_credit(&self, id: u32, credit: u32) -> Result<(), String> {
        let channels = self.lock();
        let Some(entry) = channels.map.get(&id) else {
            return closed_or_unknown(&channels, id, "Credit");
        };
        // Credit comes back only for frames sent, so it can never lift the total past the window.
        let window = self.settings.window as usize;
        if entry.shared.credit.available_permits() + credit as usize > window {
            return Err(format!("Credit of {credit} on channel {id} past its window of {window} frames"));
        }
        entry.shared.credit.add_permits(credit as usize);
        Ok(())
    }

    fn on_close(&self, id: u32, reason: String) -> Result<(), String> {
        let entry = {
            let mut channels = self.lock();
            match self.remove(&mut channels, id) {
                Some(entry) => entry,
                None => return closed_or_unknown(&channels, id, "Close"),
            }
        };
        entry.shared.finish(&reason);
        if let Some(reply) = entry.opening {
            // Closed before it was opened: an open refused.
            let _ = reply.send(Err(reason));
        }
        Ok(())
    }

    fn on_open(self: &Arc<Self>, id: u32, payload: &[u8], incoming: &mpsc::Sender<PendingOpen>) -> Result<(), String> {
        if self.side == Side::Gateway {
            return Err(format!("an Open for channel {id} from the agent (only the gateway opens channels)"));
        }
        let open = serde_json::from_slice::<Open>(payload);
        let (data, rx, shared) = self.new_channel();
        {
            let mut channels = self.lock();
            if id <= channels.highest {
                return Err(format!("an Open for channel {id}, not above channel {} already used", channels.highest));
            }
            channels.highest = id;
            if channels.ended {
                return Ok(());
            }
            if open.is_ok() {
                self.insert(&mut channels, id, Entry { data, shared: Arc::clone(&shared), opening: None });
            }
        }
        let open = match open {
            Ok(open) => open,
            Err(e) => {
                // A request this agent does not understand (another version?) fails alone.
                self.push_frame(frame::REFUSED, id, format!("the open request is not understood: {e}").as_bytes());
                return Ok(());
            }
        };
        let pending = PendingOpen { open, pending: Pending { inner: Arc::clone(self), id, shared, rx: Some(rx) } };
        match incoming.try_send(pending) {
            Ok(()) => {}
            Err(TrySendError::Full(pending)) => pending.refuse("the executor has too many open requests waiting"),
            Err(TrySendError::Closed(pending)) => pending.refuse("the executor takes no channels"),
        }
        Ok(())
    }

    fn on_opened(&self, id: u32) -> Result<(), String> {
        if self.side == Side::Agent {
            return Err(format!("an Opened for channel {id} from the gateway"));
        }
        let mut channels = self.lock();
        let Some(entry) = channels.map.get_mut(&id) else {
            return closed_or_unknown(&channels, id, "Opened");
        };
        match entry.opening.take() {
            Some(reply) => {
                let _ = reply.send(Ok(()));
                Ok(())
            }
            None => Err(format!("a second Opened for channel {id}")),
        }
    }

    fn on_refused(&self, id: u32, reason: String) -> Result<(), String> {
        if self.side == Side::Agent {
            return Err(format!("a Refused for channel {id} from the gateway"));
        }
        let entry = {
            let mut channels = self.lock();
            match channels.map.get(&id).map(|entry| entry.opening.is_some()) {
                None => return closed_or_unknown(&channels, id, "Refused"),
                Some(false) => return Err(format!("a Refused for channel {id}, which was already open")),
                Some(true) => self.remove(&mut channels, id),
            }
        };
        if let Some(entry) = entry {
            entry.shared.finish(&reason);
            if let Some(reply) = entry.opening {
                let _ = reply.send(Err(reason));
            }
        }
        Ok(())
    }
}

/// A frame for a channel not in the map: dropped if the channel existed (it has closed and the
/// peer had not heard yet), a protocol error if it never did.
fn closed_or_unknown(channels: &Channels, id: u32, what: &str) -> Result<(), String> {
    if id <= channels.highest { Ok(()) } else { Err(format!("{what} for channel {id}, which was never opened")) }
}

fn text(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

// ---- channels ----

/// One channel's identity on this side; when the last half holding it drops, the channel closes.
pub(super) struct ChanHandle {
    id: u32,
    inner: Arc<Inner>,
    shared: Arc<ChanShared>,
}

impl Drop for ChanHandle {
    fn drop(&mut self) {
        self.inner.close_channel(self.id, "");
    }
}

impl ChanHandle {
    pub(super) fn id(&self) -> u32 {
        self.id
    }

    pub(super) fn shared(&self) -> &ChanShared {
        &self.shared
    }

    pub(super) fn close(&self, reason: &str) {
        self.inner.close_channel(self.id, reason);
    }

    fn closed_error(&self) -> TunnelError {
        let reason = self.shared.reason().unwrap_or_else(|| self.inner.reason());
        TunnelError::Closed(if reason.is_empty() { "the channel was closed".to_owned() } else { reason })
    }

    pub(super) async fn send(&self, data: Bytes) -> Result<(), TunnelError> {
        let max = self.inner.settings.max_frame;
        if data.len() > max {
            return Err(TunnelError::TooLarge { size: data.len(), max });
        }
        // Both permits go back if this future is dropped before the frame is queued.
        let credit = self.shared.credit.acquire().await.map_err(|_| self.closed_error())?;
        let slot = self.inner.slots.acquire().await.map_err(|_| self.closed_error())?;
        credit.forget();
        slot.forget();
        let _ = self.inner.out.send(Out::Data(frame::encode(frame::DATA, self.id, &data)));
        Ok(())
    }
}

pub(super) fn channel(handle: ChanHandle, rx: mpsc::Receiver<Bytes>) -> Channel {
    let handle = Arc::new(handle);
    Channel {
        sender: ChannelSender { handle: Arc::clone(&handle) },
        receiver: ChannelReceiver { reader: Reader { handle, rx, consumed: 0 } },
    }
}

/// The receiving half's state: its buffer and the credit it owes the peer.
pub(super) struct Reader {
    handle: Arc<ChanHandle>,
    rx: mpsc::Receiver<Bytes>,
    /// Messages read and not yet granted back.
    consumed: u32,
}

impl Reader {
    pub(super) fn handle(&self) -> &ChanHandle {
        &self.handle
    }

    /// Cancel-safe: the buffer's `recv` is, and the credit is counted only once a message is out.
    pub(super) async fn recv(&mut self) -> Option<Bytes> {
        let data = self.rx.recv().await?;
        self.consumed += 1;
        if self.consumed >= self.handle.inner.threshold {
            self.grant();
        }
        Some(data)
    }

    fn grant(&mut self) {
        let n = std::mem::take(&mut self.consumed);
        if n == 0 || self.handle.shared.is_closed() {
            return;
        }
        self.handle.shared.peer_credit.fetch_add(n, Ordering::AcqRel);
        self.handle.inner.push_frame(frame::CREDIT, self.handle.id, &n.to_be_bytes());
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // With the sending half still alive the channel stays open; what is buffered or arrives
        // from now on has no reader, so its credit goes back to the peer (the reader task gives
        // back what arrives after `close`).
        if Arc::strong_count(&self.handle) == 1 || self.handle.shared.is_closed() {
            return;
        }
        self.rx.close();
        while self.rx.try_recv().is_ok() {
            self.consumed += 1;
        }
        self.grant();
    }
}

/// An open request not answered yet (agent side).
pub(super) struct Pending {
    inner: Arc<Inner>,
    id: u32,
    shared: Arc<ChanShared>,
    /// Taken by `accept`; `None` means answered.
    rx: Option<mpsc::Receiver<Bytes>>,
}

impl Pending {
    pub(super) fn accept(&mut self) -> Channel {
        // Always there: `PendingOpen::accept` takes the request, so it is answered once.
        let rx = self.rx.take().unwrap_or_else(|| mpsc::channel(1).1);
        if !self.shared.is_closed() {
            self.inner.push_frame(frame::OPENED, self.id, &[]);
        }
        let handle = ChanHandle { id: self.id, inner: Arc::clone(&self.inner), shared: Arc::clone(&self.shared) };
        channel(handle, rx)
    }

    pub(super) fn refuse(&mut self, reason: &str) {
        if self.rx.take().is_none() {
            return;
        }
        let removed = self.inner.remove(&mut self.inner.lock(), self.id);
        if let Some(entry) = removed {
            let reason = clip(reason, MAX_REASON);
            entry.shared.finish(reason);
            self.inner.push_frame(frame::REFUSED, self.id, reason.as_bytes());
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.refuse("the executor did not take the channel");
    }
}

// ---- the tasks ----

async fn read_loop<S>(
    inner: Arc<Inner>,
    mut stream: SplitStream<WebSocketStream<S>>,
    incoming: mpsc::Sender<PendingOpen>,
    bytes: Option<metrics::Counter>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let cancelled = inner.cancel.clone().cancelled_owned();
    tokio::pin!(cancelled);
    loop {
        let message = tokio::select! {
            biased;
            () = &mut cancelled => return,
            message = stream.next() => message,
        };
        inner.received.fetch_add(1, Ordering::Relaxed);
        inner.last_heard_ms.store(crate::store::now_millis(), Ordering::Relaxed);
        let result = match message {
            Some(Ok(Message::Binary(message))) => {
                if let Some(bytes) = &bytes {
                    bytes.increment(message.len() as u64);
                }
                inner.dispatch(message, &incoming)
            }
            // tungstenite answers pings itself; either kind only shows the peer is alive.
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => Ok(()),
            Some(Ok(Message::Text(_))) => Err("a text message".to_owned()),
            Some(Ok(Message::Frame(_))) => Err("a raw frame".to_owned()),
            Some(Ok(Message::Close(frame))) => {
                let reason = match frame {
                    Some(frame) if !frame.reason.is_empty() => {
                        format!("the peer closed the connection: {}", frame.reason)
                    }
                    _ => "the peer closed the connection".to_owned(),
                };
                inner.shutdown(CloseCode::Normal, reason);
                return;
            }
            Some(Err(e)) => {
                let code = match e {
                    WsError::Capacity(_) => CloseCode::Size,
                    WsError::Protocol(_) | WsError::Utf8(_) => CloseCode::Protocol,
                    _ => CloseCode::Error,
                };
                inner.shutdown(code, format!("the connection failed: {e}"));
                return;
            }
            None => {
                inner.shutdown(CloseCode::Normal, "the connection ended".to_owned());
                return;
            }
        };
        if let Err(violation) = result {
            inner.shutdown(CloseCode::Protocol, format!("protocol error: {violation}"));
            return;
        }
    }
}

async fn write_loop<S>(
    inner: Arc<Inner>,
    mut sink: SplitSink<WebSocketStream<S>, Message>,
    mut queue: mpsc::UnboundedReceiver<Out>,
    bytes: Option<metrics::Counter>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let cancelled = inner.cancel.clone().cancelled_owned();
    tokio::pin!(cancelled);
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let received = tokio::select! {
            biased;
            () = &mut cancelled => break,
            n = queue.recv_many(&mut batch, BATCH) => n,
        };
        if received == 0 {
            break;
        }
        let written = tokio::select! {
            biased;
            () = &mut cancelled => break,
            written = write_batch(&inner, &mut sink, &mut batch, bytes.as_ref()) => written,
        };
        if let Err(e) = written {
            inner.shutdown(CloseCode::Error, format!("the connection failed: {e}"));
            break;
        }
    }
    let (code, reason) = inner.end.get().cloned().unwrap_or((CloseCode::Normal, String::new()));
    let farewell = async {
        let frame = CloseFrame { code, reason: clip(&reason, MAX_WS_REASON).into() };
        sink.send(Message::Close(Some(frame))).await?;
        sink.close().await
    };
    // The peer may be gone or stalled: the goodbye is best effort.
    let _ = tokio::time::timeout(FAREWELL, farewell).await;
}

/// Feeds the whole batch, then flushes once.
async fn write_batch<S>(
    inner: &Inner,
    sink: &mut SplitSink<WebSocketStream<S>, Message>,
    batch: &mut Vec<Out>,
    bytes: Option<&metrics::Counter>,
) -> Result<(), WsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut data = 0;
    for out in batch.drain(..) {
        let message = match out {
            Out::Data(frame) => {
                data += 1;
                Message::Binary(frame)
            }
            Out::Control(message) => message,
        };
        if let (Some(bytes), Message::Binary(frame)) = (bytes, &message) {
            bytes.increment(frame.len() as u64);
        }
        sink.feed(message).await?;
    }
    sink.flush().await?;
    inner.slots.add_permits(data);
    Ok(())
}

async fn heartbeat(inner: Arc<Inner>) {
    let every = inner.settings.heartbeat;
    let cancelled = inner.cancel.clone().cancelled_owned();
    tokio::pin!(cancelled);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = inner.received.load(Ordering::Relaxed);
    let mut silent = 0;
    loop {
        tokio::select! {
            biased;
            () = &mut cancelled => return,
            _ = tick.tick() => {}
        }
        let now = inner.received.load(Ordering::Relaxed);
        if now == seen {
            silent += 1;
            if silent >= SILENT_HEARTBEATS {
                inner.shutdown(
                    CloseCode::Away,
                    format!("nothing from the peer for {SILENT_HEARTBEATS} heartbeats of {every:?}"),
                );
                return;
            }
        } else {
            seen = now;
            silent = 0;
        }
        let _ = inner.out.send(Out::Control(Message::Ping(Bytes::new())));
    }
}
