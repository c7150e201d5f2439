//! The scoped store: the only data access a tool has. Every query is bound to the caller's
//! tenant and, for flock-owned rows, to the caller's flock scope. No method takes a tenant
//! id; writes run in a unit of work that appends the call's audit event in the same
//! transaction. A flock outside the scope is indistinguishable from one that does not exist.

use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyArguments;
use sqlx::query::Query;
use time::Date;

use super::FlockAccess;
use crate::audit::{self, AuditWriter, CallAudit};
use crate::store::{Db, FlockId, StoreError, TenantId, UserId, now_millis};

/// A flock as tools see it.
#[derive(Debug, Clone, Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Flock {
    /// The flock's id (UUID).
    pub id: String,
    /// The flock's name, unique in its tenant.
    pub name: String,
    pub breed: String,
    pub hen_count: i64,
}

/// Eggs laid by one flock on one day.
#[derive(Debug, Clone, Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct EggCount {
    pub flock: String,
    /// ISO date, YYYY-MM-DD.
    pub day: String,
    pub eggs: i64,
    /// Subject of the user who recorded it.
    pub recorded_by: String,
}

/// An audit event as the audit tool shows it.
#[derive(Debug, Clone, Serialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct AuditEntry {
    pub seq: i64,
    /// Unix epoch milliseconds.
    pub occurred_at: i64,
    /// Subject of the caller ("" when the user no longer exists).
    pub user: String,
    pub tool: Option<String>,
    /// `ok`, `denied`, `failed`, or `unknown`: the call was recorded and forwarded, and no
    /// outcome was recorded (it runs, or the gateway stopped while it ran).
    pub outcome: String,
    pub error_class: Option<String>,
    pub duration_us: i64,
    /// How many calls the event stands for (more than 1 only for rate-limited calls gathered
    /// into one event).
    pub calls: i64,
}

/// How a tool names a flock: by id (a UUID) or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlockKey {
    Id(FlockId),
    Name(String),
}

impl FlockKey {
    pub fn parse(text: &str) -> Self {
        match text.parse::<FlockId>() {
            Ok(id) => FlockKey::Id(id),
            Err(_) => FlockKey::Name(text.to_owned()),
        }
    }
}

/// What a write needs to audit itself.
pub(crate) struct WriteAudit<'a> {
    pub writer: &'a AuditWriter,
    pub call: &'a CallAudit,
}

/// Data access bound to one caller.
pub struct ScopedStore<'a> {
    db: &'a Db,
    tenant: TenantId,
    user: UserId,
    subject: &'a str,
    flocks: FlockAccess<'a>,
    audit: Option<WriteAudit<'a>>,
}

/// The flock-scope condition on `column`, with its parameters numbered from `next`.
/// `None`: the scope holds no flock, so the query would return nothing.
fn scope_clause(flocks: &FlockAccess<'_>, column: &str, next: usize) -> Option<(String, Vec<FlockId>)> {
    match flocks {
        FlockAccess::AllOfTenant => Some((String::new(), Vec::new())),
        FlockAccess::Only(ids) if ids.is_empty() => None,
        FlockAccess::Only(ids) => {
            let params: Vec<String> = (0..ids.len()).map(|i| format!("${}", next + i)).collect();
            Some((format!(" AND {column} IN ({})", params.join(", ")), ids.iter().copied().collect()))
        }
    }
}

fn bind_ids<'q>(mut query: Query<'q, sqlx::Any, AnyArguments>, ids: &[FlockId]) -> Query<'q, sqlx::Any, AnyArguments> {
    for id in ids {
        query = query.bind(*id);
    }
    query
}

const FLOCK_COLUMNS: &str = "f.id, f.name, f.breed, f.hen_count";

fn flock_from_row(row: &sqlx::any::AnyRow) -> Result<Flock, StoreError> {
    Ok(Flock {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        breed: row.try_get("breed")?,
        hen_count: row.try_get("hen_count")?,
    })
}

impl<'a> ScopedStore<'a> {
    pub(crate) fn new(
        db: &'a Db,
        tenant: TenantId,
        user: UserId,
        subject: &'a str,
        flocks: FlockAccess<'a>,
        audit: Option<WriteAudit<'a>>,
    ) -> Self {
        Self { db, tenant, user, subject, flocks, audit }
    }

    /// The flocks the caller may see, by name.
    pub async fn list_flocks(&self) -> Result<Vec<Flock>, StoreError> {
        let Some((scope, ids)) = scope_clause(&self.flocks, "f.id", 2) else {
            return Ok(Vec::new());
        };
        let sql = format!("SELECT {FLOCK_COLUMNS} FROM flocks f WHERE f.tenant_id = $1{scope} ORDER BY f.name");
        let query = bind_ids(sqlx::query(sqlx::AssertSqlSafe(sql)).bind(self.tenant), &ids);
        let rows = query.fetch_all(self.db.pool()).await?;
        rows.iter().map(flock_from_row).collect()
    }

    /// One flock by id or name; `None` when it does not exist OR is outside the scope.
    pub async fn find_flock(&self, key: &FlockKey) -> Result<Option<Flock>, StoreError> {
        let mut conn = self.db.pool().acquire().await?;
        find_flock_on(&mut conn, self.tenant, &self.flocks, key).await
    }

    /// Egg counts from `from` to `to` (inclusive), of one flock or of every flock in scope.
    pub async fn egg_counts(
        &self,
        flock: Option<&FlockKey>,
        from: Date,
        to: Date,
    ) -> Result<Vec<EggCount>, StoreError> {
        let mut conn = self.db.pool().acquire().await?;
        let flock_id = match flock {
            Some(key) => match find_flock_on(&mut conn, self.tenant, &self.flocks, key).await? {
                Some(f) => Some(f.id),
                None => return Err(StoreError::NotFound("flock not found".into())),
            },
            None => None,
        };
        let next = if flock_id.is_some() { 5 } else { 4 };
        let Some((scope, ids)) = scope_clause(&self.flocks, "e.flock_id", next) else {
            return Ok(Vec::new());
        };
        let flock_filter = if flock_id.is_some() { " AND e.flock_id = $4" } else { "" };
        let sql = format!(
            "SELECT f.name, e.day, e.eggs, e.recorded_by FROM egg_counts e \
             JOIN flocks f ON f.id = e.flock_id AND f.tenant_id = e.tenant_id \
             WHERE e.tenant_id = $1 AND e.day >= $2 AND e.day <= $3{flock_filter}{scope} \
             ORDER BY f.name, e.day"
        );
        let mut query =
            sqlx::query(sqlx::AssertSqlSafe(sql)).bind(self.tenant).bind(from.to_string()).bind(to.to_string());
        if let Some(id) = flock_id {
            query = query.bind(id);
        }
        let rows = bind_ids(query, &ids).fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|row| {
                Ok(EggCount {
                    flock: row.try_get("name")?,
                    day: row.try_get("day")?,
                    eggs: row.try_get("eggs")?,
                    recorded_by: row.try_get("recorded_by")?,
                })
            })
            .collect()
    }

    /// Records (or corrects) the eggs a flock in scope laid on `day`. A unit of work: the
    /// write and the call's audit event commit together or not at all.
    pub async fn record_egg_count(&self, key: &FlockKey, day: Date, eggs: i64) -> Result<EggCount, StoreError> {
        let Some(audit) = &self.audit else {
            return Err(StoreError::Invalid { field: "audit", message: "a write needs an audited call".into() });
        };
        // The call's record is in the chain before its write (it committed while the tool
        // ran): the write commits with the call's outcome.
        let record = audit.call.committed_record().await.map_err(|_| StoreError::Invalid {
            field: "audit",
            message: "the call's record could not be written".into(),
        })?;
        // The chain lock first, then the transaction (see `audit`).
        let mut head = audit.writer.chains().lock(self.tenant).await;
        let mut tx = self.db.begin().await?;
        let flock = find_flock_on(&mut tx, self.tenant, &self.flocks, key)
            .await?
            .ok_or_else(|| StoreError::NotFound("flock not found".into()))?;
        let flock_id: FlockId = flock
            .id
            .parse()
            .map_err(|_| StoreError::Invalid { field: "id", message: "stored flock id is not a UUID".into() })?;
        sqlx::query(
            "INSERT INTO egg_counts (tenant_id, flock_id, day, eggs, recorded_by, recorded_at) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (flock_id, day) DO UPDATE SET eggs = excluded.eggs, \
             recorded_by = excluded.recorded_by, recorded_at = excluded.recorded_at",
        )
        .bind(self.tenant)
        .bind(flock_id)
        .bind(day.to_string())
        .bind(eggs)
        .bind(self.subject)
        .bind(now_millis())
        .execute(&mut *tx)
        .await?;
        let event = match record {
            Some(id) => audit.call.outcome_event(id, audit::Outcome::Ok, None, None),
            None => audit.call.event(audit::Outcome::Ok, None),
        };
        let new_head = audit::append(&mut tx, &head, &event).await.inspect_err(|_| *head = None)?;
        tx.commit().await.inspect_err(|_| *head = None)?;
        *head = Some(new_head);
        audit.call.mark_recorded();
        Ok(EggCount { flock: flock.name, day: day.to_string(), eggs, recorded_by: self.subject.to_owned() })
    }

    /// The tenant's newest audit events.
    pub async fn recent_audit_events(&self, limit: i64) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = sqlx::query(
            // A call's record and its outcome are one row (a record with none: `unknown`).
            "SELECT a.seq, a.occurred_at, COALESCE(u.subject, '') AS subject, a.tool, \
             CASE WHEN a.outcome = 'started' THEN COALESCE(o.outcome, 'unknown') ELSE a.outcome END AS outcome, \
             CASE WHEN a.outcome = 'started' THEN o.error_class ELSE a.error_class END AS error_class, \
             COALESCE(o.duration_us, a.duration_us) AS duration_us, a.calls FROM audit_events a \
             LEFT JOIN audit_events o ON o.tenant_id = a.tenant_id AND o.call_id = a.id \
             LEFT JOIN users u ON u.id = a.user_id AND u.tenant_id = a.tenant_id \
             WHERE a.tenant_id = $1 AND a.call_id IS NULL ORDER BY a.seq DESC LIMIT $2",
        )
        .bind(self.tenant)
        .bind(limit)
        .fetch_all(self.db.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AuditEntry {
                    seq: row.try_get("seq")?,
                    occurred_at: row.try_get("occurred_at")?,
                    user: row.try_get("subject")?,
                    tool: row.try_get("tool")?,
                    outcome: row.try_get("outcome")?,
                    error_class: row.try_get("error_class")?,
                    duration_us: row.try_get("duration_us")?,
                    calls: row.try_get("calls")?,
                })
            })
            .collect()
    }

    pub fn user(&self) -> UserId {
        self.user
    }
}

async fn find_flock_on(
    conn: &mut sqlx::AnyConnection,
    tenant: TenantId,
    flocks: &FlockAccess<'_>,
    key: &FlockKey,
) -> Result<Option<Flock>, StoreError> {
    let Some((scope, ids)) = scope_clause(flocks, "f.id", 3) else {
        return Ok(None);
    };
    if let FlockKey::Name(name) = key
        && name.contains('\0')
    {
        // Flock names are validated slugs: none holds U+0000, which PostgreSQL's text can't
        // even hold. Not found, the same answer on both databases.
        return Ok(None);
    }
    let column = match key {
        FlockKey::Id(_) => "f.id",
        FlockKey::Name(_) => "f.name",
    };
    let sql = format!("SELECT {FLOCK_COLUMNS} FROM flocks f WHERE f.tenant_id = $1 AND {column} = $2{scope}");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(tenant);
    query = match key {
        FlockKey::Id(id) => query.bind(*id),
        FlockKey::Name(name) => query.bind(name.clone()),
    };
    let row = bind_ids(query, &ids).fetch_optional(conn).await?;
    row.as_ref().map(flock_from_row).transpose()
}
