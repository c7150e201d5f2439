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

/// One statement, one row: the tenant by slug, the user by (tenant, subject), and the
/// user's roles and flock assignments aggregated beside them (each a lookup on a unique or
/// primary-key index, so the cost does not depend on the number of users). The user, role
/// and assignment lookups are bound to the tenant found by slug, so a user of another tenant
/// never matches. Roles are lowercase names and flock ids UUIDs: neither holds a comma.
const LOOKUP: &str = "\
SELECT t.id, t.status, t.name, u.id, u.status, u.display_name, \
       (SELECT string_agg(r.role, ',') FROM user_roles r \
         WHERE r.user_id = u.id AND r.tenant_id = t.id), \
       (SELECT string_agg(fa.flock_id, ',') FROM flock_assignments fa \
         WHERE fa.user_id = u.id AND fa.tenant_id = t.id) \
  FROM tenants t LEFT JOIN users u ON u.tenant_id = t.id AND u.subject = $2 \
 WHERE t.slug = $1";

/// Only the tenant: for system actors, who have no user row.
const LOOKUP_TENANT: &str = "SELECT t.id, t.status, t.name FROM tenants t WHERE t.slug = $1";

impl Db {
    /// The identity change counter: bumped by a trigger on every change of tenants, users,
    /// roles and flock assignments (see the identity cache).
    pub async fn identity_epoch(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT epoch FROM identity_epoch WHERE id = 1").fetch_one(self.pool()).await?)
    }

    /// Reads the tenant, and unless `subject` is `None`, the user, roles and assignments.
    pub async fn load_principal(&self, tenant_slug: &str, subject: Option<&str>) -> Result<PrincipalRows, StoreError> {
        if tenant_slug == super::admin::PLATFORM_SLUG {
            // The platform chain's row is no tenant anybody belongs to.
            return Ok(PrincipalRows::default());
        }
        if tenant_slug.contains('\0') || subject.is_some_and(|s| s.contains('\0')) {
            // No stored slug or subject holds U+0000 (they are validated printable), and
            // PostgreSQL would refuse the text outright: nobody, on either database.
            return Ok(PrincipalRows::default());
        }
        let row = match subject {
            Some(subject) => sqlx::query(LOOKUP).bind(tenant_slug).bind(subject).fetch_optional(self.pool()).await?,
            None => sqlx::query(LOOKUP_TENANT).bind(tenant_slug).fetch_optional(self.pool()).await?,
        };
        let mut out = PrincipalRows::default();
        let Some(row) = row else {
            return Ok(out);
        };
        let id: String = row.try_get(0)?;
        out.tenant = Some(TenantRow { id: parse_id(&id)?, status: row.try_get(1)?, name: row.try_get(2)? });
        if subject.is_none() {
            return Ok(out);
        }
        if let Some(id) = row.try_get::<Option<String>, _>(3)? {
            out.user = Some(UserRow { id: parse_id(&id)?, status: row.try_get(4)?, display_name: row.try_get(5)? });
        }
        if let Some(roles) = row.try_get::<Option<String>, _>(6)? {
            out.roles = roles.split(',').map(str::to_owned).collect();
        }
        if let Some(flocks) = row.try_get::<Option<String>, _>(7)? {
            out.assigned_flocks = flocks.split(',').map(parse_id).collect::<Result<_, _>>()?;
        }
        Ok(out)
    }
}

fn parse_id<T: std::str::FromStr<Err = uuid::Error>>(text: &str) -> Result<T, StoreError> {
    text.parse().map_err(|e: uuid::Error| StoreError::Invalid { field: "id", message: e.to_string() })
}
