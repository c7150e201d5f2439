//! The MCP surface beyond tools: the upstreams' prompts, resources and resource templates,
//! aggregated for a session and filtered by its grants (kind `prompt` and `resource`), and the
//! requests that go to one of them (`prompts/get`, `resources/read`, `completion/complete`,
//! `resources/subscribe`). A name or URI that is not granted is answered exactly like one
//! that does not exist (`Err(ProxyError::NotFound)`).

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{
    ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, GetPromptRequest, GetPromptRequestParams,
    Prompt, ReadResourceRequest, ReadResourceRequestParams, Reference, Resource, ResourceContents, ResourceTemplate,
    ServerResult,
};
use rmcp::service::{Peer, SubscriptionSink};
use tokio_util::sync::CancellationToken;

use crate::context::McpCallContext;
use crate::model::Role;
use crate::policy::{Item, ItemAction};
use crate::proxy::Ask;
use crate::proxy::connection::Servable;
use crate::proxy::surface;
use crate::proxy::{Connection, Exchange, ProxyError, Snapshot, UpstreamError, Upstreams, unavailable};
use crate::relay::catalog::{Kinds, Notifier};
use crate::store::entities::GrantKind;

/// What one `subscriptions/listen` stream follows (see [`Upstreams::listen`]).
#[derive(Default)]
pub struct Listening {
    watched: Vec<Arc<Connection>>,
    subscribed: Vec<(Arc<Connection>, String)>,
}

/// A session to tell when a list it was given changes.
pub struct Watch<'a> {
    pub session: &'a str,
    pub peer: &'a Peer<RoleServer>,
}

impl Watch<'_> {
    pub(super) fn notifier(&self) -> Notifier {
        Notifier::Session(self.peer.clone())
    }
}

/// Each server's items as the caller sees them: `item` gives the exposed item (named for its
/// server, whether that server is prefixed), or `None` for one not served to this caller.
fn expose<T>(
    snapshot: &Snapshot,
    gathered: Vec<(String, Arc<Vec<T>>)>,
    item: impl Fn(&str, bool, &T) -> Option<T>,
) -> Vec<T> {
    let mut out = Vec::new();
    for (server, items) in gathered {
        let prefixed = snapshot.prefixed(&server) != Some(false);
        out.extend(items.iter().filter_map(|i| item(&server, prefixed, i)));
    }
    out
}

/// The grants that cover requests of `action`.
fn grant_kind(action: ItemAction) -> GrantKind {
    if action.of_prompt() { GrantKind::Prompt } else { GrantKind::Resource }
}

/// Whether `item` is listed for the caller: a grant covers it (a tenant without policies), or
/// the tenant's policies allow it, the grants being permits.
fn listed(snapshot: &Snapshot, ask: &Ask, item: &Item<'_>, roles: &[Role]) -> bool {
    let kind = grant_kind(item.action);
    match ask.grants_only() {
        true => snapshot.allowed_kind(item.server, kind, item.name, roles),
        false => ask.list_item(item, snapshot.granting(item.server, kind, item.name, roles).as_deref()),
    }
}

impl Upstreams {
    /// The prompts the caller may use, named like tools.
    pub async fn prompts(
        &self,
        snapshot: &Snapshot,
        roles: &[Role],
        ask: &Ask,
        watch: Option<Watch<'_>>,
    ) -> Vec<Prompt> {
        let gathered = self.gather::<Prompt>(snapshot, roles, ask, watch).await;
        let mut out = expose(snapshot, gathered, |server, prefixed, prompt| {
            let free = prefixed || surface::unprefixed_name_free(snapshot, &prompt.name, |_| false);
            let item = Item { action: ItemAction::GetPrompt, server, name: &prompt.name };
            (free && listed(snapshot, ask, &item, roles)).then(|| {
                let mut prompt = prompt.clone();
                prompt.name = surface::exposed_name(server, prefixed, &prompt.name);
                prompt
            })
        });
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The resources the caller may read, under the URIs the gateway exposes.
    pub async fn resources(
        &self,
        snapshot: &Snapshot,
        roles: &[Role],
        ask: &Ask,
        watch: Option<Watch<'_>>,
    ) -> Vec<Resource> {
        let gathered = self.gather::<Resource>(snapshot, roles, ask, watch).await;
        let mut out = expose(snapshot, gathered, |server, prefixed, resource| {
            let uri = surface::exposed_uri(server, prefixed, &resource.uri)?;
            let item = Item { action: ItemAction::ReadResource, server, name: &resource.uri };
            listed(snapshot, ask, &item, roles).then(|| {
                let mut resource = resource.clone();
                resource.uri = uri;
                resource
            })
        });
        out.sort_by(|a, b| a.uri.cmp(&b.uri));
        out
    }

    /// The resource templates the caller may use, under the URIs the gateway exposes.
    pub async fn templates(
        &self,
        snapshot: &Snapshot,
        roles: &[Role],
        ask: &Ask,
        watch: Option<Watch<'_>>,
    ) -> Vec<ResourceTemplate> {
        let gathered = self.gather::<ResourceTemplate>(snapshot, roles, ask, watch).await;
        let mut out = expose(snapshot, gathered, |server, prefixed, template| {
            let uri_template = surface::exposed_uri(server, prefixed, &template.uri_template)?;
            let item = Item { action: ItemAction::ReadResource, server, name: &template.uri_template };
            listed(snapshot, ask, &item, roles).then(|| {
                let mut template = template.clone();
                template.uri_template = uri_template;
                template
            })
        });
        out.sort_by(|a, b| a.uri_template.cmp(&b.uri_template));
        out
    }

    /// Each granted server's list of `T` (every server's, for a tenant with policies: a policy
    /// may permit what no grant does), fetched concurrently; a server that fails is left out
    /// (and logged), like a server whose tools can't be listed.
    async fn gather<T: Servable>(
        &self,
        snapshot: &Snapshot,
        roles: &[Role],
        ask: &Ask,
        watch: Option<Watch<'_>>,
    ) -> Vec<(String, Arc<Vec<T>>)> {
        let mut tasks = tokio::task::JoinSet::new();
        for (server, connection) in &snapshot.servers {
            if ask.grants_only() && !snapshot.any_grant_kind(server, T::GRANT, roles) {
                continue;
            }
            if let Some(watch) = &watch {
                connection.catalog.watch(watch.session, &watch.notifier());
            }
            let (server, connection, timeout) = (server.clone(), Arc::clone(connection), self.connect_timeout);
            tasks.spawn(async move { (server, connection.listed::<T>(timeout).await) });
        }
        let mut out = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let Ok((server, items)) = joined else { continue };
            match items {
                Ok(items) => out.push((server, items)),
                Err(UpstreamError::LoginNeeded { .. }) => {}
                Err(e) => tracing::warn!(%server, error = %e, "upstream server unavailable; its list is left out"),
            }
        }
        out
    }

    /// The connection `server` of the snapshot, started, when the caller may make a request
    /// `action` of `name` on it: a grant covers it (a tenant without policies), or the tenant's
    /// policies allow it (with the grants as permits), noted on `ask` for the audit.
    async fn granted(
        &self,
        snapshot: &Snapshot,
        item: Item<'_>,
        ctx: &McpCallContext,
        ask: &Ask,
    ) -> Result<(Arc<Connection>, Peer<rmcp::RoleClient>), ProxyError> {
        let connection = snapshot.connection(item.server).ok_or(ProxyError::NotFound)?;
        let kind = grant_kind(item.action);
        if ask.grants_only() {
            if !snapshot.allowed_kind(item.server, kind, item.name, ctx.roles()) {
                return Err(ProxyError::NotFound);
            }
        } else {
            ask.decide_item(&item, snapshot.granting(item.server, kind, item.name, ctx.roles()).as_deref())?;
        }
        match connection.ready(self.connect_timeout).await {
            Ok((peer, _)) => Ok((Arc::clone(connection), peer)),
            Err(UpstreamError::LoginNeeded { .. }) => Err(self.login_needed(connection, ctx).await),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// `prompts/get` of an exposed prompt name. `Err(ProxyError::NotFound)`: no such prompt for this caller.
    pub async fn get_prompt(
        &self,
        snapshot: &Snapshot,
        mut params: GetPromptRequestParams,
        ctx: &McpCallContext,
        ask: &Ask,
        exchange: Exchange,
    ) -> Result<ServerResult, ProxyError> {
        let (server, name) = surface::route_name(snapshot, &params.name).ok_or(ProxyError::NotFound)?;
        let name = name.to_owned();
        let item = Item { action: ItemAction::GetPrompt, server, name: &name };
        let (connection, peer) = self.granted(snapshot, item, ctx, ask).await?;
        let listed = connection.listed::<Prompt>(self.connect_timeout).await.map_err(unavailable)?;
        if !listed.iter().any(|p| p.name == name) {
            return Err(ProxyError::NotFound);
        }
        params.name = name;
        // The caller's multi round-trip state is the gateway's, never the upstream's.
        (params.request_state, params.input_responses) = (None, None);
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params));
        match self.proxied(&connection, peer, ctx, request, exchange).await? {
            answer @ (ServerResult::GetPromptResult(_) | ServerResult::InputRequiredResult(_)) => Ok(answer),
            _ => Err(ProxyError::Unavailable("the upstream answered prompts/get with something else".into())),
        }
    }

    /// Whether `server` of the snapshot (started if need be) speaks a revision without
    /// `initialize`, so a 2026-07-28 caller's multi round-trip passes through to it. A server
    /// that can't be started answers false (the request itself then reports why).
    pub async fn serves_modern(&self, snapshot: &Snapshot, server: &str) -> bool {
        let Some(connection) = snapshot.connection(server) else { return false };
        connection.ready(self.connect_timeout).await.is_ok() && connection.speaks_modern()
    }

    /// `resources/read` of an exposed URI: the contents come back under exposed URIs too.
    /// `Err(ProxyError::NotFound)`: no such resource for this caller; the upstream's own "not found"
    /// (-32002) is answered the same way, so the two can't be told apart.
    pub async fn read_resource(
        &self,
        snapshot: &Snapshot,
        mut params: ReadResourceRequestParams,
        ctx: &McpCallContext,
        ask: &Ask,
        exchange: Exchange,
    ) -> Result<ServerResult, ProxyError> {
        let exposed = params.uri.clone();
        let (server, uri) = surface::route_uri(snapshot, &exposed).ok_or(ProxyError::NotFound)?;
        let item = Item { action: ItemAction::ReadResource, server, name: uri };
        let (connection, peer) = self.granted(snapshot, item, ctx, ask).await?;
        let prefixed = snapshot.prefixed(server) != Some(false);
        params.uri = uri.to_owned();
        (params.request_state, params.input_responses) = (None, None);
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params));
        let answer = match self.proxied(&connection, peer, ctx, request, exchange).await {
            Err(ProxyError::Upstream(e)) if e.code == rmcp::model::ErrorCode::RESOURCE_NOT_FOUND => {
                return Err(ProxyError::NotFound);
            }
            other => other?,
        };
        let mut result = match answer {
            ServerResult::ReadResourceResult(result) => result,
            input @ ServerResult::InputRequiredResult(_) => return Ok(input),
            _ => {
                return Err(ProxyError::Unavailable("the upstream answered resources/read with something else".into()));
            }
        };
        for contents in &mut result.contents {
            if let ResourceContents::TextResourceContents { uri, .. }
            | ResourceContents::BlobResourceContents { uri, .. } = contents
            {
                *uri = surface::exposed_uri(server, prefixed, uri).unwrap_or_else(|| exposed.clone());
            }
        }
        Ok(ServerResult::ReadResourceResult(result))
    }

    /// `completion/complete` for a prompt's argument or a resource template's variable,
    /// asked of the server that owns it. An upstream that offers no completion completes
    /// nothing.
    pub async fn complete(
        &self,
        snapshot: &Snapshot,
        mut params: CompleteRequestParams,
        ctx: &McpCallContext,
        ask: &Ask,
        exchange: Exchange,
    ) -> Result<CompleteResult, ProxyError> {
        let (connection, peer) = match &mut params.r#ref {
            Reference::Prompt(prompt) => {
                let (server, name) = surface::route_name(snapshot, &prompt.name).ok_or(ProxyError::NotFound)?;
                let name = name.to_owned();
                let item = Item { action: ItemAction::CompletePrompt, server, name: &name };
                let granted = self.granted(snapshot, item, ctx, ask).await?;
                prompt.name = name;
                granted
            }
            Reference::Resource(resource) => {
                let (server, uri) = surface::route_uri(snapshot, &resource.uri).ok_or(ProxyError::NotFound)?;
                let uri = uri.to_owned();
                let item = Item { action: ItemAction::CompleteResource, server, name: &uri };
                let granted = self.granted(snapshot, item, ctx, ask).await?;
                resource.uri = uri;
                granted
            }
            _ => return Err(ProxyError::NotFound),
        };
        if peer.peer_info().is_none_or(|i| i.capabilities.completions.is_none()) {
            return Ok(CompleteResult::default());
        }
        let request = ClientRequest::CompleteRequest(CompleteRequest::new(params));
        match self.proxied(&connection, peer, ctx, request, exchange).await? {
            ServerResult::CompleteResult(result) => Ok(result),
            _ => Err(ProxyError::Unavailable("the upstream answered completion/complete with something else".into())),
        }
    }

    /// `resources/subscribe`: the session hears of updates of that resource, and only it.
    /// `Ok(false)`: the server takes no subscriptions.
    pub async fn subscribe(
        &self,
        snapshot: &Snapshot,
        exposed: &str,
        ctx: &McpCallContext,
        ask: &Ask,
        watch: Watch<'_>,
    ) -> Result<bool, ProxyError> {
        let (server, uri) = surface::route_uri(snapshot, exposed).ok_or(ProxyError::NotFound)?;
        let item = Item { action: ItemAction::ReadResource, server, name: uri };
        let (connection, peer) = self.granted(snapshot, item, ctx, ask).await?;
        if !Connection::offers_subscriptions(&peer) {
            return Ok(false);
        }
        connection.subscribe(&peer, uri, watch.session, &watch.notifier(), exposed).await.map_err(unavailable)?;
        Ok(true)
    }

    /// Follows, for one `subscriptions/listen` stream (`key`), the list changes of every
    /// server of the snapshot, each kind only where the caller holds a grant of it (and its
    /// filter asked for it), and the updates of the resources in the filter that the caller may
    /// read; a URI it may not read (or that does not exist) is followed by nothing, silently,
    /// so the stream never tells one from the other. Returns what [`Upstreams::unlisten`] undoes.
    pub async fn listen(
        &self,
        snapshot: &Snapshot,
        ctx: &McpCallContext,
        ask: &Ask,
        key: &str,
        sink: &SubscriptionSink,
        ended: &CancellationToken,
    ) -> Listening {
        let filter = sink.accepted().clone();
        let mut listening = Listening::default();
        for (server, connection) in &snapshot.servers {
            // A tenant with policies: any server may hold something they permit.
            let grant = |kind| !ask.grants_only() || snapshot.any_grant_kind(server, kind, ctx.roles());
            let kinds = Kinds {
                tools: filter.tools_list_changed == Some(true) && grant(GrantKind::Tool),
                prompts: filter.prompts_list_changed == Some(true) && grant(GrantKind::Prompt),
                resources: filter.resources_list_changed == Some(true) && grant(GrantKind::Resource),
            };
            if kinds != Kinds::default() {
                let to = Notifier::Listen { sink: sink.clone(), kinds, ended: ended.clone() };
                connection.catalog.watch(key, &to);
                listening.watched.push(Arc::clone(connection));
            }
        }
        let to = Notifier::Listen { sink: sink.clone(), kinds: Kinds::default(), ended: ended.clone() };
        for exposed in filter.resource_subscriptions.iter().flatten() {
            let Some((server, uri)) = surface::route_uri(snapshot, exposed) else { continue };
            let item = Item { action: ItemAction::ReadResource, server, name: uri };
            let Ok((connection, peer)) = self.granted(snapshot, item, ctx, ask).await else {
                continue;
            };
            if !Connection::offers_subscriptions(&peer) {
                continue;
            }
            match connection.subscribe(&peer, uri, key, &to, exposed).await {
                Ok(()) => listening.subscribed.push((connection, uri.to_owned())),
                Err(e) => tracing::debug!(server, error = %e, "upstream subscription for a listen stream failed"),
            }
        }
        listening
    }

    /// Undoes [`Upstreams::listen`] for the stream `key` when it ends.
    pub async fn unlisten(&self, listening: Listening, key: &str) {
        for connection in listening.watched {
            connection.catalog.unwatch(key);
        }
        for (connection, uri) in listening.subscribed {
            if let Ok((peer, _)) = connection.ready(self.connect_timeout).await {
                connection.unsubscribe(&peer, &uri, key).await;
            }
        }
    }

    /// `resources/unsubscribe`; `Err(ProxyError::NotFound)`: the session was not subscribed to it.
    pub async fn unsubscribe(&self, snapshot: &Snapshot, exposed: &str, session: &str) -> Result<(), ProxyError> {
        let (server, uri) = surface::route_uri(snapshot, exposed).ok_or(ProxyError::NotFound)?;
        let connection = snapshot.connection(server).ok_or(ProxyError::NotFound)?;
        let peer = match connection.ready(self.connect_timeout).await {
            Ok((peer, _)) => peer,
            Err(e) => return Err(unavailable(e)),
        };
        if connection.unsubscribe(&peer, uri, session).await { Ok(()) } else { Err(ProxyError::NotFound) }
    }

    /// An exchange counted like a call (in flight, last used), and checked for a credential
    /// that can no longer be used.
    async fn proxied(
        &self,
        connection: &Connection,
        peer: Peer<rmcp::RoleClient>,
        ctx: &McpCallContext,
        request: ClientRequest,
        exchange: Exchange,
    ) -> Result<ServerResult, ProxyError> {
        let _call = connection.begin_call();
        match self.exchange(connection, peer, ctx, request, exchange).await {
            Err(e) => Err(self.recheck_login(connection, ctx, e).await),
            ok => ok,
        }
    }
}
