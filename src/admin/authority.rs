//! Who is asking, and what each act needs. Fail closed: an authority covers exactly what
//! [`Authority::authorize`] lists, nothing else.

use super::AdminError;
use crate::model::Role;
use crate::store::{TenantId, UserId};

/// The caller of an administrative act.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// `scopegate admin` on a host that holds the database's credentials: everything.
    Cli,
    /// A platform administrator (a subject listed in `admin.platform_subjects`): every tenant,
    /// the executors and the server declarations.
    Platform { subject: String },
    /// A user of one tenant, acting with its roles there.
    Member(Member),
}

/// A user of a tenant, as its token and the database name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub tenant: TenantId,
    pub slug: String,
    pub user: UserId,
    pub subject: String,
    pub roles: Vec<Role>,
}

/// What an act needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need<'a> {
    /// Tenants, executors: platform administrators only.
    Platform,
    /// A tenant's server declarations, and changes of the tenant itself: platform
    /// administrators only (a member of another tenant is told it does not exist).
    PlatformOver(&'a str),
    /// The tenant's users, roles, flocks, assignments, bindings, grants, root allowances and
    /// upstream logins: its owners (and platform administrators).
    Manage(&'a str),
    /// The tenant's audit trail and its verification: its auditors (and platform
    /// administrators).
    Audit(&'a str),
    /// What decides who can sign in to the tenant (the identity providers it trusts): its
    /// owners, who change it, and its auditors, who check it (and platform administrators).
    Inspect(&'a str),
    /// The build's guard report (the same for every tenant): an owner or auditor of any tenant.
    Report,
    /// The calls of the tenant waiting for a second person: its approvers, who decide them, and
    /// its owners and auditors, who see them (and platform administrators).
    Approvals(&'a str),
    /// Deciding such a call: the tenant's approvers only. A second person decides, so never the
    /// operator's CLI or a platform administrator, who are no user of the tenant.
    Approve(&'a str),
}

impl Authority {
    /// Ok when this authority covers `need`. A member asking about another tenant is told
    /// the resource does not exist (whether or not it does); one asking about its own
    /// tenant without the role is told it may not.
    pub fn authorize(&self, need: Need<'_>) -> Result<(), AdminError> {
        // The platform chain's row is no tenant: its chain is read like one (by platform
        // administrators only: no member belongs to it), nothing else names it.
        if let Need::PlatformOver(slug) | Need::Manage(slug) | Need::Inspect(slug) = need
            && slug == crate::store::admin::PLATFORM_SLUG
        {
            return Err(AdminError::NotFound("no such resource".into()));
        }
        let member = match (self, need) {
            (Authority::Cli | Authority::Platform { .. }, Need::Approve(_)) => {
                return Err(AdminError::Denied(
                    "a call is approved by an approver of its tenant, signed in as that user".into(),
                ));
            }
            (Authority::Cli | Authority::Platform { .. }, _) => return Ok(()),
            (Authority::Member(member), _) => member,
        };
        let (slug, role) = match need {
            Need::Platform => return Err(AdminError::Forbidden),
            Need::PlatformOver(slug) if member.slug != slug => {
                return Err(AdminError::NotFound("no such resource".into()));
            }
            Need::PlatformOver(_) => return Err(AdminError::Forbidden),
            Need::Report => {
                return if member.roles.iter().any(|r| matches!(r, Role::Owner | Role::Auditor)) {
                    Ok(())
                } else {
                    Err(AdminError::Forbidden)
                };
            }
            Need::Manage(slug) => (slug, &[Role::Owner][..]),
            Need::Audit(slug) => (slug, &[Role::Auditor][..]),
            Need::Inspect(slug) => (slug, &[Role::Owner, Role::Auditor][..]),
            Need::Approvals(slug) => (slug, &[Role::Approver, Role::Owner, Role::Auditor][..]),
            Need::Approve(slug) => (slug, &[Role::Approver][..]),
        };
        if member.slug != slug {
            return Err(AdminError::NotFound("no such resource".into()));
        }
        if member.roles.iter().any(|r| role.contains(r)) { Ok(()) } else { Err(AdminError::Forbidden) }
    }

    /// Who made a change, as its audit event names them.
    pub fn actor(&self) -> String {
        match self {
            Authority::Cli => "cli".to_owned(),
            Authority::Platform { subject } => format!("platform:{subject}"),
            Authority::Member(m) => format!("tenant:{}:{}", m.slug, m.subject),
        }
    }

    /// The user an audit event of `tenant`'s chain names: the member itself in its own
    /// tenant, else the nil id (an actor that is no user of the tenant, as a service token).
    pub(super) fn user_in(&self, tenant: TenantId) -> UserId {
        match self {
            Authority::Member(m) if m.tenant == tenant => m.user,
            _ => UserId::nil(),
        }
    }

    /// The tenant whose owner this is, if it is a member.
    pub fn member(&self) -> Option<&Member> {
        match self {
            Authority::Member(m) => Some(m),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(slug: &str, roles: &[Role]) -> Authority {
        Authority::Member(Member {
            tenant: TenantId::generate(),
            slug: slug.into(),
            user: UserId::generate(),
            subject: "u".into(),
            roles: roles.to_vec(),
        })
    }

    #[test]
    fn the_matrix() {
        let platform = Authority::Platform { subject: "ops".into() };
        let owner = member("acme", &[Role::Owner]);
        let auditor = member("acme", &[Role::Auditor]);
        let worker = member("acme", &[Role::Worker, Role::Manager]);
        for need in [
            Need::Platform,
            Need::PlatformOver("acme"),
            Need::Manage("acme"),
            Need::Audit("acme"),
            Need::Inspect("acme"),
            Need::Report,
        ] {
            assert!(platform.authorize(need).is_ok());
            assert!(Authority::Cli.authorize(need).is_ok());
        }
        assert!(owner.authorize(Need::Manage("acme")).is_ok());
        assert!(matches!(owner.authorize(Need::Audit("acme")), Err(AdminError::Forbidden)));
        assert!(matches!(owner.authorize(Need::Manage("globex")), Err(AdminError::NotFound(_))));
        assert!(matches!(owner.authorize(Need::Platform), Err(AdminError::Forbidden)));
        assert!(matches!(owner.authorize(Need::PlatformOver("acme")), Err(AdminError::Forbidden)));
        assert!(matches!(owner.authorize(Need::PlatformOver("globex")), Err(AdminError::NotFound(_))));
        assert!(auditor.authorize(Need::Audit("acme")).is_ok());
        assert!(matches!(auditor.authorize(Need::Audit("globex")), Err(AdminError::NotFound(_))));
        assert!(matches!(auditor.authorize(Need::Manage("acme")), Err(AdminError::Forbidden)));
        assert!(owner.authorize(Need::Report).is_ok() && auditor.authorize(Need::Report).is_ok());
        assert!(owner.authorize(Need::Inspect("acme")).is_ok() && auditor.authorize(Need::Inspect("acme")).is_ok());
        assert!(matches!(owner.authorize(Need::Inspect("globex")), Err(AdminError::NotFound(_))));
        assert!(matches!(auditor.authorize(Need::Inspect("globex")), Err(AdminError::NotFound(_))));
        // The platform chain: its trail for platform administrators, nothing else for anyone.
        let chain = crate::store::admin::PLATFORM_SLUG;
        assert!(platform.authorize(Need::Audit(chain)).is_ok());
        for who in [&platform, &Authority::Cli, &owner] {
            for need in [Need::Manage(chain), Need::PlatformOver(chain), Need::Inspect(chain)] {
                assert!(matches!(who.authorize(need), Err(AdminError::NotFound(_))), "{who:?} {need:?}");
            }
        }
        assert!(matches!(auditor.authorize(Need::Audit(chain)), Err(AdminError::NotFound(_))));
        for need in [Need::Platform, Need::Manage("acme"), Need::Audit("acme"), Need::Inspect("acme"), Need::Report] {
            assert!(worker.authorize(need).is_err(), "{need:?}");
        }
    }
}
