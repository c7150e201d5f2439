//! The tasks the gateway handed out (`io.modelcontextprotocol/tasks`): one row per task,
//! written before the caller learns of it (a `tasks/get` right after the `CreateTaskResult`
//! resolves, on any replica), read by every `tasks/*` request, and gone after its expiry.
//! What a row means and who may see it is decided in `mcp::tasks`; this only stores it.

use sqlx::{AnyConnection, Row};

use super::{StoreError, TenantId, UserId};

/// A task's status, as the extension names it.
pub const STATUSES: [&str; 5] = ["working", "input_required", "completed", "failed", "cancelled"];

/// Whether `status` ends a task.
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

/// One task row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// The gateway's id (a v4 UUID); the caller's handle seals it.
    pub id: String,
    pub tenant: TenantId,
    pub user: UserId,
    /// The server and tool the caller called (the caller's names).
    pub server: String,
    pub tool: String,
    /// The capabilities of the connection the task was created on (a pool key part).
    pub caps: String,
    /// The upstream's own task id: never shown to the caller.
    pub upstream_task_id: String,
    pub args_digest: String,
    pub status: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub expires_at: i64,
    pub terminal_at: Option<i64>,
    pub cancel_requested_at: Option<i64>,
}

/// The columns of a task row, in the order of [`TaskRow`].
macro_rules! columns {
    () => {
        "id, tenant_id, user_id, server, tool, caps, upstream_task_id, args_digest, status, \
         created_at, updated_at, expires_at, terminal_at, cancel_requested_at"
    };
}

fn row_of(row: &sqlx::any::AnyRow) -> Result<TaskRow, StoreError> {
    Ok(TaskRow {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant_id")?,
        user: row.try_get("user_id")?,
        server: row.try_get("server")?,
        tool: row.try_get("tool")?,
        caps: row.try_get("caps")?,
        upstream_task_id: row.try_get("upstream_task_id")?,
        args_digest: row.try_get("args_digest")?,
        status: row.try_get("status")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        expires_at: row.try_get("expires_at")?,
        terminal_at: row.try_get("terminal_at")?,
        cancel_requested_at: row.try_get("cancel_requested_at")?,
    })
}

/// Records a new task. A status the extension does not name is refused before anything is
/// written (the table checks it too).
pub async fn insert(conn: &mut AnyConnection, task: &TaskRow) -> Result<(), StoreError> {
    if !STATUSES.contains(&task.status.as_str()) {
        return Err(StoreError::Invalid { field: "status", message: format!("unknown task status `{}`", task.status) });
    }
    sqlx::query(concat!(
        "INSERT INTO tasks (",
        columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
    ))
    .bind(&task.id)
    .bind(task.tenant)
    .bind(task.user)
    .bind(&task.server)
    .bind(&task.tool)
    .bind(&task.caps)
    .bind(&task.upstream_task_id)
    .bind(&task.args_digest)
    .bind(&task.status)
    .bind(task.created_at)
    .bind(task.updated_at)
    .bind(task.expires_at)
    .bind(task.terminal_at)
    .bind(task.cancel_requested_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// The task `id` of this owner that has not expired at `now`; `None` for any other (another
/// owner's, an expired or an unknown one: the caller cannot tell them apart).
pub async fn find_owned(
    conn: &mut AnyConnection,
    id: &str,
    tenant: TenantId,
    user: UserId,
    now: i64,
) -> Result<Option<TaskRow>, StoreError> {
    let row = sqlx::query(concat!(
        "SELECT ",
        columns!(),
        " FROM tasks WHERE id = $1 AND tenant_id = $2 AND user_id = $3 AND expires_at > $4"
    ))
    .bind(id)
    .bind(tenant)
    .bind(user)
    .bind(now)
    .fetch_optional(conn)
    .await?;
    row.as_ref().map(row_of).transpose()
}

/// Records the status the upstream reported at `now`. Returns whether this is the first
/// terminal status seen (the one to audit); a task that ended keeps its first terminal status.
pub async fn observe_status(conn: &mut AnyConnection, id: &str, status: &str, now: i64) -> Result<bool, StoreError> {
    if !STATUSES.contains(&status) {
        return Err(StoreError::Invalid { field: "status", message: format!("unknown task status `{status}`") });
    }
    let terminal_at = is_terminal(status).then_some(now);
    let done = sqlx::query(
        "UPDATE tasks SET status = $1, updated_at = $2, terminal_at = $3 WHERE id = $4 AND terminal_at IS NULL",
    )
    .bind(status)
    .bind(now)
    .bind(terminal_at)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(terminal_at.is_some() && done.rows_affected() == 1)
}

/// Records a `tasks/cancel` (the first one counts).
pub async fn mark_cancel_requested(conn: &mut AnyConnection, id: &str, now: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE tasks SET cancel_requested_at = $1 WHERE id = $2 AND cancel_requested_at IS NULL")
        .bind(now)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Forgets the tasks that expired before `now`; returns how many.
pub async fn purge_expired(conn: &mut AnyConnection, now: i64) -> Result<u64, StoreError> {
    Ok(sqlx::query("DELETE FROM tasks WHERE expires_at <= $1").bind(now).execute(conn).await?.rows_affected())
}
