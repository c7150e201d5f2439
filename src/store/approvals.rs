//! Calls a person confirms (migration 0024): the calls that wait for a second person of the
//! tenant (`call_approvals`), and the single use of a caller's consent given by multi
//! round-trip (`call_consents`). What needs a confirmation, and how the caller is asked, is
//! decided in `crate::mcp::confirm`; this only stores it.

use serde::{Deserialize, Serialize};
use sqlx::{AnyConnection, Row};

use super::{Db, StoreError, TenantId, UserId, now_millis, unique_conflict};

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for an approver (until it expires).
    Pending,
    /// An approver allowed it: the waiting call is forwarded, once.
    Approved,
    /// An approver refused it: the call is refused.
    Rejected,
    /// Nobody decided before it expired, or the call that waited for it ended: refused.
    Lapsed,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Lapsed => "lapsed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "rejected" => Self::Rejected,
            "lapsed" => Self::Lapsed,
            _ => return None,
        })
    }

    /// A filter of approvals by state: one state, or `all` (none).
    pub fn filter(text: &str) -> Result<Option<Self>, StoreError> {
        if text == "all" {
            return Ok(None);
        }
        Self::parse(text).map(Some).ok_or_else(|| StoreError::Invalid {
            field: "state",
            message: format!("`{}`: pending, approved, rejected, lapsed or all", text.escape_debug()),
        })
    }
}

/// How the call waits for its approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Waiting {
    /// The caller's request stays open until the decision (or the configured bound).
    Wait,
    /// The caller holds a task (2026-07-28, tasks extension) that runs the call once approved.
    Task,
}

impl Waiting {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Wait => "wait",
            Self::Task => "task",
        }
    }
}

/// A call waiting for a second person, as it is written.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub id: String,
    pub tenant: TenantId,
    pub user: UserId,
    pub subject: String,
    pub server: String,
    /// The tool as the caller named it.
    pub tool: String,
    /// The approved definition's title, if it has one.
    pub title: Option<String>,
    /// The arguments' canonical JSON: what the approver is shown and what is forwarded.
    pub arguments: String,
    pub args_digest: String,
    pub via: Waiting,
    pub expires_at: i64,
}

/// One stored approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRow {
    pub id: String,
    pub user: String,
    pub subject: String,
    pub server: String,
    pub tool: String,
    pub title: Option<String>,
    pub arguments: String,
    pub args_digest: String,
    pub via: String,
    /// As stored: a `pending` row past its expiry is lapsed (see [`ApprovalRow::state_now`]).
    pub state: ApprovalState,
    pub created_at: i64,
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    pub decided_by: Option<String>,
    pub decided_subject: Option<String>,
    pub reason: Option<String>,
    pub ran_at: Option<i64>,
}

impl ApprovalRow {
    /// Its state at `now`: a pending one whose time is up is lapsed, whoever wrote it last.
    pub fn state_now(&self, now: i64) -> ApprovalState {
        match self.state {
            ApprovalState::Pending if self.expires_at <= now => ApprovalState::Lapsed,
            state => state,
        }
    }
}

const COLUMNS: &str = "id, user_id, subject, server, tool, title, arguments, args_digest, via, state, created_at, \
                       expires_at, decided_at, decided_by, decided_subject, reason, ran_at";

fn row_of(r: &sqlx::any::AnyRow) -> Result<ApprovalRow, StoreError> {
    let state: String = r.try_get("state")?;
    Ok(ApprovalRow {
        id: r.try_get("id")?,
        user: r.try_get("user_id")?,
        subject: r.try_get("subject")?,
        server: r.try_get("server")?,
        tool: r.try_get("tool")?,
        title: r.try_get("title")?,
        arguments: r.try_get("arguments")?,
        args_digest: r.try_get("args_digest")?,
        via: r.try_get("via")?,
        state: ApprovalState::parse(&state)
            .ok_or_else(|| StoreError::Invalid { field: "approval", message: format!("stored state `{state}`") })?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        decided_at: r.try_get("decided_at")?,
        decided_by: r.try_get("decided_by")?,
        decided_subject: r.try_get("decided_subject")?,
        reason: r.try_get("reason")?,
        ran_at: r.try_get("ran_at")?,
    })
}

/// A tenant's approvals in `state` (`None`: all), newest first. A pending one past its expiry
/// counts as lapsed.
pub async fn list(
    conn: &mut AnyConnection,
    tenant: TenantId,
    state: Option<ApprovalState>,
) -> Result<Vec<ApprovalRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM call_approvals WHERE tenant_id = $1 ORDER BY created_at DESC, id");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(tenant).fetch_all(conn).await?;
    let now = now_millis();
    let mut all = Vec::with_capacity(rows.len());
    for row in &rows {
        let row = row_of(row)?;
        if state.is_none_or(|s| row.state_now(now) == s) {
            all.push(row);
        }
    }
    Ok(all)
}

/// One of a tenant's approvals.
pub async fn get(conn: &mut AnyConnection, tenant: TenantId, id: &str) -> Result<Option<ApprovalRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM call_approvals WHERE tenant_id = $1 AND id = $2");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(tenant).bind(id).fetch_optional(conn).await?;
    row.as_ref().map(row_of).transpose()
}

/// An approver's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject => "reject",
        }
    }
}

/// Why a decision was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("approval `{0}` does not exist in this tenant")]
    NotFound(String),
    /// The approver is the caller: a call is never approved by the person who made it.
    #[error("a call can't be approved or rejected by the person who made it")]
    OwnCall,
    /// Decided already, or lapsed.
    #[error("approval `{id}` is {state}: it can't be {decision}d")]
    Settled { id: String, state: &'static str, decision: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Decides pending approval `id` of `tenant` for approver `by` (`subject`): one conditional
/// update, so of two decisions (or a decision and the call's lapse, on any replica) exactly one
/// lands. Never by the caller itself. Answers the decided row.
pub async fn decide(
    conn: &mut AnyConnection,
    tenant: TenantId,
    id: &str,
    decision: Decision,
    by: UserId,
    subject: &str,
    reason: Option<&str>,
) -> Result<ApprovalRow, DecideError> {
    let now = now_millis();
    let state = match decision {
        Decision::Approve => ApprovalState::Approved,
        Decision::Reject => ApprovalState::Rejected,
    };
    let done = sqlx::query(
        "UPDATE call_approvals SET state = $1, decided_at = $2, decided_by = $3, decided_subject = $4, reason = $5 \
         WHERE tenant_id = $6 AND id = $7 AND state = 'pending' AND expires_at > $2 AND user_id <> $3",
    )
    .bind(state.as_str())
    .bind(now)
    .bind(by.to_string())
    .bind(subject)
    .bind(reason)
    .bind(tenant)
    .bind(id)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::from)?;
    let row = get(&mut *conn, tenant, id).await?.ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
    if done.rows_affected() == 1 {
        return Ok(row);
    }
    if row.user == by.to_string() {
        return Err(DecideError::OwnCall);
    }
    Err(DecideError::Settled { id: id.to_owned(), state: row.state_now(now).as_str(), decision: decision.as_str() })
}

impl Db {
    /// Writes a call waiting for a second person.
    pub async fn create_approval(&self, new: &NewApproval) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO call_approvals (id, tenant_id, user_id, subject, server, tool, title, arguments, args_digest, \
             via, state, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12)",
        )
        .bind(&new.id)
        .bind(new.tenant)
        .bind(new.user.to_string())
        .bind(&new.subject)
        .bind(&new.server)
        .bind(&new.tool)
        .bind(new.title.as_deref())
        .bind(&new.arguments)
        .bind(&new.args_digest)
        .bind(new.via.as_str())
        .bind(now_millis())
        .bind(new.expires_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Approval `id` of `tenant`, as it stands.
    pub async fn approval(&self, tenant: TenantId, id: &str) -> Result<Option<ApprovalRow>, StoreError> {
        let mut conn = self.pool().acquire().await?;
        get(&mut conn, tenant, id).await
    }

    /// Ends a pending approval nobody decided (its time is up, or its call ended): `true` when
    /// it was still pending, `false` when a decision landed first.
    pub async fn lapse_approval(&self, tenant: TenantId, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE call_approvals SET state = 'lapsed', decided_at = $1 \
             WHERE tenant_id = $2 AND id = $3 AND state = 'pending'",
        )
        .bind(now_millis())
        .bind(tenant)
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Takes an approved call to forward it: `true` once, for the first taker; never for an
    /// approval that is not approved.
    pub async fn take_approved(&self, tenant: TenantId, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE call_approvals SET ran_at = $1 \
             WHERE tenant_id = $2 AND id = $3 AND state = 'approved' AND ran_at IS NULL",
        )
        .bind(now_millis())
        .bind(tenant)
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Uses consent `id` (good until `expires_at`): `true` the first time, `false` when it was
    /// used before (on any replica). Consents past their expiry are pruned on the way: their
    /// sealed states are refused as expired before they get here.
    pub async fn use_consent(&self, tenant: TenantId, id: &str, expires_at: i64) -> Result<bool, StoreError> {
        let now = now_millis();
        sqlx::query("DELETE FROM call_consents WHERE expires_at < $1").bind(now - 60_000).execute(self.pool()).await?;
        let inserted =
            sqlx::query("INSERT INTO call_consents (id, tenant_id, expires_at, used_at) VALUES ($1, $2, $3, $4)")
                .bind(id)
                .bind(tenant)
                .bind(expires_at)
                .bind(now)
                .execute(self.pool())
                .await
                .map_err(|e| unique_conflict(e, || "used".to_owned()));
        match inserted {
            Ok(_) => Ok(true),
            Err(StoreError::Conflict(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
