//! A tenant's provisioning: the claim of its users' tokens that names their groups, and the
//! roles each group gives. Read when a verified token names a subject the tenant does not
//! have (see `identity::provision`).

use std::collections::BTreeMap;

use sqlx::AnyConnection;

use super::{StoreError, TenantId, now_millis};
use crate::model::Role;

/// A tenant's provisioning: the claim, and each group's roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioning {
    pub role_claim: String,
    pub roles: BTreeMap<String, Vec<Role>>,
}

impl Provisioning {
    /// The roles the groups of a token give: those the map names for them, nothing else.
    pub fn roles_of(&self, groups: &[&str]) -> Vec<Role> {
        let mut roles: Vec<Role> = groups.iter().filter_map(|g| self.roles.get(*g)).flatten().copied().collect();
        roles.sort();
        roles.dedup();
        roles
    }
}

/// The tenant's provisioning, if it opted in.
pub async fn get(conn: &mut AnyConnection, tenant: TenantId) -> Result<Option<Provisioning>, StoreError> {
    let claim: Option<String> = sqlx::query_scalar("SELECT role_claim FROM tenant_provisioning WHERE tenant_id = $1")
        .bind(tenant)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(role_claim) = claim else { return Ok(None) };
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT claim_value, role FROM tenant_role_map WHERE tenant_id = $1 ORDER BY claim_value, role")
            .bind(tenant)
            .fetch_all(conn)
            .await?;
    let mut roles: BTreeMap<String, Vec<Role>> = BTreeMap::new();
    for (value, role) in rows {
        // The table's CHECK admits only the four roles; anything else is a broken database.
        let role: Role = role.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        roles.entry(value).or_default().push(role);
    }
    for list in roles.values_mut() {
        list.sort();
    }
    Ok(Some(Provisioning { role_claim, roles }))
}

/// Replaces the tenant's provisioning with `config` (checked first: a claim name, and groups of
/// 1 to 256 characters each mapping to at least one role).
pub async fn set(conn: &mut AnyConnection, tenant: TenantId, config: &Provisioning) -> Result<(), StoreError> {
    let claim = &config.role_claim;
    if claim.is_empty() || claim.len() > 128 || crate::vocab::text::hidden_char(claim).is_some() {
        return Err(StoreError::Invalid { field: "role_claim", message: "must be 1-128 printable characters".into() });
    }
    for (group, roles) in &config.roles {
        if group.is_empty() || group.len() > 256 || crate::vocab::text::hidden_char(group).is_some() {
            return Err(StoreError::Invalid {
                field: "roles",
                message: format!("group `{group}` must be 1-256 printable characters"),
            });
        }
        if roles.is_empty() {
            return Err(StoreError::Invalid { field: "roles", message: format!("group `{group}` maps to no role") });
        }
    }
    delete(&mut *conn, tenant).await?;
    sqlx::query("INSERT INTO tenant_provisioning (tenant_id, role_claim, created_at) VALUES ($1, $2, $3)")
        .bind(tenant)
        .bind(claim)
        .bind(now_millis())
        .execute(&mut *conn)
        .await?;
    for (group, roles) in &config.roles {
        let mut roles = roles.clone();
        roles.sort();
        roles.dedup();
        for role in roles {
            sqlx::query("INSERT INTO tenant_role_map (tenant_id, claim_value, role) VALUES ($1, $2, $3)")
                .bind(tenant)
                .bind(group)
                .bind(role.as_str())
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

/// Turns the tenant's provisioning off. False when it was off.
pub async fn delete(conn: &mut AnyConnection, tenant: TenantId) -> Result<bool, StoreError> {
    sqlx::query("DELETE FROM tenant_role_map WHERE tenant_id = $1").bind(tenant).execute(&mut *conn).await?;
    let done = sqlx::query("DELETE FROM tenant_provisioning WHERE tenant_id = $1").bind(tenant).execute(conn).await?;
    Ok(done.rows_affected() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_gets_only_the_roles_its_groups_map_to() {
        let config = Provisioning {
            role_claim: "groups".into(),
            roles: BTreeMap::from([
                ("farmhands".to_owned(), vec![Role::Worker]),
                ("bosses".to_owned(), vec![Role::Manager, Role::Auditor]),
            ]),
        };
        assert_eq!(config.roles_of(&["farmhands", "admins", "root"]), vec![Role::Worker]);
        assert_eq!(config.roles_of(&["bosses", "farmhands"]), vec![Role::Manager, Role::Worker, Role::Auditor]);
        assert!(config.roles_of(&["admins"]).is_empty());
        assert!(config.roles_of(&[]).is_empty());
    }
}
