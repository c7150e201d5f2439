//! A short-lived cache of identity rows (tenant, user, roles, assignments) keyed by tenant
//! slug and subject. Off by default (`auth.identity_cache_ms = 0`): then every request reads
//! the database and revocation applies on the next request. When on, a revocation (user
//! disabled, assignment removed, tenant suspended) applies within the configured staleness.
//! Token checks (signature, expiry) are never cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::principal::PrincipalRows;

/// Most entries held; past it the cache is emptied (simple and bounded).
const MAX_ENTRIES: usize = 100_000;

/// (tenant slug, subject; `None` for a system actor)
type Key = (String, Option<String>);

pub(crate) struct IdentityCache {
    ttl: Duration,
    entries: Mutex<HashMap<Key, (Instant, Arc<PrincipalRows>)>>,
}

impl IdentityCache {
    pub fn new(ttl: Duration) -> Option<Self> {
        (!ttl.is_zero()).then(|| Self { ttl, entries: Mutex::default() })
    }

    pub fn get(&self, tenant: &str, subject: Option<&str>) -> Option<Arc<PrincipalRows>> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (at, rows) = entries.get(&(tenant.to_owned(), subject.map(str::to_owned)))?;
        (at.elapsed() < self.ttl).then(|| Arc::clone(rows))
    }

    pub fn put(&self, tenant: &str, subject: Option<&str>, rows: Arc<PrincipalRows>) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert((tenant.to_owned(), subject.map(str::to_owned)), (Instant::now(), rows));
    }
}
