//! What every handler of the MCP endpoint shares: the gateway's state as the dispatcher, the
//! lean relay and the call pipeline read it.

use std::sync::Arc;
use std::time::Duration;

use rmcp::ErrorData;

use super::cursor::CursorKey;
use super::registry::ToolSet;
use super::rounds;
use crate::audit::AuditWriter;
use crate::identity::SessionRegistry;
use crate::proxy::Upstreams;
use crate::store::Db;

/// What every session's handler shares: no caller in here.
pub(crate) struct Shared {
    pub db: Db,
    pub audit: AuditWriter,
    pub sessions: Arc<SessionRegistry>,
    pub tools: ToolSet,
    pub upstreams: Arc<Upstreams>,
    pub call_timeout: Duration,
    /// How long a task the gateway runs may run and is kept (`mcp.task_ttl_secs`).
    pub task_ttl: Duration,
    /// The largest result of such a task that is kept (`mcp.task_max_result_bytes`).
    pub task_max_result_bytes: usize,
    /// How long a caller has to confirm a call (`mcp.confirm_timeout_secs`).
    pub confirm_timeout: Duration,
    /// How long a waiting call waits for an approver (`mcp.approval_wait_secs`).
    pub approval_wait: Duration,
    /// The most a request answered as plain JSON can wait: a little less than the HTTP request
    /// timeout, so its refusal is answered and audited before the request is cut.
    pub approval_wait_plain: Duration,
    /// The most a session's call can wait with nothing sent in the session: a little less than
    /// `mcp.session_idle_secs`, after which rmcp ends an idle session (and the call with it).
    pub session_wait: Duration,
    pub record_raw_arguments: bool,
    pub label_tenant: bool,
    /// Seals the aggregated lists' pagination cursors (shared by the replicas).
    pub cursors: CursorKey,
    /// Seals the handles of tasks (shared by the replicas, see `mcp::tasks`).
    pub tasks_key: CursorKey,
    /// Seals the multi round-trip's states (shared by the replicas: a retry that lands on
    /// another replica is forwarded to the one its exchange waits in).
    pub rounds_key: CursorKey,
    /// This replica's id (what a `requestState` names).
    pub replica: String,
    /// Calls of 2026-07-28 callers waiting for an answer (multi round-trip).
    pub rounds: rounds::Exchanges,
    /// The sessions the lean relay may serve (recorded when their clients are initialized).
    pub lean: super::lean::Sessions,
}

/// Exactly what rmcp answers for a tool it does not know: a forbidden tool answers the same.
pub(crate) fn unknown_tool() -> ErrorData {
    ErrorData::invalid_params("tool not found", None)
}
