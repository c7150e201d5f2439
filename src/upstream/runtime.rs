//! The proxy's runtime: connections to upstream servers, shared per (tenant, resolved
//! declaration), started lazily, restarted on the next call after a crash and closed when
//! idle; per-session snapshots of which servers a session sees; the call path (identity
//! assertion, timeout, cancellation) and the routing of upstream progress and log messages
//! back to the session that called.
//!
//! A session's snapshot is resolved once (on its first `tools/list` or upstream call) and
//! frozen: a changed declaration applies to new sessions, and a session keeps the connection
//! its snapshot named. A stateless request is its own session. Snapshots and connections are
//! keyed by tenant, so sessions of different tenants never share one.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientRequest, Implementation, JsonObject, ProgressNotificationParam,
    ProgressToken, RequestMetaObject, ServerResult, Tool,
};
use rmcp::model::{GetExtensions, JsonRpcMessage, JsonRpcNotification, ServerNotification};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningService, RxJsonRpcMessage, ServiceError,
    TxJsonRpcMessage,
};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ErrorData, RoleServer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::client::ASSERTION_META_KEY;
use super::executor::{Executor, LocalExecutor, UpstreamError};
use super::{PathStyle, PathUri, ResolvedServer, ServerName, parse_declarations};
use crate::auth::assertion::{AssertedCaller, AssertionSigner};
use crate::context::{FlockAccess, McpCallContext};
use crate::identity::SessionRegistry;
use crate::model::Role;
use crate::store::entities::GrantRow;
use crate::store::{Db, StoreError, TenantId, now_millis};
use crate::telemetry::metrics;
use http::HeaderName;

/// Separates the server from the tool in an upstream tool's name: `server__tool`.
pub const NAME_SEPARATOR: &str = "__";

/// Why a proxied call failed (the call's audit class is [`ProxyError::class`]).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("upstream server unavailable: {0}")]
    Unavailable(String),
    #[error("tool call timed out")]
    Timeout,
    #[error("cancelled by the client")]
    Cancelled,
    #[error("upstream error: {}", .0.message)]
    Upstream(ErrorData),
    #[error("signing the identity assertion failed")]
    Assertion,
}

impl ProxyError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "upstream_unavailable",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Upstream(_) => "upstream_error",
            Self::Assertion => "internal",
        }
    }

    /// What the client is told: the upstream's own JSON-RPC error, or a generic one that
    /// names no process, path or address of the gateway host.
    pub fn into_error_data(self) -> ErrorData {
        match self {
            Self::Upstream(e) => e,
            Self::Timeout => ErrorData::internal_error("tool call timed out", None),
            Self::Cancelled => ErrorData::internal_error("tool call cancelled", None),
            Self::Unavailable(_) => ErrorData::internal_error("upstream server unavailable", None),
            Self::Assertion => ErrorData::internal_error("internal error", None),
        }
    }
}

/// One proxied call: the upstream's own tool name, its arguments, where its notifications go,
/// and when it ends.
pub struct UpstreamCall<'a> {
    pub tool: &'a str,
    pub arguments: Option<JsonObject>,
    pub downstream: Downstream,
    pub timeout: Duration,
    /// Cancelled when the client cancels the call.
    pub cancelled: CancellationToken,
}

/// The session a proxied call came from: where its progress and log messages go.
#[derive(Clone)]
pub struct Downstream {
    /// The session id, or a per-request id for a stateless call.
    pub owner: String,
    pub peer: Peer<RoleServer>,
    /// The downstream request's progress token, when its client asked for progress.
    pub progress: Option<ProgressToken>,
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
struct Routes {
    state: Mutex<RouteTable>,
    dispatch: Dispatch,
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
struct Dispatch {
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
    fn horizon(&self) -> u64 {
        self.lock().next
    }

    /// Waits until every notification below `horizon` has been handled, or [`SETTLE_BOUND`].
    async fn settle(&self, horizon: u64) {
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
    fn announce(&self, downstream: Downstream) -> RouteGuard<'_> {
        let mut table = self.lock();
        let id = table.next_announcement;
        table.next_announcement += 1;
        table.announced.push((id, downstream));
        RouteGuard { routes: self, slot: Slot::Announced(id) }
    }

    /// The one session every in-flight (or just finished) call belongs to, if there is one.
    fn single_owner(&self) -> Option<Peer<RoleServer>> {
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
        owners.all(|d| d.owner == first.owner).then(|| first.peer.clone())
    }
}

enum Slot {
    Announced(u64),
    Routed(ProgressToken),
}

/// A call's place in the route table: announced, then routed; retired when the call ends,
/// however it ends.
struct RouteGuard<'a> {
    routes: &'a Routes,
    slot: Slot,
}

impl RouteGuard<'_> {
    /// Routes the announced call by its progress token; returns its caller and the progress
    /// that came for it before.
    fn route(&mut self, token: &ProgressToken) -> Option<(Downstream, Vec<ProgressNotificationParam>)> {
        let Slot::Announced(id) = self.slot else {
            return None;
        };
        let mut table = self.routes.lock();
        let at = table.announced.iter().position(|(i, _)| *i == id)?;
        let (_, downstream) = table.announced.swap_remove(at);
        table.calls.insert(token.clone(), downstream.clone());
        self.slot = Slot::Routed(token.clone());
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
            Slot::Routed(token) => table.calls.remove(token),
        };
        if let Some(done) = done {
            table.finished.push_back((Instant::now(), done));
        }
    }
}

/// Sends `params` to the calling session under its own progress token, if it asked for progress.
async fn forward_progress(server: &str, target: Downstream, mut params: ProgressNotificationParam) {
    let Downstream { peer, progress: Some(token), .. } = target else {
        return;
    };
    params.progress_token = token;
    if let Err(e) = peer.notify_progress(params).await {
        tracing::debug!(%server, error = %e, "progress not delivered");
    }
}

/// The gateway's side of an upstream connection: forwards progress to the calling session,
/// and log messages only where the calling session is certain.
#[derive(Clone)]
pub struct ProxyClient {
    routes: Arc<Routes>,
    server: String,
}

impl ProxyClient {
    /// `transport`, with this connection's progress and log notifications counted.
    pub fn counted<T: Transport<RoleClient>>(&self, transport: T) -> Counted<T> {
        Counted { inner: transport, routes: Arc::clone(&self.routes) }
    }

    fn handled(&self, context: &NotificationContext<RoleClient>) -> Handled<'_> {
        Handled(&self.routes.dispatch, context.extensions.get::<Seq>().copied())
    }
}

impl ClientHandler for ProxyClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("scopegate", env!("CARGO_PKG_VERSION")))
    }

    async fn on_progress(&self, params: ProgressNotificationParam, context: NotificationContext<RoleClient>) {
        let _handled = self.handled(&context);
        if let Some(target) = self.routes.progress_target(&params) {
            forward_progress(&self.server, target, params).await;
        }
    }

    /// Logging is deprecated in MCP (SEP-2577) but still sent by upstreams and still in the
    /// protocol versions the gateway serves, so it is forwarded.
    ///
    /// A log message names no call. It goes to the calling session only when every call in
    /// flight on this connection belongs to that one session; otherwise it is dropped, never
    /// guessed (the connection is shared by the tenant's sessions).
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        let _handled = self.handled(&context);
        match self.routes.single_owner() {
            Some(peer) => {
                if let Err(e) = peer.notify_logging_message(params).await {
                    tracing::debug!(server = %self.server, error = %e, "log message not delivered");
                }
            }
            None => {
                metrics::denial("upstream_log_unroutable");
                tracing::debug!(server = %self.server, "upstream log message with no single calling session; dropped");
            }
        }
    }
}

/// A started upstream connection, found to have the tool about to be called.
pub struct Upstream(Peer<RoleClient>);

struct Live {
    service: RunningService<RoleClient, ProxyClient>,
    /// The upstream's tools, as it named them (valid, unique names only).
    tools: Arc<Vec<Tool>>,
}

/// One upstream server for one tenant and one resolved declaration.
pub struct Connection {
    server: ResolvedServer,
    executor: Executor,
    routes: Arc<Routes>,
    live: tokio::sync::Mutex<Option<Live>>,
    last_used_ms: AtomicI64,
    in_flight: AtomicUsize,
}

impl Connection {
    fn new(server: ResolvedServer, executor: Executor) -> Self {
        Self {
            server,
            executor,
            routes: Arc::default(),
            live: tokio::sync::Mutex::new(None),
            last_used_ms: AtomicI64::new(now_millis()),
            in_flight: AtomicUsize::new(0),
        }
    }

    pub fn server(&self) -> &ServerName {
        &self.server.name
    }

    /// The running connection, started (or restarted after a crash) if need be.
    async fn ready(&self, timeout: Duration) -> Result<(Peer<RoleClient>, Arc<Vec<Tool>>), UpstreamError> {
        self.last_used_ms.store(now_millis(), Ordering::Relaxed);
        let mut live = self.live.lock().await;
        if let Some(current) = live.as_ref() {
            if !current.service.peer().is_transport_closed() {
                return Ok((current.service.peer().clone(), Arc::clone(&current.tools)));
            }
            tracing::warn!(server = %self.server.name, "upstream connection closed; restarting it");
            metrics::upstream_restart(self.server.name.as_str());
        }
        // Dropping the old service kills its child process.
        *live = None;
        let handler = ProxyClient { routes: Arc::clone(&self.routes), server: self.server.name.to_string() };
        let service = self.executor.connect(&self.server, handler, timeout).await?;
        let listed = tokio::time::timeout(timeout, service.peer().list_all_tools()).await;
        let tools = match listed {
            Ok(Ok(tools)) => usable_tools(self.server.name.as_str(), tools),
            Ok(Err(e)) => return Err(UpstreamError::Connect(format!("listing tools: {e}"))),
            Err(_) => return Err(UpstreamError::ConnectTimeout(timeout)),
        };
        let tools = Arc::new(tools);
        let peer = service.peer().clone();
        *live = Some(Live { service, tools: Arc::clone(&tools) });
        Ok((peer, tools))
    }

    /// Closes the connection if it has been idle for `idle`; the next use starts it again.
    async fn close_if_idle(&self, idle: Duration) {
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        if self.in_flight.load(Ordering::Acquire) > 0
            || now_millis() - self.last_used_ms.load(Ordering::Relaxed) < idle_ms
        {
            return;
        }
        if let Ok(mut live) = self.live.try_lock()
            && let Some(old) = live.take()
        {
            tracing::debug!(server = %self.server.name, "closing an idle upstream connection");
            let _ = old.service.cancel().await;
        }
    }

    async fn close(&self) {
        if let Some(old) = self.live.lock().await.take() {
            let _ = old.service.cancel().await;
        }
    }
}

/// Tool names the gateway can serve as `server__tool`: MCP's tool-name characters, within
/// 128 characters once prefixed, each name once (the first wins).
fn usable_tools(server: &str, tools: Vec<Tool>) -> Vec<Tool> {
    let mut seen = std::collections::HashSet::new();
    tools
        .into_iter()
        .filter(|tool| {
            let name = tool.name.as_ref();
            let valid = !name.is_empty()
                && server.len() + NAME_SEPARATOR.len() + name.len() <= 128
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
            if !valid {
                tracing::warn!(%server, tool = %name, "upstream tool name unusable; not served");
                return false;
            }
            if !seen.insert(name.to_owned()) {
                tracing::warn!(%server, tool = %name, "upstream lists a tool twice; the first is served");
                return false;
            }
            true
        })
        .collect()
}

/// The upstream servers one session sees, frozen when the session first needed them.
pub struct Snapshot {
    tenant: TenantId,
    servers: BTreeMap<String, Arc<Connection>>,
    grants: Vec<GrantRow>,
}

impl Snapshot {
    /// The allow list: a grant names the server, one of the caller's roles, and the tool or `*`.
    pub fn allowed(&self, server: &str, tool: &str, roles: &[Role]) -> bool {
        self.grants.iter().any(|g| g.server == server && roles.contains(&g.role) && (g.tool == "*" || g.tool == tool))
    }

    fn any_grant(&self, server: &str, roles: &[Role]) -> bool {
        self.grants.iter().any(|g| g.server == server && roles.contains(&g.role))
    }

    pub fn connection(&self, server: &str) -> Option<&Arc<Connection>> {
        self.servers.get(server)
    }
}

/// Every upstream connection of the gateway, and the sessions' snapshots.
pub struct Upstreams {
    db: Db,
    local: Arc<LocalExecutor>,
    signer: Arc<AssertionSigner>,
    sessions: Arc<SessionRegistry>,
    connect_timeout: Duration,
    idle: Duration,
    pool: Mutex<HashMap<(TenantId, String), Arc<Connection>>>,
    snapshots: Mutex<HashMap<String, Arc<Snapshot>>>,
    requests: AtomicUsize,
}

/// Settings of the upstream runtime.
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    pub idle: Duration,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Upstreams {
    pub fn new(
        db: Db,
        local: LocalExecutor,
        signer: Arc<AssertionSigner>,
        sessions: Arc<SessionRegistry>,
        settings: UpstreamSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            db,
            local: Arc::new(local),
            signer,
            sessions,
            connect_timeout: settings.connect_timeout,
            idle: settings.idle,
            pool: Mutex::default(),
            snapshots: Mutex::default(),
            requests: AtomicUsize::new(0),
        })
    }

    /// The runtime for `config`, with the local executor as configured (validated at load).
    pub fn from_config(
        config: &crate::config::UpstreamConfig,
        db: Db,
        signer: Arc<AssertionSigner>,
        sessions: Arc<SessionRegistry>,
    ) -> Result<Arc<Self>, UpstreamError> {
        let root = if config.local_root.is_empty() {
            LocalExecutor::default_root().ok_or_else(|| UpstreamError::Config {
                key: "upstream.local_root",
                message: "the working directory is not a usable path; configure a file: URI".to_owned(),
            })?
        } else {
            PathUri::parse(&config.local_root, PathStyle::Posix)
                .map_err(|e| UpstreamError::Config { key: "upstream.local_root", message: e.to_string() })?
        };
        let header = HeaderName::try_from(config.assertion_header.as_str())
            .map_err(|e| UpstreamError::Config { key: "upstream.assertion_header", message: e.to_string() })?;
        let local = LocalExecutor::new(root, config.inherit_env.clone(), header, &config.ca_file)?;
        let settings = UpstreamSettings {
            connect_timeout: Duration::from_secs(config.connect_timeout_secs),
            idle: Duration::from_secs(config.idle_secs),
        };
        Ok(Self::new(db, local, signer, sessions, settings))
    }

    /// A per-request owner id for a stateless call (its own session).
    pub fn stateless_owner(&self) -> String {
        format!("request-{}", self.requests.fetch_add(1, Ordering::Relaxed))
    }

    /// The session's snapshot, resolved on first use; a stateless call (no session) resolves
    /// its own. A snapshot is never handed to another tenant.
    pub async fn snapshot(&self, tenant: TenantId, session: Option<&str>) -> Result<Arc<Snapshot>, StoreError> {
        if let Some(session) = session
            && let Some(existing) = lock(&self.snapshots).get(session).cloned()
        {
            if existing.tenant == tenant {
                return Ok(existing);
            }
            // Session binding makes this unreachable; if it ever happens, see nothing.
            tracing::error!("a session's upstream snapshot belongs to another tenant; refusing it");
            return Ok(Arc::new(Snapshot { tenant, servers: BTreeMap::new(), grants: Vec::new() }));
        }
        let fresh = Arc::new(self.resolve(tenant).await?);
        match session {
            Some(session) => {
                let mut snapshots = lock(&self.snapshots);
                let kept = snapshots.entry(session.to_owned()).or_insert_with(|| Arc::clone(&fresh));
                Ok(if kept.tenant == tenant { Arc::clone(kept) } else { fresh })
            }
            None => Ok(fresh),
        }
    }

    /// Resolves every server the tenant bound, each in its bound executor's context, and the
    /// tenant's grants. A server that can't be resolved is left out (and logged): it is not
    /// served, rather than served wrongly.
    async fn resolve(&self, tenant: TenantId) -> Result<Snapshot, StoreError> {
        let (entities, grants) = tokio::try_join!(self.db.resolve_servers(tenant), self.db.upstream_grants(tenant))?;
        let mut servers = BTreeMap::new();
        for (server, entity) in entities {
            let executor = match Executor::for_row(&entity.executor, &self.local) {
                Ok(executor) => executor,
                Err(e) => {
                    tracing::warn!(%server, error = %e, "upstream server not served");
                    continue;
                }
            };
            let resolved = match resolve_declaration(&server, &entity.declaration, &executor) {
                Ok(resolved) => resolved,
                Err(problem) => {
                    tracing::warn!(%server, entity = %entity.entity, %problem, "upstream declaration unusable; not served");
                    continue;
                }
            };
            let key = (tenant, resolved.fingerprint());
            let connection = Arc::clone(
                lock(&self.pool).entry(key).or_insert_with(|| Arc::new(Connection::new(resolved, executor))),
            );
            servers.insert(server, connection);
        }
        Ok(Snapshot { tenant, servers, grants })
    }

    /// The upstream tools the caller may use, named `server__tool`. Servers with no grant for
    /// the caller are not even started; one that fails to start is left out of the list.
    pub async fn list(&self, snapshot: &Snapshot, roles: &[Role]) -> Vec<Tool> {
        let mut tasks = tokio::task::JoinSet::new();
        for (name, connection) in &snapshot.servers {
            if !snapshot.any_grant(name, roles) {
                continue;
            }
            let connection = Arc::clone(connection);
            let timeout = self.connect_timeout;
            tasks.spawn(async move {
                let tools = connection.ready(timeout).await;
                (connection, tools)
            });
        }
        let mut out = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((connection, tools)) = joined else { continue };
            let server = connection.server().as_str();
            match tools {
                Ok((_, tools)) => out.extend(
                    tools.iter().filter(|t| snapshot.allowed(server, &t.name, roles)).map(|t| prefixed(server, t)),
                ),
                Err(e) => tracing::warn!(%server, error = %e, "upstream server unavailable; its tools are not listed"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The (started) upstream, if it has `tool` (`None`: it does not). Starting it may fail:
    /// then the call fails as unavailable rather than as unknown.
    pub async fn upstream_with(&self, connection: &Connection, tool: &str) -> Result<Option<Upstream>, ProxyError> {
        let (peer, tools) = connection.ready(self.connect_timeout).await.map_err(unavailable)?;
        Ok(tools.iter().any(|t| t.name == tool).then_some(Upstream(peer)))
    }

    /// Calls `tool` on the upstream for the caller: the call carries an identity assertion
    /// (audience: the server id) and nothing of the client's own credentials. It ends at
    /// `timeout` or when the client cancels; either way the upstream is told to cancel.
    pub async fn call(
        &self,
        connection: &Connection,
        upstream: Upstream,
        ctx: &McpCallContext,
        call: UpstreamCall<'_>,
    ) -> Result<CallToolResult, ProxyError> {
        connection.in_flight.fetch_add(1, Ordering::AcqRel);
        let result = self.call_inner(connection, upstream.0, ctx, call).await;
        connection.last_used_ms.store(now_millis(), Ordering::Relaxed);
        connection.in_flight.fetch_sub(1, Ordering::AcqRel);
        result
    }

    async fn call_inner(
        &self,
        connection: &Connection,
        peer: Peer<RoleClient>,
        ctx: &McpCallContext,
        UpstreamCall { tool, arguments, downstream, timeout, cancelled }: UpstreamCall<'_>,
    ) -> Result<CallToolResult, ProxyError> {
        let assertion = self
            .signer
            .assertion(&asserted_caller(ctx), connection.server().as_str())
            .map_err(|_| ProxyError::Assertion)?;
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert(ASSERTION_META_KEY.to_owned(), Value::String(assertion));
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let options = PeerRequestOptions::with_timeout(timeout).with_meta(meta);
        // Announced before it is sent: whatever the upstream sends back at once finds its caller.
        let mut route = connection.routes.announce(downstream);
        let handle = peer.send_request_with_option(request, options).await.map_err(unavailable)?;
        if let Some((target, early)) = route.route(&handle.progress_token) {
            for params in early {
                forward_progress(connection.server().as_str(), target.clone(), params).await;
            }
        }
        let (id, upstream) = (handle.id.clone(), handle.peer.clone());
        let answer = tokio::select! {
            answer = handle.await_response() => {
                // What the upstream sent before its answer reaches the caller before the answer.
                connection.routes.dispatch.settle(connection.routes.dispatch.horizon()).await;
                answer
            }
            () = cancelled.cancelled() => {
                let notification = CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id),
                    Some("cancelled by the client".to_owned()),
                ));
                let _ = upstream.send_notification(notification.into()).await;
                return Err(ProxyError::Cancelled);
            }
        };
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(ProxyError::Unavailable("the upstream answered a call with something else".to_owned())),
            Err(ServiceError::Timeout { .. }) => Err(ProxyError::Timeout),
            Err(ServiceError::McpError(e)) => Err(ProxyError::Upstream(e)),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Drops snapshots of ended sessions and closes idle connections, until `shutdown`;
    /// then closes every connection (and so stops every child process).
    pub fn spawn_sweeper(self: &Arc<Self>, shutdown: CancellationToken) {
        let this = Arc::clone(self);
        let period = (this.idle / 4).clamp(Duration::from_millis(200), Duration::from_secs(30));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = tick.tick() => {}
                }
                this.sweep().await;
            }
            let all: Vec<_> = lock(&this.pool).drain().map(|(_, c)| c).collect();
            lock(&this.snapshots).clear();
            for connection in all {
                connection.close().await;
            }
        });
    }

    async fn sweep(&self) {
        lock(&self.snapshots).retain(|session, _| self.sessions.principal(session).is_some());
        let connections: Vec<_> = lock(&self.pool).values().cloned().collect();
        for connection in &connections {
            connection.close_if_idle(self.idle).await;
        }
        drop(connections);
        // A connection no snapshot names any more, and closed, is forgotten.
        lock(&self.pool).retain(|_, c| {
            Arc::strong_count(c) > 1
                || c.in_flight.load(Ordering::Acquire) > 0
                || c.live.try_lock().is_ok_and(|l| l.is_some())
        });
    }

    /// Connections currently running (for tests and metrics).
    pub async fn running(&self) -> usize {
        let connections: Vec<_> = lock(&self.pool).values().cloned().collect();
        let mut n = 0;
        for c in connections {
            if c.live.lock().await.is_some() {
                n += 1;
            }
        }
        n
    }
}

fn unavailable(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::Unavailable(e.to_string())
}

fn prefixed(server: &str, tool: &Tool) -> Tool {
    let mut tool = tool.clone();
    tool.name = format!("{server}{NAME_SEPARATOR}{}", tool.name).into();
    tool
}

/// Splits `server__tool` at the first separator (server names can't contain it).
pub fn split_tool_name(name: &str) -> Option<(&str, &str)> {
    name.split_once(NAME_SEPARATOR).filter(|(s, t)| !s.is_empty() && !t.is_empty())
}

/// Who the assertion speaks for: plain values of the call's context.
fn asserted_caller(ctx: &McpCallContext) -> AssertedCaller {
    AssertedCaller {
        tenant: ctx.tenant_slug().to_owned(),
        tenant_id: ctx.tenant_id().to_string(),
        user: ctx.subject().to_owned(),
        user_id: ctx.user_id().to_string(),
        roles: ctx.roles().iter().map(|r| r.as_str().to_owned()).collect(),
        flocks: match ctx.flocks() {
            FlockAccess::AllOfTenant => json!("all"),
            FlockAccess::Only(ids) => Value::Array(ids.iter().map(|id| Value::String(id.to_string())).collect()),
        },
    }
}

/// One stored server declaration, resolved for its bound executor.
fn resolve_declaration(server: &str, declaration: &str, executor: &Executor) -> Result<ResolvedServer, String> {
    let value: Value = serde_json::from_str(declaration).map_err(|e| format!("stored declaration: {e}"))?;
    let file = json!({ server: value }).to_string();
    let parsed = parse_declarations(&file).map_err(|e| e.to_string())?;
    if let Some(error) = parsed.errors.first() {
        return Err(error.to_string());
    }
    let declared = parsed.servers.into_iter().next().ok_or("no server in the declaration")?;
    declared
        .resolve(&executor.placement(), executor.env())
        .map_err(|errors| errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
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

    fn tool(name: &str) -> Tool {
        Tool::new(name.to_owned(), "t", Arc::new(JsonObject::new()))
    }

    #[test]
    fn upstream_tool_names_split_at_the_first_separator() {
        assert_eq!(split_tool_name("fx__whoami"), Some(("fx", "whoami")));
        assert_eq!(split_tool_name("fx__a__b"), Some(("fx", "a__b")), "the tool keeps its own `__`");
        assert_eq!(split_tool_name("whoami"), None);
        assert_eq!(split_tool_name("__x"), None);
        assert_eq!(split_tool_name("fx__"), None);
    }

    #[test]
    fn unusable_and_repeated_upstream_tools_are_not_served() {
        let long = "x".repeat(126);
        let kept = usable_tools(
            "fx",
            vec![tool("echo"), tool("echo"), tool("bad name"), tool("ok.v2-x_y"), tool(""), tool(&long)],
        );
        let names: Vec<_> = kept.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(names, ["echo", "ok.v2-x_y"]);
        let fits = "x".repeat(124);
        assert_eq!(usable_tools("fx", vec![tool(&fits)]).len(), 1, "fx__ + 124 = 128 characters");
    }

    #[test]
    fn a_grant_names_server_role_and_tool() {
        let snapshot = Snapshot {
            tenant: TenantId::generate(),
            servers: BTreeMap::new(),
            grants: vec![
                GrantRow { server: "fx".into(), role: Role::Owner, tool: "*".into() },
                GrantRow { server: "fx".into(), role: Role::Worker, tool: "whoami".into() },
            ],
        };
        assert!(snapshot.allowed("fx", "anything", &[Role::Owner]));
        assert!(snapshot.allowed("fx", "whoami", &[Role::Worker]));
        assert!(!snapshot.allowed("fx", "echo", &[Role::Worker]));
        assert!(!snapshot.allowed("fx", "whoami", &[Role::Auditor]));
        assert!(!snapshot.allowed("other", "whoami", &[Role::Owner]), "a grant names its server");
        assert!(!snapshot.allowed("fx", "whoami", &[]));
    }
}
