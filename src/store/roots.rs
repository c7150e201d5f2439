//! Root allowances: which role of a tenant may select plugin roots at or below which base on a
//! remote executor the tenant owns. Stores and lists them; never decides a selection (that is
//! [`crate::selection::roots::check_root_selection`], over the rows read here).
//!
//! Each write is checked whole before it writes: an unknown tenant or executor, an executor
//! the tenant does not own (`local` included: it is the gateway host, whose files a session
//! never selects), a base that is not a canonical `file:` URI, or an allowance that already
//! exists is refused and nothing is written. A duplicate is a conflict, not a silent success,
//! like a duplicate grant. Administrative writes are not audit events (none of `admin` writes
//! one); the allowance row keeps its `created_at`.

use serde::Serialize;
use sqlx::{AnyConnection, Row};

use super::admin::tenant_id_by_slug;
use super::{Db, RootAllowanceId, StoreError, TenantId, now_millis, unique_conflict};
use crate::decl::canonical::parse_canonical;
use crate::model::Role;

/// The longest base the store keeps (the table checks it too).
pub const MAX_BASE_LEN: usize = 1024;

/// One allowance: `role` of the tenant may select roots at or below `base` on `executor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RootAllowance {
    pub id: RootAllowanceId,
    /// The executor's name.
    pub executor: String,
    /// A canonical `file:` URI.
    pub base: String,
    pub role: Role,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// `base` as it will be stored: a canonical `file:` URI, named `under` after the command's flag.
fn validate_base(base: &str) -> Result<(), StoreError> {
    if base.len() > MAX_BASE_LEN {
        return Err(StoreError::Invalid { field: "under", message: format!("longer than {MAX_BASE_LEN} bytes") });
    }
    parse_canonical(base).map_err(|e| StoreError::Invalid { field: "under", message: e.to_string() })?;
    Ok(())
}

/// The id of the remote executor `name` if the tenant owns it; otherwise a refusal naming
/// `executor` (the local executor has no owners, so it is refused here too).
async fn owned_executor_id(
    conn: &mut AnyConnection,
    tenant: TenantId,
    tenant_slug: &str,
    name: &str,
) -> Result<String, StoreError> {
    let (id, kind): (String, String) = sqlx::query_as("SELECT id, kind FROM executors WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("executor `{name}` does not exist")))?;
    if kind != "remote" {
        return Err(StoreError::Invalid {
            field: "executor",
            message: format!("`{name}` is a {kind} executor: roots are selected only on a remote executor"),
        });
    }
    super::entities::require_owner(&mut *conn, &id, tenant, tenant_slug, name).await?;
    Ok(id)
}

/// Lets `role` of the tenant select roots at or below `base` on the remote executor
/// `executor`, which the tenant must own. Returns the new allowance's id.
pub async fn allow_root(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    executor: &str,
    base: &str,
    role: Role,
) -> Result<RootAllowanceId, StoreError> {
    validate_base(base)?;
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let executor_id = owned_executor_id(&mut *conn, tenant, tenant_slug, executor).await?;
    let id = RootAllowanceId::generate();
    sqlx::query(
        "INSERT INTO executor_root_allowances (id, tenant_id, executor_id, base, role, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(tenant)
    .bind(executor_id)
    .bind(base)
    .bind(role.as_str())
    .bind(now_millis())
    .execute(conn)
    .await
    .map_err(|e| {
        unique_conflict(e, || {
            format!("`{role}` may already select roots under `{base}` on `{executor}` in `{tenant_slug}`")
        })
    })?;
    Ok(id)
}

const ALLOWANCES: &str = "\
SELECT a.id, x.name AS executor, a.base, a.role, a.created_at \
  FROM executor_root_allowances a JOIN executors x ON x.id = a.executor_id \
 WHERE a.tenant_id = $1 AND ($2 = '' OR x.name = $2) \
 ORDER BY x.name, a.base, a.role";

fn allowance_from_row(row: &sqlx::any::AnyRow) -> Result<RootAllowance, StoreError> {
    let role: String = row.try_get("role")?;
    Ok(RootAllowance {
        id: row.try_get("id")?,
        executor: row.try_get("executor")?,
        base: row.try_get("base")?,
        // The table's CHECK admits only the four roles; anything else is a broken database.
        role: role.parse().map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        created_at: row.try_get("created_at")?,
    })
}

async fn allowances(
    conn: &mut AnyConnection,
    tenant: TenantId,
    executor: Option<&str>,
) -> Result<Vec<RootAllowance>, StoreError> {
    let rows = sqlx::query(ALLOWANCES).bind(tenant).bind(executor.unwrap_or_default()).fetch_all(conn).await?;
    rows.iter().map(allowance_from_row).collect()
}

/// The tenant's allowances, of every executor or of `executor` only (which must exist),
/// ordered by executor, base and role.
pub async fn list_root_allowances(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    executor: Option<&str>,
) -> Result<Vec<RootAllowance>, StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    if let Some(name) = executor {
        let exists: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM executors WHERE name = $1")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        if exists == 0 {
            return Err(StoreError::NotFound(format!("executor `{name}` does not exist")));
        }
    }
    allowances(conn, tenant, executor).await
}

/// Deletes the tenant's allowance `id`. Another tenant's id is answered like an unknown one.
pub async fn delete_root_allowance(conn: &mut AnyConnection, tenant_slug: &str, id: &str) -> Result<(), StoreError> {
    let parsed: RootAllowanceId = id
        .parse()
        .map_err(|_| StoreError::Invalid { field: "id", message: format!("`{id}` is not an allowance id (a UUID)") })?;
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let done = sqlx::query("DELETE FROM executor_root_allowances WHERE tenant_id = $1 AND id = $2")
        .bind(tenant)
        .bind(parsed)
        .execute(conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("root allowance `{id}` does not exist in `{tenant_slug}`")));
    }
    Ok(())
}

impl Db {
    /// Every root allowance of the tenant (all executors), in one query: the rows
    /// [`crate::selection::roots::check_root_selection`] decides over.
    pub async fn root_allowances(&self, tenant: TenantId) -> Result<Vec<RootAllowance>, StoreError> {
        let mut conn = self.pool().acquire().await?;
        allowances(&mut conn, tenant, None).await
    }

    /// The names of the remote executors the tenant owns, sorted.
    pub async fn owned_executors(&self, tenant: TenantId) -> Result<Vec<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT x.name FROM executor_owners o JOIN executors x ON x.id = o.executor_id \
              WHERE o.tenant_id = $1 AND x.kind = 'remote' ORDER BY x.name",
        )
        .bind(tenant)
        .fetch_all(self.pool())
        .await?)
    }
}
