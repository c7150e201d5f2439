//! Administrative writes (tenants, users, roles, flocks, assignments): each one transaction,
//! each input validated first, so a refused call leaves nothing half-written.

use sqlx::AnyConnection;

use super::{FlockId, StoreError, TenantId, UserId, now_millis, unique_conflict};
use crate::model::{Role, TenantStatus, UserStatus};

/// The slug of the platform chain's row ([`platform_chain`]): no valid tenant slug, so no
/// tenant can be created under it, and no token or tenant route names it.
pub const PLATFORM_SLUG: &str = "@platform";

/// The chain of platform administrators' acts (the nil tenant id; its row comes from a
/// migration). It is audited, verified, checkpointed and exported like a tenant's chain.
pub const fn platform_chain() -> TenantId {
    TenantId::nil()
}

/// Slugs and flock names: lowercase letters, digits and dashes, 1 to 63 characters.
pub fn validate_slug(field: &'static str, value: &str) -> Result<(), StoreError> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            field,
            message: format!("`{value}` must be 1-63 lowercase letters, digits or dashes"),
        })
    }
}

/// A caller-chosen name (a subject, a display name, a tenant's name): 1 to `max` bytes, not
/// blank, and no character that hides or reorders text ([`crate::vocab::text::hidden_char`]).
pub fn validate_text(field: &'static str, value: &str, max: usize) -> Result<(), StoreError> {
    if value.trim().is_empty() || value.len() > max {
        return Err(StoreError::Invalid { field, message: format!("must be 1-{max} printable characters") });
    }
    if let Some(c) = crate::vocab::text::hidden_char(value) {
        return Err(StoreError::Invalid {
            field,
            message: format!(
                "must be printable: U+{:04X} (a control or invisible formatting character) is not allowed",
                u32::from(c)
            ),
        });
    }
    Ok(())
}

pub(crate) async fn tenant_id_by_slug(conn: &mut AnyConnection, slug: &str) -> Result<TenantId, StoreError> {
    sqlx::query_scalar::<_, TenantId>("SELECT id FROM tenants WHERE slug = $1")
        .bind(slug)
        .fetch_optional(conn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("tenant `{slug}` does not exist")))
}

pub(crate) async fn user_id_by_subject(
    conn: &mut AnyConnection,
    tenant: TenantId,
    subject: &str,
) -> Result<UserId, StoreError> {
    sqlx::query_scalar::<_, UserId>("SELECT id FROM users WHERE tenant_id = $1 AND subject = $2")
        .bind(tenant)
        .bind(subject)
        .fetch_optional(conn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("user `{subject}` does not exist in this tenant")))
}

async fn flock_id_by_name(conn: &mut AnyConnection, tenant: TenantId, name: &str) -> Result<FlockId, StoreError> {
    sqlx::query_scalar::<_, FlockId>("SELECT id FROM flocks WHERE tenant_id = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .fetch_optional(conn)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("flock `{name}` does not exist in this tenant")))
}

/// Gives the user `roles`, each once: a role named twice is one role (the table's key would
/// refuse a second row).
pub(crate) async fn insert_user_roles(
    tx: &mut AnyConnection,
    tenant: TenantId,
    user: UserId,
    roles: &[Role],
) -> Result<(), StoreError> {
    let mut once = roles.to_vec();
    once.sort();
    once.dedup();
    for role in once {
        sqlx::query("INSERT INTO user_roles (tenant_id, user_id, role) VALUES ($1, $2, $3)")
            .bind(tenant)
            .bind(user)
            .bind(role.as_str())
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

pub async fn count_tenants(conn: &mut AnyConnection) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tenants WHERE slug <> $1").bind(PLATFORM_SLUG).fetch_one(conn).await?)
}

pub async fn create_tenant(conn: &mut AnyConnection, slug: &str, name: &str) -> Result<TenantId, StoreError> {
    validate_slug("slug", slug)?;
    validate_text("name", name, 200)?;
    let id = TenantId::generate();
    sqlx::query("INSERT INTO tenants (id, slug, name, status, created_at) VALUES ($1, $2, $3, 'active', $4)")
        .bind(id)
        .bind(slug)
        .bind(name)
        .bind(now_millis())
        .execute(&mut *conn)
        .await
        .map_err(|e| unique_conflict(e, || format!("tenant `{slug}` already exists")))?;
    Ok(id)
}

pub async fn set_tenant_status(conn: &mut AnyConnection, slug: &str, status: TenantStatus) -> Result<(), StoreError> {
    let done = sqlx::query("UPDATE tenants SET status = $1 WHERE slug = $2")
        .bind(status.as_str())
        .bind(slug)
        .execute(&mut *conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("tenant `{slug}` does not exist")));
    }
    Ok(())
}

/// Records (or, with `None`, clears) the organization id a tenant has at the identity
/// provider; an id is another tenant's at most once.
pub async fn set_tenant_org_id(conn: &mut AnyConnection, slug: &str, org_id: Option<&str>) -> Result<(), StoreError> {
    if let Some(org_id) = org_id {
        validate_text("org_id", org_id, 200)?;
    }
    let done = sqlx::query("UPDATE tenants SET org_id = $1 WHERE slug = $2 AND slug <> $3")
        .bind(org_id)
        .bind(slug)
        .bind(PLATFORM_SLUG)
        .execute(&mut *conn)
        .await
        .map_err(|e| {
            super::unique_conflict(e, || {
                format!("organization id `{}` is another tenant's", org_id.unwrap_or_default())
            })
        })?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("tenant `{slug}` does not exist")));
    }
    Ok(())
}

/// Turns the tenant's write-ahead audit on or off: with it, a call's record is committed before
/// the call is forwarded (no side effect without a record), and the call waits for both in turn.
pub async fn set_tenant_write_ahead(conn: &mut AnyConnection, slug: &str, on: bool) -> Result<(), StoreError> {
    let done = sqlx::query("UPDATE tenants SET audit_write_ahead = $1 WHERE slug = $2 AND slug <> $3")
        .bind(i64::from(on))
        .bind(slug)
        .bind(PLATFORM_SLUG)
        .execute(&mut *conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("tenant `{slug}` does not exist")));
    }
    Ok(())
}

pub async fn rename_tenant(conn: &mut AnyConnection, slug: &str, name: &str) -> Result<(), StoreError> {
    validate_text("name", name, 200)?;
    let done =
        sqlx::query("UPDATE tenants SET name = $1 WHERE slug = $2").bind(name).bind(slug).execute(&mut *conn).await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("tenant `{slug}` does not exist")));
    }
    Ok(())
}

/// Changes what is given of a user: display name, status, roles (the whole set, at least one).
pub async fn update_user(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    subject: &str,
    display_name: Option<&str>,
    status: Option<UserStatus>,
    roles: Option<&[Role]>,
) -> Result<(), StoreError> {
    if let Some(name) = display_name {
        validate_text("display_name", name, 200)?;
    }
    if roles.is_some_and(<[Role]>::is_empty) {
        return Err(StoreError::Invalid { field: "roles", message: "must name at least one role".into() });
    }
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let user = user_id_by_subject(&mut *conn, tenant, subject).await?;
    if let Some(name) = display_name {
        sqlx::query("UPDATE users SET display_name = $1 WHERE tenant_id = $2 AND id = $3")
            .bind(name)
            .bind(tenant)
            .bind(user)
            .execute(&mut *conn)
            .await?;
    }
    if let Some(status) = status {
        set_status(&mut *conn, tenant, user, status).await?;
    }
    if let Some(roles) = roles {
        sqlx::query("DELETE FROM user_roles WHERE tenant_id = $1 AND user_id = $2")
            .bind(tenant)
            .bind(user)
            .execute(&mut *conn)
            .await?;
        insert_user_roles(conn, tenant, user, roles).await?;
    }
    Ok(())
}

/// Creates a user with its roles in one transaction.
pub async fn create_user(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    subject: &str,
    display_name: &str,
    roles: &[Role],
) -> Result<UserId, StoreError> {
    validate_text("subject", subject, 320)?;
    validate_text("display_name", display_name, 200)?;
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let id = UserId::generate();
    sqlx::query(
        "INSERT INTO users (id, tenant_id, subject, display_name, status, created_at) \
         VALUES ($1, $2, $3, $4, 'active', $5)",
    )
    .bind(id)
    .bind(tenant)
    .bind(subject)
    .bind(display_name)
    .bind(now_millis())
    .execute(&mut *conn)
    .await
    .map_err(|e| unique_conflict(e, || format!("user `{subject}` already exists in `{tenant_slug}`")))?;
    insert_user_roles(&mut *conn, tenant, id, roles).await?;
    Ok(id)
}

/// Inserts `count` users named `{prefix}{n}@{tenant}` with `role`, in batches, in one
/// transaction. For benchmarks and load tests.
pub async fn create_users_bulk(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    prefix: &str,
    count: usize,
    role: Role,
) -> Result<(), StoreError> {
    const BATCH: usize = 500;
    // Values are interpolated below: every one is generated here (UUIDs, a counter) or
    // validated (the slug through the lookup, the prefix here). No free text reaches the SQL.
    validate_slug("prefix", prefix.trim_end_matches('-'))?;
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let now = now_millis();
    let mut n = 0;
    while n < count {
        let size = BATCH.min(count - n);
        let mut users =
            String::from("INSERT INTO users (id, tenant_id, subject, display_name, status, created_at) VALUES ");
        let mut roles = String::from("INSERT INTO user_roles (tenant_id, user_id, role) VALUES ");
        let ids: Vec<UserId> = (0..size).map(|_| UserId::generate()).collect();
        for (i, id) in ids.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let subject = format!("{prefix}{}@{tenant_slug}", n + i);
            users.push_str(&format!("{sep}('{id}','{tenant}','{subject}','{subject}','active',{now})"));
            roles.push_str(&format!("{sep}('{tenant}','{id}','{}')", role.as_str()));
        }
        sqlx::query(sqlx::AssertSqlSafe(users)).execute(&mut *conn).await?;
        sqlx::query(sqlx::AssertSqlSafe(roles)).execute(&mut *conn).await?;
        n += size;
    }
    Ok(())
}

pub async fn set_user_status(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    subject: &str,
    status: UserStatus,
) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let user = user_id_by_subject(&mut *conn, tenant, subject).await?;
    set_status(conn, tenant, user, status).await
}

async fn set_status(
    conn: &mut AnyConnection,
    tenant: TenantId,
    user: UserId,
    status: UserStatus,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE users SET status = $1 WHERE tenant_id = $2 AND id = $3")
        .bind(status.as_str())
        .bind(tenant)
        .bind(user)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn create_flock(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    name: &str,
    breed: &str,
    hen_count: i64,
) -> Result<FlockId, StoreError> {
    validate_slug("name", name)?;
    validate_text("breed", breed, 100)?;
    if !(0..=1_000_000).contains(&hen_count) {
        return Err(StoreError::Invalid { field: "hen_count", message: "must be 0 to 1000000".into() });
    }
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let id = FlockId::generate();
    sqlx::query(
        "INSERT INTO flocks (id, tenant_id, name, breed, hen_count, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(tenant)
    .bind(name)
    .bind(breed)
    .bind(hen_count)
    .bind(now_millis())
    .execute(&mut *conn)
    .await
    .map_err(|e| unique_conflict(e, || format!("flock `{name}` already exists in `{tenant_slug}`")))?;
    Ok(id)
}

/// Assigns a flock to a user; both must belong to the tenant (the composite foreign
/// keys enforce it again in the database).
pub async fn assign_flock(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    subject: &str,
    flock: &str,
) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let user = user_id_by_subject(&mut *conn, tenant, subject).await?;
    let flock_id = flock_id_by_name(&mut *conn, tenant, flock).await?;
    sqlx::query("INSERT INTO flock_assignments (tenant_id, user_id, flock_id) VALUES ($1, $2, $3)")
        .bind(tenant)
        .bind(user)
        .bind(flock_id)
        .execute(&mut *conn)
        .await
        .map_err(|e| unique_conflict(e, || format!("`{subject}` is already assigned to `{flock}`")))?;
    Ok(())
}

pub async fn unassign_flock(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    subject: &str,
    flock: &str,
) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let user = user_id_by_subject(&mut *conn, tenant, subject).await?;
    let flock_id = flock_id_by_name(&mut *conn, tenant, flock).await?;
    let done = sqlx::query("DELETE FROM flock_assignments WHERE tenant_id = $1 AND user_id = $2 AND flock_id = $3")
        .bind(tenant)
        .bind(user)
        .bind(flock_id)
        .execute(&mut *conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("`{subject}` is not assigned to `{flock}`")));
    }
    Ok(())
}

/// When the tenant was retired, if it was (NotFound when there is no such tenant).
pub async fn retired_at(conn: &mut AnyConnection, slug: &str) -> Result<Option<i64>, StoreError> {
    let row: Option<(Option<i64>,)> = sqlx::query_as("SELECT retired_at FROM tenants WHERE slug = $1 AND slug <> $2")
        .bind(slug)
        .bind(PLATFORM_SLUG)
        .fetch_optional(conn)
        .await?;
    row.map(|(at,)| at).ok_or_else(|| StoreError::NotFound(format!("tenant `{slug}` does not exist")))
}

/// Retires a tenant: suspended for good, its data and its audit chain kept. Nothing of a
/// tenant is ever deleted with its chain; [`purge_tenant`] removes its data afterwards.
pub async fn retire_tenant(conn: &mut AnyConnection, slug: &str) -> Result<(), StoreError> {
    if retired_at(&mut *conn, slug).await?.is_some() {
        return Err(StoreError::Conflict(format!("tenant `{slug}` is already retired")));
    }
    sqlx::query("UPDATE tenants SET status = 'suspended', retired_at = $1 WHERE slug = $2")
        .bind(now_millis())
        .bind(slug)
        .execute(conn)
        .await?;
    Ok(())
}

/// Everything a retired tenant held but its chain: users (their roles, assignments, stored
/// credentials and tasks), flocks and egg counts, server declarations, bindings and grants,
/// executor ownerships and root allowances, provisioning, policies and the tool catalogue. The tenant row, its audit events
/// and its chain's head stay. Refused for a tenant that is not retired.
pub async fn purge_tenant(conn: &mut AnyConnection, slug: &str) -> Result<(), StoreError> {
    if retired_at(&mut *conn, slug).await?.is_none() {
        return Err(StoreError::Conflict(format!(
            "tenant `{slug}` is not retired: retire it first (its data is purged only once it is)"
        )));
    }
    let tenant = tenant_id_by_slug(&mut *conn, slug).await?;
    // Children before parents, so the order holds whether or not foreign keys cascade.
    for table in [
        "tasks",
        "policies",
        "tool_catalogue",
        "tool_definitions",
        "oauth_logins",
        "oauth_credentials",
        "executor_root_allowances",
        "executor_owners",
        "mcp_server_grants",
        "mcp_server_bindings",
        "mcp_server_entities",
        "tenant_role_map",
        "tenant_provisioning",
        "tenant_issuers",
        "egg_counts",
        "flock_assignments",
        "user_roles",
        "flocks",
        "users",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE tenant_id = $1")))
            .bind(tenant)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

pub async fn delete_user(conn: &mut AnyConnection, tenant_slug: &str, subject: &str) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let user = user_id_by_subject(&mut *conn, tenant, subject).await?;
    sqlx::query("DELETE FROM users WHERE tenant_id = $1 AND id = $2").bind(tenant).bind(user).execute(conn).await?;
    Ok(())
}

pub async fn add_role(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    subject: &str,
    role: Role,
) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let user = user_id_by_subject(&mut *conn, tenant, subject).await?;
    insert_user_roles(conn, tenant, user, &[role]).await.map_err(|e| match e {
        StoreError::Sql(sqlx::Error::Database(db)) if db.is_unique_violation() => {
            StoreError::Conflict(format!("`{subject}` already has the role `{role}`"))
        }
        other => other,
    })
}

pub async fn remove_role(
    conn: &mut AnyConnection,
    tenant_slug: &str,
    subject: &str,
    role: Role,
) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let user = user_id_by_subject(&mut *conn, tenant, subject).await?;
    let done = sqlx::query("DELETE FROM user_roles WHERE tenant_id = $1 AND user_id = $2 AND role = $3")
        .bind(tenant)
        .bind(user)
        .bind(role.as_str())
        .execute(conn)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("`{subject}` does not have the role `{role}`")));
    }
    Ok(())
}

pub async fn delete_flock(conn: &mut AnyConnection, tenant_slug: &str, name: &str) -> Result<(), StoreError> {
    let tenant = tenant_id_by_slug(&mut *conn, tenant_slug).await?;
    let flock = flock_id_by_name(&mut *conn, tenant, name).await?;
    sqlx::query("DELETE FROM flocks WHERE tenant_id = $1 AND id = $2").bind(tenant).bind(flock).execute(conn).await?;
    Ok(())
}
