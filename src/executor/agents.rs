//! The agents connected to this gateway replica, by executor name: which one is connected, with
//! which root and secret, and the rule for a second agent presenting a name already connected
//! (the first keeps it; the second is refused until the first is gone). Never authenticates an
//! agent (the connect route does) and never opens a server (the host handler does); reading a
//! file through a connected agent is in `file`.
//!
//! With replicas (a [`Cluster`]), an agent connected here is registered for the others, and an
//! agent connected to another replica is reached through it ([`Agents::reach`], over a link:
//! see `link`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cluster::Cluster;
use crate::decl::PathUri;
use crate::store::entities::Executor as ExecutorRow;
use crate::telemetry::metrics;
use crate::tunnel::{Channel, Settings, TunnelError, TunnelHandle};

/// How long a name stays reserved for an agent whose upgrade has not completed.
const UPGRADE_GRACE: Duration = Duration::from_secs(10);

/// A connected agent, as the host handler uses it: its own tunnel, or a link to the replica
/// that holds it (channels are opened on either alike).
#[derive(Clone)]
pub struct AgentLink {
    /// The agent's own root: every path of a server opened there stays inside it.
    pub root: PathUri,
    tunnel: TunnelHandle,
    /// The replica it is reached through (`None`: connected here).
    pub via: Option<String>,
}

impl AgentLink {
    /// Opens a channel on the agent (see [`TunnelHandle::open`]), counted by route.
    pub async fn open(&self, open: &crate::tunnel::Open, timeout: Duration) -> Result<Channel, TunnelError> {
        let channel = self.tunnel.open(open, timeout).await?;
        self.counted();
        Ok(channel)
    }

    /// Counts a channel opened on this link (`scopegate_executor_channels_total{route}`).
    pub(super) fn counted(&self) {
        metrics::executor_channel(if self.via.is_some() { "relayed" } else { "local" });
    }

    /// Channels open now on the tunnel (or link) this reaches the agent by.
    pub fn channels_open(&self) -> usize {
        self.tunnel.channels_open()
    }

    /// The agent's tunnel itself (connected here) or the link to its replica.
    pub(super) fn tunnel(&self) -> &TunnelHandle {
        &self.tunnel
    }
}

enum State {
    Upgrading(Instant),
    Live(TunnelHandle),
}

struct Slot {
    serial: u64,
    root: PathUri,
    secret_hash: String,
    state: State,
}

impl Slot {
    /// Whether this slot still holds its name against a newcomer.
    fn holds(&self) -> bool {
        match &self.state {
            State::Upgrading(since) => since.elapsed() < UPGRADE_GRACE,
            State::Live(tunnel) => !tunnel.is_closed(),
        }
    }
}

/// Why an agent can't take its name now.
#[derive(Debug, thiserror::Error)]
#[error("executor `{0}` is already connected to this gateway; the first agent keeps it")]
pub struct AlreadyConnected(pub String);

/// The connected agents of this replica.
pub struct Agents {
    slots: Mutex<HashMap<String, Slot>>,
    /// The root each executor's agent last reported, kept across disconnects: a server is
    /// placed under it when a snapshot is resolved, and checked against the live root when
    /// it is opened.
    roots: Mutex<HashMap<String, PathUri>>,
    serial: AtomicU64,
    /// Bumped whenever an agent connects or disconnects: what follows readiness watches it.
    changes: tokio::sync::watch::Sender<u64>,
    /// The other replicas, when there may be any, and the tunnel settings of links to them.
    cluster: Option<(Arc<Cluster>, Settings)>,
    /// Links to agents connected to other replicas, by executor name.
    relayed: Mutex<HashMap<String, AgentLink>>,
    /// How many times each executor's agent connected to this replica, and when it last did.
    connects: Mutex<HashMap<String, (u64, i64)>>,
}

/// An executor agent as this replica knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentStatus {
    /// Connected to this replica now.
    pub connected: bool,
    /// When it last connected here (Unix milliseconds).
    pub connected_at: i64,
    /// How many times it connected here since this replica started (1: never reconnected).
    pub connects: u64,
    /// When this replica last heard from it (any message, heartbeats included).
    pub last_heard_ms: Option<i64>,
}

impl Default for Agents {
    fn default() -> Self {
        Self {
            slots: Mutex::default(),
            roots: Mutex::default(),
            serial: AtomicU64::new(0),
            changes: tokio::sync::watch::Sender::new(0),
            cluster: None,
            relayed: Mutex::default(),
            connects: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Agents {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The agents of a replica among others: those connected here are registered for the
    /// others, and those connected elsewhere are reached through links with `settings`.
    /// Every heartbeat it reads which agents the other replicas hold, and a change there is a
    /// change here too (see [`Agents::changes`]): what follows readiness hears of an agent that
    /// connected to, or left, another replica. Call it inside a Tokio runtime; the watch ends
    /// with the registry.
    pub fn clustered(cluster: Arc<Cluster>, settings: Settings) -> Arc<Self> {
        let agents = Arc::new(Self { cluster: Some((Arc::clone(&cluster), settings)), ..Self::default() });
        let weak = Arc::downgrade(&agents);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(cluster.heartbeat());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut seen = None;
            loop {
                tick.tick().await;
                if weak.strong_count() == 0 {
                    return;
                }
                let Some(now) = cluster.agents_elsewhere().await else { continue };
                if seen.as_ref().is_some_and(|before| *before != now)
                    && let Some(agents) = weak.upgrade()
                {
                    agents.changed();
                }
                seen = Some(now);
            }
        });
        agents
    }

    /// Executor `name`'s agent wherever it is connected: here, or through the replica that
    /// holds it (a link kept for the next call, dropped when that replica drops the agent).
    pub async fn reach(&self, name: &str) -> Option<AgentLink> {
        if let Some(link) = self.link(name) {
            return Some(link);
        }
        let (cluster, settings) = self.cluster.as_ref()?;
        let cached = lock(&self.relayed).get(name).filter(|l| !l.tunnel.is_closed()).cloned();
        if cached.is_some() {
            return cached;
        }
        for holder in cluster.agent_holders(name).await {
            let Some(root) = PathUri::parse_reported(&holder.root) else {
                tracing::warn!(executor = name, root = %holder.root, "a replica registered an unreadable root");
                continue;
            };
            match super::link::dial(cluster, &holder, name, settings).await {
                Ok(tunnel) => {
                    tracing::info!(executor = name, via = %holder.replica_id, "reaching an agent through another replica");
                    let link = AgentLink { root, tunnel, via: Some(holder.replica_id) };
                    lock(&self.relayed).insert(name.to_owned(), link.clone());
                    return Some(link);
                }
                Err(e) => {
                    tracing::warn!(executor = name, via = %holder.replica_id, error = %e, "a link to another replica failed")
                }
            }
        }
        None
    }

    /// The root executor `name`'s agent reports: as last reported here, or, never connected
    /// here, as reported to a replica that holds it now.
    pub async fn root_of(&self, name: &str) -> Option<PathUri> {
        if let Some(root) = self.root(name) {
            return Some(root);
        }
        let (cluster, _) = self.cluster.as_ref()?;
        cluster.agent_holders(name).await.iter().find_map(|h| PathUri::parse_reported(&h.root))
    }

    /// Reserves `executor`'s name for an agent that has authenticated and is upgrading. The
    /// first agent keeps a name while it is connected: a second one is refused (and, as agents
    /// retry, takes over once the first is gone), so two agents never flap over one name.
    pub fn reserve(
        self: &Arc<Self>,
        executor: ExecutorRow,
        root: PathUri,
        secret_hash: String,
    ) -> Result<Reservation, AlreadyConnected> {
        let mut slots = lock(&self.slots);
        if slots.get(&executor.name).is_some_and(Slot::holds) {
            return Err(AlreadyConnected(executor.name));
        }
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let name = executor.name.clone();
        slots.insert(name.clone(), Slot { serial, root, secret_hash, state: State::Upgrading(Instant::now()) });
        Ok(Reservation { agents: Arc::clone(self), name, serial, live: false })
    }

    /// The connected agent of executor `name`, if there is one.
    pub fn link(&self, name: &str) -> Option<AgentLink> {
        let slots = lock(&self.slots);
        let slot = slots.get(name)?;
        match &slot.state {
            State::Live(tunnel) if !tunnel.is_closed() => {
                Some(AgentLink { root: slot.root.clone(), tunnel: tunnel.clone(), via: None })
            }
            _ => None,
        }
    }

    /// The root executor `name`'s agent last reported to this replica.
    pub fn root(&self, name: &str) -> Option<PathUri> {
        lock(&self.roots).get(name).cloned()
    }

    /// A receiver that sees every connect and disconnect of an agent (as a changed counter).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Agents connected now.
    /// What this replica knows of `name`'s agent: `None` if it never connected here.
    pub fn status(&self, name: &str) -> Option<AgentStatus> {
        let (connects, connected_at) = *lock(&self.connects).get(name)?;
        let live = lock(&self.slots).get(name).and_then(|slot| match &slot.state {
            State::Live(tunnel) if !tunnel.is_closed() => Some(tunnel.last_heard_ms()),
            _ => None,
        });
        Some(AgentStatus { connected: live.is_some(), connected_at, connects, last_heard_ms: live })
    }

    pub fn connected(&self) -> usize {
        lock(&self.slots).values().filter(|s| matches!(&s.state, State::Live(t) if !t.is_closed())).count()
    }

    /// Drops every agent whose executor is gone or whose secret is no longer the one it
    /// authenticated with (`secrets`: name -> secret hash of every remote executor).
    pub fn recheck(&self, secrets: &HashMap<String, String>) {
        let slots = lock(&self.slots);
        for (name, slot) in slots.iter() {
            let reason = match secrets.get(name) {
                None => "deleted",
                Some(hash) if *hash != slot.secret_hash => "secret_rotated",
                Some(_) => continue,
            };
            if let State::Live(tunnel) = &slot.state
                && !tunnel.is_closed()
            {
                tracing::warn!(executor = %name, reason, "dropping a connected executor agent");
                metrics::executor_dropped(reason);
                tunnel.close(match reason {
                    "deleted" => "the executor was deleted",
                    _ => "the executor's secret was rotated",
                });
            }
        }
    }

    /// Ends every agent's tunnel (shutdown): agents reconnect, to this replica when it is back.
    pub fn close_all(&self, reason: &str) {
        for slot in lock(&self.slots).values() {
            if let State::Live(tunnel) = &slot.state {
                tunnel.close(reason);
            }
        }
    }
}

/// A name reserved for an upgrading agent; released when dropped unless made live, and then
/// released when the tunnel ends (see [`Reservation::live`]).
pub struct Reservation {
    agents: Arc<Agents>,
    name: String,
    serial: u64,
    live: bool,
}

impl Reservation {
    /// The agent's tunnel is up: the name is its own until the tunnel ends. Returns when it
    /// has ended.
    pub async fn live(mut self, tunnel: TunnelHandle) -> String {
        let root = {
            let mut slots = lock(&self.agents.slots);
            let Some(slot) = slots.get_mut(&self.name).filter(|s| s.serial == self.serial) else {
                tunnel.close("superseded");
                return "superseded".to_owned();
            };
            // Counted before the agent is seen connected: whoever sees it sees this connect.
            let mut connects = lock(&self.agents.connects);
            let entry = connects.entry(self.name.clone()).or_insert((0, 0));
            *entry = (entry.0 + 1, crate::store::now_millis());
            drop(connects);
            slot.state = State::Live(tunnel.clone());
            slot.root.clone()
        };
        self.live = true;
        let reported = root.to_string();
        let returning = lock(&self.agents.roots).insert(self.name.clone(), root).is_some();
        metrics::executor_connected(returning);
        tracing::info!(executor = %self.name, returning, "executor agent connected");
        self.agents.changed();
        let cluster = self.agents.cluster.as_ref().map(|(c, _)| Arc::clone(c));
        let since = match &cluster {
            Some(cluster) => Some(cluster.agent_arrived(&self.name, &reported).await),
            None => None,
        };
        let why = tunnel.closed().await;
        tracing::info!(executor = %self.name, reason = %why, "executor agent disconnected");
        if let (Some(cluster), Some(since)) = (cluster, since) {
            cluster.agent_left(&self.name, since).await;
        }
        why
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.live {
            metrics::executor_disconnected();
        }
        let mut slots = lock(&self.agents.slots);
        if slots.get(&self.name).is_some_and(|s| s.serial == self.serial) {
            slots.remove(&self.name);
        }
        drop(slots);
        if self.live {
            self.agents.changed();
        }
    }
}
