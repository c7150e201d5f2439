//! What a connection knows of its upstream besides the call path: its lists (tools, prompts,
//! resources, resource templates), fetched on first use and again after the upstream says one
//! changed; the sessions and `subscriptions/listen` streams to tell when one does; and which of
//! them subscribed to which of its resources. Shared by the connection and its client handler;
//! holds no caller's identity (a listen stream is held with the kinds its caller may hear of).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use rmcp::RoleServer;
use rmcp::model::{
    Prompt, PromptListChangedNotification, Resource, ResourceListChangedNotification, ResourceTemplate,
    ResourceUpdatedNotification, ResourceUpdatedNotificationParam, ServerCapabilities, ServerNotification, Tool,
    ToolListChangedNotification,
};
use rmcp::service::{Peer, RoleClient, ServiceError, SubscriptionSink};
use tokio_util::sync::CancellationToken;

use crate::store::entities::GrantKind;
use crate::vocab::names::NAME_SEPARATOR;

/// One of the upstream's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    Tools,
    Prompts,
    Resources,
    Templates,
}

/// One of an upstream's lists: where the catalog keeps it, whether the upstream offers it,
/// how it is fetched, and which grants cover its items.
pub(crate) trait Listed: Clone + Send + Sync + 'static {
    /// The list's name in errors.
    const WHAT: &'static str;
    /// The kind of grant that covers its items.
    const GRANT: GrantKind;
    fn slot(state: &mut State) -> &mut Slot<Self>;
    fn offered(caps: &ServerCapabilities) -> bool;
    fn fetch(peer: &Peer<RoleClient>) -> impl Future<Output = Result<Vec<Self>, ServiceError>> + Send;
    /// The items the gateway can serve (names it can't, or repeated ones, are left out).
    fn usable(_server: &str, list: Vec<Self>) -> Vec<Self> {
        list
    }
}

impl Listed for Tool {
    const WHAT: &'static str = "tools";
    const GRANT: GrantKind = GrantKind::Tool;
    fn slot(state: &mut State) -> &mut Slot<Self> {
        &mut state.tools
    }
    fn offered(_: &ServerCapabilities) -> bool {
        true
    }
    fn fetch(peer: &Peer<RoleClient>) -> impl Future<Output = Result<Vec<Self>, ServiceError>> + Send {
        peer.list_all_tools()
    }
    fn usable(server: &str, list: Vec<Self>) -> Vec<Self> {
        usable_tools(server, list)
    }
}

impl Listed for Prompt {
    const WHAT: &'static str = "prompts";
    const GRANT: GrantKind = GrantKind::Prompt;
    fn slot(state: &mut State) -> &mut Slot<Self> {
        &mut state.prompts
    }
    fn offered(caps: &ServerCapabilities) -> bool {
        caps.prompts.is_some()
    }
    fn fetch(peer: &Peer<RoleClient>) -> impl Future<Output = Result<Vec<Self>, ServiceError>> + Send {
        peer.list_all_prompts()
    }
    fn usable(server: &str, list: Vec<Self>) -> Vec<Self> {
        usable_prompts(server, list)
    }
}

impl Listed for Resource {
    const WHAT: &'static str = "resources";
    const GRANT: GrantKind = GrantKind::Resource;
    fn slot(state: &mut State) -> &mut Slot<Self> {
        &mut state.resources
    }
    fn offered(caps: &ServerCapabilities) -> bool {
        caps.resources.is_some()
    }
    fn fetch(peer: &Peer<RoleClient>) -> impl Future<Output = Result<Vec<Self>, ServiceError>> + Send {
        peer.list_all_resources()
    }
}

impl Listed for ResourceTemplate {
    const WHAT: &'static str = "resource templates";
    const GRANT: GrantKind = GrantKind::Resource;
    fn slot(state: &mut State) -> &mut Slot<Self> {
        &mut state.templates
    }
    fn offered(caps: &ServerCapabilities) -> bool {
        caps.resources.is_some()
    }
    fn fetch(peer: &Peer<RoleClient>) -> impl Future<Output = Result<Vec<Self>, ServiceError>> + Send {
        peer.list_all_resource_templates()
    }
}

/// A cached list and how many times it was invalidated: a list fetched while it was
/// invalidated again is not kept (it may be older than the change).
pub(crate) struct Slot<T> {
    list: Option<Arc<Vec<T>>>,
    generation: u64,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self { list: None, generation: 0 }
    }
}

impl<T> Slot<T> {
    fn invalidate(&mut self) {
        self.list = None;
        self.generation += 1;
    }

    fn store(&mut self, generation: u64, list: Arc<Vec<T>>) {
        if self.generation == generation {
            self.list = Some(list);
        }
    }
}

/// Where a caller hears of changes: its session (protocol revisions with `initialize`), or one
/// of its `subscriptions/listen` streams (2026-07-28), which carries only what its filter
/// accepted and, of the lists, only the kinds the caller holds a grant for.
#[derive(Clone)]
pub enum Notifier {
    Session(Peer<RoleServer>),
    Listen {
        sink: SubscriptionSink,
        /// The lists this caller may hear of on this connection.
        kinds: Kinds,
        /// Cancelled when the stream ends.
        ended: CancellationToken,
    },
}

/// A set of [`ListKind`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
}

impl Kinds {
    fn has(self, kind: ListKind) -> bool {
        match kind {
            ListKind::Tools => self.tools,
            ListKind::Prompts => self.prompts,
            ListKind::Resources | ListKind::Templates => self.resources,
        }
    }
}

impl Notifier {
    fn is_closed(&self) -> bool {
        match self {
            Self::Session(peer) => peer.is_transport_closed(),
            Self::Listen { ended, .. } => ended.is_cancelled(),
        }
    }

    /// Tells the caller that a list changed (a listen stream: only of a kind it may see and
    /// its filter accepted).
    pub async fn list_changed(&self, kind: ListKind) {
        if let Self::Listen { kinds, .. } = self
            && !kinds.has(kind)
        {
            return;
        }
        let notification = match kind {
            ListKind::Tools => ServerNotification::ToolListChangedNotification(ToolListChangedNotification::default()),
            ListKind::Prompts => {
                ServerNotification::PromptListChangedNotification(PromptListChangedNotification::default())
            }
            ListKind::Resources | ListKind::Templates => {
                ServerNotification::ResourceListChangedNotification(ResourceListChangedNotification::default())
            }
        };
        self.send(notification, "list change").await;
    }

    /// Tells the caller that a resource it subscribed to changed.
    pub async fn resource_updated(&self, update: ResourceUpdatedNotificationParam) {
        let notification = ServerNotification::ResourceUpdatedNotification(ResourceUpdatedNotification::new(update));
        self.send(notification, "resource update").await;
    }

    async fn send(&self, notification: ServerNotification, what: &str) {
        let delivered = match self {
            Self::Session(peer) => peer.send_notification(notification).await.map_err(|e| e.to_string()),
            // The sink checks its filter and tags the subscription id.
            Self::Listen { sink, .. } => sink.send(notification).await.map_err(|e| e.to_string()),
        };
        if let Err(e) = delivered {
            tracing::debug!(error = %e, "{what} not delivered");
        }
    }
}

/// A caller that subscribed to a resource: where its updates go, under the URI it knows.
struct Subscriber {
    to: Notifier,
    exposed: String,
}

#[derive(Default)]
pub(crate) struct State {
    tools: Slot<Tool>,
    prompts: Slot<Prompt>,
    resources: Slot<Resource>,
    templates: Slot<ResourceTemplate>,
    /// Sessions that listed through this connection (by session id) and listen streams (by
    /// their own key): told when a list changes.
    watchers: HashMap<String, Notifier>,
    /// Upstream URI -> subscribed sessions, by session id.
    subscriptions: BTreeMap<String, HashMap<String, Subscriber>>,
}

/// See the module documentation.
#[derive(Default)]
pub struct Catalog {
    state: Mutex<State>,
}

/// What a subscription change requires of the upstream.
#[derive(Debug, PartialEq, Eq)]
pub enum UpstreamSubscription {
    /// The first session subscribed: subscribe upstream.
    Subscribe,
    /// The last session left: unsubscribe upstream.
    Unsubscribe,
    /// Nothing to tell the upstream.
    Unchanged,
}

impl Catalog {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached list of `T`, if it is current.
    pub(crate) fn cached<T: Listed>(&self) -> Option<Arc<Vec<T>>> {
        T::slot(&mut self.lock()).list.clone()
    }

    /// Where the list of `T` stands: a fetch started now is stored only if it still is.
    pub(crate) fn generation<T: Listed>(&self) -> u64 {
        T::slot(&mut self.lock()).generation
    }

    pub(crate) fn store<T: Listed>(&self, generation: u64, list: Arc<Vec<T>>) {
        T::slot(&mut self.lock()).store(generation, list);
    }

    /// Forgets `kind`'s list: the next use fetches it again.
    pub fn invalidate(&self, kind: ListKind) {
        let mut state = self.lock();
        match kind {
            ListKind::Tools => state.tools.invalidate(),
            ListKind::Prompts => state.prompts.invalidate(),
            ListKind::Resources => state.resources.invalidate(),
            ListKind::Templates => state.templates.invalidate(),
        }
    }

    /// Forgets every list (a new upstream process may offer others).
    pub fn invalidate_all(&self) {
        for kind in [ListKind::Tools, ListKind::Prompts, ListKind::Resources, ListKind::Templates] {
            self.invalidate(kind);
        }
    }

    /// Tells `key` (a session, or a listen stream) when a list of this connection changes.
    pub fn watch(&self, key: &str, to: &Notifier) {
        let mut state = self.lock();
        if !state.watchers.contains_key(key) {
            state.watchers.insert(key.to_owned(), to.clone());
        }
    }

    /// Forgets `key` as a watcher (a listen stream that ended).
    pub fn unwatch(&self, key: &str) {
        self.lock().watchers.remove(key);
    }

    /// Whom to tell of a changed list (those whose transport closed are forgotten).
    pub fn watchers(&self) -> Vec<Notifier> {
        let mut state = self.lock();
        state.watchers.retain(|_, to| !to.is_closed());
        state.watchers.values().cloned().collect()
    }

    /// Records `key`'s subscription to upstream `uri` (known to it as `exposed`).
    pub fn subscribe(&self, uri: &str, key: &str, to: &Notifier, exposed: &str) -> UpstreamSubscription {
        let mut state = self.lock();
        let subscribers = state.subscriptions.entry(uri.to_owned()).or_default();
        let first = subscribers.is_empty();
        subscribers.insert(key.to_owned(), Subscriber { to: to.clone(), exposed: exposed.to_owned() });
        if first { UpstreamSubscription::Subscribe } else { UpstreamSubscription::Unchanged }
    }

    /// Drops `session`'s subscription to upstream `uri`; `None`: it had none.
    pub fn unsubscribe(&self, uri: &str, session: &str) -> Option<UpstreamSubscription> {
        let mut state = self.lock();
        let subscribers = state.subscriptions.get_mut(uri)?;
        subscribers.remove(session)?;
        if subscribers.is_empty() {
            state.subscriptions.remove(uri);
            return Some(UpstreamSubscription::Unsubscribe);
        }
        Some(UpstreamSubscription::Unchanged)
    }

    /// Every upstream URI some session is subscribed to (to subscribe again after a restart).
    pub fn subscribed(&self) -> Vec<String> {
        self.lock().subscriptions.keys().cloned().collect()
    }

    /// Where an update of upstream `uri` goes: each subscribed session, with the URI it knows.
    pub fn updated(&self, uri: &str) -> Vec<(Notifier, ResourceUpdatedNotificationParam)> {
        let state = self.lock();
        let Some(subscribers) = state.subscriptions.get(uri) else { return Vec::new() };
        subscribers.values().map(|s| (s.to.clone(), ResourceUpdatedNotificationParam::new(s.exposed.clone()))).collect()
    }

    /// Forgets the watchers and subscriptions of sessions `live` says are gone; returns the
    /// upstream URIs no session is subscribed to any more.
    pub fn retain_sessions(&self, live: impl Fn(&str) -> bool) -> Vec<String> {
        let mut state = self.lock();
        state.watchers.retain(|key, to| !to.is_closed() && (matches!(to, Notifier::Listen { .. }) || live(key)));
        let mut dropped = Vec::new();
        state.subscriptions.retain(|uri, subscribers| {
            subscribers.retain(|key, s| !s.to.is_closed() && (matches!(s.to, Notifier::Listen { .. }) || live(key)));
            if subscribers.is_empty() {
                dropped.push(uri.clone());
            }
            !subscribers.is_empty()
        });
        dropped
    }
}

/// Prompt names the gateway can serve: the same rule as tools.
pub(crate) fn usable_prompts(server: &str, prompts: Vec<Prompt>) -> Vec<Prompt> {
    let mut seen = std::collections::HashSet::new();
    prompts
        .into_iter()
        .filter(|p| {
            let ok = usable_name(server, &p.name) && seen.insert(p.name.clone());
            if !ok {
                tracing::warn!(%server, prompt = %p.name, "upstream prompt name unusable or repeated; not served");
            }
            ok
        })
        .collect()
}

fn usable_name(server: &str, name: &str) -> bool {
    !name.is_empty()
        && server.len() + NAME_SEPARATOR.len() + name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Tool names the gateway can serve as `server__tool`: MCP's tool-name characters, within
/// 128 characters once prefixed, each name once (the first wins).
pub(crate) fn usable_tools(server: &str, tools: Vec<Tool>) -> Vec<Tool> {
    let mut seen = std::collections::HashSet::new();
    tools
        .into_iter()
        .filter(|tool| {
            let name = tool.name.as_ref();
            if !usable_name(server, name) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_fetched_across_an_invalidation_is_not_kept() {
        let catalog = Catalog::default();
        let generation = catalog.generation::<Prompt>();
        catalog.invalidate(ListKind::Prompts);
        catalog.store::<Prompt>(generation, Arc::new(Vec::new()));
        assert!(catalog.cached::<Prompt>().is_none(), "stale: fetched before the change");
        let generation = catalog.generation::<Prompt>();
        catalog.store::<Prompt>(generation, Arc::new(Vec::new()));
        assert!(catalog.cached::<Prompt>().is_some());
        catalog.invalidate_all();
        assert!(catalog.cached::<Prompt>().is_none());
    }

    fn tool(name: &str) -> Tool {
        Tool::new(name.to_owned(), "t", Arc::new(rmcp::model::JsonObject::new()))
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
}
