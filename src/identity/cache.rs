//! A cache of identity rows (tenant, user, roles, assignments) keyed by tenant slug and
//! subject, invalidated by change rather than by age.
//!
//! Every insert, update or delete of `tenants`, `users`, `user_roles` or `flock_assignments`
//! bumps one counter, `identity_epoch.epoch`, by a database trigger (migration 0004), so a
//! change made by `scopegate admin`, by another gateway replica or by hand in SQL bumps it
//! alike. A poller reads the counter every `auth.identity_cache_ms`; a cached entry serves only
//! while the counter has not moved since the entry was read. A revocation therefore applies
//! within one poll interval (plus the poll's own query), however long the entry has lived.
//!
//! Fail closed: when the poller has not read the counter for two intervals (database
//! unreachable, poller stopped) no entry serves, and every request reads the database as if
//! the cache were off. `auth.identity_cache_ms = 0` turns the cache off. Token checks
//! (signature, expiry) are never cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::store::Db;
use crate::store::principal::PrincipalRows;

/// Most entries held; past it the cache is emptied (simple and bounded).
const MAX_ENTRIES: usize = 100_000;

/// An entry older than this is read again even if the counter never moved: a bound for a
/// change that bypassed the triggers (a restore with triggers disabled, say).
const MAX_AGE: Duration = Duration::from_secs(60);

/// (tenant slug, subject; `None` for a system actor)
type Key = (String, Option<String>);

pub(crate) struct IdentityCache {
    /// How often the counter is read: the staleness bound.
    refresh: Duration,
    /// Entries older than this are read again however still the counter stands.
    max_age: Duration,
    state: Mutex<State>,
    /// The counter each time a read finds it moved (what else follows changes waits on it).
    moved: tokio::sync::watch::Sender<i64>,
}

#[derive(Default)]
struct State {
    /// The counter as last read, and when.
    epoch: Option<(i64, Instant)>,
    entries: HashMap<Key, Entry>,
}

/// An entry is always from the counter's current value: entries are dropped when the
/// counter moves, and rows read under an older value are never stored.
struct Entry {
    at: Instant,
    rows: Arc<PrincipalRows>,
}

/// The counter value taken before an entry's rows are read: the rows are stored only if the
/// counter still has it, so they are never older than the value the cache trusts. What else is
/// reused while the counter stands (a caller's resolved upstream servers) compares these.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch(i64);

impl IdentityCache {
    /// `None` when `refresh` is zero (the cache is off).
    pub fn new(refresh: Duration) -> Option<Self> {
        (!refresh.is_zero()).then(|| Self {
            refresh,
            max_age: MAX_AGE,
            state: Mutex::default(),
            moved: tokio::sync::watch::Sender::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The counter, if it was read recently enough to trust (within two intervals).
    fn fresh_epoch(&self, state: &State, now: Instant) -> Option<i64> {
        state.epoch.filter(|(_, at)| now.duration_since(*at) <= 2 * self.refresh).map(|(e, _)| e)
    }

    /// The counter to store rows read from now on under; `None`: don't cache them.
    pub fn epoch(&self) -> Option<Epoch> {
        self.fresh_epoch(&self.lock(), Instant::now()).map(Epoch)
    }

    /// Cached rows, only if the counter is fresh (and so has not moved since they were read).
    pub fn get(&self, tenant: &str, subject: Option<&str>) -> Option<Arc<PrincipalRows>> {
        let state = self.lock();
        let now = Instant::now();
        self.fresh_epoch(&state, now)?;
        let entry = state.entries.get(&(tenant.to_owned(), subject.map(str::to_owned)))?;
        (now.duration_since(entry.at) < self.max_age).then(|| Arc::clone(&entry.rows))
    }

    pub fn put(&self, tenant: &str, subject: Option<&str>, epoch: Epoch, rows: Arc<PrincipalRows>) {
        let mut state = self.lock();
        if state.epoch.is_none_or(|(current, _)| current != epoch.0) {
            return; // read under an older value: already stale
        }
        if state.entries.len() >= MAX_ENTRIES {
            state.entries.clear();
        }
        state.entries.insert((tenant.to_owned(), subject.map(str::to_owned)), Entry { at: Instant::now(), rows });
    }

    /// Records a read of the counter; entries read under another value are dropped.
    fn observe(&self, epoch: i64) {
        let mut state = self.lock();
        let moved = state.epoch.is_some_and(|(previous, _)| previous != epoch);
        if moved {
            state.entries.clear();
        }
        state.epoch = Some((epoch, Instant::now()));
        drop(state);
        if moved {
            self.moved.send_replace(epoch);
        }
    }

    /// Changes each time a read of the counter finds it moved.
    pub fn moves(&self) -> tokio::sync::watch::Receiver<i64> {
        self.moved.subscribe()
    }

    /// Reads the counter every interval until `shutdown`. A failed read is logged and leaves
    /// the last value to go stale, which turns the cache off until a read succeeds.
    pub fn spawn_poller(self: &Arc<Self>, db: Db, shutdown: CancellationToken) {
        let cache = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(cache.refresh);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = tick.tick() => {}
                }
                match db.identity_epoch().await {
                    Ok(epoch) => {
                        if failing {
                            tracing::info!("identity change counter readable again; identity cache back on");
                            failing = false;
                        }
                        cache.observe(epoch);
                        crate::telemetry::metrics::identity_counter_readable(true);
                    }
                    Err(e) => {
                        crate::telemetry::metrics::identity_counter_readable(false);
                        if !failing {
                            tracing::warn!(error = %e, "reading the identity change counter failed; identity cache off until it reads");
                            failing = true;
                        }
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Arc<PrincipalRows> {
        Arc::new(PrincipalRows::default())
    }

    /// A cache that has read the counter at `counter` and holds olivia's rows under it.
    fn holding_olivia(refresh: Duration, counter: i64) -> (IdentityCache, Epoch) {
        let cache = IdentityCache::new(refresh).unwrap();
        cache.observe(counter);
        let epoch = cache.epoch().unwrap();
        cache.put("acme", Some("olivia"), epoch, rows());
        (cache, epoch)
    }

    #[test]
    fn nothing_serves_before_the_counter_is_read() {
        let cache = IdentityCache::new(Duration::from_secs(1)).unwrap();
        assert!(cache.epoch().is_none(), "no counter read yet: rows are not cached");
        assert!(cache.get("acme", Some("olivia")).is_none());
    }

    #[test]
    fn an_entry_serves_while_the_counter_stands_still() {
        let (cache, _) = holding_olivia(Duration::from_secs(1), 7);
        cache.observe(7);
        assert!(cache.get("acme", Some("olivia")).is_some());
        assert!(cache.get("acme", Some("wanda")).is_none());
        assert!(cache.get("globex", Some("olivia")).is_none());
    }

    #[test]
    fn a_moved_counter_drops_every_entry() {
        let (cache, epoch) = holding_olivia(Duration::from_secs(1), 7);
        cache.observe(8);
        assert!(cache.get("acme", Some("olivia")).is_none(), "a change since the read invalidates it");
        // Rows read under the old value and stored late are not kept either.
        cache.put("acme", Some("olivia"), epoch, rows());
        assert!(cache.get("acme", Some("olivia")).is_none());
        // Any change of value counts, backwards too (a restored database).
        let epoch = cache.epoch().unwrap();
        cache.put("acme", Some("olivia"), epoch, rows());
        cache.observe(3);
        assert!(cache.get("acme", Some("olivia")).is_none());
    }

    #[test]
    fn a_counter_not_read_for_two_intervals_turns_the_cache_off() {
        let (cache, _) = holding_olivia(Duration::from_millis(20), 1);
        assert!(cache.get("acme", Some("olivia")).is_some());
        std::thread::sleep(Duration::from_millis(60));
        assert!(cache.get("acme", Some("olivia")).is_none(), "a stale counter is not trusted");
        assert!(cache.epoch().is_none(), "and nothing new is cached");
        cache.observe(1);
        assert!(cache.get("acme", Some("olivia")).is_some(), "a fresh read of the same value trusts it again");
    }

    #[test]
    fn an_entry_is_read_again_after_its_maximum_age_though_the_counter_stands_still() {
        let (mut cache, _) = holding_olivia(Duration::from_secs(10), 5);
        assert_eq!(cache.max_age, MAX_AGE);
        cache.max_age = Duration::from_millis(30);
        assert!(cache.get("acme", Some("olivia")).is_some());
        std::thread::sleep(Duration::from_millis(40));
        cache.observe(5);
        assert!(cache.get("acme", Some("olivia")).is_none(), "too old: read again");
    }

    #[test]
    fn zero_turns_the_cache_off() {
        assert!(IdentityCache::new(Duration::ZERO).is_none());
    }
}
