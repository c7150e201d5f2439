//! The rows policies are made of: each tenant's Cedar policies and the platform's (on the
//! platform chain's row), a tenant's policy mode, and the tool catalogue its schema is generated
//! from. SQL only; what the text means is `policy`'s.

use sqlx::{AnyConnection, Row};

use super::{Db, StoreError, TenantId, now_millis};
use crate::vocab::digest::sha256_hex;

/// One stored policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRow {
    pub name: String,
    pub body: String,
    pub digest: String,
    /// `enforce` or `log_only`.
    pub mode: String,
    pub created_at: i64,
    pub updated_at: i64,
}

fn policy_from_row(row: &sqlx::any::AnyRow) -> Result<PolicyRow, StoreError> {
    Ok(PolicyRow {
        name: row.try_get("name")?,
        body: row.try_get("body")?,
        digest: row.try_get("digest")?,
        mode: row.try_get("mode")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

const POLICIES: &str =
    "SELECT name, body, digest, mode, created_at, updated_at FROM policies WHERE tenant_id = $1 ORDER BY name";

/// The policies of `owner` (a tenant, or the platform chain's id for the platform's), by name.
pub async fn list_policies(conn: &mut AnyConnection, owner: TenantId) -> Result<Vec<PolicyRow>, StoreError> {
    let rows = sqlx::query(POLICIES).bind(owner).fetch_all(conn).await?;
    rows.iter().map(policy_from_row).collect()
}

pub async fn get_policy(
    conn: &mut AnyConnection,
    owner: TenantId,
    name: &str,
) -> Result<Option<PolicyRow>, StoreError> {
    let row = sqlx::query(
        "SELECT name, body, digest, mode, created_at, updated_at FROM policies WHERE tenant_id = $1 AND name = $2",
    )
    .bind(owner)
    .bind(name)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(policy_from_row).transpose()
}

/// Creates or replaces `owner`'s policy `name`; the row as it now is.
pub async fn put_policy(
    conn: &mut AnyConnection,
    owner: TenantId,
    name: &str,
    body: &str,
    mode: &str,
) -> Result<PolicyRow, StoreError> {
    let now = now_millis();
    let digest = sha256_hex(body.as_bytes());
    let updated = sqlx::query(
        "UPDATE policies SET body = $1, digest = $2, mode = $3, updated_at = $4 WHERE tenant_id = $5 AND name = $6",
    )
    .bind(body)
    .bind(&digest)
    .bind(mode)
    .bind(now)
    .bind(owner)
    .bind(name)
    .execute(&mut *conn)
    .await?;
    if updated.rows_affected() == 0 {
        sqlx::query(
            "INSERT INTO policies (id, tenant_id, name, body, digest, mode, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
        )
        .bind(uuid::Uuid::now_v7().to_string())
        .bind(owner)
        .bind(name)
        .bind(body)
        .bind(&digest)
        .bind(mode)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    get_policy(conn, owner, name).await?.ok_or_else(|| StoreError::NotFound(format!("policy `{name}`")))
}

/// Deletes `owner`'s policy `name`; whether there was one.
pub async fn delete_policy(conn: &mut AnyConnection, owner: TenantId, name: &str) -> Result<bool, StoreError> {
    let done = sqlx::query("DELETE FROM policies WHERE tenant_id = $1 AND name = $2")
        .bind(owner)
        .bind(name)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// A tenant's policy mode as stored (`enforce` or `log_only`).
pub async fn policy_mode(conn: &mut AnyConnection, tenant: TenantId) -> Result<String, StoreError> {
    Ok(sqlx::query_scalar("SELECT policy_mode FROM tenants WHERE id = $1").bind(tenant).fetch_one(conn).await?)
}

pub async fn set_policy_mode(conn: &mut AnyConnection, tenant: TenantId, mode: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE tenants SET policy_mode = $1 WHERE id = $2").bind(mode).bind(tenant).execute(conn).await?;
    Ok(())
}

/// The servers a tenant bound, by name.
pub async fn bound_servers(conn: &mut AnyConnection, tenant: TenantId) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar("SELECT server FROM mcp_server_bindings WHERE tenant_id = $1 ORDER BY server")
        .bind(tenant)
        .fetch_all(conn)
        .await?)
}

/// The tool lists recorded for a tenant's servers: (server, JSON array of tool definitions).
pub async fn catalogue(conn: &mut AnyConnection, tenant: TenantId) -> Result<Vec<(String, String)>, StoreError> {
    let rows = sqlx::query("SELECT server, tools FROM tool_catalogue WHERE tenant_id = $1 ORDER BY server")
        .bind(tenant)
        .fetch_all(conn)
        .await?;
    rows.iter().map(|r| Ok((r.try_get("server")?, r.try_get("tools")?))).collect()
}

/// Everything a tenant's policies are loaded from, read in one transaction.
#[derive(Debug, Clone, Default)]
pub struct PolicyInputs {
    pub mode: String,
    pub tenant: Vec<PolicyRow>,
    pub platform: Vec<PolicyRow>,
    pub servers: Vec<String>,
    pub catalogue: Vec<(String, String)>,
}

impl Db {
    /// What `tenant`'s policies are loaded from. Platform and tenant policies are read first and
    /// the rest only when there is one (most tenants have none).
    pub async fn policy_inputs(&self, tenant: TenantId) -> Result<PolicyInputs, StoreError> {
        let mut tx = self.pool().begin().await?;
        let conn = &mut *tx;
        let platform = list_policies(&mut *conn, super::admin::platform_chain()).await?;
        let own = list_policies(&mut *conn, tenant).await?;
        let mode = policy_mode(&mut *conn, tenant).await?;
        if platform.is_empty() && own.is_empty() {
            tx.commit().await?;
            return Ok(PolicyInputs { mode, ..PolicyInputs::default() });
        }
        let servers = bound_servers(&mut *conn, tenant).await?;
        let catalogue = catalogue(&mut *conn, tenant).await?;
        tx.commit().await?;
        Ok(PolicyInputs { mode, tenant: own, platform, servers, catalogue })
    }

    /// Records the tools `server` of `tenant` listed, unless the stored list is the same
    /// (compared by digest, so a replica that sees what another recorded writes nothing and
    /// moves no change counter). Whether it wrote.
    pub async fn record_catalogue(&self, tenant: TenantId, server: &str, tools: &str) -> Result<bool, StoreError> {
        let digest = sha256_hex(tools.as_bytes());
        // IMMEDIATE on SQLite: it reads, then writes (see `Db::begin`).
        let mut tx = self.begin().await?;
        let stored: Option<String> =
            sqlx::query_scalar("SELECT digest FROM tool_catalogue WHERE tenant_id = $1 AND server = $2")
                .bind(tenant)
                .bind(server)
                .fetch_optional(&mut *tx)
                .await?;
        if stored.as_deref() == Some(digest.as_str()) {
            tx.commit().await?;
            return Ok(false);
        }
        let now = now_millis();
        if stored.is_some() {
            sqlx::query(
                "UPDATE tool_catalogue SET tools = $1, digest = $2, seen_at = $3 WHERE tenant_id = $4 AND server = $5",
            )
            .bind(tools)
            .bind(&digest)
            .bind(now)
            .bind(tenant)
            .bind(server)
            .execute(&mut *tx)
            .await?;
        } else {
            sqlx::query(
                "INSERT INTO tool_catalogue (tenant_id, server, tools, digest, seen_at) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(tenant)
            .bind(server)
            .bind(tools)
            .bind(&digest)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}

/// An active user's roles and assigned flock ids, by subject (`None`: no such active user).
pub async fn user_roles_and_flocks(
    conn: &mut AnyConnection,
    tenant: TenantId,
    subject: &str,
) -> Result<Option<(Vec<String>, Vec<String>)>, StoreError> {
    let user: Option<String> =
        sqlx::query_scalar("SELECT id FROM users WHERE tenant_id = $1 AND subject = $2 AND status = 'active'")
            .bind(tenant)
            .bind(subject)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(user) = user else { return Ok(None) };
    let roles = sqlx::query_scalar("SELECT role FROM user_roles WHERE tenant_id = $1 AND user_id = $2 ORDER BY role")
        .bind(tenant)
        .bind(&user)
        .fetch_all(&mut *conn)
        .await?;
    let flocks = sqlx::query_scalar("SELECT flock_id FROM flock_assignments WHERE tenant_id = $1 AND user_id = $2")
        .bind(tenant)
        .bind(&user)
        .fetch_all(&mut *conn)
        .await?;
    Ok(Some((roles, flocks)))
}

/// The subjects of a tenant's active users, in order.
pub async fn active_subjects(conn: &mut AnyConnection, tenant: TenantId) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar("SELECT subject FROM users WHERE tenant_id = $1 AND status = 'active' ORDER BY subject")
        .bind(tenant)
        .fetch_all(conn)
        .await?)
}
