//! What a connection knows of its upstream besides the call path: its lists (tools, prompts,
//! resources, resource templates), fetched on first use and again after the upstream says one
//! changed; the sessions to tell when one does; and which sessions subscribed to which of its
//! resources. Shared by the connection and its client handler; holds no caller.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use rmcp::RoleServer;
use rmcp::model::{Prompt, Resource, ResourceTemplate, ResourceUpdatedNotificationParam, ServerCapabilities, Tool};
use rmcp::service::{Peer, RoleClient, ServiceError};

use crate::store::entities::GrantKind;

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
pub(super) trait Listed: Clone + Send + Sync + 'static {
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
        super::connection::usable_tools(server, list)
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
        super::connection::usable_prompts(server, list)
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
pub(super) struct Slot<T> {
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

/// A session that subscribed to a resource: where its updates go, under the URI it knows.
struct Subscriber {
    peer: Peer<RoleServer>,
    exposed: String,
}

#[derive(Default)]
pub(super) struct State {
    tools: Slot<Tool>,
    prompts: Slot<Prompt>,
    resources: Slot<Resource>,
    templates: Slot<ResourceTemplate>,
    /// Sessions that listed through this connection, by session id: told when a list changes.
    watchers: HashMap<String, Peer<RoleServer>>,
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
    pub(super) fn cached<T: Listed>(&self) -> Option<Arc<Vec<T>>> {
        T::slot(&mut self.lock()).list.clone()
    }

    /// Where the list of `T` stands: a fetch started now is stored only if it still is.
    pub(super) fn generation<T: Listed>(&self) -> u64 {
        T::slot(&mut self.lock()).generation
    }

    pub(super) fn store<T: Listed>(&self, generation: u64, list: Arc<Vec<T>>) {
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

    /// Tells `session` when a list of this connection changes.
    pub fn watch(&self, session: &str, peer: &Peer<RoleServer>) {
        let mut state = self.lock();
        if !state.watchers.contains_key(session) {
            state.watchers.insert(session.to_owned(), peer.clone());
        }
    }

    /// The sessions to tell of a changed list (those whose transport closed are forgotten).
    pub fn watchers(&self) -> Vec<Peer<RoleServer>> {
        let mut state = self.lock();
        state.watchers.retain(|_, peer| !peer.is_transport_closed());
        state.watchers.values().cloned().collect()
    }

    /// Records `session`'s subscription to upstream `uri` (known to it as `exposed`).
    pub fn subscribe(&self, uri: &str, session: &str, peer: &Peer<RoleServer>, exposed: &str) -> UpstreamSubscription {
        let mut state = self.lock();
        let subscribers = state.subscriptions.entry(uri.to_owned()).or_default();
        let first = subscribers.is_empty();
        subscribers.insert(session.to_owned(), Subscriber { peer: peer.clone(), exposed: exposed.to_owned() });
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
    pub fn updated(&self, uri: &str) -> Vec<(Peer<RoleServer>, ResourceUpdatedNotificationParam)> {
        let state = self.lock();
        let Some(subscribers) = state.subscriptions.get(uri) else { return Vec::new() };
        subscribers
            .values()
            .map(|s| (s.peer.clone(), ResourceUpdatedNotificationParam::new(s.exposed.clone())))
            .collect()
    }

    /// Forgets the watchers and subscriptions of sessions `live` says are gone; returns the
    /// upstream URIs no session is subscribed to any more.
    pub fn retain_sessions(&self, live: impl Fn(&str) -> bool) -> Vec<String> {
        let mut state = self.lock();
        state.watchers.retain(|session, peer| live(session) && !peer.is_transport_closed());
        let mut dropped = Vec::new();
        state.subscriptions.retain(|uri, subscribers| {
            subscribers.retain(|session, s| live(session) && !s.peer.is_transport_closed());
            if subscribers.is_empty() {
                dropped.push(uri.clone());
            }
            !subscribers.is_empty()
        });
        dropped
    }
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
}
