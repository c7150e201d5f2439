//! The proxy's runtime: the pool of upstream connections, shared per (tenant, resolved
//! declaration) (`connection`), the sessions' frozen snapshots (`snapshot`), and the call
//! path (identity assertion, timeout, cancellation; notifications go back through
//! `relay`). Never decides who a caller is; it is handed the call's context.
//!
//! A session's snapshot is resolved once (on its first `tools/list` or upstream call) and
//! frozen: a changed declaration applies to new sessions, and a session keeps the connection
//! its snapshot named. A stateless request is its own session. Snapshots and connections are
//! keyed by tenant, so sessions of different tenants never share one.
//!
//! `surface` names upstream tools, prompts and resources for clients and routes them back;
//! `features` serves the surface beyond tools; `lean` is the upstream's side of the lean relay.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderName;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam, ClientRequest,
    JsonObject, RequestMetaObject, ServerResult, Tool,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient, ServiceError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::auth::assertion::{AssertedCaller, AssertionSigner};
use crate::context::{FlockAccess, McpCallContext};
use crate::decl::PathStyle;
use crate::decl::PathUri;
use crate::decl::ResolvedServer;
use crate::decl::ResolvedTransport;
use crate::executor::remote::{Agents, RemoteHostHandler};
use crate::executor::{Executor, LocalExecutor, UpstreamError};
use crate::identity::SessionRegistry;
use crate::model::Role;
use crate::oauth::{TokenOwner, UpstreamOAuth};
use crate::store::entities::GrantKind;
use crate::store::{Db, StoreError, TenantId, UserId};
use crate::telemetry::trace;
use crate::wire::client::ASSERTION_META_KEY;

pub use crate::proxy::connection::{Connection, ConnectionAuth, Upstream};
pub use crate::proxy::snapshot::Snapshot;
use crate::relay::forward_progress;
pub use crate::relay::{CallOrigin, Downstream, LogLevel, ProxyClient, RelayCaps, Round, Sink};

mod ask;
pub mod connection;
mod features;
mod lean;
pub mod pins;
mod policies;
pub mod snapshot;
pub mod surface;
pub use crate::relay::ProxyError;
pub use ask::Ask;
pub use features::{Listening, Watch};
pub use lean::{LeanResult, LeanTarget};
pub use policies::Policies;

/// One proxied call: the upstream's own tool name, its arguments, where its notifications go,
/// and when it ends.
pub struct UpstreamCall<'a> {
    pub tool: &'a str,
    pub arguments: Option<JsonObject>,
    pub downstream: Downstream,
    pub timeout: Duration,
    /// Cancelled when the client cancels the call.
    pub cancelled: CancellationToken,
    /// See [`Exchange::passed`].
    pub passed: Option<PassedInput>,
}

/// Where an exchange's side traffic goes and when it ends.
pub struct Exchange {
    pub downstream: Downstream,
    pub timeout: Duration,
    /// Cancelled when the client cancels the request.
    pub cancelled: CancellationToken,
    /// A 2026-07-28 caller and a 2026-07-28 upstream: the multi round-trip passes through.
    /// The request carries the caller's `inputResponses` and the upstream's own `requestState`
    /// (unsealed from the gateway's), and an `input_required` answer is returned as it is (all
    /// of its requests, under the upstream's keys) instead of being asked here. `None`: the
    /// gateway asks the caller itself (see [`Upstreams::exchange`]).
    pub passed: Option<PassedInput>,
}

/// What a passed-through retry carries to the upstream (see [`Exchange::passed`]).
#[derive(Debug, Clone, Default)]
pub struct PassedInput {
    pub responses: Option<rmcp::model::InputResponses>,
    pub state: Option<String>,
    /// The caller declared the tasks extension (`io.modelcontextprotocol/tasks`) on this
    /// request: the request declares it to the upstream too, which may then answer a task.
    pub tasks: bool,
}

/// How one request is sent (see [`Upstreams::exchange`]).
struct Sent<'a> {
    downstream: &'a Downstream,
    timeout: Duration,
    cancelled: &'a CancellationToken,
    /// Declare the tasks extension to the upstream (see [`PassedInput::tasks`]).
    tasks: bool,
}

/// Every upstream connection of the gateway, and the sessions' snapshots.
pub struct Upstreams {
    db: Db,
    oauth: Option<Arc<UpstreamOAuth>>,
    local: Arc<LocalExecutor>,
    remote: Arc<RemoteHostHandler>,
    signer: Arc<AssertionSigner>,
    sessions: Arc<SessionRegistry>,
    connect_timeout: Duration,
    idle: Duration,
    pool: Mutex<HashMap<(TenantId, String), Arc<Connection>>>,
    snapshots: Mutex<HashMap<String, Arc<Snapshot>>>,
    /// The snapshots of callers without a session, reused while the change counter stands.
    alone: Mutex<HashMap<AloneKey, Resolved>>,
    /// The change counter (the identity cache's): `None` until the gateway hands it over, or
    /// when the cache is off; then a caller without a session is resolved on every request.
    changes: std::sync::OnceLock<Arc<crate::identity::IdentityCache>>,
    requests: AtomicUsize,
    /// Each tenant's policies (and the platform's), which decide with the grants.
    policies: Arc<crate::proxy::Policies>,
    /// Each tenant's pinned upstream definitions, which every list is served under.
    pins: Arc<pins::Pins>,
}

/// A caller without a session: tenant, user and what its client declared.
type AloneKey = (TenantId, UserId, RelayCaps);

/// A snapshot resolved while the change counter stood at `epoch`.
struct Resolved {
    epoch: crate::identity::Epoch,
    at: std::time::Instant,
    snapshot: Arc<Snapshot>,
}

/// A reused snapshot older than this is resolved again even if the counter never moved (a
/// change that bypassed the triggers); and the most kept (past it, they are all dropped).
const ALONE_MAX_AGE: Duration = Duration::from_secs(60);
const ALONE_MAX_ENTRIES: usize = 10_000;

/// Settings of the upstream runtime.
pub struct UpstreamSettings {
    pub connect_timeout: Duration,
    pub idle: Duration,
    /// OAuth to protected upstream servers; `None` (no token key): such servers are not served.
    pub oauth: Option<Arc<UpstreamOAuth>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Upstreams {
    /// Every upstream connection this replica holds for `tenant` (one server may have several:
    /// per declared client capabilities, per user for per-user credentials), as the admin API
    /// shows them, by server.
    pub fn tenant_status(&self, tenant: TenantId) -> Vec<connection::ConnectionStatus> {
        let held: Vec<Arc<Connection>> =
            lock(&self.pool).iter().filter(|((t, _), _)| *t == tenant).map(|(_, c)| Arc::clone(c)).collect();
        let mut out: Vec<_> = held.iter().map(|c| c.status()).collect();
        out.sort_by(|a, b| a.server.cmp(&b.server));
        out
    }

    pub fn new(
        db: Db,
        local: LocalExecutor,
        remote: Arc<RemoteHostHandler>,
        signer: Arc<AssertionSigner>,
        sessions: Arc<SessionRegistry>,
        settings: UpstreamSettings,
        policies: Arc<crate::proxy::Policies>,
    ) -> Arc<Self> {
        let db_for_pins = db.clone();
        Arc::new(Self {
            db,
            oauth: settings.oauth,
            local: Arc::new(local),
            remote,
            signer,
            sessions,
            connect_timeout: settings.connect_timeout,
            idle: settings.idle,
            pool: Mutex::default(),
            snapshots: Mutex::default(),
            alone: Mutex::default(),
            changes: std::sync::OnceLock::new(),
            requests: AtomicUsize::new(0),
            policies,
            pins: Arc::new(pins::Pins::new(db_for_pins)),
        })
    }

    /// Each tenant's policies.
    pub fn policies(&self) -> &Arc<crate::proxy::Policies> {
        &self.policies
    }

    /// The facts policies read of `connection`'s tools (started if need be), by tool name.
    pub(crate) async fn connection_facts(
        &self,
        tenant: TenantId,
        connection: &Connection,
    ) -> Result<Arc<HashMap<String, Arc<crate::policy::ToolFacts>>>, ProxyError> {
        let (_, tools) = connection.ready(self.connect_timeout).await.map_err(unavailable)?;
        Ok(self.tool_facts(tenant, connection, &tools))
    }

    /// The facts policies read of `connection`'s tools `tools` (tenant `tenant`), by tool name.
    /// A list seen for the first time is also recorded in the tenant's catalogue (written only
    /// when it differs from the stored one), which the tenant's policy schema is generated from.
    pub(crate) fn tool_facts(
        &self,
        tenant: TenantId,
        connection: &Connection,
        tools: &Arc<Vec<rmcp::model::Tool>>,
    ) -> Arc<HashMap<String, Arc<crate::policy::ToolFacts>>> {
        let server = connection.server().as_str();
        let mut held = lock(&connection.facts);
        let of = match held.as_ref() {
            Some(of) if Arc::ptr_eq(&of.tools, tools) => of,
            _ => {
                let facts: HashMap<String, Arc<crate::policy::ToolFacts>> = tools
                    .iter()
                    .map(|t| (t.name.to_string(), Arc::new(crate::policy::ToolFacts::upstream(server, t))))
                    .collect();
                let number = connection.catalogue.latest.fetch_add(1, Ordering::AcqRel) + 1;
                held.insert(connection::ToolFactsOf {
                    tools: Arc::clone(tools),
                    facts: Arc::new(facts),
                    recorded: Arc::default(),
                    recording: Arc::default(),
                    number,
                })
            }
        };
        let facts = Arc::clone(&of.facts);
        if of.recorded.load(Ordering::Acquire) || of.recording.swap(true, Ordering::AcqRel) {
            return facts;
        }
        let (recorded, recording) = (Arc::clone(&of.recorded), Arc::clone(&of.recording));
        let (writes, number) = (Arc::clone(&connection.catalogue), of.number);
        drop(held);
        match serde_json::to_string(tools.as_slice()) {
            Ok(json) => {
                let (db, server) = (self.db.clone(), server.to_owned());
                tokio::spawn(async move {
                    let _one = writes.one_at_a_time.lock().await;
                    // A newer list was served meanwhile: it records itself, and this one must
                    // not land after it.
                    let newer = writes.latest.load(Ordering::Acquire) != number;
                    let written = if newer { Ok(false) } else { db.record_catalogue(tenant, &server, &json).await };
                    match written {
                        Ok(_) => recorded.store(true, Ordering::Release),
                        Err(e) => {
                            tracing::warn!(%server, error = %e, "recording the server's tools for policies failed; tried again on next use");
                        }
                    }
                    recording.store(false, Ordering::Release);
                });
            }
            Err(e) => tracing::warn!(%server, error = %e, "the server's tools do not serialize; not recorded"),
        }
        facts
    }

    /// The runtime for `config`, with the local executor as configured (validated at load).
    pub fn from_config(
        config: &crate::config::UpstreamConfig,
        db: Db,
        signer: Arc<AssertionSigner>,
        sessions: Arc<SessionRegistry>,
        agents: Arc<Agents>,
        oauth: Option<Arc<UpstreamOAuth>>,
        policies: Arc<crate::proxy::Policies>,
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
        let local = LocalExecutor::new(root, config.inherit_env.clone(), header.clone(), &config.ca_file)?;
        let settings = UpstreamSettings {
            connect_timeout: Duration::from_secs(config.connect_timeout_secs),
            idle: Duration::from_secs(config.idle_secs),
            oauth,
        };
        let remote = RemoteHostHandler::new(db.clone(), agents, header);
        Ok(Self::new(db, local, remote, signer, sessions, settings, policies))
    }

    /// Reuse a caller's resolved servers, outside a session, while `changes` (the change
    /// counter, which every change of what they are resolved from moves) stands still; hold
    /// each tenant's pinned definitions while it stands, and when it moves serve every running
    /// connection's lists under the pins as they are now, telling its sessions of each list
    /// whose served items changed (an owner's decision here or on another replica, a hold seen
    /// elsewhere). Ends with the counter's poller.
    pub(crate) fn follow_changes(self: &Arc<Self>, changes: Arc<crate::identity::IdentityCache>) {
        self.pins.follow_changes(Arc::clone(&changes));
        let mut moves = changes.moves();
        let _ = self.changes.set(changes);
        let upstreams = Arc::downgrade(self);
        tokio::spawn(async move {
            while moves.changed().await.is_ok() {
                let Some(upstreams) = upstreams.upgrade() else { break };
                let held: Vec<(TenantId, Arc<Connection>)> =
                    lock(&upstreams.pool).iter().map(|((t, _), c)| (*t, Arc::clone(c))).collect();
                let (timeout, pins) = (upstreams.connect_timeout, Arc::clone(&upstreams.pins));
                drop(upstreams);
                // Each tenant's pins read once, here, rather than by each of its connections at
                // the same time (a failed read is the connection's to report).
                let tenants: BTreeSet<TenantId> = held.iter().map(|(t, _)| *t).collect();
                for tenant in tenants {
                    let _ = pins.of(tenant).await;
                }
                // Each on its own: a slow upstream delays no other connection.
                for (_, connection) in held {
                    tokio::spawn(async move { connection.repin(timeout).await });
                }
            }
        });
    }

    /// Each tenant's pinned upstream definitions.
    pub fn pins(&self) -> &Arc<pins::Pins> {
        &self.pins
    }

    /// The remote host handler (selected plugin roots open their servers through it).
    pub fn remote(&self) -> &Arc<RemoteHostHandler> {
        &self.remote
    }

    /// How long a server may take to start and list its tools.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// A per-request owner id for a stateless call (its own session).
    pub fn stateless_owner(&self) -> String {
        format!("request-{}", self.requests.fetch_add(1, Ordering::Relaxed))
    }

    /// The OAuth side of the runtime, when a token key is configured.
    pub fn oauth(&self) -> Option<&Arc<UpstreamOAuth>> {
        self.oauth.as_ref()
    }

    /// The session's snapshot, resolved on first use; a stateless call (no session) gets its
    /// caller's, reused while nothing it is resolved from changed ([`Self::follow_changes`]).
    /// A snapshot is never handed to another tenant or user.
    pub async fn snapshot(
        &self,
        tenant: TenantId,
        user: UserId,
        session: Option<&str>,
        caps: RelayCaps,
    ) -> Result<Arc<Snapshot>, StoreError> {
        let mine = |s: &Snapshot| s.tenant == tenant && s.user == user;
        if let Some(session) = session
            && let Some(existing) = lock(&self.snapshots).get(session).cloned()
        {
            if mine(&existing) {
                return Ok(existing);
            }
            // Session binding makes this unreachable; if it ever happens, see nothing.
            tracing::error!("a session's upstream snapshot belongs to another caller; refusing it");
            return Ok(Arc::new(Snapshot::empty(tenant, user)));
        }
        let Some(session) = session else { return self.snapshot_alone(tenant, user, caps).await };
        let fresh = Arc::new(self.resolve(tenant, user, caps).await?);
        let mut snapshots = lock(&self.snapshots);
        let kept = snapshots.entry(session.to_owned()).or_insert_with(|| Arc::clone(&fresh));
        Ok(if mine(kept) { Arc::clone(kept) } else { fresh })
    }

    /// The snapshot of a caller without a session: the one resolved while the change counter
    /// stood where it stands now (read recently enough to trust), or a fresh one, kept only if
    /// the counter did not move while it was resolved and it is settled (an executor's agent
    /// connecting moves no counter). Without a trusted counter, always fresh.
    async fn snapshot_alone(
        &self,
        tenant: TenantId,
        user: UserId,
        caps: RelayCaps,
    ) -> Result<Arc<Snapshot>, StoreError> {
        let counter = || self.changes.get().and_then(|c| c.epoch());
        let Some(epoch) = counter() else {
            return Ok(Arc::new(self.resolve(tenant, user, caps).await?));
        };
        let key = (tenant, user, caps);
        if let Some(kept) = lock(&self.alone).get(&key)
            && kept.epoch == epoch
            && kept.at.elapsed() < ALONE_MAX_AGE
        {
            return Ok(Arc::clone(&kept.snapshot));
        }
        let (fresh, settled) = self.resolve_settled(tenant, user, caps).await?;
        let fresh = Arc::new(fresh);
        if settled && counter() == Some(epoch) {
            let mut alone = lock(&self.alone);
            if alone.len() >= ALONE_MAX_ENTRIES {
                alone.clear();
            }
            let resolved = Resolved { epoch, at: std::time::Instant::now(), snapshot: Arc::clone(&fresh) };
            alone.insert(key, resolved);
        }
        Ok(fresh)
    }

    /// The tenant's server `server` resolved in its bound executor's context, with that
    /// executor (for an OAuth login).
    pub async fn resolve_one(&self, tenant: TenantId, server: &str) -> Result<(ResolvedServer, Executor), String> {
        let entity = self
            .db
            .resolve_server(tenant, server)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("server `{server}` is not bound for the tenant"))?;
        let executor =
            Executor::for_row(&entity.executor, &self.local, &self.remote).await.map_err(|e| e.to_string())?;
        let resolved = executor.resolve(server, &entity.declaration).map_err(|e| e.problem)?;
        Ok((resolved, executor))
    }

    /// Resolves every server the tenant bound, each in its bound executor's context, and the
    /// tenant's grants. A server that can't be resolved is left out (and logged): it is not
    /// served, rather than served wrongly.
    async fn resolve(&self, tenant: TenantId, user: UserId, caps: RelayCaps) -> Result<Snapshot, StoreError> {
        Ok(self.resolve_settled(tenant, user, caps).await?.0)
    }

    /// [`Self::resolve`], and whether the snapshot is settled: `false` when a server was left out
    /// for a reason that may pass by itself (its executor's agent is not connected), so it
    /// must not be reused.
    async fn resolve_settled(
        &self,
        tenant: TenantId,
        user: UserId,
        caps: RelayCaps,
    ) -> Result<(Snapshot, bool), StoreError> {
        let (entities, grants) = tokio::try_join!(self.db.resolve_servers(tenant), self.db.upstream_grants(tenant))?;
        let mut settled = true;
        let mut servers = BTreeMap::new();
        let mut outside_root = BTreeSet::new();
        let mut unprefixed = Vec::new();
        for (server, entity) in entities {
            let executor = match Executor::for_row(&entity.executor, &self.local, &self.remote).await {
                Ok(executor) => executor,
                Err(e) => {
                    tracing::warn!(%server, error = %e, "upstream server not served");
                    settled = false;
                    continue;
                }
            };
            let resolved = match executor.resolve(&server, &entity.declaration) {
                Ok(resolved) => resolved,
                Err(problem) => {
                    tracing::warn!(%server, entity = %entity.entity, %problem, "upstream declaration unusable; not served");
                    if problem.outside_root {
                        outside_root.insert(server);
                    }
                    continue;
                }
            };
            let auth = match (&resolved.transport, &self.oauth) {
                (ResolvedTransport::Http { oauth: Some(spec), .. }, Some(oauth)) => Some(ConnectionAuth {
                    oauth: Arc::clone(oauth),
                    owner: TokenOwner::for_call(tenant, &server, user, spec),
                }),
                (ResolvedTransport::Http { oauth: Some(_), .. }, None) => {
                    tracing::warn!(%server, "OAuth-protected upstream not served: no upstream.token_key_file");
                    continue;
                }
                _ => None,
            };
            // A per-user login's connection is that user's alone; a connection is shared only
            // by sessions whose clients can answer the same requests.
            let key = match auth.as_ref().and_then(|a| a.owner.user) {
                Some(user) => (tenant, format!("{}/user/{user}/{}", resolved.fingerprint(), caps.key())),
                None => (tenant, format!("{}/{}", resolved.fingerprint(), caps.key())),
            };
            let connection = Arc::clone(lock(&self.pool).entry(key).or_insert_with(|| {
                let pin = connection::PinScope { tenant, pins: Arc::clone(&self.pins) };
                Arc::new(Connection::new(resolved, executor, auth, caps, Some(pin)))
            }));
            if !entity.prefixed {
                unprefixed.push(server.clone());
            }
            servers.insert(server, connection);
        }
        // One unprefixed server per tenant (refused at binding time); should two ever be
        // found, neither is served unprefixed rather than one guessed.
        let bare = match unprefixed.as_slice() {
            [one] => Some(one.clone()),
            [] => None,
            more => {
                tracing::error!(servers = ?more, "more than one server bound without a prefix; all keep their prefix");
                None
            }
        };
        Ok((Snapshot { tenant, user, servers, grants, bare, outside_root }, settled))
    }

    /// The upstream tools the caller may use, named `server__tool` (or `tool` for the
    /// tenant's unprefixed server, never shadowing a native tool: `native`): granted, or
    /// (tenants with policies) some call of which the policies could permit. Without policies,
    /// servers with no grant for the caller are not even started; one that fails to start is
    /// left out.
    pub async fn list(
        &self,
        snapshot: &Snapshot,
        roles: &[Role],
        ask: &crate::proxy::Ask,
        native: impl Fn(&str) -> bool,
        watch: Option<Watch<'_>>,
    ) -> Vec<Tool> {
        let may_log_in = |connection: &Connection| may_log_in(connection, roles);
        let mut tasks = tokio::task::JoinSet::new();
        for (name, connection) in &snapshot.servers {
            if !snapshot.any_grant(name, roles) && ask.grants_only() {
                continue;
            }
            if let Some(watch) = &watch {
                connection.catalog.watch(watch.session, &watch.notifier());
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
            let prefixed = snapshot.prefixed(server) != Some(false);
            match tools {
                Ok((_, tools)) => {
                    // Always: a list seen for the first time is recorded for the tenant's
                    // policy schema, whether or not the tenant has policies yet.
                    let facts = self.tool_facts(snapshot.tenant, &connection, &tools);
                    let facts = (!ask.grants_only()).then_some(facts);
                    let listed = |t: &Tool| match &facts {
                        None => snapshot.allowed(server, &t.name, roles),
                        Some(facts) => {
                            let grant = snapshot.granting(server, GrantKind::Tool, &t.name, roles);
                            facts.get(t.name.as_ref()).is_some_and(|f| ask.list(f, grant.as_deref()))
                        }
                    };
                    out.extend(
                        tools
                            .iter()
                            .filter(|t| listed(t))
                            .filter(|t| prefixed || surface::unprefixed_name_free(snapshot, &t.name, &native))
                            .map(|t| named(server, prefixed, t)),
                    )
                }
                Err(UpstreamError::LoginNeeded { .. }) if may_log_in(&connection) => {
                    out.push(login_tool(server, prefixed));
                }
                Err(e) => tracing::warn!(%server, error = %e, "upstream server unavailable; its tools are not listed"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The (started) upstream, if it has `tool` (`None`: it does not). Starting it may fail:
    /// then the call fails as unavailable rather than as unknown.
    pub async fn upstream_with(
        &self,
        connection: &Connection,
        tool: &str,
        ctx: &McpCallContext,
    ) -> Result<Option<Upstream>, ProxyError> {
        match connection.ready(self.connect_timeout).await {
            Ok((peer, tools)) => Ok(tools.iter().any(|t| t.name == tool).then_some(Upstream(peer))),
            Err(UpstreamError::LoginNeeded { .. }) => Err(self.login_needed(connection, ctx).await),
            Err(e @ UpstreamError::OutsideRoot { .. }) => {
                tracing::warn!(error = %e, "upstream server not served");
                Err(ProxyError::OutsideRoot(connection.server().to_string()))
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    /// The error of a call that needs a login: with a start link when the caller may log in
    /// for the credential the call would carry (their own, or, for an owner or manager, the
    /// tenant's).
    async fn login_needed(&self, connection: &Connection, ctx: &McpCallContext) -> ProxyError {
        let server = connection.server().to_string();
        let link = match &connection.auth {
            Some(auth) if may_log_in(connection, ctx.roles()) => match auth.oauth.login_link(&auth.owner).await {
                Ok(link) => Some(link),
                Err(e) => {
                    tracing::error!(%server, error = %e, "making a login link failed");
                    None
                }
            },
            _ => None,
        };
        ProxyError::LoginNeeded { server, link }
    }

    /// When a call to an OAuth-protected server failed because its credential can no longer
    /// be used (its refresh was refused: locally the transport fails, through an agent the
    /// server's 401 comes back), the connection is closed and the call needs a login.
    async fn recheck_login(&self, connection: &Connection, ctx: &McpCallContext, error: ProxyError) -> ProxyError {
        let Some(auth) = &connection.auth else { return error };
        if matches!(error, ProxyError::Timeout | ProxyError::Cancelled | ProxyError::LoginNeeded { .. }) {
            return error;
        }
        match auth.oauth.vault().usable(auth.owner.tenant, &auth.owner.server, auth.owner.user).await {
            Ok(false) => {
                connection.close().await;
                self.login_needed(connection, ctx).await
            }
            _ => error,
        }
    }

    /// Calls `tool` on the upstream for the caller: the call carries an identity assertion
    /// (audience: the server id) and nothing of the client's own credentials. It ends at
    /// `timeout` or when the client cancels; either way the upstream is told to cancel.
    /// The answer is the call's result, or (passed through, see [`Exchange::passed`]) the
    /// upstream's `input_required`.
    pub async fn call(
        &self,
        connection: &Connection,
        upstream: Upstream,
        ctx: &McpCallContext,
        call: UpstreamCall<'_>,
    ) -> Result<ServerResult, ProxyError> {
        let span = trace::upstream_span(connection.server().as_str(), call.tool, "rmcp");
        async move {
            let _call = connection.begin_call();
            match self.call_inner(connection, upstream.0, ctx, call).await {
                Err(e) => Err(self.recheck_login(connection, ctx, e).await),
                ok => ok,
            }
        }
        .instrument(span)
        .await
    }

    async fn call_inner(
        &self,
        connection: &Connection,
        peer: Peer<RoleClient>,
        ctx: &McpCallContext,
        UpstreamCall { tool, arguments, downstream, timeout, cancelled, passed }: UpstreamCall<'_>,
    ) -> Result<ServerResult, ProxyError> {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = arguments;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let call_declares_tasks = passed.as_ref().is_some_and(|p| p.tasks);
        let exchange = Exchange { downstream, timeout, cancelled, passed };
        match self.exchange(connection, peer, ctx, request, exchange).await? {
            answer @ (ServerResult::CallToolResult(_) | ServerResult::InputRequiredResult(_)) => Ok(answer),
            // A task only to a request that declared the extension (else it is no answer).
            answer @ ServerResult::CreateTaskResult(_) if call_declares_tasks => Ok(answer),
            _ => Err(ProxyError::Unavailable("the upstream answered a call with something else".to_owned())),
        }
    }

    /// Sends one request to the upstream for the caller: it carries an identity assertion
    /// (audience: the server id) and nothing of the client's own credentials; what the
    /// upstream sends while serving it (progress, log lines, requests of the client) goes to
    /// the caller. It ends at the timeout or when the client cancels; either way the upstream
    /// is told to cancel.
    pub(crate) async fn exchange(
        &self,
        connection: &Connection,
        peer: Peer<RoleClient>,
        ctx: &McpCallContext,
        mut request: ClientRequest,
        Exchange { downstream, timeout, cancelled, passed }: Exchange,
    ) -> Result<ServerResult, ProxyError> {
        if let Some(PassedInput { responses, state, tasks }) = passed {
            if responses.is_some() || state.is_some() {
                request = with_responses(request, responses, state)
                    .ok_or_else(|| unavailable("a request that takes no multi round-trip"))?;
            }
            let sent = Sent { downstream: &downstream, timeout, cancelled: &cancelled, tasks };
            let answer = self.send_once(connection, &peer, ctx, request, sent).await?;
            if let ServerResult::InputRequiredResult(input) = &answer {
                crate::relay::audit_passed(connection.server().as_str(), &downstream, connection.caps, input)
                    .await
                    .map_err(ProxyError::Upstream)?;
            }
            return Ok(answer);
        }
        // An upstream on protocol 2026-07-28 asks its client by answering `input_required`:
        // the gateway asks the caller (the way the caller takes it) and sends the request again
        // with the answers and the upstream's `requestState`, a bounded number of times.
        for _round in 0..=MAX_UPSTREAM_ROUNDS {
            let sent = Sent { downstream: &downstream, timeout, cancelled: &cancelled, tasks: false };
            let answer = self.send_once(connection, &peer, ctx, request.clone(), sent).await?;
            let ServerResult::InputRequiredResult(input) = answer else { return Ok(answer) };
            let mut responses = rmcp::model::InputResponses::new();
            for (key, asked) in input.input_requests.unwrap_or_default() {
                let answer = ask_for_upstream(connection, &downstream, asked, &cancelled).await;
                responses.insert(key, answer.map_err(ProxyError::Upstream)?);
            }
            request = with_responses(request, Some(responses), input.request_state)
                .ok_or_else(|| unavailable("the upstream answered input_required to a request that can't take it"))?;
        }
        Err(ProxyError::Unavailable(format!("the upstream asked more than {MAX_UPSTREAM_ROUNDS} rounds of input")))
    }

    /// One request to the upstream and its answer (see [`Upstreams::exchange`]).
    async fn send_once(
        &self,
        connection: &Connection,
        peer: &Peer<RoleClient>,
        ctx: &McpCallContext,
        request: ClientRequest,
        Sent { downstream, timeout, cancelled, tasks }: Sent<'_>,
    ) -> Result<ServerResult, ProxyError> {
        let assertion = self
            .signer
            .assertion(&asserted_caller(ctx), connection.server().as_str())
            .map_err(|_| ProxyError::Assertion)?;
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert(ASSERTION_META_KEY.to_owned(), Value::String(assertion));
        // A 2026-07-28 upstream logs to a request only at the level the request names: the
        // caller's (its session's `logging/setLevel`, or its own request's), none without one.
        if connection.speaks_modern()
            && let Some(level) = downstream.log_level.level()
        {
            meta.set_log_level(level);
        }
        // The tasks extension is declared per request, and only for a caller that declared it
        // on its own request (rmcp's client declares the connection's capabilities on every
        // request; these replace them).
        if tasks && connection.speaks_modern() {
            meta.set_client_capabilities(connection.caps.declared_with_tasks());
        }
        // The trace context, in `_meta` like the assertion (an HTTP upstream's client moves it
        // into headers): the current span's `traceparent` and `tracestate`, nothing else.
        trace::inject_meta(&mut meta.0.0);
        let options = PeerRequestOptions::with_timeout(timeout).with_meta(meta);
        // Announced before it is sent: whatever the upstream sends back at once finds its caller.
        let mut route = connection.routes.announce(downstream.clone());
        let handle = peer.send_request_with_option(request, options).await.map_err(unavailable)?;
        if let Some((target, early)) = route.route(&handle.progress_token, &handle.id) {
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
            Ok(result) => Ok(result),
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
            lock(&this.alone).clear();
            for connection in all {
                connection.close().await;
            }
        });
    }

    async fn sweep(&self) {
        lock(&self.snapshots).retain(|session, _| self.sessions.principal(session).is_some());
        lock(&self.alone).retain(|_, kept| kept.at.elapsed() < ALONE_MAX_AGE);
        let connections: Vec<_> = lock(&self.pool).values().cloned().collect();
        for connection in &connections {
            connection.retain_sessions(|session| self.sessions.principal(session).is_some()).await;
            connection.close_if_idle(self.idle).await;
        }
        drop(connections);
        // A connection no snapshot names any more, and closed, is forgotten.
        lock(&self.pool).retain(|_, c| {
            Arc::strong_count(c) > 1 || c.in_flight() > 0 || c.live.try_lock().is_ok_and(|l| l.is_some())
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

/// The most rounds of input one request to a 2026-07-28 upstream may ask for.
const MAX_UPSTREAM_ROUNDS: usize = 10;

/// Asks the caller of `downstream` what a 2026-07-28 upstream's `input_required` asked, and
/// returns the answer as the upstream expects it in `inputResponses`.
async fn ask_for_upstream(
    connection: &Connection,
    downstream: &Downstream,
    asked: rmcp::model::InputRequest,
    cancelled: &CancellationToken,
) -> Result<Value, ErrorData> {
    let Some(request) = crate::relay::asked_request(asked) else {
        return Err(ErrorData::invalid_request("an input request of an unknown kind", None));
    };
    let asked = crate::relay::Asked::of(&request, connection.caps)?;
    let server = connection.server().as_str();
    let answer = crate::relay::relay_to(server, downstream, asked, request, cancelled).await?;
    serde_json::to_value(&answer).map_err(|e| ErrorData::internal_error(format!("relayed answer: {e}"), None))
}

/// `request` again, carrying the caller's answers and the upstream's `requestState`; `None`
/// for a request that takes no multi round-trip.
fn with_responses(
    request: ClientRequest,
    responses: Option<rmcp::model::InputResponses>,
    state: Option<String>,
) -> Option<ClientRequest> {
    Some(match request {
        ClientRequest::CallToolRequest(mut r) => {
            (r.params.input_responses, r.params.request_state) = (responses, state);
            ClientRequest::CallToolRequest(r)
        }
        ClientRequest::GetPromptRequest(mut r) => {
            (r.params.input_responses, r.params.request_state) = (responses, state);
            ClientRequest::GetPromptRequest(r)
        }
        ClientRequest::ReadResourceRequest(mut r) => {
            (r.params.input_responses, r.params.request_state) = (responses, state);
            ClientRequest::ReadResourceRequest(r)
        }
        _ => return None,
    })
}

/// The name of the tool listed in place of a server's tools while it needs a login.
pub const LOGIN_TOOL: &str = "login";

/// Whether a caller with `roles` may start a login for `connection`'s credential: a user
/// their own; the tenant's, an owner or manager.
fn may_log_in(connection: &Connection, roles: &[Role]) -> bool {
    match &connection.auth {
        Some(auth) if auth.owner.user.is_some() => true,
        Some(_) => roles.iter().any(|r| matches!(r, Role::Owner | Role::Manager)),
        None => false,
    }
}

/// The tool listed for a server that needs a login: calling it answers with the login link.
fn login_tool(server: &str, prefixed: bool) -> Tool {
    let schema: JsonObject = serde_json::from_value(json!({"type": "object", "properties": {}})).unwrap_or_default();
    Tool::new(
        surface::exposed_name(server, prefixed, LOGIN_TOOL),
        format!(
            "Server `{server}` needs an OAuth login before its tools can be used: call this to get the login link."
        ),
        Arc::new(schema),
    )
}

fn unavailable(e: impl std::fmt::Display) -> ProxyError {
    ProxyError::Unavailable(e.to_string())
}

fn named(server: &str, prefixed: bool, tool: &Tool) -> Tool {
    let mut tool = tool.clone();
    tool.name = surface::exposed_name(server, prefixed, &tool.name).into();
    tool
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
