//! TenantContext: the caller's tenant, or explicitly unresolved; never a default tenant.

use crate::store::TenantId;

#[derive(Debug, Clone)]
pub(in crate::identity) struct Tenant {
    pub id: TenantId,
    pub slug: String,
    pub name: String,
    /// Its call records are committed before a call is forwarded (`audit_write_ahead`).
    pub audit_write_ahead: bool,
}

/// The tenant of the request. Starts unresolved; only the resolver makes it resolved.
#[derive(Debug, Clone, Default)]
pub(in crate::identity) struct TenantContext {
    tenant: Option<Tenant>,
}

impl TenantContext {
    pub fn resolved(tenant: Tenant) -> Self {
        Self { tenant: Some(tenant) }
    }

    pub fn is_resolved(&self) -> bool {
        self.tenant.is_some()
    }

    pub fn get(&self) -> Option<&Tenant> {
        self.tenant.as_ref()
    }
}
