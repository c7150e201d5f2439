//! Calls waiting for a second person, as approvers (and the tenant's owners and auditors) see
//! them: who called, which server and tool, the exact arguments the call would be forwarded
//! with and their digest. Approvers decide through [`super::write::Write::DecideApproval`]; a
//! call is never decided by the person who made it.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::AnyConnection;
use utoipa::ToSchema;

use super::AdminError;
use crate::store::TenantId;
use crate::store::approvals::{self, ApprovalRow, ApprovalState};
use crate::store::now_millis;

/// One call waiting for (or decided by) an approver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalView {
    /// Names it in `/approvals/{id}`; the call's audit events name it too (`confirm.id`).
    pub id: String,
    /// `pending` (waiting; only these can be decided), `approved`, `rejected` or `lapsed`
    /// (nobody decided before it expired, or the call stopped waiting).
    pub state: ApprovalState,
    /// The subject of the user who made the call.
    pub caller: String,
    pub server: String,
    /// The tool as the caller named it.
    pub tool: String,
    /// Its approved definition's title, if it has one.
    pub title: Option<String>,
    /// The exact arguments the call is forwarded with when approved.
    #[schema(value_type = Object)]
    pub arguments: Value,
    /// The hex SHA-256 of the arguments' canonical JSON (what the audit records).
    pub args_digest: String,
    /// `wait` (the caller's request waits) or `task` (the caller holds a task).
    pub via: String,
    /// Epoch milliseconds.
    pub created_at: i64,
    /// When it lapses undecided (epoch milliseconds).
    pub expires_at: i64,
    pub decided_at: Option<i64>,
    /// The subject of the approver who decided it.
    pub decided_by: Option<String>,
    /// The approver's reason, if one was given.
    pub reason: Option<String>,
    /// When the approved call was forwarded (once).
    pub ran_at: Option<i64>,
}

fn view(row: ApprovalRow, now: i64) -> ApprovalView {
    let state = row.state_now(now);
    ApprovalView {
        // Stored as the canonical text of an object; anything else is shown as the text.
        arguments: serde_json::from_str(&row.arguments).unwrap_or(Value::String(row.arguments)),
        id: row.id,
        state,
        caller: row.subject,
        server: row.server,
        tool: row.tool,
        title: row.title,
        args_digest: row.args_digest,
        via: row.via,
        created_at: row.created_at,
        expires_at: row.expires_at,
        decided_at: row.decided_at,
        decided_by: row.decided_subject,
        reason: row.reason,
        ran_at: row.ran_at,
    }
}

/// A tenant's approvals in `state` (all when `None`), newest first.
pub async fn views(
    conn: &mut AnyConnection,
    tenant: TenantId,
    state: Option<ApprovalState>,
) -> Result<Vec<ApprovalView>, AdminError> {
    let now = now_millis();
    Ok(approvals::list(conn, tenant, state).await?.into_iter().map(|r| view(r, now)).collect())
}

/// One of a tenant's approvals.
pub async fn detail(conn: &mut AnyConnection, tenant: TenantId, id: &str) -> Result<Option<ApprovalView>, AdminError> {
    Ok(approvals::get(conn, tenant, id).await?.map(|r| view(r, now_millis())))
}

/// The longest reason an approver may give, in characters.
pub const REASON_MAX: usize = 500;

/// An approver's reason, checked: at most [`REASON_MAX`] characters, nothing that hides or
/// reorders text.
pub fn check_reason(reason: Option<&str>) -> Result<Option<String>, AdminError> {
    let Some(reason) = reason.map(str::trim).filter(|r| !r.is_empty()) else { return Ok(None) };
    if reason.chars().count() > REASON_MAX {
        return Err(AdminError::Invalid { field: "reason", message: format!("at most {REASON_MAX} characters") });
    }
    if let Some(c) = crate::vocab::text::hidden_char(reason) {
        return Err(AdminError::Invalid {
            field: "reason",
            message: format!("holds {c:?}, a character that is not shown as it is"),
        });
    }
    Ok(Some(reason.to_owned()))
}
