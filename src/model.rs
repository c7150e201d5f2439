//! Plain domain values shared by storage, identity and tools: roles and statuses.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A user's role within one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs the farm: every flock, every action.
    Owner,
    /// Manages every flock of the tenant.
    Manager,
    /// Works only the flocks assigned to them.
    Worker,
    /// Reads every flock and the audit trail; writes nothing.
    Auditor,
    /// Approves or rejects the calls of the tenant's other users that wait for a second
    /// person; sees no flock by this role alone.
    Approver,
}

impl Role {
    pub const ALL: [Role; 5] = [Role::Owner, Role::Manager, Role::Worker, Role::Auditor, Role::Approver];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Manager => "manager",
            Role::Worker => "worker",
            Role::Auditor => "auditor",
            Role::Approver => "approver",
        }
    }

    /// Whether this role sees every flock of its tenant (worker: assigned flocks only).
    pub fn sees_all_flocks(self) -> bool {
        match self {
            Role::Owner | Role::Manager | Role::Auditor => true,
            Role::Worker | Role::Approver => false,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown role `{0}` (expected owner, manager, worker, auditor or approver)")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownRole(s.to_owned()))
    }
}

/// Who confirms a call before it is forwarded: the calling person, asked through its client,
/// or a second person of the tenant with the [`Role::Approver`] role. Ordered by strictness:
/// where several rules name a call, the strictest one decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Confirm {
    Caller,
    Approver,
}

impl Confirm {
    pub fn as_str(self) -> &'static str {
        match self {
            Confirm::Caller => "caller",
            Confirm::Approver => "approver",
        }
    }

    /// The setting a stored or written text names.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "caller" => Some(Confirm::Caller),
            "approver" => Some(Confirm::Approver),
            _ => None,
        }
    }
}

impl fmt::Display for Confirm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a tenant may use the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TenantStatus {
    Active,
    Suspended,
}

impl TenantStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantStatus::Active => "active",
            TenantStatus::Suspended => "suspended",
        }
    }
}

/// Whether a user may use the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UserStatus {
    Active,
    Disabled,
}

impl UserStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            UserStatus::Active => "active",
            UserStatus::Disabled => "disabled",
        }
    }
}
