//! A session's frozen view of the tenant's upstream servers and grants: which connections it
//! names and which tools each of the caller's roles may use. Never another tenant's.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::connection::Connection;
use crate::model::Role;
use crate::store::entities::GrantRow;
use crate::store::{TenantId, UserId};

/// The upstream servers one session sees, frozen when the session first needed them.
pub struct Snapshot {
    pub(super) tenant: TenantId,
    /// Whose session it is: a per-user OAuth server's connection carries this user's login.
    pub(super) user: UserId,
    pub(super) servers: BTreeMap<String, Arc<Connection>>,
    pub(super) grants: Vec<GrantRow>,
    /// The one server bound without the `server__` prefix, if any (see `surface`).
    pub(super) bare: Option<String>,
}

impl super::surface::NameSpace for Snapshot {
    fn prefixed(&self, server: &str) -> Option<bool> {
        self.servers.contains_key(server).then(|| self.bare.as_deref() != Some(server))
    }

    fn unprefixed(&self) -> Option<&str> {
        self.bare.as_deref()
    }
}

impl Snapshot {
    /// A snapshot with no server: what a caller sees when its own can't be used.
    pub(super) fn empty(tenant: TenantId, user: UserId) -> Self {
        Self { tenant, user, servers: BTreeMap::new(), grants: Vec::new(), bare: None }
    }

    /// Whether `server` is in the snapshot, and bound with a prefix.
    pub fn prefixed(&self, server: &str) -> Option<bool> {
        super::surface::NameSpace::prefixed(self, server)
    }

    /// The allow list: a grant names the server, one of the caller's roles, and the tool or `*`.
    pub fn allowed(&self, server: &str, tool: &str, roles: &[Role]) -> bool {
        self.grants.iter().any(|g| g.server == server && roles.contains(&g.role) && (g.tool == "*" || g.tool == tool))
    }

    pub fn any_grant(&self, server: &str, roles: &[Role]) -> bool {
        self.grants.iter().any(|g| g.server == server && roles.contains(&g.role))
    }

    pub fn connection(&self, server: &str) -> Option<&Arc<Connection>> {
        self.servers.get(server)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_names_server_role_and_tool() {
        let snapshot = Snapshot {
            tenant: TenantId::generate(),
            user: UserId::generate(),
            servers: BTreeMap::new(),
            grants: vec![
                GrantRow { server: "fx".into(), role: Role::Owner, tool: "*".into() },
                GrantRow { server: "fx".into(), role: Role::Worker, tool: "whoami".into() },
            ],
            bare: None,
        };
        assert!(snapshot.allowed("fx", "anything", &[Role::Owner]));
        assert!(snapshot.allowed("fx", "whoami", &[Role::Worker]));
        assert!(!snapshot.allowed("fx", "echo", &[Role::Worker]));
        assert!(!snapshot.allowed("fx", "whoami", &[Role::Auditor]));
        assert!(!snapshot.allowed("other", "whoami", &[Role::Owner]), "a grant names its server");
        assert!(!snapshot.allowed("fx", "whoami", &[]));
    }
}
