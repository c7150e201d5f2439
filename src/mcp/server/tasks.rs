//! Tasks of upstreams (`io.modelcontextprotocol/tasks`, SEP-2663) relayed for 2026-07-28
//! callers that declare the extension on their request. A task an upstream answers a call
//! with is recorded (`store::tasks`) before the caller learns of it, under a handle the
//! gateway mints (`mcp::tasks`); `tasks/get`, `tasks/update` and `tasks/cancel` open the
//! handle, find the task of this very caller, pass the grants of the call that created it
//! again, and go to the task's upstream under its own id. Anything else (a forged, foreign,
//! expired handle, or one whose tool the caller may no longer call) is answered exactly as
//! an unknown task (-32602), and audited as refused.
//!
//! Callers on older revisions never see a task: the extension is not defined there, so the
//! gateway neither declares it upstream for them nor serves `tasks/*` to them.

use rmcp::model::{
    CancelTaskParams, CancelTaskRequest, ClientRequest, CreateTaskResult, GetTaskParams, GetTaskRequest, GetTaskResult,
    TaskStatus, UpdateTaskParams, UpdateTaskRequest,
};

use super::*;
use crate::audit::AuditEvent;
use crate::mcp::tasks;
use crate::proxy::Connection;
use crate::store::now_millis;
use crate::store::tasks::{self as rows, TaskRow};

/// Whether this request declared the tasks extension: only a 2026-07-28 request can (the
/// extension is not defined on the older revisions, whatever their `initialize` declared).
pub(crate) fn declares_tasks(context: &RequestContext<RoleServer>) -> bool {
    by_rounds(context) && context.meta.client_capabilities().is_some_and(|c| c.supports_tasks())
}

/// Where a call that may become a task went, as the task's row keeps it.
pub(crate) struct TaskOrigin {
    pub server: String,
    /// The tool as the caller named it.
    pub tool: String,
    pub caps: RelayCaps,
    pub args_digest: String,
    /// Only this replica can reach the task (a relayed task of a stdio upstream).
    pub pinned: bool,
}

/// The three requests on a task.
#[derive(Clone, Copy)]
enum Method {
    Get,
    Update,
    Cancel,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Get => "tasks/get",
            Method::Update => "tasks/update",
            Method::Cancel => "tasks/cancel",
        }
    }
}

/// The status as the extension (and the task's row) names it. One this gateway does not know
/// is not an end: the task is kept as still working.
pub(super) fn status_name(status: &TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::InputRequired => "input_required",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        _ => "working",
    }
}

/// The answer to a task the caller may not see: exactly that of one that does not exist.
pub(super) fn unknown_task() -> ErrorData {
    ErrorData::invalid_params("Failed to retrieve task: Task not found", None)
}

/// An upstream's error about one of its tasks, as the caller may see it: a task it does not
/// know is the gateway's unknown task; any other error loses its `data` and every mention of
/// the upstream's own id.
fn private(mut e: ErrorData, upstream_id: Option<&str>) -> ErrorData {
    if e.code == rmcp::model::ErrorCode::INVALID_PARAMS {
        return unknown_task();
    }
    if let Some(id) = upstream_id.filter(|id| !id.is_empty()) {
        e.message = e.message.replace(id, "(the task)").into();
    }
    e.data = None;
    e
}

pub(super) fn internal(e: impl std::fmt::Display) -> ErrorData {
    tracing::error!(error = %e, "task store failed");
    ErrorData::internal_error("internal error", None)
}

/// What the gateway reached of a caller's task: its row and, for a task of the upstream's own,
/// the upstream serving it (`None`: the gateway runs the task, see `task_run`).
struct Reached {
    row: TaskRow,
    upstream: Option<(Arc<Connection>, crate::proxy::Upstream)>,
}

impl GatewayServer {
    /// A task an upstream answered a call with: recorded (owner, server, tool, the upstream's
    /// id, expiry) and its creation audited before the caller sees it, under the gateway's
    /// handle. The upstream's id goes no further.
    pub(super) async fn adopt_task(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        origin: TaskOrigin,
        mut created: CreateTaskResult,
    ) -> Result<CreateTaskResult, ProxyError> {
        let now = now_millis();
        let pinned = origin.pinned;
        let row = TaskRow {
            id: uuid::Uuid::new_v4().to_string(),
            tenant: ctx.tenant_id(),
            user: ctx.user_id(),
            server: origin.server,
            tool: origin.tool,
            caps: origin.caps.key(),
            upstream_task_id: Some(std::mem::take(&mut created.task.task_id)),
            args_digest: origin.args_digest,
            status: status_name(&created.task.status).to_owned(),
            created_at: now,
            updated_at: now,
            expires_at: tasks::expiry(now, created.task.ttl_ms),
            terminal_at: None,
            cancel_requested_at: None,
            lease_until: None,
            result: None,
            error: None,
        };
        created.task.task_id = self.record_task(ctx, context, &row, pinned).await?;
        // The gateway keeps the task no longer than this.
        let left = u64::try_from(row.expires_at - now).unwrap_or(0);
        created.task.ttl_ms = Some(created.task.ttl_ms.map_or(left, |t| t.min(left)));
        created.task.poll_interval_ms.get_or_insert(tasks::DEFAULT_POLL_MS);
        created.meta = None;
        Ok(created)
    }

    /// Records a new task and audits its creation, before the caller learns of it; returns the
    /// caller's handle. Fails closed: no row or no event, no handle.
    pub(super) async fn record_task(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        row: &TaskRow,
        pinned: bool,
    ) -> Result<String, ProxyError> {
        let stored = async {
            let mut conn = self.shared.db.pool().acquire().await?;
            rows::insert(&mut conn, row).await
        };
        if let Err(e) = stored.await {
            tracing::error!(error = %e, "recording a task failed");
            return Err(ProxyError::Upstream(ErrorData::internal_error("internal error", None)));
        }
        let event = self.task_event(ctx, context, "tasks/create", &row.tool, Some(&row.args_digest), Outcome::Ok, None);
        self.shared.audit.record_or_withhold(event, &row.tool).await.map_err(|w| ProxyError::Upstream(w.into()))?;
        let replica = pinned.then_some(self.shared.replica.as_str());
        Ok(tasks::mint(&self.shared.tasks_key, &row.id, row.tenant, row.user, row.expires_at, replica))
    }

    /// `tasks/get`: the upstream's state of the caller's task, under the caller's handle.
    pub(super) async fn get_task_of(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let (ctx, reached) = self.reach(Method::Get, &request.task_id, &context).await?;
        let Some(upstream_id) = reached.row.upstream_task_id.clone() else {
            return self.get_run_task(reached.row, request.task_id).await;
        };
        let upstream = ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(upstream_id)));
        let answer = self.relay_task(&ctx, &context, &reached, upstream).await?;
        let ServerResult::GetTaskResult(mut result) = answer else {
            return Err(ErrorData::internal_error("the upstream answered tasks/get with something else", None));
        };
        result.task.task.task_id = request.task_id;
        result.meta = None;
        let status = status_name(&result.task.task.status);
        self.observe(&ctx, &context, &reached.row, status).await?;
        Ok(result)
    }

    /// `tasks/update`: the caller's answers to its task's input requests, to the upstream.
    pub(super) async fn update_task_of(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (ctx, reached) = self.reach(Method::Update, &request.task_id, &context).await?;
        let Some(upstream_id) = reached.row.upstream_task_id.clone() else {
            return self.update_run_task(&reached.row, request.input_responses).await;
        };
        let mut params = UpdateTaskParams::new(upstream_id, request.input_responses);
        params.meta = None;
        let upstream = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(params));
        match self.relay_task(&ctx, &context, &reached, upstream).await? {
            ServerResult::TaskAckResult(_) => Ok(()),
            _ => Err(ErrorData::internal_error("the upstream answered tasks/update with something else", None)),
        }
    }

    /// `tasks/cancel`: recorded and audited, then sent to the upstream.
    pub(super) async fn cancel_task_of(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (ctx, reached) = self.reach(Method::Cancel, &request.task_id, &context).await?;
        let mut conn = self.shared.db.pool().acquire().await.map_err(internal)?;
        rows::mark_cancel_requested(&mut conn, &reached.row.id, now_millis()).await.map_err(internal)?;
        drop(conn);
        let event = self.task_event(&ctx, &context, "tasks/cancel", &reached.row.tool, None, Outcome::Ok, None);
        self.shared.audit.record_or_withhold(event, &reached.row.tool).await?;
        // A task the gateway runs: the replica running it reads the cancel from the row.
        let Some(upstream_id) = reached.row.upstream_task_id.clone() else { return Ok(()) };
        let upstream = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(CancelTaskParams::new(upstream_id)));
        match self.relay_task(&ctx, &context, &reached, upstream).await? {
            ServerResult::TaskAckResult(_) => Ok(()),
            _ => Err(ErrorData::internal_error("the upstream answered tasks/cancel with something else", None)),
        }
    }

    /// The caller (fail closed), its task named by `handle`, and the upstream serving it,
    /// reached the way the call that created it was: the same server, the caller's grants on
    /// the tool now. Anything else is answered as an unknown task and audited as refused.
    async fn reach(
        &self,
        method: Method,
        handle: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(McpCallContext, Reached), ErrorData> {
        let ctx = context_for(context, &self.shared.sessions).map_err(|e| refused(&e))?;
        if !declares_tasks(context) {
            // As a caller that did not declare the extension (on the older revisions it is not
            // defined, whatever their `initialize` said): rmcp refuses such requests before
            // they get here, and this holds should it not.
            return Err(ErrorData::missing_required_client_capability(
                rmcp::model::ClientCapabilities::builder().enable_tasks().build(),
            ));
        }
        let (row, refusal) = match self.find(&ctx, handle).await? {
            None => (None, "unknown_task"),
            Some(row) => match self.route_task(&ctx, context, &row).await {
                Ok(Some(upstream)) => return Ok((ctx, Reached { row, upstream })),
                Ok(None) => (Some(row), "not_granted"),
                Err(e) => {
                    let event = self.task_event(
                        &ctx,
                        context,
                        method.name(),
                        &row.tool,
                        None,
                        Outcome::Failed,
                        Some(e.class()),
                    );
                    self.shared.audit.record_or_withhold(event, method.name()).await?;
                    return Err(e.into_error_data());
                }
            },
        };
        metrics::denial("unknown_task");
        let tool = row.as_ref().map(|r| r.tool.as_str());
        let event =
            self.task_event(&ctx, context, method.name(), tool.unwrap_or(""), None, Outcome::Denied, Some(refusal));
        let event = AuditEvent { tool: tool.map(str::to_owned), ..event };
        self.shared.audit.record_or_withhold(event, method.name()).await?;
        Err(unknown_task())
    }

    /// The caller's own task of this handle, when it has not expired.
    async fn find(&self, ctx: &McpCallContext, handle: &str) -> Result<Option<TaskRow>, ErrorData> {
        let now = now_millis();
        let Some(id) = tasks::open(&self.shared.tasks_key, handle, ctx.tenant_id(), ctx.user_id(), now) else {
            return Ok(None);
        };
        let mut conn = self.shared.db.pool().acquire().await.map_err(internal)?;
        rows::find_owned(&mut conn, &id, ctx.tenant_id(), ctx.user_id(), now).await.map_err(internal)
    }

    /// When the caller's grants still allow the task's tool on its server, or (a tenant with
    /// policies) the policies would still list it for the caller (`None` otherwise): for a task
    /// of the upstream's own, the connection it was created on and its upstream.
    #[allow(clippy::type_complexity)]
    async fn route_task(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        row: &TaskRow,
    ) -> Result<Option<Option<(Arc<Connection>, crate::proxy::Upstream)>>, ProxyError> {
        let Some(caps) = RelayCaps::from_key(&row.caps) else { return Ok(None) };
        let upstreams = &self.shared.upstreams;
        let snapshot = upstreams
            .snapshot(ctx.tenant_id(), ctx.user_id(), ctx.session_id(), caps)
            .await
            .map_err(|e| ProxyError::Unavailable(e.to_string()))?;
        let Some((server, name)) = surface::route_name(&*snapshot, &row.tool) else { return Ok(None) };
        if server != row.server {
            return Ok(None);
        }
        let Some(connection) = snapshot.connection(server).cloned() else { return Ok(None) };
        let ask = super::ask_for(&self.shared, ctx, context).await;
        if ask.grants_only() {
            if !snapshot.allowed(server, name, ctx.roles()) {
                return Ok(None);
            }
        } else {
            let facts = upstreams.connection_facts(ctx.tenant_id(), &connection).await?;
            let grant = snapshot.granting(server, crate::store::entities::GrantKind::Tool, name, ctx.roles());
            if !facts.get(name).is_some_and(|f| ask.list(f, grant.as_deref())) {
                return Ok(None);
            }
        }
        if row.upstream_task_id.is_none() {
            return Ok(Some(None));
        }
        match upstreams.upstream_with(&connection, name, ctx).await? {
            Some(upstream) => Ok(Some(Some((connection, upstream)))),
            None => Ok(None),
        }
    }

    /// One request on the task to its upstream, declaring the extension.
    async fn relay_task(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        reached: &Reached,
        request: ClientRequest,
    ) -> Result<ServerResult, ErrorData> {
        let Some((connection, upstream)) = &reached.upstream else {
            return Err(ErrorData::internal_error("internal error", None));
        };
        let mut exchange = self.exchange(ctx, context);
        exchange.passed = Some(PassedInput { responses: None, state: None, tasks: true });
        let answer = self.shared.upstreams.exchange(connection, upstream.peer(), ctx, request, exchange).await;
        answer.map_err(|e| private(e.into_error_data(), reached.row.upstream_task_id.as_deref()))
    }

    /// Records the status a poll saw; the first terminal one is audited (`tasks/<status>`).
    async fn observe(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        row: &TaskRow,
        status: &str,
    ) -> Result<(), ErrorData> {
        if row.terminal_at.is_some() || row.status == status && !rows::is_terminal(status) {
            return Ok(());
        }
        let mut conn = self.shared.db.pool().acquire().await.map_err(internal)?;
        let first_end = rows::observe_status(&mut conn, &row.id, status, now_millis()).await.map_err(internal)?;
        drop(conn);
        if first_end {
            let (outcome, class) = match status {
                "completed" => (Outcome::Ok, None),
                "cancelled" => (Outcome::Failed, Some("cancelled")),
                _ => (Outcome::Failed, Some("task_failed")),
            };
            let action = format!("tasks/{status}");
            let event = self.task_event(ctx, context, &action, &row.tool, Some(&row.args_digest), outcome, class);
            self.shared.audit.record_or_withhold(event, &row.tool).await?;
        }
        Ok(())
    }

    /// An audit event of `action` on a task of `tool`, by this caller.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn task_event(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        action: &str,
        tool: &str,
        args_digest: Option<&str>,
        outcome: Outcome,
        class: Option<&str>,
    ) -> AuditEvent {
        let call = call_audit(
            ctx,
            client_of(context, ctx.session_id()),
            tool.to_owned(),
            args_digest.unwrap_or_default().to_owned(),
            None,
        );
        let event = call.event(outcome, class);
        AuditEvent { action: action.to_owned(), args_digest: args_digest.map(str::to_owned), ..event }
    }
}
