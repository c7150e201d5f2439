//! The one-round-trip lookup behind identity resolution; returns rows, decides nothing.

use sqlx::Row;

use super::{Db, FlockId, StoreError, TenantId, UserId};

/// Everything the database knows about (tenant slug, subject), as read in one query.
#[derive(Debug, Default, Clone)]
pub struct PrincipalRows {
    pub tenant: Option<TenantRow>,
    pub user: Option<UserRow>,
    pub roles: Vec<String>,
    pub assigned_flocks: Vec<FlockId>,
}

#[derive(Debug, Clone)]
pub struct TenantRow {
    pub id: TenantId,
    pub name: String,
    pub status: String,
}

#[derive(Debug, Clone)]
pub struct UserRow {
    pub id: UserId,
    pub display_name: String,
    pub status: String,
}

/// One statement, four indexed lookups glued with UNION ALL: the tenant by slug, the
/// user by (tenant, subject), the user's roles and flock assignments. The user, role
/// and assignment rows join through the tenant slug, so a user of another tenant never
/// matches. Cost does not depend on the number of users (unique indexes throughout).
const LOOKUP: &str = "\
SELECT 'tenant' AS kind, t.id AS a, t.status AS b, t.name AS c \
  FROM tenants t WHERE t.slug = $1 \
UNION ALL \
SELECT 'user', u.id, u.status, u.display_name \
  FROM tenants t JOIN users u ON u.tenant_id = t.id \
 WHERE t.slug = $1 AND u.subject = $2 \
UNION ALL \
SELECT 'role', r.role, '', '' \
  FROM tenants t JOIN users u ON u.tenant_id = t.id \
  JOIN user_roles r ON r.user_id = u.id AND r.tenant_id = t.id \
 WHERE t.slug = $1 AND u.subject = $2 \
UNION ALL \
SELECT 'flock', fa.flock_id, '', '' \
  FROM tenants t JOIN users u ON u.tenant_id = t.id \
  JOIN flock_assignments fa ON fa.user_id = u.id AND fa.tenant_id = t.id \
 WHERE t.slug = $1 AND u.subject = $2";

/// Only the tenant: for system actors, who have no user row.
const LOOKUP_TENANT: &str = "SELECT 'tenant' AS kind, t.id AS a, t.status AS b, t.name AS c \
  FROM tenants t WHERE t.slug = $1";

impl Db {
    /// Reads the tenant, and unless `subject` is `None`, the user, roles and assignments.
    pub async fn load_principal(&self, tenant_slug: &str, subject: Option<&str>) -> Result<PrincipalRows, StoreError> {
        let rows = match subject {
            Some(subject) => sqlx::query(LOOKUP).bind(tenant_slug).bind(subject).fetch_all(self.pool()).await?,
            None => sqlx::query(LOOKUP_TENANT).bind(tenant_slug).fetch_all(self.pool()).await?,
        };
        let mut out = PrincipalRows::default();
        for row in rows {
            let kind: String = row.try_get(0)?;
            let a: String = row.try_get(1)?;
            let b: String = row.try_get(2)?;
            let c: String = row.try_get(3)?;
            match kind.as_str() {
                "tenant" => out.tenant = Some(TenantRow { id: parse_id(&a)?, name: c, status: b }),
                "user" => out.user = Some(UserRow { id: parse_id(&a)?, display_name: c, status: b }),
                "role" => out.roles.push(a),
                "flock" => out.assigned_flocks.push(parse_id(&a)?),
                other => {
                    return Err(StoreError::Invalid { field: "kind", message: format!("unexpected row kind {other}") });
                }
            }
        }
        Ok(out)
    }
}

fn parse_id<T: std::str::FromStr<Err = uuid::Error>>(text: &str) -> Result<T, StoreError> {
    text.parse().map_err(|e: uuid::Error| StoreError::Invalid { field: "id", message: e.to_string() })
}
