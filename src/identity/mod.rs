//! Identity: who is calling, resolved once per HTTP request from verified claims and the
//! database. Owns the raw identity types; nothing outside this module can name them.
//!
//! `TenantContext`, `CurrentUserContext`, `FlockScope` and `ResolvedIdentity` are visible
//! only inside `crate::identity`. Code elsewhere (tools above all) learns the caller only
//! through [`McpCallContext`], which is built per tool call by a factory that fails closed.

mod cache;
mod context;
mod flock_scope;
mod issuers;
mod middleware;
mod provision;
mod resolver;
pub mod scoped;
mod sessions;
mod tenant;
mod user;

pub(crate) use cache::{Epoch, IdentityCache};
pub use context::{CallSite, ContextError, FlockAccess, McpCallContext};
pub(crate) use issuers::TrustedIssuers;
pub(crate) use middleware::{Gate, SESSION_HEADER, authenticate, bearer_token};
pub use resolver::IdentityError;
pub use sessions::{InFlight, Principal, SessionRegistry, Slot};

use rmcp::model::RequestId;

use flock_scope::FlockScope;
use tenant::TenantContext;
use user::CurrentUserContext;

/// Verifies a bearer token, whoever issued it: the gateway's own issuer (`auth.issuer`, or the
/// development secret), or an issuer a tenant trusts (then only that tenant's: see
/// [`Authenticator::verify_trusted`]). Answers the claims and the tenant the token names, if any.
pub(crate) async fn verify_bearer(
    authenticator: &crate::auth::Authenticator,
    trusted: &TrustedIssuers,
    token: &str,
) -> Result<(crate::auth::Claims, Option<String>), crate::auth::AuthError> {
    let Some(issuer) = authenticator.foreign_issuer(token) else {
        return authenticator.verify_any_tenant(token).await;
    };
    let trusts = trusted.of(&issuer).await.map_err(|e| {
        tracing::error!(error = %e, "reading the tenants' trusted issuers failed; refusing the token");
        crate::auth::AuthError::KeysUnavailable
    })?;
    let claims = authenticator.verify_trusted(token, &issuer, &trusts).await?;
    let tenant = claims.tenant.clone();
    Ok((claims, Some(tenant)))
}

/// The JSON-RPC message an identity was resolved for: the body of the HTTP request that
/// the middleware authenticated. A tool call must match it exactly (check 2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::identity) struct MessageBinding {
    pub request_id: Option<RequestId>,
    pub session_id: Option<String>,
}

/// Everything known about the caller of one HTTP request. One per request, behind an
/// `Arc`, in the request's extensions.
#[derive(Debug)]
pub(in crate::identity) struct ResolvedIdentity {
    pub tenant: TenantContext,
    pub user: CurrentUserContext,
    pub flocks: FlockScope,
    pub message: MessageBinding,
    /// `exp` of the token this identity came from (Unix seconds).
    pub expires_at: i64,
    /// The token's claims named in `auth.policy_claims`, as text (what policies read).
    pub policy_claims: Vec<(String, String)>,
}

impl ResolvedIdentity {
    pub fn principal(&self) -> Option<Principal> {
        Some(Principal { tenant: self.tenant.get()?.id, user: self.user.get()?.id })
    }
}

/// The principal and token expiry of the identity the middleware put on a request, as
/// plain values (for session binding). `None` when the request carries no identity.
pub(crate) fn request_principal(extensions: &http::Extensions) -> Option<(Principal, i64)> {
    let identity = extensions.get::<std::sync::Arc<ResolvedIdentity>>()?;
    Some((identity.principal()?, identity.expires_at))
}
