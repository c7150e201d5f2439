//! The replicas of one database as one gateway: so that any replica serves anything, whichever
//! one a load balancer picks.
//!
//! Each replica joins with a random id and the URL the others reach it at (`replicas` table),
//! and says it is alive every heartbeat; one silent for three heartbeats is taken for gone.
//! Through it:
//!
//! - **The published key set** (`keys`): every replica's assertion-signing public keys are in
//!   the database, so `/.well-known/jwks.json` is the same on every replica, across restarts
//!   and rotations; private keys never leave their process.
//! - **Agents** (`replica_agents`): which replica holds which executor agent's tunnel. A replica
//!   without the agent opens its channels through one that has it, over an authenticated
//!   replica-to-replica link (`link` authorizes it; the executor module runs it).
//! - **Forwarding** (`forward`): a stateless request that continues something waiting in one
//!   replica's memory (a multi round-trip exchange) is sent on to that replica.
//!
//! It never decides who a caller is or what a caller may do: a forwarded request is
//! authenticated again by the replica that serves it, and a link only carries channels the
//! calling replica's own checks already allowed.

mod forward;
mod keys;
mod link;

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::auth::assertion::AssertionSigner;
use crate::config::Config;
use crate::store::{Db, StoreError, now_millis};

pub use forward::{FORWARDED_HEADER, ForwardError};
pub use link::{LinkRefused, REPLICA_HEADER};

/// Rows of replicas and keys silent for longer than this are deleted.
const PURGE_AFTER_MS: i64 = 24 * 60 * 60 * 1000;

/// This replica, as the others know it.
pub struct Cluster {
    id: String,
    internal_url: String,
    db: Db,
    heartbeat: Duration,
    /// Authorizing links, under the replicas' shared key (`shared_keys` row `replicas`).
    links: link::Links,
    /// The agents connected here, with their roots and when they connected: registered again
    /// if this replica's row was ever purged.
    held: Mutex<HashMap<String, (String, i64)>>,
    signer: Arc<AssertionSigner>,
    /// For links and forwarded requests to other replicas (no total timeout: a forwarded call
    /// may stream for as long as the call runs).
    http: reqwest::Client,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The URL other replicas reach one listening on `listen` at: its own address, or, listening on
/// every address, the first address this host's name resolves to (in a container, its own).
fn derived_url(listen: SocketAddr) -> String {
    if !listen.ip().is_unspecified() {
        return format!("http://{listen}");
    }
    let name = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let resolved = (name.as_str(), listen.port()).to_socket_addrs().ok().and_then(|mut addrs| {
        let all: Vec<SocketAddr> = addrs.by_ref().collect();
        all.iter().find(|a| !a.ip().is_loopback()).or(all.first()).copied()
    });
    match resolved {
        Some(addr) => format!("http://{addr}"),
        None => format!("http://{name}:{}", listen.port()),
    }
}

impl Cluster {
    /// Joins the database's replicas: registers this one and publishes its signing key, before
    /// it serves anything (so every other replica's JWKS lists the key before the first
    /// assertion signed with it).
    pub async fn join(config: &Config, db: &Db, signer: Arc<AssertionSigner>) -> Result<Arc<Self>, StoreError> {
        let internal_url = match config.cluster.internal_url.trim() {
            "" => derived_url(config.server.listen),
            url => url.trim_end_matches('/').to_owned(),
        };
        let secret = db.shared_key("replicas").await?;
        crate::tls::install_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| StoreError::Invalid { field: "cluster", message: format!("an HTTP client: {e}") })?;
        let id = uuid::Uuid::new_v4().to_string();
        let cluster = Arc::new(Self {
            links: link::Links::new(&id, &secret),
            id,
            internal_url,
            db: db.clone(),
            heartbeat: Duration::from_millis(config.cluster.heartbeat_ms),
            held: Mutex::default(),
            signer,
            http,
        });
        db.register_replica(&cluster.id, &cluster.internal_url, now_millis()).await?;
        cluster.publish_current_key().await?;
        tracing::info!(replica = %cluster.id, internal_url = %cluster.internal_url, "joined the replicas");
        Ok(cluster)
    }

    /// This replica's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The base URL other replicas reach this one at.
    pub fn internal_url(&self) -> &str {
        &self.internal_url
    }

    /// How often this replica says it is alive.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// The HTTP client for links and forwarded requests to other replicas.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The earliest heartbeat of a replica still taken for alive.
    fn alive_since(&self) -> i64 {
        now_millis() - 3 * i64::try_from(self.heartbeat.as_millis()).unwrap_or(i64::MAX / 4)
    }

    /// The authorization for asking replica `to` for `purpose` over a link (see `link`).
    pub fn authorize(&self, to: &str, purpose: &str) -> String {
        self.links.authorize(to, purpose)
    }

    /// Checks a link authorization presented to this replica for `purpose`; the asking
    /// replica's id when it holds.
    pub fn check_link(&self, presented: &str, purpose: &str) -> Result<String, LinkRefused> {
        self.links.check(presented, purpose)
    }

    /// The URL of replica `id`, when it is another replica and alive.
    pub async fn peer_url(&self, id: &str) -> Option<String> {
        if id == self.id {
            return None;
        }
        match self.db.live_replica_url(id, self.alive_since()).await {
            Ok(url) => url,
            Err(e) => {
                tracing::warn!(error = %e, replica = %id, "looking up a replica failed");
                None
            }
        }
    }

    /// The other live replicas holding `executor`'s agent (URL and the root it reported), the
    /// most recently connected first.
    pub async fn agent_holders(&self, executor: &str) -> Vec<crate::store::cluster::AgentHolder> {
        match self.db.agent_holders(executor, self.alive_since()).await {
            Ok(holders) => holders.into_iter().filter(|h| h.replica_id != self.id).collect(),
            Err(e) => {
                tracing::warn!(error = %e, executor, "looking up an executor's replica failed");
                Vec::new()
            }
        }
    }

    /// Which agents the other live replicas hold now (executor and replica, in order); `None`
    /// when the database can't say.
    pub async fn agents_elsewhere(&self) -> Option<Vec<(String, String)>> {
        match self.db.agents_held_since(self.alive_since()).await {
            Ok(all) => Some(all.into_iter().filter(|(_, replica)| *replica != self.id).collect()),
            Err(e) => {
                tracing::warn!(error = %e, "reading the other replicas' agents failed");
                None
            }
        }
    }

    /// `executor`'s agent connected here with `root`: the other replicas may reach it through
    /// this one from now on. Returns when it connected (what [`Self::agent_left`] takes).
    pub async fn agent_arrived(&self, executor: &str, root: &str) -> i64 {
        let now = now_millis();
        lock(&self.held).insert(executor.to_owned(), (root.to_owned(), now));
        if let Err(e) = self.db.agent_held(executor, &self.id, root, now).await {
            tracing::warn!(error = %e, executor, "registering an agent for the other replicas failed");
        }
        now
    }

    /// `executor`'s agent (connected at `since`) left this replica.
    pub async fn agent_left(&self, executor: &str, since: i64) {
        {
            let mut held = lock(&self.held);
            if held.get(executor).is_some_and(|(_, at)| *at <= since) {
                held.remove(executor);
            }
        }
        if let Err(e) = self.db.agent_released(executor, &self.id, since).await {
            tracing::warn!(error = %e, executor, "unregistering an agent failed; it lapses with this replica");
        }
    }

    /// One heartbeat: alive now, the signing key published ahead, and (re-registered when this
    /// replica's row was purged after a long silence) its agents listed again.
    async fn beat(&self) -> Result<(), StoreError> {
        let now = now_millis();
        if !self.db.replica_seen(&self.id, now).await? {
            tracing::warn!(replica = %self.id, "this replica's row was gone; registering again");
            self.db.register_replica(&self.id, &self.internal_url, now).await?;
            let held: Vec<_> = lock(&self.held).iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            for (executor, (root, at)) in held {
                self.db.agent_held(&executor, &self.id, &root, at).await?;
            }
        }
        self.publish_current_key().await
    }

    /// Heartbeats until `stop`, and a key rotation every `rotate_every` (see [`Self::leave`]
    /// for the end).
    pub fn spawn(self: &Arc<Self>, rotate_every: Duration, stop: tokio_util::sync::CancellationToken) {
        let cluster = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(cluster.heartbeat);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut rotate = tokio::time::interval_at(tokio::time::Instant::now() + rotate_every, rotate_every);
            let mut purge = tokio::time::interval(Duration::from_secs(60));
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = tick.tick() => {
                        if let Err(e) = cluster.beat().await {
                            tracing::warn!(error = %e, "replica heartbeat failed; trying again");
                        }
                    }
                    _ = rotate.tick() => {
                        if let Err(e) = cluster.rotate_key().await {
                            tracing::error!(error = %e, "assertion key rotation failed; keeping the current key");
                        }
                    }
                    _ = purge.tick() => cluster.purge().await,
                }
            }
        });
    }

    /// This replica stops: its row and its agents' rows go, so no other replica looks for
    /// anything here any more. Its keys stay published until their assertions have expired.
    pub async fn leave(&self) {
        if let Err(e) = self.db.replica_gone(&self.id).await {
            tracing::warn!(error = %e, "leaving the replicas failed; this replica lapses by itself");
        }
    }

    async fn purge(&self) {
        let before = now_millis() - PURGE_AFTER_MS;
        if let Err(e) = self.db.purge_replicas(before).await {
            tracing::warn!(error = %e, "deleting long-gone replicas failed");
        }
        if let Err(e) = self.db.purge_signing_keys(before).await {
            tracing::warn!(error = %e, "deleting long-unpublished keys failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_specific_listen_address_is_its_own_internal_url() {
        assert_eq!(derived_url("127.0.0.1:8080".parse().unwrap()), "http://127.0.0.1:8080");
        assert_eq!(derived_url("[::1]:9000".parse().unwrap()), "http://[::1]:9000");
        let every = derived_url("0.0.0.0:8080".parse().unwrap());
        assert!(every.starts_with("http://") && every.ends_with(":8080"), "{every}");
        assert!(!every.contains("0.0.0.0"), "{every}");
    }
}
