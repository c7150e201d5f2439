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
    pub slug: String,
    pub name: String,
    pub status: String,
    /// The tenant's call records are committed before the call is forwarded.
    pub audit_write_ahead: bool,
}

#[derive(Debug, Clone)]
pub struct UserRow {
    pub id: UserId,
    pub display_name: String,
    pub status: String,
}

/// How a token names its tenant: by slug, or by the organization id recorded on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantKey<'a> {
    Slug(&'a str),
    OrgId(&'a str),
}

impl TenantKey<'_> {
    fn text(&self) -> &str {
        match self {
            TenantKey::Slug(s) | TenantKey::OrgId(s) => s,
        }
    }
}

/// One statement, one row: the tenant by slug (or organization id), the user by (tenant,
/// subject), and the user's roles and flock assignments aggregated beside them (each a lookup
/// on a unique or primary-key index, so the cost does not depend on the number of users). The
/// user, role and assignment lookups are bound to the tenant found, so a user of another tenant
/// never matches. Roles are lowercase names and flock ids UUIDs: neither holds a comma.
macro_rules! lookup {
    ($by:literal) => {
        concat!(
            "SELECT t.id, t.status, t.name, t.slug, t.audit_write_ahead, u.id, u.status, u.display_name, ",
            "(SELECT string_agg(r.role, ',') FROM user_roles r WHERE r.user_id = u.id AND r.tenant_id = t.id), ",
            "(SELECT string_agg(fa.flock_id, ',') FROM flock_assignments fa ",
            "WHERE fa.user_id = u.id AND fa.tenant_id = t.id) ",
            "FROM tenants t LEFT JOIN users u ON u.tenant_id = t.id AND u.subject = $2 WHERE t.",
            $by,
            " = $1"
        )
    };
}
const LOOKUP_BY_SLUG: &str = lookup!("slug");
const LOOKUP_BY_ORG: &str = lookup!("org_id");

/// Only the tenant: for system actors, who have no user row.
const TENANT_BY_SLUG: &str =
    "SELECT t.id, t.status, t.name, t.slug, t.audit_write_ahead FROM tenants t WHERE t.slug = $1";
const TENANT_BY_ORG: &str =
    "SELECT t.id, t.status, t.name, t.slug, t.audit_write_ahead FROM tenants t WHERE t.org_id = $1";

impl Db {
    /// The identity change counter: bumped by a trigger on every change of tenants, users,
    /// roles and flock assignments (see the identity cache).
    pub async fn identity_epoch(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT epoch FROM identity_epoch WHERE id = 1").fetch_one(self.pool()).await?)
    }

    /// Reads the tenant, and unless `subject` is `None`, the user, roles and assignments.
    pub async fn load_principal(
        &self,
        tenant: TenantKey<'_>,
        subject: Option<&str>,
    ) -> Result<PrincipalRows, StoreError> {
        if tenant == TenantKey::Slug(super::admin::PLATFORM_SLUG) {
            // The platform chain's row is no tenant anybody belongs to.
            return Ok(PrincipalRows::default());
        }
        if tenant.text().contains('\0') || subject.is_some_and(|s| s.contains('\0')) {
            // No stored slug, organization id or subject holds U+0000 (they are validated
            // printable), and PostgreSQL would refuse the text outright: nobody, on either
            // database.
            return Ok(PrincipalRows::default());
        }
        let query = match (tenant, subject.is_some()) {
            (TenantKey::Slug(_), true) => LOOKUP_BY_SLUG,
            (TenantKey::OrgId(_), true) => LOOKUP_BY_ORG,
            (TenantKey::Slug(_), false) => TENANT_BY_SLUG,
            (TenantKey::OrgId(_), false) => TENANT_BY_ORG,
        };
        let mut query = sqlx::query(query).bind(tenant.text());
        if let Some(subject) = subject {
            query = query.bind(subject);
        }
        let mut out = PrincipalRows::default();
        let Some(row) = query.fetch_optional(self.pool()).await? else {
            return Ok(out);
        };
        let id: String = row.try_get(0)?;
        out.tenant = Some(TenantRow {
            id: parse_id(&id)?,
            status: row.try_get(1)?,
            name: row.try_get(2)?,
            slug: row.try_get(3)?,
            audit_write_ahead: row.try_get::<i64, _>(4)? != 0,
        });
        if subject.is_none() {
            return Ok(out);
        }
        if let Some(id) = row.try_get::<Option<String>, _>(5)? {
            out.user = Some(UserRow { id: parse_id(&id)?, status: row.try_get(6)?, display_name: row.try_get(7)? });
        }
        if let Some(roles) = row.try_get::<Option<String>, _>(8)? {
            out.roles = roles.split(',').map(str::to_owned).collect();
        }
        if let Some(flocks) = row.try_get::<Option<String>, _>(9)? {
            out.assigned_flocks = flocks.split(',').map(parse_id).collect::<Result<_, _>>()?;
        }
        Ok(out)
    }
}

fn parse_id<T: std::str::FromStr<Err = uuid::Error>>(text: &str) -> Result<T, StoreError> {
    text.parse().map_err(|e: uuid::Error| StoreError::Invalid { field: "id", message: e.to_string() })
}
