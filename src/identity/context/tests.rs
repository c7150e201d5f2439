//! The four fail-closed checks of the factory, each with the case that must throw.
//! No tools are registered and no `/mcp` is mounted: the context stands alone.

use std::sync::Arc;

use rmcp::model::RequestId;

use super::*;
use crate::identity::flock_scope::FlockScope;
use crate::identity::sessions::Principal;
use crate::identity::tenant::{Tenant, TenantContext};
use crate::identity::user::{CurrentUserContext, User};
use crate::identity::{MessageBinding, ResolvedIdentity};

const SESSION: &str = "session-1";

fn call_id() -> RequestId {
    RequestId::Number(7)
}

fn tenant() -> TenantContext {
    TenantContext::resolved(Tenant {
        id: TenantId::generate(),
        slug: "acme".into(),
        name: "Acme".into(),
        audit_write_ahead: false,
    })
}

fn user(roles: Vec<Role>) -> CurrentUserContext {
    CurrentUserContext::resolved(User {
        id: UserId::generate(),
        subject: "wanda@acme.test".into(),
        display_name: "Wanda".into(),
        roles,
    })
}

fn binding() -> MessageBinding {
    MessageBinding { request_id: Some(call_id()), session_id: Some(SESSION.into()) }
}

/// A fully resolved worker identity for the call `call_id()` in session `SESSION`.
fn good() -> ResolvedIdentity {
    ResolvedIdentity {
        tenant: tenant(),
        user: user(vec![Role::Worker]),
        flocks: FlockScope::pending(&[Role::Worker]).resolve([FlockId::generate()]),
        message: binding(),
        expires_at: i64::MAX,
        policy_claims: Vec::new(),
    }
}

fn parts_with(identity: Option<ResolvedIdentity>) -> http::request::Parts {
    let (mut parts, ()) = http::Request::new(()).into_parts();
    if let Some(identity) = identity {
        parts.extensions.insert(Arc::new(identity));
    }
    parts
}

/// Sessions with `SESSION` bound to the identity's own principal.
fn sessions_for(identity: &ResolvedIdentity) -> SessionRegistry {
    let sessions = SessionRegistry::new();
    if let Some(p) = identity.principal() {
        sessions.bind(SESSION, p);
    }
    sessions
}

fn build(identity: ResolvedIdentity) -> Result<McpCallContext, ContextError> {
    let sessions = sessions_for(&identity);
    let parts = parts_with(Some(identity));
    let id = call_id();
    McpCallContext::for_call(CallSite { parts: Some(&parts), request_id: &id, session_id: Some(SESSION) }, &sessions)
}

#[test]
fn a_resolved_caller_gets_a_context_with_read_only_values() {
    let identity = good();
    let ctx = build(identity).expect("a resolved worker gets a context");
    assert_eq!(ctx.tenant_slug(), "acme");
    assert_eq!(ctx.subject(), "wanda@acme.test");
    assert_eq!(ctx.roles(), &[Role::Worker]);
    assert!(matches!(ctx.flocks(), FlockAccess::Only(ids) if ids.len() == 1));
    assert!(ctx.require_any_role(&[Role::Worker]).is_ok());
    assert_eq!(ctx.require_any_role(&[Role::Owner, Role::Auditor]), Err(ContextError::RoleDenied));
}

// Check 1 ------------------------------------------------------------------------------

#[test]
fn check1_a_call_without_its_http_request_fails() {
    let id = call_id();
    let sessions = SessionRegistry::new();
    let result = McpCallContext::for_call(CallSite { parts: None, request_id: &id, session_id: None }, &sessions);
    assert_eq!(result.unwrap_err(), ContextError::NoHttpRequest);
}

#[test]
fn check1_an_http_request_without_identity_fails() {
    let parts = parts_with(None);
    let id = call_id();
    let sessions = SessionRegistry::new();
    let result = McpCallContext::for_call(
        CallSite { parts: Some(&parts), request_id: &id, session_id: Some(SESSION) },
        &sessions,
    );
    assert_eq!(result.unwrap_err(), ContextError::NoIdentity);
}

// Check 2 ------------------------------------------------------------------------------

#[test]
fn check2_an_identity_resolved_for_another_message_fails() {
    // The identity came with the request that carried JSON-RPC id 6 (say, the session's
    // earlier call or its initialize); the call being handled is id 7.
    let mut identity = good();
    identity.message.request_id = Some(RequestId::Number(6));
    assert_eq!(build(identity).unwrap_err(), ContextError::ForeignMessage);

    let mut identity = good();
    identity.message.request_id = None;
    assert_eq!(build(identity).unwrap_err(), ContextError::ForeignMessage);

    // Same number, different type: "7" is not 7.
    let mut identity = good();
    identity.message.request_id = Some(RequestId::String("7".into()));
    assert_eq!(build(identity).unwrap_err(), ContextError::ForeignMessage);
}

#[test]
fn check2_an_identity_from_another_session_fails() {
    let mut identity = good();
    identity.message.session_id = Some("session-2".into());
    assert_eq!(build(identity).unwrap_err(), ContextError::ForeignMessage);

    let mut identity = good();
    identity.message.session_id = None;
    assert_eq!(build(identity).unwrap_err(), ContextError::ForeignMessage);
}

#[test]
fn check2_a_session_bound_to_another_principal_fails() {
    let identity = good();
    let sessions = SessionRegistry::new();
    sessions.bind(SESSION, Principal { tenant: TenantId::generate(), user: UserId::generate() });
    let parts = parts_with(Some(identity));
    let id = call_id();
    let result = McpCallContext::for_call(
        CallSite { parts: Some(&parts), request_id: &id, session_id: Some(SESSION) },
        &sessions,
    );
    assert_eq!(result.unwrap_err(), ContextError::SessionMismatch);
}

#[test]
fn check2_a_session_nobody_bound_fails() {
    let identity = good();
    let parts = parts_with(Some(identity));
    let id = call_id();
    let result = McpCallContext::for_call(
        CallSite { parts: Some(&parts), request_id: &id, session_id: Some(SESSION) },
        &SessionRegistry::new(),
    );
    assert_eq!(result.unwrap_err(), ContextError::SessionMismatch);
}

// Check 3 ------------------------------------------------------------------------------

#[test]
fn check3_an_unresolved_tenant_fails() {
    let mut identity = good();
    identity.tenant = TenantContext::default();
    assert_eq!(build_sessionless(identity).unwrap_err(), ContextError::Unresolved("tenant"));
}

/// Builds a session-less call so check 2's session lookup can't be what refuses.
fn build_sessionless(mut identity: ResolvedIdentity) -> Result<McpCallContext, ContextError> {
    identity.message.session_id = None;
    let parts = parts_with(Some(identity));
    let id = call_id();
    McpCallContext::for_call(
        CallSite { parts: Some(&parts), request_id: &id, session_id: None },
        &SessionRegistry::new(),
    )
}

#[test]
fn check3_an_unresolved_user_fails() {
    let mut identity = good();
    identity.user = CurrentUserContext::default();
    assert_eq!(build_sessionless(identity).unwrap_err(), ContextError::Unresolved("user"));
}

#[test]
fn check3_an_unresolved_flock_scope_fails() {
    let mut identity = good();
    identity.flocks = FlockScope::unresolved();
    assert_eq!(build(identity).unwrap_err(), ContextError::Unresolved("flock scope"));
}

/// The plausible wrong fix: gating on `is_unrestricted()` instead of `is_resolved()`.
/// An owner's scope derived from roles but never confirmed is unrestricted AND unresolved;
/// it must be refused.
#[test]
fn check3_an_unresolved_scope_that_would_default_to_unrestricted_fails() {
    let mut identity = good();
    identity.user = user(vec![Role::Owner]);
    identity.flocks = FlockScope::pending(&[Role::Owner]);
    assert!(identity.flocks.is_unrestricted(), "precondition: the scope looks unrestricted");
    assert!(!identity.flocks.is_resolved(), "precondition: the scope is not resolved");
    assert_eq!(build(identity).unwrap_err(), ContextError::Unresolved("flock scope"));
}

// Check 4 ------------------------------------------------------------------------------

#[test]
fn check4_a_system_actor_fails() {
    let mut identity = good();
    identity.user = CurrentUserContext::system_actor("service:billing");
    identity.flocks = FlockScope::pending(&[]).resolve([]);
    assert_eq!(build(identity).unwrap_err(), ContextError::SystemActor);
}
