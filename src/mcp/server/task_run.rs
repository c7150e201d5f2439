//! Tasks the gateway runs itself: a tool that a server's declaration names under `tasks`, on
//! a server that does not offer the tasks extension, called by a 2026-07-28 caller that
//! declared it. The extension lets a server decide alone to answer a call with a task; the
//! gateway is that server to its callers. The call goes to the upstream as a plain call,
//! started on this replica; the caller gets a task at once, and its row (`store::tasks`) is
//! what every replica answers polls from:
//!
//! - the replica running the call keeps a lease on the row while it runs, and checks the row
//!   every [`POLL`]: a `tasks/cancel` (made on any replica) cancels the call, which tells the
//!   upstream; answers a `tasks/update` recorded go to the questions waiting for them;
//! - what the upstream asks its client while the call runs (its `elicitation/create`,
//!   `sampling/createMessage` or `roots/list`, or a 2026-07-28 upstream's `input_required`)
//!   becomes the task's `inputRequests`, under keys the gateway mints;
//! - the end is written to the row (the result, bounded by `mcp.task_max_result_bytes`, or the
//!   JSON-RPC error) and audited; a task whose lease lapsed unfinished (its replica stopped)
//!   is answered failed.
//!
//! For a tool whose declaration says `inputBeforeTask`, a 2026-07-28 upstream that asks its
//! first question right away (within [`PROMOTE_AFTER`]) is answered through the call's own
//! multi round-trip instead, before any task exists: the extension wants the rounds of a tool
//! that gathers its input before it works resolved before the task is created (the suite's
//! `tasks-mrtr-composition`).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{
    CreateTaskResult, DetailedTask, GetTaskResult, InputRequest, InputRequests, InputResponses, Task, TaskPayload,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::tasks::{TaskOrigin, internal, status_name, unknown_task};
use super::*;
use crate::audit::{AuditEvent, CallAudit};
use crate::mcp::tasks;
use crate::store::now_millis;
use crate::store::tasks::{self as rows, TaskRow};

/// How long a call that becomes a task is waited on first (see the module's doc).
const PROMOTE_AFTER: Duration = Duration::from_millis(250);

/// How often the replica running a task reads its row.
const POLL: Duration = Duration::from_millis(200);

/// How long a lease lasts past its last renewal by the running replica.
const LEASE_MS: i64 = 10_000;

/// How often the running replica renews its lease (a write; the row is read every [`POLL`]).
const RENEW_EVERY_MS: i64 = 2_000;

/// The most rounds of questions a 2026-07-28 upstream may ask in one task.
const MAX_ROUNDS: usize = 10;

/// A call of the upstream, made again for each round of a 2026-07-28 upstream's questions.
pub(crate) type Call = Arc<dyn Fn(Exchange) -> BoxFuture<'static, Result<ServerResult, ProxyError>> + Send + Sync>;

/// How a task the gateway runs is started.
pub(crate) struct Start {
    pub origin: TaskOrigin,
    /// What binds the caller's multi round-trip (its `requestState`).
    pub binding: rounds::Binding,
    /// The upstream speaks 2026-07-28: its questions are `input_required` answers.
    pub modern_upstream: bool,
    /// Its first questions, when they come at once, are asked through the call's own multi
    /// round-trip before the task exists (the declaration's `inputBeforeTask`).
    pub input_first: bool,
    /// The caller's answers and the upstream's `requestState` of a round this call continues.
    pub first: PassedInput,
    pub call: Call,
}

/// An RFC 3339 time of epoch milliseconds.
fn iso(ms: i64) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// The JSON-RPC error object of `e`.
fn error_json(e: &ErrorData) -> String {
    serde_json::to_string(e).unwrap_or_else(|_| r#"{"code":-32603,"message":"internal error"}"#.to_owned())
}

impl GatewayServer {
    /// Runs a call as a task of the gateway's (see the module's doc): the caller's answer is the
    /// task, or the upstream's first multi round-trip question.
    pub(super) async fn run_as_task(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        start: Start,
    ) -> Result<CallToolResponse, ProxyError> {
        let shared = &self.shared;
        let Start { origin, binding, modern_upstream, input_first, first, call } = start;
        let (asks, asked) = mpsc::channel(8);
        let cancel = CancellationToken::new();
        let mut downstream = Downstream {
            rounds: Some(asks),
            progress: None,
            log_level: Arc::new(LogLevel::of_request(None)),
            ..self.downstream(ctx, context)
        };
        if let Some(origin) = downstream.origin.take() {
            let origin = CallOrigin {
                audit: origin.audit.clone(),
                tenant: origin.tenant,
                user: origin.user,
                session: origin.session.clone(),
                request_id: origin.request_id.clone(),
                client: origin.client.clone(),
                timeout: shared.task_ttl,
            };
            downstream.origin = Some(Arc::new(origin));
        }
        let (ttl, cancelled) = (shared.task_ttl, cancel.clone());
        let exchange = move |passed: Option<PassedInput>| Exchange {
            downstream: downstream.clone(),
            timeout: ttl,
            cancelled: cancelled.clone(),
            passed,
        };
        let mut running = tokio::spawn((call)(exchange(modern_upstream.then_some(first))));
        let mut early = None;
        if modern_upstream && input_first {
            tokio::select! {
                ended = &mut running => early = Some(joined(ended)),
                () = tokio::time::sleep(PROMOTE_AFTER) => {}
            }
            if let Some(Ok(ServerResult::InputRequiredResult(mut input))) = early {
                let upstream = input.request_state.take();
                input.request_state =
                    Some(rounds::seal_passed(&shared.cursors, &binding, upstream, shared.call_timeout));
                return Ok(CallToolResponse::InputRequired(input));
            }
        }

        let now = now_millis();
        let row = TaskRow {
            id: uuid::Uuid::new_v4().to_string(),
            tenant: ctx.tenant_id(),
            user: ctx.user_id(),
            server: origin.server,
            tool: origin.tool,
            caps: origin.caps.key(),
            upstream_task_id: None,
            args_digest: origin.args_digest,
            status: "working".to_owned(),
            created_at: now,
            updated_at: now,
            expires_at: now + ms(shared.task_ttl),
            terminal_at: None,
            cancel_requested_at: None,
            lease_until: Some(now + LEASE_MS),
            result: None,
            error: None,
        };
        // Any replica serves it: its state is in the database, and its lease says who runs it.
        let handle = self.record_task(ctx, context, &row, false).await.inspect_err(|_| cancel.cancel())?;
        let ttl = u64::try_from(row.expires_at - row.created_at).unwrap_or(0);
        let task = Task::new(handle, rmcp::model::TaskStatus::Working, iso(now), iso(now))
            .with_ttl_ms(ttl)
            .with_poll_interval_ms(tasks::DEFAULT_POLL_MS);
        let runner = Runner {
            db: shared.db.clone(),
            audit: shared.audit.clone(),
            call_audit: call_audit(
                ctx,
                client_of(context, ctx.session_id()),
                row.tool.clone(),
                row.args_digest.clone(),
                None,
            ),
            id: row.id.clone(),
            tool: row.tool.clone(),
            expires_at: row.expires_at,
            max_result: shared.task_max_result_bytes,
            cancel: cancel.clone(),
            asked,
            waiting: HashMap::new(),
            minted: 0,
            renewed: now,
        };
        let again = move |passed: PassedInput| (call)(exchange(Some(passed)));
        tokio::spawn(runner.drive(early, running, modern_upstream, again).in_current_span());
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    /// `tasks/get` of a task the gateway runs: its row, as the extension shapes it.
    pub(super) async fn get_run_task(&self, row: TaskRow, handle: String) -> Result<GetTaskResult, ErrorData> {
        let mut conn = self.shared.db.pool().acquire().await.map_err(internal)?;
        let now = now_millis();
        let mut row = row;
        // A task whose replica stopped running it: failed.
        if row.terminal_at.is_none() && row.lease_until.is_some_and(|until| until < now) {
            let error = ErrorData::internal_error("the gateway replica running the task stopped", None);
            rows::finish(&mut conn, &row.id, "failed", None, Some(&error_json(&error)), now).await.map_err(internal)?;
            row = rows::find(&mut conn, &row.id).await.map_err(internal)?.ok_or_else(unknown_task)?;
        }
        let object = |text: &Option<String>| -> Result<rmcp::model::JsonObject, ErrorData> {
            serde_json::from_str(text.as_deref().unwrap_or("{}")).map_err(internal)
        };
        let (status, payload) = match row.status.as_str() {
            "completed" => {
                (rmcp::model::TaskStatus::Completed, TaskPayload::Completed { result: object(&row.result)? })
            }
            "failed" => (rmcp::model::TaskStatus::Failed, TaskPayload::Failed { error: object(&row.error)? }),
            "cancelled" => (rmcp::model::TaskStatus::Cancelled, TaskPayload::Cancelled),
            _ => {
                let open: Vec<(String, String)> = rows::open_inputs(&mut conn, &row.id).await.map_err(internal)?;
                let input_requests: InputRequests = open
                    .into_iter()
                    .filter_map(|(key, request)| serde_json::from_str::<InputRequest>(&request).ok().map(|r| (key, r)))
                    .collect();
                if input_requests.is_empty() {
                    (rmcp::model::TaskStatus::Working, TaskPayload::Working)
                } else {
                    (rmcp::model::TaskStatus::InputRequired, TaskPayload::InputRequired { input_requests })
                }
            }
        };
        let ttl = u64::try_from(row.expires_at - row.created_at).unwrap_or(0);
        let mut task = Task::new(handle, status, iso(row.created_at), iso(row.updated_at)).with_ttl_ms(ttl);
        if !status_name(&task.status).ends_with("ed") {
            task = task.with_poll_interval_ms(tasks::DEFAULT_POLL_MS);
        }
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }

    /// `tasks/update` of a task the gateway runs: each answer to a question still open is
    /// recorded for the replica running it; others are ignored.
    pub(super) async fn update_run_task(&self, row: &TaskRow, responses: InputResponses) -> Result<(), ErrorData> {
        let mut conn = self.shared.db.pool().acquire().await.map_err(internal)?;
        for (key, response) in responses {
            let response = serde_json::to_string(&response).map_err(internal)?;
            rows::answer_input(&mut conn, &row.id, &key, &response).await.map_err(internal)?;
        }
        Ok(())
    }
}

/// The outcome of a spawned call.
fn joined(ended: Result<Result<ServerResult, ProxyError>, tokio::task::JoinError>) -> Result<ServerResult, ProxyError> {
    ended.unwrap_or_else(|e| Err(ProxyError::Unavailable(format!("the call stopped: {e}"))))
}

/// What the replica running a task holds.
struct Runner {
    db: crate::store::Db,
    audit: crate::audit::AuditWriter,
    call_audit: CallAudit,
    id: String,
    tool: String,
    expires_at: i64,
    max_result: usize,
    cancel: CancellationToken,
    /// What a legacy upstream asks its client while the call runs.
    asked: mpsc::Receiver<Round>,
    /// The questions waiting for an answer, by key.
    waiting: HashMap<String, oneshot::Sender<Value>>,
    minted: u64,
    /// When the lease was last renewed (epoch ms).
    renewed: i64,
}

/// Why a task stopped before its call ended.
enum Stop {
    Cancelled,
    Expired,
}

impl Runner {
    /// Runs the task to its end: its call (and, for a 2026-07-28 upstream, the calls of its
    /// further rounds), serving questions, answers, cancellation and the lease meanwhile.
    async fn drive(
        mut self,
        early: Option<Result<ServerResult, ProxyError>>,
        mut running: tokio::task::JoinHandle<Result<ServerResult, ProxyError>>,
        modern_upstream: bool,
        again: impl Fn(PassedInput) -> BoxFuture<'static, Result<ServerResult, ProxyError>>,
    ) {
        let mut outcome = early;
        let mut round = 0;
        let end = loop {
            let answer = match outcome.take() {
                Some(answer) => answer,
                None => match self.wait(&mut running).await {
                    Ok(answer) => answer,
                    Err(stop) => break Err(stop),
                },
            };
            match answer {
                Ok(ServerResult::InputRequiredResult(input)) if modern_upstream && round < MAX_ROUNDS => {
                    round += 1;
                    let responses = match self.ask_round(input.input_requests.unwrap_or_default()).await {
                        Ok(responses) => responses,
                        Err(stop) => break Err(stop),
                    };
                    let passed = PassedInput { responses: Some(responses), state: input.request_state, tasks: false };
                    running = tokio::spawn(again(passed));
                }
                other => break Ok(other),
            }
        };
        self.cancel.cancel();
        let (status, result, error) = match end {
            Err(Stop::Cancelled) | Ok(Err(ProxyError::Cancelled)) => ("cancelled", None, None),
            Err(Stop::Expired) => ("failed", None, Some(ErrorData::internal_error("the task ran out of time", None))),
            Ok(Ok(ServerResult::CallToolResult(mut result))) => {
                result.result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
                match serde_json::to_string(&result) {
                    Ok(json) if json.len() <= self.max_result => ("completed", Some(json), None),
                    Ok(json) => {
                        let message =
                            format!("the task's result ({} bytes) is larger than the gateway keeps", json.len());
                        ("failed", None, Some(ErrorData::internal_error(message, None)))
                    }
                    Err(e) => ("failed", None, Some(ErrorData::internal_error(format!("the result: {e}"), None))),
                }
            }
            Ok(Ok(_)) => (
                "failed",
                None,
                Some(ErrorData::internal_error("the upstream answered a call with something else", None)),
            ),
            Ok(Err(e)) => ("failed", None, Some(e.into_error_data())),
        };
        self.finish(status, result, error).await;
    }

    /// Waits for the running call's answer, serving its questions, the answers recorded for
    /// them, cancellation, the lease and the expiry meanwhile.
    async fn wait(
        &mut self,
        running: &mut tokio::task::JoinHandle<Result<ServerResult, ProxyError>>,
    ) -> Result<Result<ServerResult, ProxyError>, Stop> {
        let mut tick = tokio::time::interval(POLL);
        loop {
            tokio::select! {
                ended = &mut *running => return Ok(joined(ended)),
                Some(round) = self.asked.recv() => {
                    if let Round::Ask { request, answer } = round {
                        let key = self.mint_key();
                        self.ask(&key, &request).await;
                        self.waiting.insert(key, answer);
                    }
                }
                _ = tick.tick() => self.check().await?,
            }
        }
    }

    /// Asks a 2026-07-28 upstream's round of questions as the task's and waits for every
    /// answer; returns them under the upstream's keys.
    async fn ask_round(&mut self, requests: InputRequests) -> Result<InputResponses, Stop> {
        let mut pending = Vec::new();
        for (upstream_key, request) in requests {
            let key = self.mint_key();
            let (answer, answered) = oneshot::channel();
            self.ask(&key, &request).await;
            self.waiting.insert(key, answer);
            pending.push((upstream_key, answered));
        }
        let mut tick = tokio::time::interval(POLL);
        let mut responses = InputResponses::new();
        for (upstream_key, mut answered) in pending {
            let value = loop {
                tokio::select! {
                    value = &mut answered => break value.unwrap_or(Value::Null),
                    _ = tick.tick() => self.check().await?,
                }
            };
            responses.insert(upstream_key, value);
        }
        Ok(responses)
    }

    fn mint_key(&mut self) -> String {
        self.minted += 1;
        format!("input-{}", self.minted)
    }

    /// Records a question of the task and shows the task waiting for input.
    async fn ask(&self, key: &str, request: &InputRequest) {
        let Ok(request) = serde_json::to_string(request) else { return };
        let recorded = async {
            let mut conn = self.db.pool().acquire().await?;
            rows::add_input(&mut conn, &self.id, key, &request, now_millis()).await?;
            rows::observe_status(&mut conn, &self.id, "input_required", now_millis()).await
        };
        if let Err(e) = recorded.await {
            tracing::warn!(error = %e, task = %self.id, "recording a task's question failed");
        }
    }

    /// One check of the row: the lease renewed, answers passed on, a cancel or the expiry seen.
    async fn check(&mut self) -> Result<(), Stop> {
        let now = now_millis();
        if now >= self.expires_at {
            return Err(Stop::Expired);
        }
        let renew = now - self.renewed >= RENEW_EVERY_MS;
        let checked = async {
            let mut conn = self.db.pool().acquire().await?;
            if renew {
                rows::renew_lease(&mut conn, &self.id, now + LEASE_MS).await?;
            }
            let row = rows::find(&mut conn, &self.id).await?;
            let answers = rows::take_answers(&mut conn, &self.id, now).await?;
            Ok::<_, crate::store::StoreError>((row, answers, conn))
        };
        let (row, answers, mut conn) = match checked.await {
            Ok(checked) => checked,
            Err(e) => {
                tracing::warn!(error = %e, task = %self.id, "checking a task failed; checking again");
                return Ok(());
            }
        };
        if renew {
            self.renewed = now;
        }
        match row {
            // Gone (its user deleted, or purged): nobody can see it any more.
            None => return Err(Stop::Cancelled),
            Some(row) if row.cancel_requested_at.is_some() => return Err(Stop::Cancelled),
            Some(_) => {}
        }
        let had = !self.waiting.is_empty();
        for (key, response) in answers {
            if let Some(answer) = self.waiting.remove(&key) {
                let _ = answer.send(serde_json::from_str(&response).unwrap_or(Value::Null));
            }
        }
        if had && self.waiting.is_empty() {
            let _ = rows::observe_status(&mut conn, &self.id, "working", now).await;
        }
        Ok(())
    }

    /// Writes the task's end and audits it (the end is audited before it is shown; when the
    /// audit can't be written, the result is withheld and the task failed).
    async fn finish(&self, status: &str, result: Option<String>, error: Option<ErrorData>) {
        let (outcome, class) = match status {
            "completed" => (Outcome::Ok, None),
            "cancelled" => (Outcome::Failed, Some("cancelled")),
            _ => (Outcome::Failed, Some("task_failed")),
        };
        let event = self.call_audit.event(outcome, class);
        let event = AuditEvent { action: format!("tasks/{status}"), ..event };
        let (status, result, error) = match self.audit.record_or_withhold(event, &self.tool).await {
            Ok(()) => (status, result, error),
            Err(_) => ("failed", None, Some(ErrorData::internal_error("the task's end could not be recorded", None))),
        };
        let error = error.as_ref().map(error_json);
        let written = async {
            let mut conn = self.db.pool().acquire().await?;
            rows::finish(&mut conn, &self.id, status, result.as_deref(), error.as_deref(), now_millis()).await
        };
        if let Err(e) = written.await {
            tracing::error!(error = %e, task = %self.id, "writing a task's end failed");
        }
    }
}
