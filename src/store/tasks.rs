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
    /// The upstream's own task id (never shown to the caller); `None`: the gateway runs it.
    pub upstream_task_id: Option<String>,
    pub args_digest: String,
    pub status: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub expires_at: i64,
    pub terminal_at: Option<i64>,
    pub cancel_requested_at: Option<i64>,
    /// A task the gateway runs: its replica runs it until then (renewed while it does).
    pub lease_until: Option<i64>,
    /// A task the gateway runs that completed: the tool result, as JSON.
    pub result: Option<String>,
    /// A task the gateway runs that failed: the JSON-RPC error, as JSON.
    pub error: Option<String>,
}

/// The columns of a task row, in the order of [`TaskRow`].
macro_rules! columns {
    () => {
        "id, tenant_id, user_id, server, tool, caps, upstream_task_id, args_digest, status, \
         created_at, updated_at, expires_at, terminal_at, cancel_requested_at, lease_until, result, error"
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
        lease_until: row.try_get("lease_until")?,
        result: row.try_get("result")?,
        error: row.try_get("error")?,
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
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
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
    .bind(task.lease_until)
    .bind(&task.result)
    .bind(&task.error)
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

/// The task `id`, whoever owns it (for the replica that runs it).
pub async fn find(conn: &mut AnyConnection, id: &str) -> Result<Option<TaskRow>, StoreError> {
    let row =
        sqlx::query(concat!("SELECT ", columns!(), " FROM tasks WHERE id = $1")).bind(id).fetch_optional(conn).await?;
    row.as_ref().map(row_of).transpose()
}

/// Ends a task the gateway runs with `status` and its result or error, unless it ended
/// already. Returns whether this ended it (the end to audit).
pub async fn finish(
    conn: &mut AnyConnection,
    id: &str,
    status: &str,
    result: Option<&str>,
    error: Option<&str>,
    now: i64,
) -> Result<bool, StoreError> {
    if !is_terminal(status) {
        return Err(StoreError::Invalid { field: "status", message: format!("`{status}` does not end a task") });
    }
    let done = sqlx::query(
        "UPDATE tasks SET status = $1, result = $2, error = $3, updated_at = $4, terminal_at = $4, lease_until = NULL \
         WHERE id = $5 AND terminal_at IS NULL",
    )
    .bind(status)
    .bind(result)
    .bind(error)
    .bind(now)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Keeps the lease of the replica running task `id` until `until` (while it has not ended).
pub async fn renew_lease(conn: &mut AnyConnection, id: &str, until: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE tasks SET lease_until = $1 WHERE id = $2 AND terminal_at IS NULL")
        .bind(until)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Records a question task `id` asks its caller, under `key`.
pub async fn add_input(
    conn: &mut AnyConnection,
    id: &str,
    key: &str,
    request: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO task_inputs (task_id, input_key, request, created_at) VALUES ($1, $2, $3, $4)")
        .bind(id)
        .bind(key)
        .bind(request)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}

/// The questions of task `id` not answered yet: (key, request), in the order asked.
pub async fn open_inputs(conn: &mut AnyConnection, id: &str) -> Result<Vec<(String, String)>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT input_key, request FROM task_inputs WHERE task_id = $1 AND response IS NULL ORDER BY created_at, input_key",
    )
    .bind(id)
    .fetch_all(conn)
    .await?)
}

/// Answers the question `key` of task `id`, if it is still open; returns whether it was.
pub async fn answer_input(conn: &mut AnyConnection, id: &str, key: &str, response: &str) -> Result<bool, StoreError> {
    let done =
        sqlx::query("UPDATE task_inputs SET response = $1 WHERE task_id = $2 AND input_key = $3 AND response IS NULL")
            .bind(response)
            .bind(id)
            .bind(key)
            .execute(conn)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// The answers of task `id` not yet passed on to the running call, marked passed on at `now`:
/// (key, response).
pub async fn take_answers(conn: &mut AnyConnection, id: &str, now: i64) -> Result<Vec<(String, String)>, StoreError> {
    let answers: Vec<(String, String)> = sqlx::query_as(
        "SELECT input_key, response FROM task_inputs WHERE task_id = $1 AND response IS NOT NULL AND delivered_at IS NULL",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    for (key, _) in &answers {
        sqlx::query("UPDATE task_inputs SET delivered_at = $1 WHERE task_id = $2 AND input_key = $3")
            .bind(now)
            .bind(id)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    Ok(answers)
}
