//! One upstream server for one tenant and one resolved declaration: started lazily on its
//! executor, restarted on the next use after a crash, closed when idle. Never decides who may
//! call it (the snapshot's grants do).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::model::{Prompt, Resource, ResourceTemplate, SubscribeRequestParams, Tool, UnsubscribeRequestParams};
use rmcp::service::{Peer, RoleClient, RunningService, ServiceError};
use tracing::Instrument;

use crate::decl::ResolvedServer;
use crate::decl::ServerName;
use crate::decl::declaration::Revision;
use crate::executor::{Executor, UpstreamError};
use crate::oauth::{TokenOwner, UpstreamOAuth};
use crate::proxy::pins::{Pinned, Pins, Served};
use crate::relay::catalog::{Catalog, ListKind, Listed, Notifier, UpstreamSubscription};
use crate::relay::{Lifecycle, ProxyClient, RelayCaps, Routes};
use crate::store::now_millis;
use crate::telemetry::{metrics, trace};
use crate::wire::client::WireSlot;

/// A started upstream connection, found to have the tool about to be called.
#[derive(Clone)]
pub struct Upstream(pub(super) Peer<RoleClient>);

impl Upstream {
    /// The peer requests to this upstream are sent to.
    pub(crate) fn peer(&self) -> Peer<RoleClient> {
        self.0.clone()
    }

    /// Whether the upstream offers the tasks extension (it runs its own tasks).
    pub fn offers_tasks(&self) -> bool {
        self.0.peer_info().is_some_and(|info| info.capabilities.supports_tasks())
    }
}

pub(super) struct Live {
    service: RunningService<RoleClient, ProxyClient>,
    /// Ends the `subscriptions/listen` stream kept open to a 2026-07-28 upstream.
    _follow: Option<tokio_util::sync::DropGuard>,
}

/// How an OAuth-protected server's connection is authorized: whose credential it carries.
pub struct ConnectionAuth {
    pub oauth: Arc<UpstreamOAuth>,
    pub owner: TokenOwner,
}

/// How long rmcp waits for an answer to its `server/discover` probe before it falls back to
/// `initialize` (`ClientLifecycleMode::Auto`).
const MODERN_PROBE_WAIT: Duration = Duration::from_secs(10);

/// The revision offered first to a server whose declaration pins none, for callers on a
/// legacy revision: the newest with an `initialize`.
const LEGACY_PREFERRED: &str = "2025-11-25";

/// One upstream server for one tenant and one resolved declaration (and, for a server whose
/// OAuth tokens are per user, one user).
pub struct Connection {
    server: ResolvedServer,
    executor: Executor,
    pub(super) auth: Option<ConnectionAuth>,
    /// What the connection tells the upstream its clients can answer (sampling, elicitation,
    /// roots): those of the sessions that share it, which all declared the same.
    pub(super) caps: RelayCaps,
    pub(super) routes: Arc<Routes>,
    /// The upstream's lists, the sessions to tell when one changes, and subscriptions.
    pub(super) catalog: Arc<Catalog>,
    /// Its proxied calls, counted by the path that served them.
    pub(crate) calls: crate::telemetry::metrics::ProxiedCalls,
    /// How the running connection's requests are sent, when the lean relay may send its own.
    pub(super) wire: Arc<WireSlot>,
    pub(super) live: tokio::sync::Mutex<Option<Live>>,
    pub(super) last_used_ms: AtomicI64,
    /// Calls under way, counted by [`CallGuard`]s only.
    in_flight: AtomicUsize,
    /// The running connection speaks a revision without `initialize` (2026-07-28).
    modern: AtomicBool,
    /// Told when the set of upstream resources sessions follow changes (a 2026-07-28
    /// upstream's listen stream is then opened again with the new set).
    subscriptions_changed: Arc<tokio::sync::Notify>,
    /// What the admin API shows of it: the revision negotiated at its last start, and its last
    /// failure to start or list (when, and why), cleared by the next success.
    health: std::sync::Mutex<Health>,
    /// Its tools as policies see them, for the tool list they were read from.
    pub(super) facts: std::sync::Mutex<Option<ToolFactsOf>>,
    /// The catalogue's writes of this connection, one at a time, and the number of the list
    /// last served (a write of an older list is skipped: it would overwrite a newer one).
    pub(super) catalogue: Arc<CatalogueWrites>,
    /// Whose pinned definitions its lists are served under (`None`: served as listed, for a
    /// server that is no tenant's binding).
    pin: Option<PinScope>,
    /// Its lists as served under the pins, for the lists and pins they were computed from.
    pinned: std::sync::Mutex<PinCache>,
}

/// The tenant whose pinned definitions a connection's lists are served under.
pub(crate) struct PinScope {
    pub tenant: crate::store::TenantId,
    pub pins: Arc<Pins>,
}

/// See [`Connection::catalogue`].
#[derive(Default)]
pub(super) struct CatalogueWrites {
    pub one_at_a_time: tokio::sync::Mutex<()>,
    pub latest: std::sync::atomic::AtomicU64,
}

/// A list as served, for the upstream's list and the pins' version it was computed from.
pub(crate) struct CachedServe<T> {
    raw: Arc<Vec<T>>,
    version: u64,
    served: Served<T>,
}

/// The served lists of a connection, by kind.
#[derive(Default)]
pub(crate) struct PinCache {
    tools: Option<CachedServe<Tool>>,
    prompts: Option<CachedServe<Prompt>>,
    templates: Option<CachedServe<ResourceTemplate>>,
}

/// A list a connection serves: under the pins (tools, prompts, resource templates), or as the
/// upstream lists it (resources, whose contents no owner reviews).
pub(crate) trait Servable: Listed {
    fn served(
        connection: &Connection,
        listed: Arc<Vec<Self>>,
    ) -> impl Future<Output = Result<(Arc<Vec<Self>>, bool), UpstreamError>> + Send;
}

impl Servable for Tool {
    fn served(
        connection: &Connection,
        listed: Arc<Vec<Self>>,
    ) -> impl Future<Output = Result<(Arc<Vec<Self>>, bool), UpstreamError>> + Send {
        connection.pinned(listed, |c| &mut c.tools)
    }
}

impl Servable for Prompt {
    fn served(
        connection: &Connection,
        listed: Arc<Vec<Self>>,
    ) -> impl Future<Output = Result<(Arc<Vec<Self>>, bool), UpstreamError>> + Send {
        connection.pinned(listed, |c| &mut c.prompts)
    }
}

impl Servable for ResourceTemplate {
    fn served(
        connection: &Connection,
        listed: Arc<Vec<Self>>,
    ) -> impl Future<Output = Result<(Arc<Vec<Self>>, bool), UpstreamError>> + Send {
        connection.pinned(listed, |c| &mut c.templates)
    }
}

impl Servable for Resource {
    async fn served(_: &Connection, listed: Arc<Vec<Self>>) -> Result<(Arc<Vec<Self>>, bool), UpstreamError> {
        Ok((listed, false))
    }
}

/// The policy facts of one tool list (the list is kept to tell when it is replaced), and
/// whether the list is recorded in the tenant's catalogue yet.
pub(super) struct ToolFactsOf {
    pub tools: Arc<Vec<Tool>>,
    pub facts: Arc<HashMap<String, Arc<crate::policy::ToolFacts>>>,
    /// Set once the catalogue holds the list; a failed write is tried again on the next use.
    pub recorded: Arc<AtomicBool>,
    /// A write is under way.
    pub recording: Arc<AtomicBool>,
    /// Its number among the lists the connection served (see [`CatalogueWrites`]).
    pub number: u64,
}

/// A connection's revision and last failure (see [`Connection::status`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    pub revision: Option<String>,
    pub last_error: Option<Failure>,
}

/// A connection's failure to start or list, as operators see it
/// ([`UpstreamError::for_operators`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub at: i64,
    pub class: &'static str,
    pub message: String,
}

/// One upstream connection as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionStatus {
    pub server: String,
    pub health: Health,
    /// The tools it listed, if its list is held now.
    pub tools: Option<usize>,
    pub last_used_ms: i64,
    pub in_flight: usize,
}

impl Connection {
    pub(crate) fn new(
        server: ResolvedServer,
        executor: Executor,
        auth: Option<ConnectionAuth>,
        caps: RelayCaps,
        pin: Option<PinScope>,
    ) -> Self {
        Self {
            calls: crate::telemetry::metrics::ProxiedCalls::of(server.name.as_str()),
            server,
            executor,
            auth,
            caps,
            routes: Arc::default(),
            catalog: Arc::default(),
            wire: Arc::default(),
            live: tokio::sync::Mutex::new(None),
            last_used_ms: AtomicI64::new(now_millis()),
            in_flight: AtomicUsize::new(0),
            modern: AtomicBool::new(false),
            subscriptions_changed: Arc::default(),
            health: std::sync::Mutex::default(),
            facts: std::sync::Mutex::default(),
            catalogue: Arc::default(),
            pin,
            pinned: std::sync::Mutex::default(),
        }
    }

    /// What the admin API shows of this connection. Never waits on the connection's own lock
    /// (a start holds it for the whole handshake).
    pub fn status(&self) -> ConnectionStatus {
        ConnectionStatus {
            server: self.server.name.to_string(),
            health: self.health.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            tools: self.catalog.cached::<Tool>().map(|t| t.len()),
            last_used_ms: self.last_used_ms.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }

    fn record(&self, outcome: Result<Option<String>, &UpstreamError>) {
        let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(Some(revision)) => {
                health.revision = Some(revision);
                health.last_error = None;
            }
            Ok(None) => health.last_error = None,
            Err(why) => {
                let (class, message) = why.for_operators();
                health.last_error = Some(Failure { at: now_millis(), class, message });
            }
        }
    }

    /// Whether the running connection speaks a revision without `initialize` (2026-07-28): its
    /// multi round-trip can pass through to a caller on the same revision.
    pub fn speaks_modern(&self) -> bool {
        self.modern.load(Ordering::Acquire)
    }

    pub fn server(&self) -> &ServerName {
        &self.server.name
    }

    /// Whether what the upstream keeps (its tasks) lives in a process only this replica
    /// reaches: a stdio server, launched here or through an agent's channel held here.
    pub fn in_process(&self) -> bool {
        matches!(self.server.transport, crate::decl::ResolvedTransport::Stdio { .. })
    }

    /// How the gateway runs `tool` as a task when the upstream has no tasks extension (its
    /// declaration's `tasks`); `None`: as a plain call.
    pub fn task_support(&self, tool: &str) -> Option<crate::decl::declaration::TaskTool> {
        self.server.tasks.get(tool).copied()
    }

    /// The gateway's side of the connection: what handles what the upstream sends.
    pub(crate) fn handler(&self) -> ProxyClient {
        ProxyClient {
            routes: Arc::clone(&self.routes),
            catalog: Arc::clone(&self.catalog),
            server: self.server.name.to_string(),
            caps: self.caps,
            wire: Arc::clone(&self.wire),
            trust_related: matches!(self.server.transport, crate::decl::ResolvedTransport::Http { .. }),
            offered: rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE,
        }
    }

    /// The running connection, started (or restarted after a crash) if need be, and its tools
    /// as served under the tenant's pinned definitions (listed again after the upstream said
    /// they changed).
    pub(crate) async fn ready(&self, timeout: Duration) -> Result<(Peer<RoleClient>, Arc<Vec<Tool>>), UpstreamError> {
        let (peer, listed) = self.ready_as_listed(timeout).await?;
        let (tools, _) = self.pinned(listed, |c| &mut c.tools).await?;
        Ok((peer, tools))
    }

    /// `listed` as served under the tenant's pins, and whether what is served changed since
    /// it was last computed (the list or the pins moved).
    async fn pinned<T: Pinned + Listed>(
        &self,
        listed: Arc<Vec<T>>,
        slot: fn(&mut PinCache) -> &mut Option<CachedServe<T>>,
    ) -> Result<(Arc<Vec<T>>, bool), UpstreamError> {
        let Some(scope) = &self.pin else { return Ok((listed, false)) };
        let unreadable = |e: crate::store::StoreError| {
            tracing::error!(server = %self.server.name, error = %e, "the tenant's pinned definitions can't be read; nothing of the server is served");
            UpstreamError::Connect(format!("the pinned definitions can't be read: {e}"))
        };
        let pins = scope.pins.of(scope.tenant).await.map_err(unreadable)?;
        if let Some(cached) = slot(&mut self.pin_cache())
            && Arc::ptr_eq(&cached.raw, &listed)
            && cached.version == pins.version
        {
            return Ok((Arc::clone(&cached.served.items), false));
        }
        let server = self.server.name.as_str();
        let (pins, served) = scope.pins.serve(scope.tenant, server, pins, &listed).await.map_err(unreadable)?;
        let mut cache = self.pin_cache();
        let entry = slot(&mut cache);
        let changed = entry.as_ref().is_some_and(|c| c.served.digests != served.digests);
        let items = Arc::clone(&served.items);
        *entry = Some(CachedServe { raw: listed, version: pins.version, served });
        Ok((items, changed))
    }

    fn pin_cache(&self) -> std::sync::MutexGuard<'_, PinCache> {
        self.pinned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves the lists this running connection holds under the tenant's pins as they are
    /// now, and tells the sessions and listen streams following it of each list whose served
    /// items changed (an owner's decision, a hold seen by another connection or replica). A
    /// list served under pins that have moved since is asked of the upstream again first: this
    /// connection's copy may be older than the change another one saw. Starts nothing.
    pub(crate) async fn repin(&self, timeout: Duration) {
        let Some(scope) = &self.pin else { return };
        let Ok(pins) = scope.pins.of(scope.tenant).await else { return };
        let (tools, prompts, templates) = {
            let cache = self.pin_cache();
            let moved = |version: Option<u64>| version.is_some_and(|v| v != pins.version);
            (
                moved(cache.tools.as_ref().map(|c| c.version)),
                moved(cache.prompts.as_ref().map(|c| c.version)),
                moved(cache.templates.as_ref().map(|c| c.version)),
            )
        };
        let mut changed = Vec::new();
        if tools && self.refreshed::<Tool>(timeout, ListKind::Tools).await {
            changed.push(ListKind::Tools);
        }
        if prompts && self.refreshed::<Prompt>(timeout, ListKind::Prompts).await {
            changed.push(ListKind::Prompts);
        }
        if templates && self.refreshed::<ResourceTemplate>(timeout, ListKind::Templates).await {
            changed.push(ListKind::Templates);
        }
        for kind in changed {
            for to in self.catalog.watchers() {
                to.list_changed(kind).await;
            }
        }
    }

    /// Lists `T` of the running upstream again and serves it under the pins: whether what is
    /// served changed. A connection that is not running is left so.
    async fn refreshed<T: Servable>(&self, timeout: Duration, kind: ListKind) -> bool {
        let peer = match self.live.lock().await.as_ref() {
            Some(live) if !live.service.peer().is_transport_closed() => live.service.peer().clone(),
            _ => return false,
        };
        self.catalog.invalidate(kind);
        match self.fetch_list::<T>(&peer, timeout).await {
            Ok(listed) => T::served(self, listed).await.is_ok_and(|(_, changed)| changed),
            Err(e) => {
                tracing::warn!(server = %self.server.name, error = %e, "listing again after the pins moved failed");
                false
            }
        }
    }

    /// [`Connection::ready`] with the tools as the upstream lists them.
    async fn ready_as_listed(&self, timeout: Duration) -> Result<(Peer<RoleClient>, Arc<Vec<Tool>>), UpstreamError> {
        self.last_used_ms.store(now_millis(), Ordering::Relaxed);
        let mut live = self.live.lock().await;
        if let Some(current) = live.as_ref() {
            let peer = current.service.peer().clone();
            if !peer.is_transport_closed() {
                if let Some(tools) = self.catalog.cached::<Tool>() {
                    return Ok((peer, tools));
                }
                let tools = self.fetch_list::<Tool>(&peer, timeout).await?;
                return Ok((peer, tools));
            }
            tracing::warn!(server = %self.server.name, "upstream connection closed; restarting it");
            metrics::upstream_restart(self.server.name.as_str());
        }
        // The connection outlives the call that starts it: it must not hold that call's trace
        // spans open (rmcp's service keeps the span it started in for its whole life).
        let started = self.start(&mut live, timeout).instrument(trace::lasting()).await;
        if let Err(e) = &started {
            tracing::warn!(server = %self.server.name, error = %e, "upstream connection failed");
            self.record(Err(e));
        }
        started
    }

    /// Starts the connection into `live` (see [`Connection::ready`]).
    async fn start(
        &self,
        live: &mut Option<Live>,
        timeout: Duration,
    ) -> Result<(Peer<RoleClient>, Arc<Vec<Tool>>), UpstreamError> {
        // Dropping the old service kills its child process.
        *live = None;
        self.catalog.invalidate_all();
        self.wire.clear();
        // The handshake, the lists and `logging/setLevel` are the gateway's own: what the new
        // process says meanwhile is no caller's.
        let _own = self.routes.own_request();
        self.routes.started();
        let service = match self.lifecycles() {
            (only, None) => self.connect(only, timeout).await?,
            (first, Some(then)) => match self.connect(first, timeout).await {
                // A legacy handshake the server answered and refused: a modern-only server.
                Err(UpstreamError::Connect(legacy)) => {
                    tracing::debug!(server = %self.server.name, error = %legacy, "initialize refused; trying server/discover");
                    self.connect(then, timeout).await.map_err(|modern| {
                        UpstreamError::Connect(format!("initialize: {legacy}; server/discover: {modern}"))
                    })?
                }
                other => other?,
            },
        };
        let peer = service.peer().clone();
        let version = peer.peer_info().map(|i| i.protocol_version.clone());
        self.modern.store(version.as_ref().is_some_and(|v| !v.has_initialize()), Ordering::Release);
        let revision = version.map(|v| v.to_string()).unwrap_or_default();
        self.record(Ok(Some(revision.clone())));
        tracing::info!(server = %self.server.name, %revision, "upstream connected");
        metrics::upstream_connected(self.server.name.as_str(), &revision);
        let tools = self.fetch_list::<Tool>(&peer, timeout).await?;
        let follow = self.after_start(&peer).await;
        *live = Some(Live { service, _follow: follow });
        Ok((peer, tools))
    }

    /// The lifecycles to try, in order: what the declaration pins; else, for callers on a
    /// modern revision, modern first with a legacy fallback (the 2026-07-28 rules); for callers
    /// on a legacy revision, `initialize` first (a dual-era server then serves them in their own
    /// era, server-to-client requests, log levels and subscriptions included) and
    /// `server/discover` for a server that refuses it (a modern-only server, bridged).
    fn lifecycles(&self) -> (Lifecycle, Option<Lifecycle>) {
        match self.server.revision {
            Revision::Modern(_) => (Lifecycle::Modern, None),
            Revision::Legacy(version) => (Lifecycle::Legacy(version), None),
            Revision::Negotiated if self.caps.modern => (Lifecycle::ModernFirst, None),
            Revision::Negotiated => (Lifecycle::Legacy(LEGACY_PREFERRED), Some(Lifecycle::Modern)),
        }
    }

    /// One attempt at the handshake in `lifecycle`. An OAuth-protected server's credential is
    /// refreshed once when the handshake is refused for it.
    async fn connect(
        &self,
        lifecycle: Lifecycle,
        timeout: Duration,
    ) -> Result<RunningService<RoleClient, ProxyClient>, UpstreamError> {
        let handler = self.handler();
        // A legacy server may leave the modern probe unanswered: rmcp falls back to
        // `initialize` after its own wait, which the handshake's time must leave room for.
        let timeout = match lifecycle {
            Lifecycle::ModernFirst => timeout + MODERN_PROBE_WAIT,
            _ => timeout,
        };
        match &self.auth {
            None => self.executor.connect(&self.server, handler, lifecycle, timeout, None).await,
            Some(auth) => {
                let manager = auth.oauth.manager(&auth.owner, &self.server, &self.executor).await?;
                match self.executor.connect(&self.server, handler.clone(), lifecycle, timeout, Some(manager)).await {
                    // Refused during the handshake (a revoked token that has not expired):
                    // once more with a refreshed one.
                    Err(UpstreamError::Unauthorized { .. }) => {
                        let manager = auth.oauth.refreshed(&auth.owner, &self.server, &self.executor).await?;
                        self.executor.connect(&self.server, handler, lifecycle, timeout, Some(manager)).await
                    }
                    other => other,
                }
            }
        }
    }

    /// Fetches the upstream's list of `T` (none when it does not offer it) and keeps it until
    /// the upstream says it changed.
    async fn fetch_list<T: Listed>(
        &self,
        peer: &Peer<RoleClient>,
        timeout: Duration,
    ) -> Result<Arc<Vec<T>>, UpstreamError> {
        let _own = self.routes.own_request();
        let generation = self.catalog.generation::<T>();
        let offered = peer.peer_info().is_some_and(|i| T::offered(&i.capabilities));
        let list = if offered {
            match tokio::time::timeout(timeout, T::fetch(peer)).await {
                Ok(Ok(list)) => list,
                Ok(Err(e)) => return Err(UpstreamError::Connect(format!("listing {}: {e}", T::WHAT))),
                Err(_) => return Err(UpstreamError::ConnectTimeout(timeout)),
            }
        } else {
            Vec::new()
        };
        let list = Arc::new(T::usable(self.server.name.as_str(), list));
        self.catalog.store(generation, Arc::clone(&list));
        Ok(list)
    }

    /// A new upstream process: it logs everything to the gateway (each session gets what its
    /// own `logging/setLevel` asks for), and it is told again of the resources sessions are
    /// subscribed to.
    #[allow(deprecated)]
    async fn after_start(&self, peer: &Peer<RoleClient>) -> Option<tokio_util::sync::DropGuard> {
        let info = peer.peer_info()?;
        // A modern upstream has neither: its log level travels in each request's `_meta`, and
        // list changes and resource updates come on a `subscriptions/listen` stream.
        if !info.protocol_version.has_initialize() {
            return Some(self.follow(peer, &info.capabilities));
        }
        if info.capabilities.logging.is_some() {
            let params = rmcp::model::SetLevelRequestParams::new(rmcp::model::LoggingLevel::Debug);
            if let Err(e) = peer.set_level(params).await {
                tracing::debug!(server = %self.server.name, error = %e, "upstream refused logging/setLevel");
            }
        }
        for uri in self.catalog.subscribed() {
            if let Err(e) = peer.subscribe(SubscribeRequestParams::new(uri)).await {
                tracing::warn!(server = %self.server.name, error = %e, "subscribing again after a restart failed");
            }
        }
        None
    }

    /// Keeps a `subscriptions/listen` stream open to a 2026-07-28 upstream for what it offers
    /// (list changes; updates of the resources sessions subscribed to), opened again with the
    /// new set whenever that set changes, and hands what arrives to the connection's handler
    /// as a legacy upstream's notifications would be. Ends with the returned guard.
    fn follow(&self, peer: &Peer<RoleClient>, caps: &rmcp::model::ServerCapabilities) -> tokio_util::sync::DropGuard {
        let stop = tokio_util::sync::CancellationToken::new();
        let (peer, handler, catalog, changed) =
            (peer.clone(), self.handler(), Arc::clone(&self.catalog), Arc::clone(&self.subscriptions_changed));
        let server = self.server.name.to_string();
        let (tools, prompts) = (
            caps.tools.as_ref().and_then(|t| t.list_changed).unwrap_or(false),
            caps.prompts.as_ref().and_then(|p| p.list_changed).unwrap_or(false),
        );
        let resources = caps.resources.as_ref();
        let (resources_changed, subscribe) = (
            resources.and_then(|r| r.list_changed).unwrap_or(false),
            resources.and_then(|r| r.subscribe).unwrap_or(false),
        );
        let ended = stop.clone();
        tokio::spawn(async move {
            loop {
                let mut filter = rmcp::model::SubscriptionFilter::new();
                filter.tools_list_changed = tools.then_some(true);
                filter.prompts_list_changed = prompts.then_some(true);
                filter.resources_list_changed = resources_changed.then_some(true);
                let uris = if subscribe { catalog.subscribed() } else { Vec::new() };
                filter.resource_subscriptions = (!uris.is_empty()).then_some(uris);
                if filter == rmcp::model::SubscriptionFilter::new() {
                    // Nothing to follow until a session subscribes to something.
                    tokio::select! {
                        () = ended.cancelled() => return,
                        () = changed.notified() => continue,
                    }
                }
                let mut subscription = tokio::select! {
                    () = ended.cancelled() => return,
                    opened = peer.listen(filter) => match opened {
                        Ok(subscription) => subscription,
                        Err(e) => {
                            tracing::debug!(%server, error = %e, "the upstream refused subscriptions/listen");
                            tokio::select! {
                                () = ended.cancelled() => return,
                                () = changed.notified() => continue,
                            }
                        }
                    },
                };
                loop {
                    tokio::select! {
                        () = ended.cancelled() => {
                            let _ = subscription.cancel().await;
                            return;
                        }
                        () = changed.notified() => {
                            let _ = subscription.cancel().await;
                            break;
                        }
                        next = subscription.next() => match next {
                            Ok(Some(notification)) => handler.followed(notification).await,
                            Ok(None) | Err(_) => {
                                if peer.is_transport_closed() {
                                    return;
                                }
                                tracing::debug!(%server, "the upstream ended its subscriptions/listen stream; opening it again");
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                break;
                            }
                        },
                    }
                }
            }
        });
        stop.drop_guard()
    }

    /// The upstream's list of `T`: prompts, resources or resource templates (none when it
    /// offers none).
    pub(crate) async fn listed<T: Servable>(&self, timeout: Duration) -> Result<Arc<Vec<T>>, UpstreamError> {
        let (peer, _) = self.ready_as_listed(timeout).await?;
        let listed = match self.catalog.cached::<T>() {
            Some(list) => list,
            None => self.fetch_list(&peer, timeout).await?,
        };
        Ok(T::served(self, listed).await?.0)
    }

    /// Whether the upstream lets clients subscribe to its resources.
    pub(crate) fn offers_subscriptions(peer: &Peer<RoleClient>) -> bool {
        peer.peer_info().and_then(|i| i.capabilities.resources.as_ref().and_then(|r| r.subscribe)).unwrap_or(false)
    }

    /// Subscribes `key` (a session or a listen stream) to upstream `uri` (the upstream is
    /// asked once, for the first).
    #[allow(deprecated)]
    pub(crate) async fn subscribe(
        &self,
        peer: &Peer<RoleClient>,
        uri: &str,
        key: &str,
        to: &Notifier,
        exposed: &str,
    ) -> Result<(), ServiceError> {
        if self.catalog.subscribe(uri, key, to, exposed) == UpstreamSubscription::Subscribe {
            if self.speaks_modern() {
                self.subscriptions_changed.notify_one();
            } else {
                let _own = self.routes.own_request();
                if let Err(e) = peer.subscribe(SubscribeRequestParams::new(uri.to_owned())).await {
                    self.catalog.unsubscribe(uri, key);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Ends `session`'s subscription to upstream `uri`; false: it had none.
    #[allow(deprecated)]
    pub(crate) async fn unsubscribe(&self, peer: &Peer<RoleClient>, uri: &str, session: &str) -> bool {
        match self.catalog.unsubscribe(uri, session) {
            None => false,
            Some(UpstreamSubscription::Unsubscribe) if self.speaks_modern() => {
                self.subscriptions_changed.notify_one();
                true
            }
            Some(UpstreamSubscription::Unsubscribe) => {
                let _own = self.routes.own_request();
                if let Err(e) = peer.unsubscribe(UnsubscribeRequestParams::new(uri.to_owned())).await {
                    tracing::debug!(server = %self.server.name, error = %e, "upstream unsubscribe failed");
                }
                true
            }
            Some(_) => true,
        }
    }

    /// Forgets the watchers and subscriptions of ended sessions, unsubscribing upstream from
    /// what no session follows any more.
    #[allow(deprecated)]
    pub(crate) async fn retain_sessions(&self, live: impl Fn(&str) -> bool) {
        let dropped = self.catalog.retain_sessions(live);
        if dropped.is_empty() {
            return;
        }
        if self.speaks_modern() {
            self.subscriptions_changed.notify_one();
            return;
        }
        let peer = match self.live.try_lock() {
            Ok(live) => live.as_ref().map(|l| l.service.peer().clone()),
            Err(_) => None,
        };
        if let Some(peer) = peer {
            let _own = self.routes.own_request();
            for uri in dropped {
                let _ = peer.unsubscribe(UnsubscribeRequestParams::new(uri)).await;
            }
        }
    }

    /// Counts a call on this connection until the guard is dropped: when the call ends, or when
    /// its future is dropped (a caller that went away), the count goes down again and the
    /// connection is marked used.
    pub(crate) fn begin_call(&self) -> CallGuard<'_> {
        CallGuard::new(&self.in_flight, &self.last_used_ms)
    }

    /// Calls under way on this connection.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Closes the connection if it has been idle for `idle`; the next use starts it again.
    pub(crate) async fn close_if_idle(&self, idle: Duration) {
        let idle_ms = i64::try_from(idle.as_millis()).unwrap_or(i64::MAX);
        if self.in_flight() > 0 || now_millis() - self.last_used_ms.load(Ordering::Relaxed) < idle_ms {
            return;
        }
        if let Ok(mut live) = self.live.try_lock()
            && let Some(old) = live.take()
        {
            tracing::debug!(server = %self.server.name, "closing an idle upstream connection");
            let _ = old.service.cancel().await;
        }
    }

    pub(crate) async fn close(&self) {
        if let Some(old) = self.live.lock().await.take() {
            let _ = old.service.cancel().await;
        }
    }
}

/// A call in flight on a [`Connection`] (see [`Connection::begin_call`]).
pub(crate) struct CallGuard<'a> {
    in_flight: &'a AtomicUsize,
    last_used_ms: &'a AtomicI64,
}

impl<'a> CallGuard<'a> {
    fn new(in_flight: &'a AtomicUsize, last_used_ms: &'a AtomicI64) -> Self {
        in_flight.fetch_add(1, Ordering::AcqRel);
        CallGuard { in_flight, last_used_ms }
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.last_used_ms.store(now_millis(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod call_guard_tests {
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

    use super::CallGuard;

    #[tokio::test]
    async fn a_dropped_call_future_is_no_longer_in_flight() {
        let (in_flight, last_used) = (AtomicUsize::new(0), AtomicI64::new(0));
        let call = async {
            let _call = CallGuard::new(&in_flight, &last_used);
            std::future::pending::<()>().await;
        };
        // The caller goes away mid-call: its future is dropped, never finished.
        let timed_out = tokio::time::timeout(std::time::Duration::from_millis(20), call).await;
        assert!(timed_out.is_err());
        assert_eq!(in_flight.load(Ordering::Acquire), 0, "a dropped call still counted");
        assert!(last_used.load(Ordering::Relaxed) > 0, "the connection is marked used");
    }

    #[test]
    fn calls_are_counted_while_they_run() {
        let (in_flight, last_used) = (AtomicUsize::new(0), AtomicI64::new(0));
        let a = CallGuard::new(&in_flight, &last_used);
        let b = CallGuard::new(&in_flight, &last_used);
        assert_eq!(in_flight.load(Ordering::Acquire), 2);
        drop(a);
        assert_eq!(in_flight.load(Ordering::Acquire), 1);
        drop(b);
        assert_eq!(in_flight.load(Ordering::Acquire), 0);
    }
}
