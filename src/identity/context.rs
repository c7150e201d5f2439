//! McpCallContext: the only way a tool learns who is calling. Built per tool call by a
//! factory that fails closed; exposes read-only values, never the raw identity types.
//!
//! The four checks (DESIGN.md), in order:
//! 1. the call carries the HTTP request it arrived on, and that request carries an identity;
//! 2. that identity was resolved for THIS message (same JSON-RPC request id and session id
//!    as the call) and its principal is the one the session is bound to;
//! 3. tenant, user and flock scope are each resolved (`is_resolved()`, never `is_unrestricted()`);
//! 4. the user id is not nil (a system actor never reaches a tool).

use std::collections::BTreeSet;
use std::sync::Arc;

use rmcp::model::RequestId;

use super::ResolvedIdentity;
use super::flock_scope::Breadth;
use super::sessions::SessionRegistry;
use crate::audit::{AuditWriter, CallAudit};
use crate::identity::scoped::{ScopedStore, WriteAudit};
use crate::model::Role;
use crate::store::Db;
use crate::store::{FlockId, TenantId, UserId};

/// What the transport knows about one tool call.
#[derive(Debug, Clone, Copy)]
pub struct CallSite<'a> {
    /// The HTTP request the call arrived on (rmcp moves it into the call's extensions).
    pub parts: Option<&'a http::request::Parts>,
    /// The JSON-RPC id of the call being handled.
    pub request_id: &'a RequestId,
    /// The MCP session the call is served in, if any.
    pub session_id: Option<&'a str>,
}

/// Why no context could be built. The call fails and nothing runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    #[error("the call carries no HTTP request")]
    NoHttpRequest,
    #[error("the HTTP request carries no resolved identity")]
    NoIdentity,
    #[error("the identity was resolved for another message")]
    ForeignMessage,
    #[error("the session is not bound to this caller")]
    SessionMismatch,
    #[error("the {0} is not resolved")]
    Unresolved(&'static str),
    #[error("a system actor can't call tools")]
    SystemActor,
    #[error("the caller's roles do not allow this")]
    RoleDenied,
    #[error("no data access is attached to this call")]
    NoStore,
}

impl ContextError {
    /// A stable label for metrics, logs and audit.
    pub fn reason(&self) -> &'static str {
        match self {
            ContextError::NoHttpRequest => "no_http_request",
            ContextError::NoIdentity => "no_identity",
            ContextError::ForeignMessage => "foreign_message",
            ContextError::SessionMismatch => "session_mismatch",
            ContextError::Unresolved("tenant") => "unresolved_tenant",
            ContextError::Unresolved("user") => "unresolved_user",
            ContextError::Unresolved(_) => "unresolved_flock_scope",
            ContextError::SystemActor => "system_actor",
            ContextError::RoleDenied => "role_denied",
            ContextError::NoStore => "no_store",
        }
    }
}

/// Which flocks the caller may touch, as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlockAccess<'a> {
    /// Every flock of the caller's tenant.
    AllOfTenant,
    /// Only these flocks of the caller's tenant (possibly none).
    Only(&'a BTreeSet<FlockId>),
}

impl FlockAccess<'_> {
    pub fn allows(&self, flock: FlockId) -> bool {
        match self {
            FlockAccess::AllOfTenant => true,
            FlockAccess::Only(ids) => ids.contains(&flock),
        }
    }
}

/// The caller of one tool call. Cheap to clone; holds the request's identity privately.
#[derive(Clone)]
pub struct McpCallContext {
    identity: Arc<ResolvedIdentity>,
    request_id: RequestId,
    session_id: Option<String>,
    data: Option<DataAccess>,
}

/// What the context hands out as data access: the database, and the call's audit record
/// for writes.
#[derive(Clone)]
struct DataAccess {
    db: Db,
    writer: AuditWriter,
    call: Option<Arc<CallAudit>>,
}

impl std::fmt::Debug for McpCallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpCallContext")
            .field("tenant", &self.identity.tenant.get().map(|t| &t.slug))
            .field("user", &self.identity.user.get().map(|u| &u.subject))
            .field("request_id", &self.request_id)
            .finish_non_exhaustive()
    }
}

impl McpCallContext {
    /// The factory. Returns a context only when all four checks hold.
    pub fn for_call(site: CallSite<'_>, sessions: &SessionRegistry) -> Result<Self, ContextError> {
        // Check 1: the HTTP request this call arrived on, and the identity on it.
        let parts = site.parts.ok_or(ContextError::NoHttpRequest)?;
        let identity = parts.extensions.get::<Arc<ResolvedIdentity>>().ok_or(ContextError::NoIdentity)?;

        // Check 2: resolved for this very message, by the session's own principal.
        if identity.message.request_id.as_ref() != Some(site.request_id)
            || identity.message.session_id.as_deref() != site.session_id
        {
            return Err(ContextError::ForeignMessage);
        }
        if let Some(session) = site.session_id {
            let bound = sessions.principal(session).ok_or(ContextError::SessionMismatch)?;
            if identity.principal() != Some(bound) {
                return Err(ContextError::SessionMismatch);
            }
        }

        // Check 3: each part resolved, one by one. Never `is_unrestricted()` here.
        if !identity.tenant.is_resolved() {
            return Err(ContextError::Unresolved("tenant"));
        }
        if !identity.user.is_resolved() {
            return Err(ContextError::Unresolved("user"));
        }
        if !identity.flocks.is_resolved() {
            return Err(ContextError::Unresolved("flock scope"));
        }

        // Check 4: a real user.
        if identity.user.get().is_some_and(|user| user.id.is_nil()) {
            return Err(ContextError::SystemActor);
        }

        Ok(Self {
            identity: Arc::clone(identity),
            request_id: site.request_id.clone(),
            session_id: site.session_id.map(str::to_owned),
            data: None,
        })
    }

    /// Attaches data access: the scoped store will read `db`, and writes will append
    /// `call`'s audit event through `writer`'s chains.
    pub(crate) fn with_data(mut self, db: Db, writer: AuditWriter, call: Option<Arc<CallAudit>>) -> Self {
        self.data = Some(DataAccess { db, writer, call });
        self
    }

    /// The caller's data, bound to its tenant and flock scope.
    pub fn store(&self) -> Result<ScopedStore<'_>, ContextError> {
        let data = self.data.as_ref().ok_or(ContextError::NoStore)?;
        let audit = data.call.as_deref().map(|call| WriteAudit { writer: &data.writer, call });
        let user = self.user();
        Ok(ScopedStore::new(&data.db, self.tenant_id(), user.id, &user.subject, self.flocks(), audit))
    }

    fn tenant(&self) -> &super::tenant::Tenant {
        self.identity.tenant.get().expect("checked resolved by the factory")
    }

    fn user(&self) -> &super::user::User {
        self.identity.user.get().expect("checked resolved by the factory")
    }

    pub fn tenant_id(&self) -> TenantId {
        self.tenant().id
    }

    pub fn tenant_slug(&self) -> &str {
        &self.tenant().slug
    }

    pub fn tenant_name(&self) -> &str {
        &self.tenant().name
    }

    /// Whether the tenant wants a call's record committed before the call is forwarded.
    pub fn audit_write_ahead(&self) -> bool {
        self.tenant().audit_write_ahead
    }

    pub fn user_id(&self) -> UserId {
        self.user().id
    }

    pub fn subject(&self) -> &str {
        &self.user().subject
    }

    pub fn display_name(&self) -> &str {
        &self.user().display_name
    }

    pub fn roles(&self) -> &[Role] {
        &self.user().roles
    }

    /// The token's claims named in `auth.policy_claims` (what policies read of the token).
    pub fn policy_claims(&self) -> &[(String, String)] {
        &self.identity.policy_claims
    }

    pub fn has_role(&self, role: Role) -> bool {
        self.roles().contains(&role)
    }

    /// Role check: succeeds when the caller holds any of `allowed`.
    pub fn require_any_role(&self, allowed: &[Role]) -> Result<(), ContextError> {
        if self.roles().iter().any(|r| allowed.contains(r)) { Ok(()) } else { Err(ContextError::RoleDenied) }
    }

    pub fn flocks(&self) -> FlockAccess<'_> {
        match self.identity.flocks.breadth() {
            Breadth::Tenant => FlockAccess::AllOfTenant,
            Breadth::Assigned(ids) => FlockAccess::Only(ids),
        }
    }

    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    pub fn session_id(&self) -> Option<&str> {
        self.session_id.as_deref()
    }

    /// `exp` of the caller's token (Unix seconds).
    pub fn token_expires_at(&self) -> i64 {
        self.identity.expires_at
    }
}

#[cfg(test)]
mod tests;
