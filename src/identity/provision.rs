//! Users made on first sight: a verified token of a subject its tenant does not have becomes a
//! user of that tenant when the tenant opted in (`store::provisioning`), with exactly the roles
//! its groups map to. Fail closed: no provisioning, no group claim, or no group that maps to a
//! role, and nothing is made (the token is refused as any unknown user's). The new user and its
//! audit event (`admin.user.provision`) are written in one transaction.

use serde_json::Value;

use crate::audit::{self, AuditEvent, Outcome};
use crate::auth::Claims;
use crate::store::{AuditEventId, Db, StoreError, TenantId, admin, now_millis, provisioning};

/// Makes the user `claims` name in `tenant`, if its provisioning admits it. True when a user
/// was made (or another request made it meanwhile).
pub(super) async fn provision(db: &Db, tenant: TenantId, slug: &str, claims: &Claims) -> Result<bool, StoreError> {
    // Read first without the write lock: a tenant that does not provision (the usual case)
    // costs an unknown subject one plain read, never a write transaction.
    let config = {
        let mut conn = db.pool().acquire().await?;
        provisioning::get(&mut conn, tenant).await?
    };
    if config.as_ref().is_none_or(|c| c.roles_of(&groups_of(claims, &c.role_claim)).is_empty()) {
        return Ok(false);
    }
    // Then again inside the transaction that makes the user: a change of the provisioning
    // made meanwhile is what counts.
    let mut tx = db.begin().await?;
    let Some(config) = provisioning::get(&mut tx, tenant).await? else { return Ok(false) };
    let groups = groups_of(claims, &config.role_claim);
    let roles = config.roles_of(&groups);
    if roles.is_empty() {
        tracing::info!(tenant = %slug, "provisioning: no group of the token maps to a role");
        return Ok(false);
    }
    let name = claims
        .rest
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| admin::validate_text("display_name", n, 200).is_ok())
        .unwrap_or(&claims.subject);
    let user = match admin::create_user(&mut tx, slug, &claims.subject, name, &roles).await {
        Ok(user) => user,
        // Another request of the same subject made it first.
        Err(StoreError::Conflict(_)) => return Ok(true),
        // A subject the gateway would not store (an invisible or reordering character): nobody
        // is made, and the token is refused as any unknown user's.
        Err(StoreError::Invalid { field, message }) => {
            tracing::info!(tenant = %slug, field, %message, "provisioning: the token's subject is refused");
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let view = serde_json::json!({
        "subject": claims.subject,
        "display_name": name,
        "roles": roles.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        "groups": groups,
    });
    let digest = crate::vocab::digest::sha256_hex(crate::vocab::digest::canonical_json(&view).as_bytes());
    let event = AuditEvent {
        id: AuditEventId::generate(),
        tenant,
        occurred_at: now_millis(),
        user,
        session_id: None,
        request_id: None,
        client_name: Some("scopegate-provisioning".into()),
        client_version: Some(env!("CARGO_PKG_VERSION").into()),
        action: "admin.user.provision".into(),
        tool: Some(format!("tenants/{}/users/{}", slug, claims.subject)),
        args_digest: Some(digest.clone()),
        args_raw: Some(crate::vocab::digest::canonical_json(&serde_json::json!({
            "actor": format!("provisioning:{}", config.role_claim),
            "before": Value::Null,
            "after": digest,
        }))),
        outcome: Outcome::Ok,
        error_class: None,
        duration_us: 0,
        calls: 1,
        policy: None,
        call_id: None,
        result_digest: None,
    };
    audit::append(&mut tx, &None, &event).await?;
    tx.commit().await?;
    tracing::info!(tenant = %slug, user = %user, roles = ?roles, "user provisioned on first sight");
    Ok(true)
}

/// The groups a token's `claim` names: a string, or the strings of an array.
fn groups_of<'a>(claims: &'a Claims, claim: &str) -> Vec<&'a str> {
    match claims.rest.get(claim) {
        Some(Value::String(group)) => vec![group.as_str()],
        Some(Value::Array(groups)) => groups.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}
