//! Session binding: which principal (tenant + user) created each MCP session.
//! A session id presented by anyone else is treated as unknown.

use std::collections::HashMap;
use std::sync::RwLock;

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
