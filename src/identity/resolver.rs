//! Identity resolution: verified claims + one database round trip -> a ResolvedIdentity,
//! or a refusal. Decides tenant, user and flock scope; never widens a scope.

use super::flock_scope::FlockScope;
use super::tenant::{Tenant, TenantContext};
use super::user::{CurrentUserContext, User};
use super::{MessageBinding, ResolvedIdentity};
use crate::auth::Claims;
use crate::model::Role;
use crate::store::{Db, StoreError};

/// Why a verified token does not get an identity. The first four answer 403 with the same
/// body (the caller learns nothing about which part failed); `Store` answers 503.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("unknown tenant")]
    UnknownTenant,
    #[error("tenant suspended")]
    SuspendedTenant,
    #[error("unknown user")]
    UnknownUser,
    #[error("user disabled")]
    DisabledUser,
    #[error("identity lookup failed: {0}")]
    Store(#[from] StoreError),
}

impl IdentityError {
    pub fn reason(&self) -> &'static str {
        match self {
            IdentityError::UnknownTenant => "unknown_tenant",
            IdentityError::SuspendedTenant => "suspended_tenant",
            IdentityError::UnknownUser => "unknown_user",
            IdentityError::DisabledUser => "disabled_user",
            IdentityError::Store(_) => "store",
        }
    }
}

/// Resolves `claims` in one query. `service_subjects` are system actors: tenant only,
/// nil user, no roles, no flocks.
pub(in crate::identity) async fn resolve(
    db: &Db,
    cache: Option<&super::IdentityCache>,
    claims: &Claims,
    service_subjects: &[String],
    message: MessageBinding,
) -> Result<ResolvedIdentity, IdentityError> {
    // A tenant's own identity provider names that tenant's users only, never a service.
    let is_service = !claims.tenant_issuer && service_subjects.iter().any(|s| s == &claims.subject);
    let subject = (!is_service).then_some(claims.subject.as_str());
    let cached = cache.and_then(|c| c.get(&claims.tenant, subject));
    crate::telemetry::metrics::identity_lookup(cached.is_some());
    let rows = match cached {
        Some(rows) => rows,
        None => {
            // The change counter before the read: the rows are at least that new.
            let epoch = cache.and_then(super::IdentityCache::epoch);
            let rows = std::sync::Arc::new(db.load_principal(claims.tenant_key(), subject).await?);
            if let (Some(cache), Some(epoch)) = (cache, epoch) {
                cache.put(&claims.tenant, subject, epoch, std::sync::Arc::clone(&rows));
            }
            rows
        }
    };

    let tenant_row = rows.tenant.clone().ok_or(IdentityError::UnknownTenant)?;
    if tenant_row.status != "active" {
        return Err(IdentityError::SuspendedTenant);
    }
    let tenant = TenantContext::resolved(Tenant {
        id: tenant_row.id,
        slug: tenant_row.slug.clone(),
        name: tenant_row.name,
        audit_write_ahead: tenant_row.audit_write_ahead,
    });

    if is_service {
        return Ok(ResolvedIdentity {
            tenant,
            user: CurrentUserContext::system_actor(&claims.subject),
            flocks: FlockScope::pending(&[]).resolve([]),
            message,
            expires_at: claims.expires_at,
            policy_claims: Vec::new(),
        });
    }

    // A subject the tenant does not have: made now if the tenant provisions users on first
    // sight and the token's groups map to a role, then read as any user is.
    let rows = match rows.user {
        Some(_) => rows,
        None if super::provision::provision(db, tenant_row.id, &tenant_row.slug, claims).await? => {
            std::sync::Arc::new(db.load_principal(claims.tenant_key(), subject).await?)
        }
        None => return Err(IdentityError::UnknownUser),
    };
    let user_row = rows.user.clone().ok_or(IdentityError::UnknownUser)?;
    if user_row.status != "active" {
        return Err(IdentityError::DisabledUser);
    }
    let mut roles = Vec::with_capacity(rows.roles.len());
    for role in &rows.roles {
        let role: Role = role
            .parse()
            .map_err(|e: crate::model::UnknownRole| StoreError::Invalid { field: "role", message: e.to_string() })?;
        roles.push(role);
    }
    roles.sort();
    let flocks = FlockScope::pending(&roles).resolve(rows.assigned_flocks.iter().copied());
    Ok(ResolvedIdentity {
        tenant,
        user: CurrentUserContext::resolved(User {
            id: user_row.id,
            subject: claims.subject.clone(),
            display_name: user_row.display_name,
            roles,
        }),
        flocks,
        message,
        expires_at: claims.expires_at,
        policy_claims: Vec::new(),
    })
}
