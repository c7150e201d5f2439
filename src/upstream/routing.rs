//! Routing what an upstream sends besides answers: progress to the call it belongs to, log
//! messages to the one session certain to have caused them, never to a guess; and ordering,
//! so a call's answer never overtakes the notifications sent before it. Requests the upstream
//! makes of its client (sampling, elicitation, roots) go to the one session whose call it is
//! serving, and list changes and resource updates to the sessions that follow them.
//!
//! Sampling, roots and logging are deprecated in MCP (SEP-2577) but still part of the protocol
//! versions the gateway serves, and upstreams still use them: they are relayed.
#![allow(deprecated)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientResult, CreateMessageRequest, CreateMessageRequestParams,
    CreateMessageResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationCapability, ErrorCode,
    FormElicitationCapability, GetExtensions, GetMeta, Implementation, InputRequest, JsonRpcMessage,
    JsonRpcNotification, ListRootsRequest, ListRootsResult, ProgressNotificationParam, ProgressToken, RequestId,
    ResourceUpdatedNotificationParam, RootsCapabilities, SamplingCapability, ServerNotification, ServerRequest,
    UrlElicitationCapability,
};
use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RequestContext, RoleClient, RxJsonRpcMessage, ServiceError,
    TxJsonRpcMessage,
};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ErrorData, RoleServer};
use serde_json::Value;

use super::catalog::{Catalog, ListKind};
use super::client::RELATED_META_KEY;
use crate::audit::{AuditWriter, CallAudit, Outcome, digest};
use crate::store::{TenantId, UserId};
use crate::telemetry::metrics;

#[derive(Clone)]
pub struct Downstream {
    /// The session id, or a per-request id for a stateless call.
    pub owner: String,
    /// Where notifications for the caller go.
    pub sink: Sink,
    /// The downstream request's progress token, when its client asked for progress.
    pub progress: Option<ProgressToken>,
    /// The least severe log level the session wants (its `logging/setLevel`).
    pub log_level: Arc<LogLevel>,
    /// Who made the call, for the audit of the requests the upstream makes of its client
    /// while serving it, and how long those may take.
    pub origin: Option<Arc<CallOrigin>>,
    /// A caller on protocol 2026-07-28 takes no requests: what the upstream asks of it goes
    /// here, to be answered by the multi round-trip (`input_required`, SEP-2322).
    pub rounds: Option<tokio::sync::mpsc::Sender<Round>>,
}

/// Where notifications for a caller go while an upstream serves its request.
#[derive(Clone)]
pub enum Sink {
    /// Through the caller's rmcp session (on the request's own event stream).
    Peer(Peer<RoleServer>),
    /// Onto the answer of a call the lean relay serves (`mcp::lean`): each item is one
    /// serialized JSON-RPC notification, written before the answer, in order.
    Stream(tokio::sync::mpsc::Sender<bytes::Bytes>),
}

impl Sink {
    /// The rmcp peer, when the caller is reached through one (the only way to ask it something).
    pub fn peer(&self) -> Option<&Peer<RoleServer>> {
        match self {
            Self::Peer(peer) => Some(peer),
            Self::Stream(_) => None,
        }
    }

    async fn notify(&self, notification: ServerNotification) -> Result<(), String> {
        match self {
            Self::Peer(peer) => peer.send_notification(notification).await.map_err(|e| e.to_string()),
            Self::Stream(stream) => {
                let message = rmcp::model::ServerJsonRpcMessage::notification(notification);
                let bytes = serde_json::to_vec(&message).map_err(|e| e.to_string())?;
                stream.send(bytes.into()).await.map_err(|_| "the caller's answer is gone".to_owned())
            }
        }
    }
}

/// Whether the request is on protocol 2026-07-28, whose client takes no requests from the
/// server (what the upstream asks of it goes by multi round-trip).
pub fn by_rounds(context: &rmcp::service::RequestContext<RoleServer>) -> bool {
    context.protocol_version().is_some_and(|v| v == rmcp::model::ProtocolVersion::V_2026_07_28)
}

/// What happens next in a call made for a 2026-07-28 caller: the upstream asks its client
/// something (answered through `answer`), or the call is over.
pub enum Round {
    Ask { request: InputRequest, answer: tokio::sync::oneshot::Sender<Value> },
    Done(Result<rmcp::model::ServerResult, super::runtime::ProxyError>),
}

/// Who made a proxied call: what the audit of a relayed sampling, elicitation or roots
/// request records.
pub struct CallOrigin {
    pub audit: AuditWriter,
    pub tenant: TenantId,
    pub user: UserId,
    pub session: Option<String>,
    pub request_id: Option<String>,
    pub client: Option<(String, String)>,
    /// How long a relayed request may take (the call's own timeout).
    pub timeout: Duration,
}

impl CallOrigin {
    /// The audit of a request `server`'s upstream makes of this caller (`ID:method`, the
    /// digest of its params).
    fn audit_of(&self, server: &str, method: &str, arguments: &Value) -> CallAudit {
        let digest = match arguments {
            Value::Object(map) => digest::arguments_digest(Some(map)),
            _ => digest::arguments_digest(None),
        };
        CallAudit::new(
            self.tenant,
            self.user,
            self.session.clone(),
            self.request_id.clone(),
            self.client.clone(),
            format!("{server}:{method}"),
            digest,
            None,
        )
    }
}

/// A session's logging level (`logging/setLevel`); until it sets one, `info` and above.
pub struct LogLevel(AtomicU8);

impl Default for LogLevel {
    fn default() -> Self {
        #[allow(deprecated)]
        Self(AtomicU8::new(severity(LoggingLevel::Info)))
    }
}

/// The severity above every level: nothing passes.
const OFF: u8 = 8;

impl LogLevel {
    /// The level of one 2026-07-28 request: what its `_meta` names
    /// (`io.modelcontextprotocol/logLevel`), and without one no log line at all.
    pub fn of_request(level: Option<LoggingLevel>) -> Self {
        Self(AtomicU8::new(level.map_or(OFF, severity)))
    }

    #[allow(deprecated)]
    pub fn set(&self, level: LoggingLevel) {
        self.0.store(severity(level), Ordering::Relaxed);
    }

    #[allow(deprecated)]
    pub fn allows(&self, level: LoggingLevel) -> bool {
        severity(level) >= self.0.load(Ordering::Relaxed)
    }

    /// The least severe level that passes (`None`: nothing passes), for a 2026-07-28
    /// upstream's request `_meta`.
    pub fn level(&self) -> Option<LoggingLevel> {
        const LEVELS: [LoggingLevel; 8] = [
            LoggingLevel::Debug,
            LoggingLevel::Info,
            LoggingLevel::Notice,
            LoggingLevel::Warning,
            LoggingLevel::Error,
            LoggingLevel::Critical,
            LoggingLevel::Alert,
            LoggingLevel::Emergency,
        ];
        LEVELS.get(usize::from(self.0.load(Ordering::Relaxed))).copied()
    }
}

#[allow(deprecated)]
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// A received notification's `_meta`. rmcp 3.11 moves the notification's extensions into the
/// handler's context before it takes the meta out of them, so `context.meta` is always empty
/// and the meta (with the gateway's related-request mark) is found in `context.extensions`.
fn notification_meta(context: &NotificationContext<RoleClient>) -> &serde_json::Map<String, Value> {
    match context.extensions.get::<rmcp::model::NotificationMetaObject>() {
        Some(meta) => &meta.0.0,
        None => &context.meta.0.0,
    }
}

/// The request of the client an upstream's `input_required` names, as the request the gateway
/// relays or audits; `None` for a kind the gateway does not know.
pub(super) fn asked_request(asked: InputRequest) -> Option<ServerRequest> {
    match asked {
        InputRequest::CreateMessage(r) => Some(ServerRequest::CreateMessageRequest(r)),
        InputRequest::Elicitation(r) => Some(ServerRequest::ElicitRequest(r)),
        InputRequest::ListRoots(r) => Some(ServerRequest::ListRootsRequest(r)),
        _ => None,
    }
}

/// How one connection attempt starts the MCP lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// The 2026-07-28 "Backward Compatibility" rules: a modern `server/discover` first
    /// (retried with a version the server names in `UnsupportedProtocolVersionError`), and
    /// `initialize` on the newest legacy revision when the answer is no recognised modern error.
    ModernFirst,
    /// `server/discover` only.
    Modern,
    /// `initialize` offering this revision only.
    Legacy(&'static str),
}

/// What a connection tells its upstream the client can answer. A connection is shared only by
/// sessions whose clients declared the same (it is part of the pool's key), so an upstream is
/// never told of a capability its caller lacks, nor denied one its caller has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RelayCaps {
    pub sampling: bool,
    pub elicitation_form: bool,
    pub elicitation_url: bool,
    pub roots: bool,
    /// The callers are on a modern revision (2026-07-28). A server whose declaration pins no
    /// revision is spoken to in the callers' era where it serves that era (a dual-era server
    /// serves both, each on its own connection), so nothing is lost in translation; a
    /// single-era server is bridged.
    pub modern: bool,
}

impl RelayCaps {
    /// What a client declared: at `initialize` in a session, in the request's own `_meta` on
    /// protocol 2026-07-28 (answered by the multi round-trip). A request of the older versions
    /// outside a session declares nothing: it has no channel for requests back to its client.
    pub fn of(context: &rmcp::service::RequestContext<RoleServer>, in_session: bool) -> Self {
        let declared = if by_rounds(context) {
            context.client_capabilities()
        } else if in_session {
            context.peer.peer_info().map(|info| info.capabilities.clone())
        } else {
            None
        };
        let caps = declared.map_or_else(Self::default, |caps| Self::declared_by(&caps));
        Self { modern: by_rounds(context), ..caps }
    }

    /// What a client's capabilities let an upstream ask it.
    pub fn declared_by(caps: &ClientCapabilities) -> Self {
        // An elicitation capability that names no mode means form (the older versions' shape).
        let (form, url) = match &caps.elicitation {
            Some(e) if e.form.is_none() && e.url.is_none() => (true, false),
            Some(e) => (e.form.is_some(), e.url.is_some()),
            None => (false, false),
        };
        Self {
            sampling: caps.sampling.is_some(),
            elicitation_form: form,
            elicitation_url: url,
            roots: caps.roots.is_some(),
            modern: false,
        }
    }

    /// The pool key's part for these capabilities.
    pub fn key(self) -> String {
        format!(
            "caps:{}{}{}{}/{}",
            u8::from(self.sampling),
            u8::from(self.elicitation_form),
            u8::from(self.elicitation_url),
            u8::from(self.roots),
            if self.modern { "modern" } else { "legacy" }
        )
    }

    fn declared(self) -> ClientCapabilities {
        let mut caps = ClientCapabilities::default();
        if self.sampling {
            caps.sampling = Some(SamplingCapability::default());
        }
        if self.elicitation_form || self.elicitation_url {
            let mut elicitation = ElicitationCapability::default();
            if self.elicitation_form {
                elicitation.form = Some(FormElicitationCapability::default());
            }
            if self.elicitation_url {
                elicitation.url = Some(UrlElicitationCapability::default());
            }
            caps.elicitation = Some(elicitation);
        }
        if self.roots {
            caps.roots = Some(RootsCapabilities::default());
        }
        caps
    }
}

/// How long a finished call still counts as a log message's possible source: an upstream
/// writes its last log line just before its answer, and the two are handled concurrently.
const LOG_LINGER: Duration = Duration::from_millis(500);

/// Progress held for a call still being sent, at most this many notifications per connection.
const MAX_EARLY: usize = 256;

/// In-flight calls of one connection, by the progress token the upstream was given, and the
/// calls that finished within [`LOG_LINGER`].
///
/// A call is announced before its request is sent and routed once rmcp has given it its
/// progress token, so an upstream that answers with progress or a log line at once (before
/// the sending task has run again) still finds its caller: progress for an unknown token is
/// held while any call is announced and handed over when that call is routed, and an
/// announced call counts as a possible source of log lines.
#[derive(Default)]
pub(super) struct Routes {
    state: Mutex<RouteTable>,
    pub(super) dispatch: Dispatch,
}

/// Progress and log notifications from the upstream, counted in the order the transport
/// delivered them, until their handler is done with them.
///
/// rmcp hands each notification to its handler in a task of its own but a call's answer
/// straight to the caller, so the answer can overtake the notifications sent before it, and
/// the downstream request would be answered (its stream closed) before its last progress.
/// A call therefore waits, once answered, until every notification that came before its
/// answer has been handled (at most [`SETTLE_BOUND`]).
#[derive(Default)]
pub(super) struct Dispatch {
    state: Mutex<DispatchState>,
    settled: tokio::sync::Notify,
}

#[derive(Default)]
struct DispatchState {
    next: u64,
    /// Notifications not yet handled, with when they came. One whose handler never runs (rmcp
    /// routed it elsewhere, or the connection died) stops counting after [`SETTLE_BOUND`].
    open: BTreeMap<u64, Instant>,
}

/// A counted notification's place in the order; travels in the notification's extensions.
#[derive(Clone, Copy, Debug)]
struct Seq(u64);

/// The longest a call's answer waits for the notifications before it.
const SETTLE_BOUND: Duration = Duration::from_secs(1);

impl Dispatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, DispatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn received(&self) -> Seq {
        let mut state = self.lock();
        let now = Instant::now();
        if state.open.len() >= 1024 {
            state.open.retain(|_, at| now.duration_since(*at) < SETTLE_BOUND);
        }
        let seq = state.next;
        state.next += 1;
        state.open.insert(seq, now);
        Seq(seq)
    }

    fn done(&self, seq: Seq) {
        self.lock().open.remove(&seq.0);
        self.settled.notify_waiters();
    }

    /// Every notification received so far is below this.
    pub(super) fn horizon(&self) -> u64 {
        self.lock().next
    }

    /// Waits until every notification below `horizon` has been handled, or [`SETTLE_BOUND`].
    pub(super) async fn settle(&self, horizon: u64) {
        let settled = async {
            loop {
                let notified = self.settled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let pending = self.lock().open.range(..horizon).any(|(_, at)| at.elapsed() < SETTLE_BOUND);
                if !pending {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(SETTLE_BOUND, settled).await.is_err() {
            tracing::debug!("upstream notifications still being handled after the answer; answering anyway");
        }
    }
}

/// Marks a counted notification handled when its handler ends, however it ends.
struct Handled<'a>(&'a Dispatch, Option<Seq>);

impl Drop for Handled<'_> {
    fn drop(&mut self) {
        if let Some(seq) = self.1 {
            self.0.done(seq);
        }
    }
}

/// An upstream transport whose progress and log notifications are counted as they arrive.
pub struct Counted<T> {
    inner: T,
    routes: Arc<Routes>,
    /// Whether a related-request mark on a received message was set by the gateway's own HTTP
    /// client (true for Streamable HTTP); otherwise any mark is the upstream's and removed.
    trust_related: bool,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Counted<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let mut message = self.inner.receive().await?;
        if !self.trust_related {
            match &mut message {
                JsonRpcMessage::Notification(n) => {
                    n.notification.get_meta_mut().0.0.remove(RELATED_META_KEY);
                }
                JsonRpcMessage::Request(r) => {
                    r.request.get_meta_mut().0.0.remove(RELATED_META_KEY);
                }
                _ => {}
            }
        }
        if let JsonRpcMessage::Notification(JsonRpcNotification { notification, .. }) = &mut message
            && matches!(
                notification,
                ServerNotification::ProgressNotification(_) | ServerNotification::LoggingMessageNotification(_)
            )
        {
            let seq = self.routes.dispatch.received();
            notification.extensions_mut().insert(seq);
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[derive(Default)]
struct RouteTable {
    calls: HashMap<ProgressToken, Downstream>,
    /// The same calls by the id of the gateway's request to the upstream.
    ids: HashMap<RequestId, Downstream>,
    /// Calls being sent: their progress token is not known yet.
    announced: Vec<(u64, Downstream)>,
    next_announcement: u64,
    early: EarlyProgress,
    finished: std::collections::VecDeque<(Instant, Downstream)>,
}

/// Progress notifications that came before their call was routed, for [`LOG_LINGER`] at most.
#[derive(Default)]
struct EarlyProgress(std::collections::VecDeque<(Instant, ProgressNotificationParam)>);

impl EarlyProgress {
    fn prune(&mut self, now: Instant) {
        while self.0.front().is_some_and(|(at, _)| now.duration_since(*at) > LOG_LINGER) {
            self.0.pop_front();
        }
    }

    fn hold(&mut self, now: Instant, params: ProgressNotificationParam) {
        self.prune(now);
        if self.0.len() < MAX_EARLY {
            self.0.push_back((now, params));
        }
    }

    /// The held notifications for `token`, in the order they came.
    fn take(&mut self, now: Instant, token: &ProgressToken) -> Vec<ProgressNotificationParam> {
        self.prune(now);
        let (mine, others): (Vec<_>, Vec<_>) = self.0.drain(..).partition(|(_, p)| &p.progress_token == token);
        self.0.extend(others);
        mine.into_iter().map(|(_, p)| p).collect()
    }
}

impl Routes {
    fn lock(&self) -> std::sync::MutexGuard<'_, RouteTable> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where progress for `token` goes; `None` (and held, if a call is being sent) when no
    /// routed call has it.
    fn progress_target(&self, params: &ProgressNotificationParam) -> Option<Downstream> {
        let mut table = self.lock();
        if let Some(target) = table.calls.get(&params.progress_token) {
            return Some(target.clone());
        }
        if !table.announced.is_empty() {
            table.early.hold(Instant::now(), params.clone());
        }
        None
    }

    /// Announces a call about to be sent; the guard retires it however the call ends.
    pub(super) fn announce(&self, downstream: Downstream) -> RouteGuard<'_> {
        let mut table = self.lock();
        let id = table.next_announcement;
        table.next_announcement += 1;
        table.announced.push((id, downstream));
        RouteGuard { routes: self, slot: Slot::Announced(id) }
    }

    /// The call a message marked with `meta`'s related request belongs to.
    fn marked(&self, meta: &serde_json::Map<String, Value>) -> Marked {
        let Some(mark) = meta.get(RELATED_META_KEY) else { return Marked::No };
        let Ok(id) = serde_json::from_value::<RequestId>(mark.clone()) else { return Marked::Unknown };
        match self.lock().ids.get(&id) {
            Some(downstream) => Marked::Call(downstream.clone()),
            None => Marked::Unknown,
        }
    }

    /// The one session every in-flight call belongs to, if there is one: where a request the
    /// upstream makes of its client goes (a finished call asks nothing).
    fn single_caller(&self) -> Option<Downstream> {
        let table = self.lock();
        let mut callers = table.calls.values().chain(table.announced.iter().map(|(_, d)| d));
        let first = callers.next()?;
        callers.all(|d| d.owner == first.owner).then(|| first.clone())
    }

    /// The one session every in-flight (or just finished) call belongs to, if there is one.
    fn single_owner(&self) -> Option<Downstream> {
        let mut table = self.lock();
        let now = Instant::now();
        while table.finished.front().is_some_and(|(at, _)| now.duration_since(*at) > LOG_LINGER) {
            table.finished.pop_front();
        }
        let mut owners = table
            .calls
            .values()
            .chain(table.announced.iter().map(|(_, d)| d))
            .chain(table.finished.iter().map(|(_, d)| d));
        let first = owners.next()?;
        owners.all(|d| d.owner == first.owner).then(|| first.clone())
    }
}

enum Slot {
    Announced(u64),
    Routed(ProgressToken, RequestId),
}

/// What a message's related-request mark says.
enum Marked {
    /// It names an in-flight call: exactly where it goes.
    Call(Downstream),
    /// It names no call in flight (one that ended, or none): it goes nowhere.
    Unknown,
    /// It has none (stdio, or the session's own event stream): only the conservative rule.
    No,
}

/// A call's place in the route table: announced, then routed; retired when the call ends,
/// however it ends.
pub(super) struct RouteGuard<'a> {
    routes: &'a Routes,
    slot: Slot,
}

impl RouteGuard<'_> {
    /// Routes the announced call by its progress token; returns its caller and the progress
    /// that came for it before.
    pub(super) fn route(
        &mut self,
        token: &ProgressToken,
        request: &RequestId,
    ) -> Option<(Downstream, Vec<ProgressNotificationParam>)> {
        let Slot::Announced(id) = self.slot else {
            return None;
        };
        let mut table = self.routes.lock();
        let at = table.announced.iter().position(|(i, _)| *i == id)?;
        let (_, downstream) = table.announced.swap_remove(at);
        table.calls.insert(token.clone(), downstream.clone());
        table.ids.insert(request.clone(), downstream.clone());
        self.slot = Slot::Routed(token.clone(), request.clone());
        let early = table.early.take(Instant::now(), token);
        Some((downstream, early))
    }
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        let mut table = self.routes.lock();
        let done = match &self.slot {
            Slot::Announced(id) => {
                table.announced.iter().position(|(i, _)| i == id).map(|at| table.announced.swap_remove(at).1)
            }
            Slot::Routed(token, request) => {
                table.ids.remove(request);
                table.calls.remove(token)
            }
        };
        if let Some(done) = done {
            table.finished.push_back((Instant::now(), done));
        }
    }
}

/// Sends `params` to the calling session under its own progress token, if it asked for progress.
pub(super) async fn forward_progress(server: &str, target: Downstream, mut params: ProgressNotificationParam) {
    let Downstream { sink, progress: Some(token), .. } = target else {
        return;
    };
    params.progress_token = token;
    let notification = ServerNotification::ProgressNotification(rmcp::model::ProgressNotification::new(params));
    if let Err(e) = sink.notify(notification).await {
        tracing::debug!(%server, error = %e, "progress not delivered");
    }
}

/// Sends a log line to the calling session, if it is at or above the session's level.
#[allow(deprecated)]
pub(super) async fn forward_log(server: &str, target: &Downstream, params: LoggingMessageNotificationParam) {
    if !target.log_level.allows(params.level) {
        return;
    }
    let notification =
        ServerNotification::LoggingMessageNotification(rmcp::model::LoggingMessageNotification::new(params));
    if let Err(e) = target.sink.notify(notification).await {
        tracing::debug!(%server, error = %e, "log message not delivered");
    }
}

/// The gateway's side of an upstream connection: forwards progress to the calling session,
/// and log messages only where the calling session is certain.
#[derive(Clone)]
pub struct ProxyClient {
    pub(super) routes: Arc<Routes>,
    pub(super) catalog: Arc<Catalog>,
    pub(super) server: String,
    pub(super) caps: RelayCaps,
    /// How the connection's requests are sent (local Streamable HTTP upstreams without
    /// credentials record it; the lean relay reads it).
    pub(super) wire: Arc<super::client::WireSlot>,
    /// The upstream speaks Streamable HTTP: what it sends on a request's event stream is
    /// marked with that request (see `client::RELATED_META_KEY`).
    pub(super) trust_related: bool,
    /// The revision offered in an `initialize` (one that has the handshake).
    pub(super) offered: rmcp::model::ProtocolVersion,
}

impl ProxyClient {
    /// Starts the MCP lifecycle on `transport` in `lifecycle` (see [`Lifecycle`]). A revision
    /// without an `initialize` handshake is never offered in one.
    pub async fn start<T, E, A>(
        mut self,
        lifecycle: Lifecycle,
        transport: T,
    ) -> Result<rmcp::service::RunningService<RoleClient, Self>, rmcp::service::ClientInitializeError>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        use rmcp::model::ProtocolVersion;
        use rmcp::{ClientLifecycleMode, ClientServiceExt};
        let modern = || vec![ProtocolVersion::V_2026_07_28];
        let mode = match lifecycle {
            Lifecycle::ModernFirst => ClientLifecycleMode::Auto {
                preferred_versions: modern(),
                legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
            },
            Lifecycle::Modern => ClientLifecycleMode::Discover { preferred_versions: modern() },
            Lifecycle::Legacy(version) => {
                self.offered = serde_json::from_value(Value::String(version.to_owned()))
                    .unwrap_or(ProtocolVersion::LATEST_WITH_INITIALIZE);
                ClientLifecycleMode::Initialize
            }
        };
        self.serve_with_lifecycle(transport, mode).await
    }

    /// `transport`, with this connection's progress and log notifications counted.
    pub fn counted<T: Transport<RoleClient>>(&self, transport: T) -> Counted<T> {
        Counted { inner: transport, routes: Arc::clone(&self.routes), trust_related: self.trust_related }
    }

    fn handled(&self, context: &NotificationContext<RoleClient>) -> Handled<'_> {
        Handled(&self.routes.dispatch, context.extensions.get::<Seq>().copied())
    }

    /// Waits until the notifications that came before this one are handled (rmcp runs handlers
    /// concurrently: a burst of progress would otherwise reach the caller out of order).
    async fn in_turn(&self, context: &NotificationContext<RoleClient>) {
        if let Some(Seq(seq)) = context.extensions.get::<Seq>().copied() {
            self.routes.dispatch.settle(seq).await;
        }
    }
}

impl ClientHandler for ProxyClient {
    fn get_info(&self) -> ClientConfig {
        let mut config =
            ClientConfig::new(self.caps.declared(), Implementation::new("scopegate", env!("CARGO_PKG_VERSION")));
        config.protocol_version = self.offered.clone();
        config
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let request = ServerRequest::CreateMessageRequest(CreateMessageRequest::new(params));
        match self.relay(request, &context).await? {
            ClientResult::CreateMessageResult(result) => Ok(*result),
            _ => Err(answered_otherwise()),
        }
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        match self.relay(ServerRequest::ElicitRequest(ElicitRequest::new(params)), &context).await? {
            ClientResult::ElicitResult(result) => Ok(result),
            _ => Err(answered_otherwise()),
        }
    }

    async fn list_roots(&self, context: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        match self.relay(ServerRequest::ListRootsRequest(ListRootsRequest::default()), &context).await? {
            ClientResult::ListRootsResult(result) => Ok(result),
            _ => Err(answered_otherwise()),
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed(ListKind::Tools).await;
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed(ListKind::Prompts).await;
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed(ListKind::Resources).await;
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.resource_updated(params).await;
    }

    async fn on_progress(&self, params: ProgressNotificationParam, context: NotificationContext<RoleClient>) {
        let _handled = self.handled(&context);
        self.in_turn(&context).await;
        if let Some(target) = self.routes.progress_target(&params) {
            forward_progress(&self.server, target, params).await;
        }
    }

    /// Logging is deprecated in MCP (SEP-2577) but still sent by upstreams and still in the
    /// protocol versions the gateway serves, so it is forwarded.
    ///
    /// A log line a Streamable HTTP upstream sends on a call's event stream is marked with that
    /// call (by the gateway's client, never by the upstream) and goes to its caller. Any other
    /// names no call: it goes to the calling session only when every call in flight on this
    /// connection belongs to that one session; otherwise it is dropped, never guessed (the
    /// connection is shared by the tenant's sessions). Either way, only at or above the
    /// session's level.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        let _handled = self.handled(&context);
        self.in_turn(&context).await;
        let target = match self.routes.marked(notification_meta(&context)) {
            Marked::Call(call) => Some(call),
            Marked::Unknown => None,
            Marked::No => self.routes.single_owner(),
        };
        match target {
            Some(target) => forward_log(&self.server, &target, params).await,
            None => {
                metrics::denial("upstream_log_unroutable");
                tracing::debug!(server = %self.server, "upstream log message with no single calling session; dropped");
            }
        }
    }
}

impl ProxyClient {
    /// An upstream's list changed: it is fetched again when next needed, and the sessions
    /// that listed it are told. (Resources and templates change together.)
    pub(super) async fn list_changed(&self, kind: ListKind) {
        self.catalog.invalidate(kind);
        if kind == ListKind::Resources {
            self.catalog.invalidate(ListKind::Templates);
        }
        for to in self.catalog.watchers() {
            to.list_changed(kind).await;
        }
    }

    /// A notification that came on the `subscriptions/listen` stream the connection keeps open
    /// to a 2026-07-28 upstream: handled as the same notification from a legacy upstream.
    pub(super) async fn followed(&self, notification: ServerNotification) {
        match notification {
            ServerNotification::ToolListChangedNotification(_) => self.list_changed(ListKind::Tools).await,
            ServerNotification::PromptListChangedNotification(_) => self.list_changed(ListKind::Prompts).await,
            ServerNotification::ResourceListChangedNotification(_) => self.list_changed(ListKind::Resources).await,
            ServerNotification::ResourceUpdatedNotification(n) => self.resource_updated(n.params).await,
            _ => {}
        }
    }

    /// An update goes to the sessions subscribed to that resource, and to no other.
    pub(super) async fn resource_updated(&self, params: ResourceUpdatedNotificationParam) {
        for (to, update) in self.catalog.updated(&params.uri) {
            to.resource_updated(update).await;
        }
    }

    /// Relays a request the upstream makes of its client (sampling, elicitation, roots) to the
    /// session whose call it is serving: only while calls of exactly one session are in
    /// flight on this connection (never a guess), only when that client declared the
    /// capability, within the call's timeout, and cancelled when the upstream cancels it.
    /// Every relayed request is audited with the caller, the digest of its params and its outcome.
    async fn relay(
        &self,
        request: ServerRequest,
        context: &RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let asked = Asked::of(&request, self.caps)?;
        let method = asked.method;
        let refuse = |why: &'static str| {
            metrics::denial(why);
            tracing::debug!(server = %self.server, %method, why, "request to the client refused");
        };
        let target = match self.routes.marked(&context.meta.0.0) {
            Marked::Call(call) => Some(call),
            Marked::Unknown => None,
            Marked::No => self.routes.single_caller(),
        };
        let Some(target) = target else {
            refuse("upstream_request_unroutable");
            return Err(ErrorData::invalid_request(
                format!("{method} refused: no single call of one client is in flight to ask"),
                None,
            ));
        };
        relay_to(&self.server, &target, asked, request, &context.ct).await
    }
}

/// An upstream's answer that is not the result of what it was asked.
fn answered_otherwise() -> ErrorData {
    ErrorData::internal_error("the client answered with something else", None)
}

/// How the client's answer to a relayed request is read.
type Parse = fn(Value) -> Result<ClientResult, serde_json::Error>;

/// A request of the client: its method, whether the connection's clients declared it, its
/// params (the audit digests them), and how its answer is read.
pub(super) struct Asked {
    method: &'static str,
    declared: bool,
    arguments: Value,
    parse: Parse,
}

impl Asked {
    pub(super) fn of(request: &ServerRequest, caps: RelayCaps) -> Result<Self, ErrorData> {
        let params = |p: serde_json::Result<Value>| p.unwrap_or(Value::Null);
        Ok(match request {
            ServerRequest::CreateMessageRequest(r) => Self {
                method: "sampling/createMessage",
                declared: caps.sampling,
                arguments: params(serde_json::to_value(&r.params)),
                parse: |v| serde_json::from_value(v).map(|r| ClientResult::CreateMessageResult(Box::new(r))),
            },
            ServerRequest::ElicitRequest(r) => Self {
                method: "elicitation/create",
                declared: match &r.params {
                    ElicitRequestParams::UrlElicitationParams { .. } => caps.elicitation_url,
                    _ => caps.elicitation_form,
                },
                arguments: params(serde_json::to_value(&r.params)),
                parse: |v| serde_json::from_value(v).map(ClientResult::ElicitResult),
            },
            ServerRequest::ListRootsRequest(_) => Self {
                method: "roots/list",
                declared: caps.roots,
                arguments: Value::Null,
                parse: |v| serde_json::from_value(v).map(ClientResult::ListRootsResult),
            },
            _ => return Err(ErrorData::invalid_request("only sampling, elicitation and roots are relayed", None)),
        })
    }
}

/// Asks `target`'s client `request` on behalf of `server`'s upstream (see `ProxyClient::relay`):
/// only when that client declared the capability, by multi round-trip for a 2026-07-28
/// caller, within the call's timeout, ended by `ct`; audited.
pub(super) async fn relay_to(
    server: &str,
    target: &Downstream,
    Asked { method, declared, arguments, parse }: Asked,
    request: ServerRequest,
    ct: &tokio_util::sync::CancellationToken,
) -> Result<ClientResult, ErrorData> {
    let refuse = |why: &'static str| {
        metrics::denial(why);
        tracing::debug!(%server, %method, why, "request to the client refused");
    };
    let Some(origin) = target.origin.clone() else {
        refuse("upstream_request_unroutable");
        return Err(ErrorData::invalid_request(format!("{method} refused: the call has no client to ask"), None));
    };
    let audit = origin.audit_of(server, method, &arguments);
    let outcome = if !declared {
        refuse("upstream_request_not_declared");
        Err((
            ErrorData::new(ErrorCode::METHOD_NOT_FOUND, format!("the client does not support {method}"), None),
            "not_declared",
        ))
    } else if let Some(rounds) = &target.rounds {
        ask_by_round(method, rounds, request, parse, origin.timeout, ct).await
    } else if let Some(peer) = target.sink.peer() {
        let options = PeerRequestOptions::with_timeout(origin.timeout);
        let sent = async {
            let handle = peer.send_request_with_option(request, options).await?;
            handle.await_response().await
        };
        tokio::select! {
            answer = sent => match answer {
                Ok(result) => Ok(result),
                Err(ServiceError::McpError(e)) => Err((e, "client_error")),
                Err(ServiceError::Timeout { .. }) => {
                    Err((ErrorData::internal_error(format!("{method}: the client did not answer in time"), None), "timeout"))
                }
                Err(e) => {
                    tracing::debug!(%server, %method, error = %e, "relayed request failed");
                    Err((ErrorData::internal_error(format!("{method}: the client could not be asked"), None), "unavailable"))
                }
            },
            () = ct.cancelled() => Err((ErrorData::internal_error("cancelled by the server", None), "cancelled")),
        }
    } else {
        // The lean relay serves only callers that declared nothing to ask (see `mcp::lean`).
        refuse("upstream_request_unroutable");
        Err((ErrorData::internal_error(format!("{method}: the client could not be asked"), None), "unavailable"))
    };
    let event = match &outcome {
        Ok(_) => audit.event(Outcome::Ok, None),
        Err((_, class)) => audit.event(Outcome::Failed, Some(class)),
    };
    // Fail closed: without its audit event the client's answer is not handed over.
    origin.audit.record_or_withhold(event, method).await?;
    outcome.map_err(|(e, _)| e)
}

/// The requests of a 2026-07-28 upstream's `input_required`, passed through to a 2026-07-28
/// caller as its request's answer: each is audited as asked of the caller (the method, the
/// digest of its params), and one the caller's client did not declare fails the request
/// (audited as such) instead of reaching it.
pub(super) async fn audit_passed(
    server: &str,
    target: &Downstream,
    caps: RelayCaps,
    input: &rmcp::model::InputRequiredResult,
) -> Result<(), ErrorData> {
    let Some(origin) = target.origin.as_ref() else {
        return Err(ErrorData::invalid_request("the request has no client to ask", None));
    };
    let mut refused = None;
    for asked in input.input_requests.iter().flat_map(|r| r.values()) {
        let Some(request) = asked_request(asked.clone()) else {
            return Err(ErrorData::invalid_request("an input request of an unknown kind", None));
        };
        let Asked { method, declared, arguments, .. } = Asked::of(&request, caps)?;
        let audit = origin.audit_of(server, method, &arguments);
        let event = if declared {
            audit.event(Outcome::Ok, None)
        } else {
            metrics::denial("upstream_request_not_declared");
            refused = Some(method);
            audit.event(Outcome::Failed, Some("not_declared"))
        };
        origin.audit.record_or_withhold(event, method).await?;
    }
    match refused {
        Some(method) => {
            Err(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, format!("the client does not support {method}"), None))
        }
        None => Ok(()),
    }
}

/// Asks a 2026-07-28 caller through the multi round-trip: the request goes out in the call's
/// `input_required` answer and the client's answer comes back with its retry.
async fn ask_by_round(
    method: &str,
    rounds: &tokio::sync::mpsc::Sender<Round>,
    request: ServerRequest,
    parse: Parse,
    timeout: Duration,
    ct: &tokio_util::sync::CancellationToken,
) -> Result<ClientResult, (ErrorData, &'static str)> {
    let request = match request {
        ServerRequest::CreateMessageRequest(r) => InputRequest::CreateMessage(r),
        ServerRequest::ElicitRequest(r) => InputRequest::Elicitation(r),
        ServerRequest::ListRootsRequest(r) => InputRequest::ListRoots(r),
        _ => return Err((ErrorData::invalid_request(format!("{method} can't be asked"), None), "invalid")),
    };
    let (answer, answered) = tokio::sync::oneshot::channel();
    let gone = || (ErrorData::internal_error(format!("{method}: the client could not be asked"), None), "unavailable");
    rounds.send(Round::Ask { request, answer }).await.map_err(|_| gone())?;
    tokio::select! {
        answer = tokio::time::timeout(timeout, answered) => match answer {
            Ok(Ok(value)) => parse(value).map_err(|e| {
                (ErrorData::invalid_params(format!("{method}: the client's answer does not fit: {e}"), None), "client_error")
            }),
            Ok(Err(_)) => Err(gone()),
            Err(_) => Err((ErrorData::internal_error(format!("{method}: the client did not answer in time"), None), "timeout")),
        },
        () = ct.cancelled() => Err((ErrorData::internal_error("cancelled by the server", None), "cancelled")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_waits_for_the_notifications_before_it_and_only_those() {
        let dispatch = Arc::new(Dispatch::default());
        let (first, second) = (dispatch.received(), dispatch.received());
        let horizon = dispatch.horizon();
        let later = dispatch.received();
        let waiting = {
            let dispatch = Arc::clone(&dispatch);
            tokio::spawn(async move { dispatch.settle(horizon).await })
        };
        dispatch.done(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "one notification before the answer is still being handled");
        dispatch.done(second);
        let started = Instant::now();
        waiting.await.unwrap();
        assert!(started.elapsed() < SETTLE_BOUND / 2, "settled once both were handled, not at the bound");
        let _ = later; // after the answer: not waited for

        // One whose handler never runs holds an answer back for SETTLE_BOUND at most.
        let _lost = dispatch.received();
        let started = Instant::now();
        dispatch.settle(dispatch.horizon()).await;
        assert!(started.elapsed() >= SETTLE_BOUND && started.elapsed() < SETTLE_BOUND * 3);
        // Once it is that old it no longer counts: the next answer does not wait for it.
        let started = Instant::now();
        dispatch.settle(dispatch.horizon()).await;
        assert!(started.elapsed() < SETTLE_BOUND / 2, "a lost notification delays one answer, not every one");
    }

    fn progress(token: u32, step: f64) -> ProgressNotificationParam {
        ProgressNotificationParam::new(ProgressToken(rmcp::model::NumberOrString::Number(token.into())), step)
    }

    #[test]
    fn held_progress_is_handed_to_its_own_call_in_order_and_expires() {
        let mut early = EarlyProgress::default();
        let now = Instant::now();
        early.hold(now, progress(1, 1.0));
        early.hold(now, progress(2, 1.0));
        early.hold(now, progress(1, 2.0));
        let mine = early.take(now, &progress(1, 0.0).progress_token);
        assert_eq!(mine.iter().map(|p| p.progress).collect::<Vec<_>>(), [1.0, 2.0], "its own, in order");
        assert!(early.take(now, &progress(1, 0.0).progress_token).is_empty(), "handed over once");
        let later = now + LOG_LINGER + Duration::from_millis(1);
        assert!(early.take(later, &progress(2, 0.0).progress_token).is_empty(), "unclaimed progress expires");
        for i in 0..(MAX_EARLY as u32 + 10) {
            early.hold(later, progress(i, 1.0));
        }
        assert_eq!(early.0.len(), MAX_EARLY, "bounded");
    }
}
