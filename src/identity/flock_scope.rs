//! FlockScope: which flocks of the tenant the caller may touch. Narrowest by default:
//! a worker with no assignment gets no flock at all, never the whole tenant.
//!
//! Breadth (what the roles grant) and resolution (whether the scope was confirmed against
//! the database for this request) are separate on purpose: the resolver first derives the
//! breadth from the roles, then resolves it. `is_unrestricted()` speaks only of breadth, so
//! a gate must test `is_resolved()`; a gate that tested breadth would pass a scope that was
//! never confirmed.

use std::collections::BTreeSet;

use crate::model::Role;
use crate::store::FlockId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::identity) enum Breadth {
    /// Every flock of the tenant (owner, manager, auditor).
    Tenant,
    /// Exactly these flocks (worker); empty means none.
    Assigned(BTreeSet<FlockId>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::identity) struct FlockScope {
    breadth: Breadth,
    resolved: bool,
}

impl Default for FlockScope {
    fn default() -> Self {
        Self::unresolved()
    }
}

impl FlockScope {
    /// Nothing known: no flock, not resolved.
    pub fn unresolved() -> Self {
        Self { breadth: Breadth::Assigned(BTreeSet::new()), resolved: false }
    }

    /// The breadth the roles grant, before assignments are confirmed. Not resolved.
    pub fn pending(roles: &[Role]) -> Self {
        let breadth = if roles.iter().any(|r| r.sees_all_flocks()) {
            Breadth::Tenant
        } else {
            Breadth::Assigned(BTreeSet::new())
        };
        Self { breadth, resolved: false }
    }

    /// Confirms the scope with the assignments read for this request. Assignments only
    /// narrow: a tenant-wide breadth stays tenant-wide, an assigned breadth becomes exactly
    /// the assigned flocks (possibly none).
    pub fn resolve(self, assignments: impl IntoIterator<Item = FlockId>) -> Self {
        let breadth = match self.breadth {
            Breadth::Tenant => Breadth::Tenant,
            Breadth::Assigned(_) => Breadth::Assigned(assignments.into_iter().collect()),
        };
        Self { breadth, resolved: true }
    }

    pub fn is_resolved(&self) -> bool {
        self.resolved
    }

    /// Whether the roles grant every flock of the tenant. Says nothing about resolution.
    pub fn is_unrestricted(&self) -> bool {
        self.breadth == Breadth::Tenant
    }

    pub fn breadth(&self) -> &Breadth {
        &self.breadth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_without_assignments_sees_no_flock() {
        let scope = FlockScope::pending(&[Role::Worker]).resolve([]);
        assert!(scope.is_resolved());
        assert!(!scope.is_unrestricted());
        assert_eq!(scope.breadth(), &Breadth::Assigned(BTreeSet::new()));
    }

    #[test]
    fn assignments_never_widen_and_owner_stays_tenant_wide() {
        let f = FlockId::generate();
        let worker = FlockScope::pending(&[Role::Worker]).resolve([f]);
        assert_eq!(worker.breadth(), &Breadth::Assigned([f].into()));
        let owner = FlockScope::pending(&[Role::Owner, Role::Worker]).resolve([f]);
        assert!(owner.is_unrestricted());
    }

    #[test]
    fn unresolved_is_narrowest_and_pending_is_not_resolved() {
        assert!(!FlockScope::default().is_resolved());
        assert!(!FlockScope::default().is_unrestricted());
        let pending = FlockScope::pending(&[Role::Owner]);
        assert!(pending.is_unrestricted() && !pending.is_resolved());
    }
}
