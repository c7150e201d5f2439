//! Session binding: which principal (tenant + user) created each MCP session, and which
//! request ids each session has in flight. A session id presented by anyone else is treated
//! as unknown.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use rmcp::model::RequestId;

pub use crate::store::Principal;

/// Session id -> the principal that created the session.
#[derive(Debug, Default)]
pub struct SessionRegistry {
    sessions: RwLock<Sessions>,
    /// (session id, request id) of every request whose answer is still being sent.
    in_flight: Mutex<HashSet<(String, RequestId)>>,
}

#[derive(Debug, Default)]
struct Sessions {
    owners: HashMap<String, Principal>,
    /// How many sessions each principal holds, places held for sessions being created included.
    counts: HashMap<Principal, usize>,
}

impl Sessions {
    fn release(&mut self, principal: Principal) {
        if let Some(n) = self.counts.get_mut(&principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.counts.remove(&principal);
            }
        }
    }
}

/// A place held for one more session of a principal while its `initialize` runs: given to the
/// session it creates ([`SessionRegistry::bind_slot`]), or given back when dropped.
#[derive(Debug)]
pub struct Slot {
    registry: Arc<SessionRegistry>,
    principal: Principal,
    taken: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.taken {
            self.registry.write().release(self.principal);
        }
    }
}

/// A request id held in flight for its session; released when dropped (the answer was sent,
/// or the client went away).
#[derive(Debug)]
pub struct InFlight {
    registry: Arc<SessionRegistry>,
    key: (String, RequestId),
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.registry.in_flight.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
    }
}

impl SessionRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Sessions> {
        self.sessions.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Sessions> {
        self.sessions.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Binds a new session to its creator. A session id is bound once: rebinding an id to
    /// another principal is refused (returns false).
    pub fn bind(&self, session_id: &str, principal: Principal) -> bool {
        let mut sessions = self.write();
        match sessions.owners.get(session_id) {
            Some(existing) => *existing == principal,
            None => {
                sessions.owners.insert(session_id.to_owned(), principal);
                *sessions.counts.entry(principal).or_default() += 1;
                true
            }
        }
    }

    /// Holds a place for one more session of `principal`, unless it holds `cap` already
    /// (0: no cap). Counted at once, so concurrent `initialize`s can't pass the cap together.
    pub fn reserve(self: &Arc<Self>, principal: Principal, cap: usize) -> Option<Slot> {
        let mut sessions = self.write();
        let held = sessions.counts.entry(principal).or_default();
        if cap > 0 && *held >= cap {
            return None;
        }
        *held += 1;
        Some(Slot { registry: Arc::clone(self), principal, taken: false })
    }

    /// [`SessionRegistry::bind`], counted in the place `slot` holds.
    pub fn bind_slot(&self, session_id: &str, mut slot: Slot) -> bool {
        let mut sessions = self.write();
        match sessions.owners.get(session_id) {
            Some(_) => false,
            None => {
                sessions.owners.insert(session_id.to_owned(), slot.principal);
                slot.taken = true;
                true
            }
        }
    }

    pub fn principal(&self, session_id: &str) -> Option<Principal> {
        self.read().owners.get(session_id).copied()
    }

    /// Holds `request` in flight for `session_id`, or `None` when a request with that id is
    /// in flight there already (JSON-RPC ids must be unique among a session's pending
    /// requests: a second one would run and never get its answer).
    pub fn begin_request(self: &Arc<Self>, session_id: &str, request: &RequestId) -> Option<InFlight> {
        let key = (session_id.to_owned(), request.clone());
        let fresh = self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone());
        fresh.then(|| InFlight { registry: Arc::clone(self), key })
    }

    pub fn unbind(&self, session_id: &str) {
        let mut sessions = self.write();
        if let Some(principal) = sessions.owners.remove(session_id) {
            sessions.release(principal);
        }
    }

    /// Every bound session id (for sweeping sessions the transport has closed).
    pub fn session_ids(&self) -> Vec<String> {
        self.read().owners.keys().cloned().collect()
    }

    /// The live sessions of each tenant on this replica.
    pub fn per_tenant(&self) -> HashMap<crate::store::TenantId, usize> {
        let mut out = HashMap::new();
        for principal in self.read().owners.values() {
            *out.entry(principal.tenant).or_default() += 1;
        }
        out
    }

    pub fn len(&self) -> usize {
        self.read().owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
