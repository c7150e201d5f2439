//! Session binding: which principal (tenant + user) created each MCP session, and which
//! request ids each session has in flight. A session id presented by anyone else is treated
//! as unknown.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use rmcp::model::RequestId;

use crate::store::{TenantId, UserId};

/// A caller as the sessions see it: tenant and user ids, nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Principal {
    pub tenant: TenantId,
    pub user: UserId,
}

/// Session id -> the principal that created the session.
#[derive(Debug, Default)]
pub struct SessionRegistry {
    sessions: RwLock<HashMap<String, Principal>>,
    /// (session id, request id) of every request whose answer is still being sent.
    in_flight: Mutex<HashSet<(String, RequestId)>>,
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

    /// Binds a new session to its creator. A session id is bound once: rebinding an id to
    /// another principal is refused (returns false).
    pub fn bind(&self, session_id: &str, principal: Principal) -> bool {
        let mut map = self.sessions.write().unwrap_or_else(|p| p.into_inner());
        match map.get(session_id) {
            Some(existing) => *existing == principal,
            None => {
                map.insert(session_id.to_owned(), principal);
                true
            }
        }
    }

    pub fn principal(&self, session_id: &str) -> Option<Principal> {
        self.sessions.read().unwrap_or_else(|p| p.into_inner()).get(session_id).copied()
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
        self.sessions.write().unwrap_or_else(|p| p.into_inner()).remove(session_id);
    }

    /// Every bound session id (for sweeping sessions the transport has closed).
    pub fn session_ids(&self) -> Vec<String> {
        self.sessions.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.sessions.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
