//! Routing what an upstream sends besides answers: progress to the call it belongs to, log
//! messages to the one session certain to have caused them, never to a guess; and ordering,
//! so a call's answer never overtakes the notifications sent before it. Requests the upstream
//! makes of its client (sampling, elicitation, roots) go to the one session whose call it is
//! serving, and list changes and resource updates to the sessions that follow them.
//!
//! Sampling, roots and logging are deprecated in MCP (SEP-2577) but still part of the protocol
//! versions the gateway serves, and upstreams still use them: they are relayed.
#![allow(deprecated)]

mod asked;
pub mod catalog;
mod downstream;
mod error;
mod order;

use asked::answered_otherwise;
pub(crate) use asked::{Asked, asked_request, audit_passed, relay_to};
pub use downstream::{Asks, CallOrigin, Downstream, LogLevel, Note, Round, Sink, by_rounds};
pub use error::{ProxyError, Refusal, RefusalAnswer};
pub use order::Counted;
use order::{DuringOwn, Handled, Marked, Seq};
pub(crate) use order::{Routes, forward_log, forward_progress};

use std::sync::Arc;

use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientResult, CreateMessageRequest, CreateMessageRequestParams,
    CreateMessageResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationCapability,
    FormElicitationCapability, Implementation, ListRootsRequest, ListRootsResult, ProgressNotificationParam,
    ResourceUpdatedNotificationParam, RootsCapabilities, SamplingCapability, ServerNotification, ServerRequest,
    UrlElicitationCapability,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ErrorData, RoleServer};
use serde_json::Value;

use crate::relay::catalog::{Catalog, ListKind};
use crate::telemetry::metrics;

/// A received notification's `_meta`. rmcp 3.11 moves the notification's extensions into the
/// handler's context before it takes the meta out of them, so `context.meta` is always empty
/// and the meta (with the gateway's related-request mark) is found in `context.extensions`.
fn notification_meta(context: &NotificationContext<RoleClient>) -> &serde_json::Map<String, Value> {
    match context.extensions.get::<rmcp::model::NotificationMetaObject>() {
        Some(meta) => &meta.0.0,
        None => &context.meta.0.0,
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

    /// The capabilities of [`RelayCaps::key`], when `key` is one.
    pub fn from_key(key: &str) -> Option<Self> {
        let (flags, era) = key.strip_prefix("caps:")?.split_once('/')?;
        let bits: Vec<bool> = flags
            .chars()
            .map(|c| match c {
                '0' => Some(false),
                '1' => Some(true),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let [sampling, elicitation_form, elicitation_url, roots] = bits[..] else { return None };
        let modern = match era {
            "modern" => true,
            "legacy" => false,
            _ => return None,
        };
        Some(Self { sampling, elicitation_form, elicitation_url, roots, modern })
    }

    /// What a connection declares on a request of a caller that declared the tasks extension.
    pub fn declared_with_tasks(self) -> ClientCapabilities {
        let mut caps = self.declared();
        caps.extensions
            .get_or_insert_with(Default::default)
            .insert(rmcp::model::TASKS_EXTENSION_ID.to_owned(), Default::default());
        caps
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
    pub(super) wire: Arc<crate::wire::client::WireSlot>,
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
    /// names no call, and could be about any call the upstream was sent, however long ago, or
    /// about the gateway's own requests: it goes to the calling session only when every call
    /// the upstream process was sent is one principal's, every call in flight (or just ended)
    /// is that one session's, and no request of the gateway's own was unanswered when it came.
    /// Otherwise it is dropped (counted, logged at debug), never guessed: the connection is
    /// shared by the tenant's users. Either way, only at or above the session's level.
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
            Marked::No if context.extensions.get::<DuringOwn>().is_some() => None,
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
