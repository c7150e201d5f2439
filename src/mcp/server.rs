//! The MCP server handler: one authorization decision for `tools/list` and `tools/call`,
//! the `McpCallContext` extractor, per-call timeout, metrics and the audit of every call.
//! The handler object lives as long as a session and holds no identity of any caller.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext};
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::model::SubscriptionFilter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult, ConstString,
    ContentBlock, CustomRequest, CustomResult, ErrorCode, GetPromptRequestParams, GetPromptResponse, Implementation,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, ServerResult, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tracing::Instrument;

mod call;
mod confirm;
mod proxied;
mod task_run;
mod tasks;

use super::cursor::{self};
use super::pipeline::call_audit;
use super::registry::ToolSet;
use super::rounds;
use super::shared::Shared;
use crate::audit::{AuditWriter, CallAudit, Outcome, digest};
use crate::context::{CallSite, ContextError, McpCallContext};
use crate::identity::{SESSION_HEADER, SessionRegistry};
use crate::model::Role;
use crate::proxy::surface;
use crate::proxy::{
    CallOrigin, Downstream, Exchange, LOGIN_TOOL, LogLevel, PassedInput, ProxyError, RelayCaps, Round, Sink, Snapshot,
    UpstreamCall, Watch,
};
use crate::relay::by_rounds;
use crate::selection::{self, Selection};
use crate::store::Db;
use crate::telemetry::{metrics, trace};
use crate::vocab::names::split_tool_name;
use call::client_of;
use tasks::{TaskOrigin, declares_tasks};

/// The per-session (or, stateless, per-request) MCP handler. It holds the session's selected
/// plugin roots (chosen at `initialize`, checked against the caller then), never a caller.
#[derive(Clone)]
pub struct GatewayServer {
    shared: Arc<Shared>,
    selection: Arc<OnceLock<Arc<Selection>>>,
    /// The session's `logging/setLevel`: upstream log lines below it are not forwarded.
    log_level: Arc<LogLevel>,
}

impl GatewayServer {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared, selection: Arc::default(), log_level: Arc::default() }
    }

    /// The caller's snapshot of the tenant's upstream servers (its session's, frozen), on
    /// connections that tell upstreams what this client can answer.
    async fn snapshot(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
    ) -> Result<Arc<Snapshot>, ErrorData> {
        let caps = RelayCaps::of(context, ctx.session_id().is_some());
        self.shared.upstreams.snapshot(ctx.tenant_id(), ctx.user_id(), ctx.session_id(), caps).await.map_err(|e| {
            tracing::error!(error = %e, "resolving upstream servers failed");
            ErrorData::internal_error("internal error", None)
        })
    }

    /// The snapshot a prompt name or resource URI belongs to: the session's selected roots'
    /// servers (`rN.NAME`) when `selected`, else the tenant's.
    async fn snapshot_of(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        selected: bool,
    ) -> Result<Arc<Snapshot>, ErrorData> {
        if !selected {
            return self.snapshot(ctx, context).await;
        }
        Ok(Arc::new(match self.selection_for(ctx, context).await? {
            Some(selection) => selection.runtime().snapshot(ctx.tenant_id(), ctx.user_id(), ctx.roles()),
            None => Snapshot::empty(ctx.tenant_id(), ctx.user_id()),
        }))
    }

    /// The session's selected roots' servers as a snapshot, when it has any.
    /// The policies' questions for a request of a selected root's server (`selected`: its
    /// grants alone decide, as for its tools) or of the tenant's.
    async fn ask_of(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        selected: bool,
    ) -> crate::proxy::Ask {
        match selected {
            true => crate::proxy::Ask::grants_alone(),
            false => ask_for(&self.shared, ctx, context).await,
        }
    }

    async fn selected_snapshot(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<Snapshot>, ErrorData> {
        let selection = self.selection_for(ctx, context).await?;
        Ok(selection.map(|s| s.runtime().snapshot(ctx.tenant_id(), ctx.user_id(), ctx.roles())))
    }

    /// Where what an upstream sends while serving this request goes, and who it is for.
    fn downstream(&self, ctx: &McpCallContext, context: &RequestContext<RoleServer>) -> Downstream {
        let upstreams = &self.shared.upstreams;
        Downstream {
            owner: ctx.session_id().map_or_else(|| upstreams.stateless_owner(), str::to_owned),
            sink: Sink::Peer(context.peer.clone()),
            progress: context.meta.get_progress_token(),
            // A 2026-07-28 request names its own level (none: no log lines); a session has one.
            log_level: if by_rounds(context) {
                Arc::new(LogLevel::of_request(context.meta.log_level()))
            } else {
                Arc::clone(&self.log_level)
            },
            rounds: None,
            origin: Some(Arc::new(CallOrigin {
                audit: self.shared.audit.clone(),
                tenant: ctx.tenant_id(),
                user: ctx.user_id(),
                session: ctx.session_id().map(str::to_owned),
                request_id: Some(crate::jsonrpc::id_text(ctx.request_id())),
                client: client_of(context, ctx.session_id()),
                timeout: self.shared.call_timeout,
            })),
        }
    }

    fn exchange(&self, ctx: &McpCallContext, context: &RequestContext<RoleServer>) -> Exchange {
        Exchange {
            downstream: self.downstream(ctx, context),
            timeout: self.shared.call_timeout,
            cancelled: context.ct.clone(),
            passed: None,
        }
    }

    /// Who a list's cursors are for.
    fn page<T>(
        &self,
        ctx: &McpCallContext,
        list: &'static str,
        request: Option<&PaginatedRequestParams>,
        items: Vec<T>,
    ) -> Result<(Vec<T>, Option<String>), ErrorData> {
        let (tenant, user) = (ctx.tenant_id().to_string(), ctx.user_id().to_string());
        let owner = cursor::Owner { list, tenant: &tenant, user: &user, session: ctx.session_id() };
        let cursor = request.and_then(|r| r.cursor.as_deref());
        cursor::page(&self.shared.cursors, &owner, cursor, items).inspect_err(|_| metrics::denial("invalid_cursor"))
    }

    /// The selected roots that apply to this request: the session's, or, for a request
    /// outside a session, those its own `_meta` names (checked now, for this request only).
    async fn selection_for(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<Arc<Selection>>, ErrorData> {
        if let Some(selection) = self.selection.get() {
            if selection.tenant() != ctx.tenant_id() {
                // Session binding makes this unreachable; if it ever happens, see nothing.
                tracing::error!("a session's selected roots belong to another tenant; refusing them");
                return Ok(None);
            }
            return Ok(Some(Arc::clone(selection)));
        }
        if ctx.session_id().is_some() {
            return Ok(None);
        }
        self.select(ctx, context, &context.meta.0, None).await
    }

    /// Checks and starts the roots `meta` selects, if any: a malformed selection or a root the
    /// caller may not select is audited and answered -32602 naming the field; nothing is read.
    async fn select(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        meta: &serde_json::Map<String, serde_json::Value>,
        peer: Option<rmcp::service::Peer<RoleServer>>,
    ) -> Result<Option<Arc<Selection>>, ErrorData> {
        let internal = |e: &dyn std::fmt::Display| {
            tracing::error!(error = %e, "checking selected roots failed");
            ErrorData::internal_error("internal error", None)
        };
        let outcome = match selection::requested(meta) {
            Ok(None) => return Ok(None),
            Ok(Some(requested)) => {
                let upstreams = &self.shared.upstreams;
                selection::authorize(upstreams.db(), ctx.tenant_id(), ctx.roles(), &requested)
                    .await
                    .map_err(|e| internal(&e))?
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(roots) => {
                let remote = Arc::clone(self.shared.upstreams.remote());
                Ok(Some(Selection::start(ctx.tenant_id(), roots, remote, peer).await))
            }
            Err(refusal) => {
                let class = refusal.refusal.unwrap_or("invalid_params");
                tracing::warn!(field = %refusal.field, class, "selected roots refused");
                metrics::denial("root_not_allowed");
                let call = call_audit(
                    ctx,
                    client_of(context, ctx.session_id()),
                    selection::SELECTED_ROOTS_KEY.to_owned(),
                    digest::arguments_digest(None),
                    None,
                );
                self.shared
                    .audit
                    .record_or_withhold(call.event(Outcome::Denied, Some(class)), selection::SELECTED_ROOTS_KEY)
                    .await?;
                Err(refusal.into_error_data())
            }
        }
    }
}

/// How long a user has to complete a login the gateway asked for by elicitation (a start link
/// lives this long).
const LOGIN_ELICITATION_TIMEOUT: std::time::Duration = crate::oauth::LOGIN_TTL;

/// Asks the client to open `link` (URL-mode elicitation) when it declared that it can; true
/// when the user says they completed the login. False (and the caller answers with the link in
/// an error) when the client can't, declines, or the protocol forbids the request.
async fn login_by_elicitation(peer: &rmcp::Peer<RoleServer>, server: &str, link: &str) -> bool {
    if !peer.supported_elicitation_modes().contains(&rmcp::service::ElicitationMode::Url) {
        return false;
    }
    let Ok(url) = reqwest::Url::parse(link) else { return false };
    let message = format!("Server `{server}` needs you to log in. Open the link, log in, then confirm.");
    let id = uuid::Uuid::new_v4().to_string();
    match peer.elicit_url_with_timeout(message, url, id, Some(LOGIN_ELICITATION_TIMEOUT)).await {
        Ok(rmcp::model::ElicitationAction::Accept) => true,
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(%server, error = %e, "login by elicitation not possible");
            false
        }
    }
}

/// The MCP request methods the transport parses into typed requests. One of them arriving
/// as a custom request means its `params` did not fit: invalid params (-32602), not an
/// unknown method (-32601).
const TYPED_METHODS: &[&str] = &[
    rmcp::model::InitializeResultMethod::VALUE,
    rmcp::model::DiscoverRequestMethod::VALUE,
    rmcp::model::PingRequestMethod::VALUE,
    rmcp::model::CompleteRequestMethod::VALUE,
    rmcp::model::SetLevelRequestMethod::VALUE,
    rmcp::model::GetPromptRequestMethod::VALUE,
    rmcp::model::ListPromptsRequestMethod::VALUE,
    rmcp::model::ListResourcesRequestMethod::VALUE,
    rmcp::model::ListResourceTemplatesRequestMethod::VALUE,
    rmcp::model::ReadResourceRequestMethod::VALUE,
    rmcp::model::SubscriptionsListenRequestMethod::VALUE,
    rmcp::model::SubscribeRequestMethod::VALUE,
    rmcp::model::UnsubscribeRequestMethod::VALUE,
    rmcp::model::CallToolRequestMethod::VALUE,
    rmcp::model::ListToolsRequestMethod::VALUE,
    rmcp::model::GetTaskMethod::VALUE,
    rmcp::model::UpdateTaskMethod::VALUE,
    rmcp::model::CancelTaskMethod::VALUE,
    rmcp::model::ListSkillsRequestMethod::VALUE,
    rmcp::model::GetSkillRequestMethod::VALUE,
    rmcp::model::ReadResourceDirectoryRequestMethod::VALUE,
];

/// Whether `roles` may use `tool`: the one decision behind listing and calling.
pub(crate) fn tool_allowed(tools: &ToolSet, tool: &str, roles: &[Role]) -> bool {
    tools.spec(tool).is_some_and(|spec| roles.iter().any(|r| spec.roles.contains(r)))
}

/// The questions this request asks of its tenant's policies: the caller, the revision (the
/// request's `MCP-Protocol-Version`, else the session's), the client's declared name.
pub(super) async fn ask_for(
    shared: &Shared,
    ctx: &McpCallContext,
    context: &RequestContext<RoleServer>,
) -> crate::proxy::Ask {
    let policies = shared.upstreams.policies().of(ctx.tenant_id(), ctx.tenant_slug()).await;
    if policies.is_empty() {
        return crate::proxy::Ask::grants_only_for(policies);
    }
    let header = context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.headers.get("mcp-protocol-version"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let revision = header
        .or_else(|| ctx.session_id().and_then(|_| context.peer.peer_info()).map(|i| i.protocol_version.to_string()))
        .unwrap_or_default();
    let client = client_of(context, ctx.session_id()).map(|(name, _)| name);
    crate::proxy::Ask::new(policies, ctx, &revision, client.as_deref())
}

/// An upstream that answered a request with the result of another.
fn other_kind() -> ProxyError {
    ProxyError::Unavailable("the upstream answered with a result of another kind".to_owned())
}

/// A prompt that does not exist for the caller, granted or not.
fn not_found_prompt() -> ErrorData {
    ErrorData::invalid_params("prompt not found", None)
}

/// A resource template that does not exist for the caller, granted or not.
fn not_found_template() -> ErrorData {
    ErrorData::invalid_params("resource template not found", None)
}

/// A resource that does not exist for the caller, granted or not (MCP's -32002).
fn not_found_resource(uri: &str) -> ErrorData {
    ErrorData::resource_not_found("resource not found", Some(serde_json::json!({ "uri": uri })))
}

/// Whether a prompt name belongs to a selected root's server (`rN.NAME__prompt`).
fn selected_name(name: &str) -> bool {
    split_tool_name(name).is_some_and(|(server, _)| selection::is_selected_server(server))
}

/// Whether a URI belongs to a selected root's server (`scopegate://rN.NAME/...`).
fn selected_uri(uri: &str) -> bool {
    uri.strip_prefix(surface::URI_SCHEME)
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(server, _)| selection::is_selected_server(server))
}

/// A session's lists are watched: it is told when an upstream's list changes. A request
/// outside a session has nobody to tell later.
fn watch<'a>(ctx: &'a McpCallContext, context: &'a RequestContext<RoleServer>) -> Option<Watch<'a>> {
    ctx.session_id().map(|session| Watch { session, peer: &context.peer })
}

fn refused(e: &ContextError) -> ErrorData {
    tracing::warn!(reason = e.reason(), "call refused: no McpCallContext");
    metrics::denial(e.reason());
    ErrorData::new(ErrorCode::INVALID_REQUEST, "the call could not be tied to an authenticated caller", None)
}

fn call_site(context: &RequestContext<RoleServer>) -> (Option<&http::request::Parts>, Option<&str>) {
    let parts = context.extensions.get::<http::request::Parts>();
    let session = parts.and_then(|p| p.headers.get(SESSION_HEADER)).and_then(|v| v.to_str().ok());
    (parts, session)
}

fn context_for(
    context: &RequestContext<RoleServer>,
    sessions: &SessionRegistry,
) -> Result<McpCallContext, ContextError> {
    let (parts, session_id) = call_site(context);
    McpCallContext::for_call(CallSite { parts, request_id: &context.id, session_id }, sessions)
}

/// What the extractor needs beside the call itself, handed over in the call's extensions
/// (the tools' receiver holds nothing).
struct CallEnv {
    db: Db,
    audit: AuditWriter,
    sessions: Arc<SessionRegistry>,
    call: Arc<CallAudit>,
}

/// The extractor: every tool that takes `McpCallContext` gets one built by the fail-closed
/// factory from this very call's HTTP request, with data access attached.
impl<S> FromContextPart<ToolCallContext<'_, S>> for McpCallContext {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let env = context.request_context.extensions.get::<Arc<CallEnv>>().cloned().ok_or_else(|| {
            refused(&ContextError::NoStore);
            ErrorData::new(ErrorCode::INVALID_REQUEST, "the call could not be tied to an authenticated caller", None)
        })?;
        let ctx = context_for(&context.request_context, &env.sessions).map_err(|e| refused(&e))?;
        Ok(ctx.with_data(env.db.clone(), env.audit.clone(), Some(Arc::clone(&env.call))))
    }
}

impl ServerHandler for GatewayServer {
    fn get_info(&self) -> ServerConfig {
        // What the gateway serves for every tenant: its own tools and the upstreams' tools,
        // prompts, resources (with subscriptions), completions and log lines, and it tells a
        // session when one of those lists changes.
        #[allow(deprecated)]
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed()
            .enable_resources()
            .enable_resources_list_changed()
            .enable_resources_subscribe()
            .enable_completions()
            .enable_logging()
            .enable_tasks()
            .build();
        // The extension a client uses to bring its own plugin roots (see `selection`).
        let mut extension = serde_json::Map::new();
        extension.insert("maxRoots".to_owned(), serde_json::json!(selection::MAX_ROOTS));
        capabilities.experimental = Some([(selection::SELECTED_ROOTS_KEY.to_owned(), extension)].into());
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("scopegate", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "scopegate: tools scoped to your tenant, user and role. Flocks you may not see \
                 do not exist for you.",
            )
    }

    /// The handshake, and the session's selected roots when `_meta` names them: checked
    /// against the caller now (a refusal fails the `initialize`, naming the field), resolved
    /// and followed for the life of the session.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        // The tasks extension is not defined on the revisions with an `initialize`.
        if let Some(extensions) = result.capabilities.extensions.as_mut() {
            extensions.remove(rmcp::model::TASKS_EXTENSION_ID);
            if extensions.is_empty() {
                result.capabilities.extensions = None;
            }
        }
        // rmcp hands the request's `_meta` over in the context (the params keep a copy only
        // when it was not moved there).
        let meta = if context.meta.0.is_empty() { request.meta.as_ref().map(|m| &m.0) } else { Some(&context.meta.0) };
        if let Some(meta) = meta.filter(|m| m.contains_key(selection::SELECTED_ROOTS_KEY)) {
            let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
            if let Some(selection) = self.select(&ctx, &context, meta, Some(context.peer.clone())).await?
                && self.selection.set(selection).is_err()
            {
                return Err(ErrorData::invalid_request("the session is already initialized", None));
            }
        }
        Ok(result)
    }

    /// The session is ready: the lean relay learns what it needs of it (what the client
    /// declared, who it is, the session's log level).
    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        let parts = context.extensions.get::<http::request::Parts>();
        let Some(session) = parts.and_then(|p| p.headers.get(SESSION_HEADER)).and_then(|v| v.to_str().ok()) else {
            return;
        };
        let Some(info) = context.peer.peer_info() else { return };
        let known = super::lean::LeanSession {
            peer: context.peer.clone(),
            caps: RelayCaps::declared_by(&info.capabilities),
            client: Some((info.client_info.name.clone(), info.client_info.version.clone())),
            log_level: Arc::clone(&self.log_level),
            // rmcp has put the negotiated revision in the peer's info by now.
            polling: info.protocol_version >= rmcp::model::ProtocolVersion::V_2025_11_25,
        };
        self.shared.lean.register(session, known);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let ask = ask_for(&self.shared, &ctx, &context).await;
        let upstreams = &self.shared.upstreams;
        // A native tool's roles are its ceiling; the tenant's policies may narrow them.
        let native_listed = |name: &str| match upstreams.policies().native_facts(name) {
            Some(facts) if !ask.grants_only() => ask.list(facts, Some(crate::policy::NATIVE_ROLES)),
            _ => true,
        };
        let mut tools: Vec<_> = self
            .shared
            .tools
            .list()
            .into_iter()
            .filter(|t| tool_allowed(&self.shared.tools, &t.name, ctx.roles()) && native_listed(&t.name))
            .collect();
        let snapshot = self.snapshot(&ctx, &context).await?;
        let native = |name: &str| self.shared.tools.has(name);
        tools.extend(upstreams.list(&snapshot, ctx.roles(), &ask, native, watch(&ctx, &context)).await);
        if let Some(selection) = self.selection_for(&ctx, &context).await? {
            tools.extend(selection.list(upstreams.connect_timeout()).await);
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let snapshot = self.snapshot(&ctx, &context).await?;
        let ask = ask_for(&self.shared, &ctx, &context).await;
        let mut all = self.shared.upstreams.resources(&snapshot, ctx.roles(), &ask, watch(&ctx, &context)).await;
        if let Some(selected) = self.selected_snapshot(&ctx, &context).await? {
            let alone = crate::proxy::Ask::grants_alone();
            all.extend(self.shared.upstreams.resources(&selected, ctx.roles(), &alone, None).await);
        }
        let (resources, next_cursor) = self.page(&ctx, "resources", request.as_ref(), all)?;
        Ok(ListResourcesResult { resources, next_cursor, ..Default::default() })
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let snapshot = self.snapshot(&ctx, &context).await?;
        let ask = ask_for(&self.shared, &ctx, &context).await;
        let mut all = self.shared.upstreams.templates(&snapshot, ctx.roles(), &ask, watch(&ctx, &context)).await;
        if let Some(selected) = self.selected_snapshot(&ctx, &context).await? {
            let alone = crate::proxy::Ask::grants_alone();
            all.extend(self.shared.upstreams.templates(&selected, ctx.roles(), &alone, None).await);
        }
        let (resource_templates, next_cursor) = self.page(&ctx, "resource_templates", request.as_ref(), all)?;
        Ok(ListResourceTemplatesResult { resource_templates, next_cursor, ..Default::default() })
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let snapshot = self.snapshot(&ctx, &context).await?;
        let ask = ask_for(&self.shared, &ctx, &context).await;
        let mut all = self.shared.upstreams.prompts(&snapshot, ctx.roles(), &ask, watch(&ctx, &context)).await;
        if let Some(selected) = self.selected_snapshot(&ctx, &context).await? {
            let alone = crate::proxy::Ask::grants_alone();
            all.extend(self.shared.upstreams.prompts(&selected, ctx.roles(), &alone, None).await);
        }
        let (prompts, next_cursor) = self.page(&ctx, "prompts", request.as_ref(), all)?;
        Ok(ListPromptsResult { prompts, next_cursor, ..Default::default() })
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let item = format!("prompts/get {}", request.name);
        let arguments = request.arguments.clone();
        let selected = selected_name(&request.name);
        let ask = Arc::new(self.ask_of(&ctx, &context, selected).await);
        let result = async {
            let snapshot = self.snapshot_of(&ctx, &context, selected).await.map_err(ProxyError::Upstream)?;
            let binding = by_rounds(&context).then(|| self.binding(&ctx, item.clone(), arguments.as_ref()));
            let server = surface::route_name(&*snapshot, &request.name).map(|(server, _)| server.to_owned());
            let modern = binding.is_some()
                && match &server {
                    Some(server) => self.shared.upstreams.serves_modern(&snapshot, server).await,
                    None => false,
                };
            let (state, responses) = (request.request_state.clone(), request.input_responses.clone());
            let (upstreams, call_ctx, ask) = (Arc::clone(&self.shared.upstreams), ctx.clone(), Arc::clone(&ask));
            let start = move |exchange| async move {
                upstreams.get_prompt(&snapshot, request, &call_ctx, &ask, exchange).await
            };
            match self
                .proxied(&ctx, &context, binding, modern, false, state.as_deref(), responses.as_ref(), start)
                .await?
            {
                rounds::Next::Input(input) => Ok(GetPromptResponse::InputRequired(input)),
                rounds::Next::Done(done) => match *done {
                    ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
                    _ => Err(other_kind()),
                },
            }
        }
        .await;
        let asked = call::Asked { item, arguments: arguments.as_ref(), policy: ask.noted() };
        self.audited(&ctx, &context, asked, result, not_found_prompt).await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let uri = request.uri.clone();
        let mut arguments = serde_json::Map::new();
        arguments.insert("uri".to_owned(), serde_json::Value::String(uri.clone()));
        let selected = selected_uri(&uri);
        let ask = Arc::new(self.ask_of(&ctx, &context, selected).await);
        let result = async {
            let snapshot = self.snapshot_of(&ctx, &context, selected).await.map_err(ProxyError::Upstream)?;
            let binding = by_rounds(&context).then(|| self.binding(&ctx, format!("resources/read {uri}"), None));
            let server = surface::route_uri(&*snapshot, &uri).map(|(server, _)| server.to_owned());
            let modern = binding.is_some()
                && match &server {
                    Some(server) => self.shared.upstreams.serves_modern(&snapshot, server).await,
                    None => false,
                };
            let (state, responses) = (request.request_state.clone(), request.input_responses.clone());
            let (upstreams, call_ctx, ask) = (Arc::clone(&self.shared.upstreams), ctx.clone(), Arc::clone(&ask));
            let start = move |exchange| async move {
                upstreams.read_resource(&snapshot, request, &call_ctx, &ask, exchange).await
            };
            match self
                .proxied(&ctx, &context, binding, modern, false, state.as_deref(), responses.as_ref(), start)
                .await?
            {
                rounds::Next::Input(input) => Ok(ReadResourceResponse::InputRequired(input)),
                rounds::Next::Done(done) => match *done {
                    ServerResult::ReadResourceResult(r) => Ok(ReadResourceResponse::Complete(r)),
                    _ => Err(other_kind()),
                },
            }
        }
        .await;
        let not_found = || not_found_resource(&uri);
        let item = "resources/read".to_owned();
        let asked = call::Asked { item, arguments: Some(&arguments), policy: ask.noted() };
        self.audited(&ctx, &context, asked, result, not_found).await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let arguments = match serde_json::to_value(&request) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        let (item, not_found): (String, fn() -> ErrorData) = match &request.r#ref {
            rmcp::model::Reference::Prompt(p) => (format!("completion/complete {}", p.name), not_found_prompt),
            _ => ("completion/complete".to_owned(), not_found_template),
        };
        let selected = match &request.r#ref {
            rmcp::model::Reference::Prompt(p) => selected_name(&p.name),
            rmcp::model::Reference::Resource(r) => selected_uri(&r.uri),
            _ => false,
        };
        let ask = self.ask_of(&ctx, &context, selected).await;
        let result = async {
            let snapshot = self.snapshot_of(&ctx, &context, selected).await.map_err(ProxyError::Upstream)?;
            let exchange = self.exchange(&ctx, &context);
            let mut result = self.shared.upstreams.complete(&snapshot, request, &ctx, &ask, exchange).await?;
            result.result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
            Ok(result)
        }
        .await;
        let asked = call::Asked { item, arguments: Some(&arguments), policy: ask.noted() };
        self.audited(&ctx, &context, asked, result, not_found).await
    }

    /// Every kind of notification the gateway relays is accepted (and every resource URI, seen
    /// or not, unknown or forbidden alike); what each caller hears is scoped in [`Self::listen`].
    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    /// A 2026-07-28 caller's `subscriptions/listen` stream: list changes of the servers (and
    /// kinds) it holds grants for, updates of the resources it may read, until the caller ends
    /// the stream or its token expires (the gateway no longer knows who listens after that).
    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), ErrorData> {
        let context = subscription.request_context();
        let ctx = context_for(context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let snapshot = self.snapshot(&ctx, context).await?;
        let key = format!("listen:{}", uuid::Uuid::new_v4());
        let ended = tokio_util::sync::CancellationToken::new();
        let _end_on_drop = ended.clone().drop_guard();
        let ask = ask_for(&self.shared, &ctx, context).await;
        let listening = self.shared.upstreams.listen(&snapshot, &ctx, &ask, &key, subscription.sink(), &ended).await;
        let left = u64::try_from(ctx.token_expires_at().saturating_sub(crate::store::now_millis() / 1000)).unwrap_or(0);
        tokio::select! {
            () = subscription.cancelled() => {}
            () = tokio::time::sleep(Duration::from_secs(left)) => {
                tracing::debug!("a listen stream ended with its caller's token");
            }
        }
        ended.cancel();
        self.shared.upstreams.unlisten(listening, &key).await;
        Ok(())
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log_level.set(request.level);
        Ok(())
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let Some(session) = ctx.session_id() else {
            return Err(ErrorData::invalid_request("resources/subscribe needs a session", None));
        };
        let selected = selected_uri(&request.uri);
        let snapshot = self.snapshot_of(&ctx, &context, selected).await?;
        let ask = self.ask_of(&ctx, &context, selected).await;
        let watch = Watch { session, peer: &context.peer };
        match self.shared.upstreams.subscribe(&snapshot, &request.uri, &ctx, &ask, watch).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ErrorData::invalid_params("this resource does not support subscriptions", None)),
            Err(ProxyError::NotFound) => {
                metrics::denial("unknown_resource");
                Err(not_found_resource(&request.uri))
            }
            Err(ProxyError::Refused(class)) => {
                metrics::denial(class);
                Err(not_found_resource(&request.uri))
            }
            Err(e) => Err(e.into_error_data()),
        }
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let ctx = context_for(&context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let Some(session) = ctx.session_id() else {
            return Err(ErrorData::invalid_request("resources/unsubscribe needs a session", None));
        };
        let snapshot = self.snapshot_of(&ctx, &context, selected_uri(&request.uri)).await?;
        match self.shared.upstreams.unsubscribe(&snapshot, &request.uri, session).await {
            Ok(()) => Ok(()),
            Err(ProxyError::NotFound) => Err(not_found_resource(&request.uri)),
            Err(e) => Err(e.into_error_data()),
        }
    }

    /// A request the transport could not type. A known method here had `params` that do not
    /// fit it: -32602 with what is wrong (a malformed `tools/call` is audited as a failed call
    /// of the tool it names). Anything else is an unknown method.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        let CustomRequest { method, params, .. } = request;
        if !TYPED_METHODS.contains(&method.as_str()) {
            return Err(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, method, None));
        }
        let params = params.unwrap_or(serde_json::Value::Null);
        let detail = if method == rmcp::model::CallToolRequestMethod::VALUE {
            let detail = serde_json::from_value::<CallToolRequestParams>(params.clone())
                .err()
                .map_or_else(|| "does not fit the method".to_owned(), |e| e.to_string());
            let tool = params.get("name").and_then(serde_json::Value::as_str).unwrap_or("(invalid)");
            self.audit_malformed_call(&context, tool).await?;
            detail
        } else {
            "does not fit the method".to_owned()
        };
        metrics::denial("invalid_params");
        Err(ErrorData::invalid_params(format!("Invalid params for {method}: {detail}"), None))
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.get_task_of(request, context).await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.update_task_of(request, context).await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.cancel_task_of(request, context).await
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        self.shared.tools.get(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = context.extensions.get::<http::request::Parts>();
        let span = trace::tool_span(parts.and_then(|p| trace::parent_in(&p.extensions)));
        self.serve_call(request, context).instrument(span).await
    }
}
