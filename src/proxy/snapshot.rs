//! A session's frozen view of the tenant's upstream servers and grants: which connections it
//! names and which tools each of the caller's roles may use. Never another tenant's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::model::Role;
use crate::proxy::connection::Connection;
use crate::store::entities::{GrantKind, GrantRow};
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
    /// Servers the tenant bound that are not served because a path of their declaration lies
    /// outside their executor's root: a call of one of their tools is audited as `outside_root`.
    pub(super) outside_root: BTreeSet<String>,
}

impl crate::proxy::surface::NameSpace for Snapshot {
    fn prefixed(&self, server: &str) -> Option<bool> {
        self.servers.contains_key(server).then(|| self.bare.as_deref() != Some(server))
    }

    fn unprefixed(&self) -> Option<&str> {
        self.bare.as_deref()
    }
}

impl Snapshot {
    /// A snapshot with no server: what a caller sees when its own can't be used.
    pub fn empty(tenant: TenantId, user: UserId) -> Self {
        Self { tenant, user, servers: BTreeMap::new(), grants: Vec::new(), bare: None, outside_root: BTreeSet::new() }
    }

    /// A snapshot of `servers`, all prefixed, under `grants`.
    pub(crate) fn with(
        tenant: TenantId,
        user: UserId,
        servers: BTreeMap<String, Arc<Connection>>,
        grants: Vec<GrantRow>,
    ) -> Self {
        Self { tenant, user, servers, grants, bare: None, outside_root: BTreeSet::new() }
    }

    /// Whether `server` is in the snapshot, and bound with a prefix.
    pub fn prefixed(&self, server: &str) -> Option<bool> {
        crate::proxy::surface::NameSpace::prefixed(self, server)
    }

    /// The allow list of tools: a tool grant names the server, one of the caller's roles, and
    /// the tool or `*`.
    pub fn allowed(&self, server: &str, tool: &str, roles: &[Role]) -> bool {
        self.allowed_kind(server, GrantKind::Tool, tool, roles)
    }

    /// The allow list of `kind`: a grant of that kind names the server, one of the caller's
    /// roles, and `name`, `*` or (resources) a prefix of `name` ending in `*`.
    pub fn allowed_kind(&self, server: &str, kind: GrantKind, name: &str, roles: &[Role]) -> bool {
        self.grants.iter().any(|g| g.covers(server, kind, name, roles))
    }

    /// The grant of `kind` that allows `name` on `server` to one of `roles`, as policies name it
    /// (`grant/<id>`): the permit a grant is.
    pub fn granting(&self, server: &str, kind: GrantKind, name: &str, roles: &[Role]) -> Option<String> {
        self.grants.iter().find(|g| g.covers(server, kind, name, roles)).map(crate::admin::read::grant_policy_id)
    }

    /// Who must confirm a call of tool `name` on `server` by a caller holding `roles`: the
    /// strictest `confirm` of the grants that allow it (`None`: none asks for one).
    pub fn confirm_of(&self, server: &str, name: &str, roles: &[Role]) -> Option<crate::model::Confirm> {
        self.grants.iter().filter(|g| g.covers(server, GrantKind::Tool, name, roles)).filter_map(|g| g.confirm).max()
    }

    /// Whether any grant of any kind on `server` names one of the caller's roles.
    pub fn any_grant(&self, server: &str, roles: &[Role]) -> bool {
        self.grants.iter().any(|g| g.server == server && roles.contains(&g.role))
    }

    /// Whether any grant of `kind` on `server` names one of the caller's roles.
    pub fn any_grant_kind(&self, server: &str, kind: GrantKind, roles: &[Role]) -> bool {
        self.grants.iter().any(|g| g.server == server && g.kind == kind && roles.contains(&g.role))
    }

    pub fn connection(&self, server: &str) -> Option<&Arc<Connection>> {
        self.servers.get(server)
    }

    /// The server of `exposed` (a `server__tool` name), when that server is not served because
    /// it leaves its executor's root and the caller holds a grant on it: then the call is
    /// refused for that reason, not as a call of a tool that does not exist.
    pub fn outside_root(&self, exposed: &str, roles: &[Role]) -> Option<&str> {
        let (server, _) = crate::vocab::names::split_tool_name(exposed)?;
        let server = self.outside_root.get(server)?;
        self.any_grant(server, roles).then_some(server.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(server: &str, role: Role, kind: GrantKind, name: &str) -> GrantRow {
        GrantRow { server: server.into(), role, kind, name: name.into(), confirm: None }
    }

    fn snapshot(grants: Vec<GrantRow>) -> Snapshot {
        Snapshot {
            tenant: TenantId::generate(),
            user: UserId::generate(),
            servers: BTreeMap::new(),
            grants,
            bare: None,
            outside_root: BTreeSet::new(),
        }
    }

    #[test]
    fn a_grant_names_server_role_and_tool() {
        let snapshot = snapshot(vec![
            grant("fx", Role::Owner, GrantKind::Tool, "*"),
            grant("fx", Role::Worker, GrantKind::Tool, "whoami"),
        ]);
        assert!(snapshot.allowed("fx", "anything", &[Role::Owner]));
        assert!(snapshot.allowed("fx", "whoami", &[Role::Worker]));
        assert!(!snapshot.allowed("fx", "echo", &[Role::Worker]));
        assert!(!snapshot.allowed("fx", "whoami", &[Role::Auditor]));
        assert!(!snapshot.allowed("other", "whoami", &[Role::Owner]), "a grant names its server");
        assert!(!snapshot.allowed("fx", "whoami", &[]));
    }

    #[test]
    fn a_grant_covers_only_its_own_kind() {
        use GrantKind::{Prompt, Resource, Tool};
        let snapshot = snapshot(vec![
            grant("fx", Role::Worker, Prompt, "whoami"),
            grant("fx", Role::Worker, Resource, "test://docs/*"),
            grant("fx", Role::Worker, Resource, "test://one.txt"),
            grant("fx", Role::Owner, Prompt, "*"),
            grant("fy", Role::Auditor, Tool, "echo"),
        ]);
        // `allowed` is about tools only: a prompt or resource grant never opens a tool.
        assert!(!snapshot.allowed("fx", "whoami", &[Role::Worker]), "a prompt grant is no tool grant");
        assert!(!snapshot.allowed("fx", "anything", &[Role::Owner]), "a prompt `*` is no tool `*`");
        assert!(snapshot.allowed("fy", "echo", &[Role::Auditor]));

        assert!(snapshot.allowed_kind("fx", Prompt, "whoami", &[Role::Worker]));
        assert!(!snapshot.allowed_kind("fx", Tool, "whoami", &[Role::Worker]));
        assert!(!snapshot.allowed_kind("fx", Resource, "whoami", &[Role::Worker]));
        assert!(!snapshot.allowed_kind("fx", Prompt, "other", &[Role::Worker]));
        assert!(snapshot.allowed_kind("fx", Prompt, "other", &[Role::Owner]), "a prompt `*`");
        assert!(!snapshot.allowed_kind("fx", Resource, "test://docs/a.md", &[Role::Owner]), "a prompt `*` only");

        assert!(snapshot.allowed_kind("fx", Resource, "test://docs/a.md", &[Role::Worker]), "under the prefix");
        assert!(snapshot.allowed_kind("fx", Resource, "test://docs/sub/b.md", &[Role::Worker]));
        assert!(!snapshot.allowed_kind("fx", Resource, "test://other/a.md", &[Role::Worker]));
        assert!(snapshot.allowed_kind("fx", Resource, "test://one.txt", &[Role::Worker]), "an exact URI");
        assert!(!snapshot.allowed_kind("fx", Resource, "test://one.txt.bak", &[Role::Worker]));
        assert!(!snapshot.allowed_kind("fx", Resource, "test://docs/a.md", &[Role::Auditor]), "another role");
        assert!(!snapshot.allowed_kind("fy", Resource, "test://docs/a.md", &[Role::Worker]), "another server");
        assert!(!snapshot.allowed_kind("fx", Resource, "test://docs/a.md", &[]));

        // any_grant: any kind; any_grant_kind: that kind only.
        assert!(snapshot.any_grant("fx", &[Role::Worker]));
        assert!(!snapshot.any_grant("fx", &[Role::Auditor]));
        assert!(snapshot.any_grant_kind("fx", Prompt, &[Role::Worker]));
        assert!(snapshot.any_grant_kind("fx", Resource, &[Role::Worker]));
        assert!(!snapshot.any_grant_kind("fx", Tool, &[Role::Worker, Role::Owner]), "no tool grant on fx");
        assert!(!snapshot.any_grant_kind("fx", Resource, &[Role::Owner]), "the owner holds prompts only");
        assert!(snapshot.any_grant_kind("fy", Tool, &[Role::Auditor]));
        assert!(!snapshot.any_grant_kind("fy", Prompt, &[Role::Auditor]));
        assert!(!snapshot.any_grant_kind("fz", Tool, &[Role::Auditor]), "an unknown server");
    }
}
