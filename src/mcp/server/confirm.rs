//! The confirmation gate of the rmcp path: a call that needs a person's confirmation (see
//! `mcp::confirm`) is asked for it here, once it is allowed and before it is forwarded. Every
//! question and answer is audited before the call goes on (fail closed).

use rmcp::model::{ElicitRequest, ElicitResult, ElicitationAction, InputRequest, InputRequiredResult};
use serde_json::json;

use super::*;
use crate::mcp::confirm::{self, Approval, CONFIRM_KEY, Needed, Refusal};
use crate::model::Confirm;
use crate::store::approvals::{NewApproval, Waiting};
use crate::store::now_millis;

/// What the gate decided of a call.
pub(super) enum Gate {
    /// Forward it (the confirmation's own `requestState` and answer taken off the request).
    Go,
    /// Answer the caller with this now: the question (`input_required`).
    Answer(Box<CallToolResponse>),
}

fn withheld(_: crate::audit::Withheld) -> ProxyError {
    ProxyError::Upstream(ErrorData::internal_error("internal error", None))
}

fn store_failed(e: crate::store::StoreError) -> ProxyError {
    tracing::error!(error = %e, "a confirmation could not be read or written");
    ProxyError::Upstream(ErrorData::internal_error("internal error", None))
}

impl GatewayServer {
    /// Asks for the confirmation `needed` names, and answers whether the call goes on.
    /// `Err(ProxyError::Unconfirmed)`: it does not (declined, rejected, lapsed, invalid, or a
    /// client that can't be asked).
    pub(super) async fn confirm_call(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        call: &CallAudit,
        request: &mut CallToolRequestParams,
        needed: Needed,
    ) -> Result<Gate, ProxyError> {
        match needed.mode {
            Confirm::Caller if by_rounds(context) => self.confirm_by_rounds(ctx, context, call, request, &needed).await,
            Confirm::Caller => self.confirm_in_session(ctx, context, call, request, &needed).await,
            Confirm::Approver => match request.request_state.as_deref().filter(|_| by_rounds(context)) {
                Some(state) => {
                    let binding = self.binding(ctx, request.name.to_string(), request.arguments.as_ref());
                    self.continued(ctx, call, &binding, state).await
                }
                None => self.approve(ctx, context, call, request, &needed).await,
            },
        }
    }

    /// A retry carrying a `requestState` that is not a confirmation's: a later round of a call
    /// confirmed (or approved) before. One passed through from a 2026-07-28 upstream goes on
    /// once (each is a new call upstream); an exchange waiting in a replica is used once there
    /// by its nature. Any other state is refused where it is used, before anything is forwarded.
    async fn continued(
        &self,
        ctx: &McpCallContext,
        call: &CallAudit,
        binding: &rounds::Binding,
        state: &str,
    ) -> Result<Gate, ProxyError> {
        if let Some((nonce, exp)) = rounds::passed_once(&self.shared.cursors, binding, state) {
            let Some(nonce) = nonce else {
                return self.invalid_answer(ctx, call, None, "sealed before it could be used once").await;
            };
            let once = format!("passed:{nonce}");
            if !self.shared.db.use_consent(ctx.tenant_id(), &once, exp).await.map_err(store_failed)? {
                return self.invalid_answer(ctx, call, None, "already used").await;
            }
        }
        Ok(Gate::Go)
    }

    /// Records one event of `call`'s confirmation, failing closed.
    async fn confirmation_event(
        &self,
        call: &CallAudit,
        action: &str,
        user: crate::store::UserId,
        outcome: Outcome,
        class: Option<&str>,
        record: &serde_json::Value,
    ) -> Result<(), ProxyError> {
        let event = call.confirmation_event(action, user, outcome, class, record);
        self.shared.audit.record_or_withhold(event, &call.tool).await.map_err(withheld)
    }

    /// A session's caller, asked by an elicitation request on the call (its client declared
    /// elicitation at `initialize`), within `mcp.confirm_timeout_secs`.
    async fn confirm_in_session(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        call: &CallAudit,
        request: &CallToolRequestParams,
        needed: &Needed,
    ) -> Result<Gate, ProxyError> {
        let caps = RelayCaps::of(context, ctx.session_id().is_some());
        if ctx.session_id().is_none() || !caps.elicitation_form {
            return Err(ProxyError::Unconfirmed(Refusal::unavailable()));
        }
        let id = uuid::Uuid::new_v4().to_string();
        let message = confirm::message(needed, request.arguments.as_ref(), &call.args_digest);
        let asked = json!({ "id": id, "by": "caller", "via": "elicitation" });
        self.confirmation_event(call, "confirm.request", ctx.user_id(), Outcome::Ok, None, &asked).await?;
        let answer = context
            .peer
            .create_elicitation_with_timeout(
                confirm::elicitation(message),
                Some(self.shared.confirm_timeout.min(self.shared.session_wait)),
            )
            .await;
        let (action, class) = match answer {
            Ok(result) => match result.action {
                ElicitationAction::Accept => (Some("accept"), None),
                ElicitationAction::Decline => (Some("decline"), Some("confirmation_declined")),
                ElicitationAction::Cancel => (Some("cancel"), Some("confirmation_cancelled")),
                // An action this gateway does not know is no acceptance.
                _ => (None, Some("confirmation_invalid")),
            },
            Err(rmcp::service::ServiceError::Timeout { .. }) => (None, Some("confirmation_timeout")),
            Err(e) => {
                tracing::debug!(error = %e, "a confirmation by elicitation failed");
                (None, Some("confirmation_failed"))
            }
        };
        let answered = json!({ "id": id, "by": "caller", "via": "elicitation", "answer": action });
        let outcome = if class.is_none() { Outcome::Ok } else { Outcome::Denied };
        self.confirmation_event(call, "confirm.answer", ctx.user_id(), outcome, class, &answered).await?;
        let mut record = confirm::record(&id, Confirm::Caller, "elicitation", Some(ctx.subject()));
        record["answer"] = json!(action);
        call.set_confirmation(record);
        match class {
            None => Ok(Gate::Go),
            Some(class) => Err(ProxyError::Unconfirmed(Refusal::declined(class, refusal_text(class)))),
        }
    }

    /// A 2026-07-28 caller: asked by an `input_required` answer carrying the elicitation, its
    /// `requestState` sealed and bound to the caller, the tool, the arguments' digest and an
    /// expiry; its retry carries the answer, and the consent is used once, on any replica.
    async fn confirm_by_rounds(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        call: &CallAudit,
        request: &mut CallToolRequestParams,
        needed: &Needed,
    ) -> Result<Gate, ProxyError> {
        let binding = self.binding(ctx, request.name.to_string(), request.arguments.as_ref());
        if let Some(state) = request.request_state.as_deref() {
            let (id, exp) = match rounds::open_consent(&self.shared.cursors, &binding, state) {
                // Not a confirmation's state: a later round of a call confirmed before. One
                // passed through from a 2026-07-28 upstream goes on once (it is a new call
                // upstream each time); an exchange waiting in a replica is used once there. Any
                // other state is refused where it is used.
                None => return self.continued(ctx, call, &binding, state).await,
                Some(Err(why)) => return self.invalid_answer(ctx, call, None, why).await,
                Some(Ok(consent)) => consent,
            };
            if !self.shared.db.use_consent(ctx.tenant_id(), &id, exp).await.map_err(store_failed)? {
                return self.invalid_answer(ctx, call, Some(&id), "already used").await;
            }
            let answer = request
                .input_responses
                .as_ref()
                .and_then(|r| r.get(CONFIRM_KEY))
                .and_then(|v| serde_json::from_value::<ElicitResult>(v.clone()).ok());
            let Some(answer) = answer else {
                return self
                    .invalid_answer(ctx, call, Some(&id), "inputResponses.confirm is not an elicitation result")
                    .await;
            };
            let (action, class) = match answer.action {
                ElicitationAction::Accept => ("accept", None),
                ElicitationAction::Decline => ("decline", Some("confirmation_declined")),
                ElicitationAction::Cancel => ("cancel", Some("confirmation_cancelled")),
                _ => ("unknown", Some("confirmation_invalid")),
            };
            let answered = json!({ "id": id, "by": "caller", "via": "input_required", "answer": action });
            let outcome = if class.is_none() { Outcome::Ok } else { Outcome::Denied };
            self.confirmation_event(call, "confirm.answer", ctx.user_id(), outcome, class, &answered).await?;
            let mut record = confirm::record(&id, Confirm::Caller, "input_required", Some(ctx.subject()));
            record["answer"] = json!(action);
            call.set_confirmation(record);
            if let Some(class) = class {
                return Err(ProxyError::Unconfirmed(Refusal::declined(class, refusal_text(class))));
            }
            request.request_state = None;
            request.input_responses = None;
            return Ok(Gate::Go);
        }
        if !RelayCaps::of(context, false).elicitation_form {
            return Err(ProxyError::Unconfirmed(Refusal::unavailable()));
        }
        let id = uuid::Uuid::new_v4().to_string();
        let exp = now_millis() + i64::try_from(self.shared.confirm_timeout.as_millis()).unwrap_or(i64::MAX / 2);
        let message = confirm::message(needed, request.arguments.as_ref(), &call.args_digest);
        let asked = json!({ "id": id, "by": "caller", "via": "input_required" });
        self.confirmation_event(call, "confirm.request", ctx.user_id(), Outcome::Ok, None, &asked).await?;
        let question = InputRequest::Elicitation(ElicitRequest::new(confirm::elicitation(message)));
        let state = rounds::seal_consent(&self.shared.cursors, &binding, &id, exp);
        let mut record = confirm::record(&id, Confirm::Caller, "input_required", None);
        record["answer"] = json!("pending");
        call.set_confirmation(record);
        let questions = [(CONFIRM_KEY.to_owned(), question)].into_iter().collect();
        let question = InputRequiredResult::new(Some(questions), Some(state));
        Ok(Gate::Answer(Box::new(CallToolResponse::InputRequired(question))))
    }

    /// A confirmation's answer that does not hold: audited as refused, answered as invalid.
    async fn invalid_answer(
        &self,
        ctx: &McpCallContext,
        call: &CallAudit,
        id: Option<&str>,
        why: &str,
    ) -> Result<Gate, ProxyError> {
        let record = json!({ "id": id, "by": "caller", "via": "input_required", "invalid": why });
        self.confirmation_event(
            call,
            "confirm.answer",
            ctx.user_id(),
            Outcome::Denied,
            Some("confirmation_invalid"),
            &record,
        )
        .await?;
        call.set_confirmation(record);
        Err(ProxyError::Unconfirmed(Refusal::invalid(why)))
    }

    /// A second person approves: the call is written as waiting for an approver of the tenant
    /// and waits for the decision, at most `mcp.approval_wait_secs` (a request answered as
    /// plain JSON, at most until the HTTP request timeout is near), then goes on only if
    /// approved, with the very arguments the approver saw.
    async fn approve(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        call: &CallAudit,
        request: &CallToolRequestParams,
        needed: &Needed,
    ) -> Result<Gate, ProxyError> {
        let wait = match ctx.session_id() {
            Some(_) => self.shared.approval_wait.min(self.shared.session_wait),
            None => self.shared.approval_wait.min(self.shared.approval_wait_plain),
        };
        let new = self.pending_approval(ctx, call, request, needed, Waiting::Wait, wait).await?;
        let ended = tokio::select! {
            ended = confirm::wait_for_approval(&self.shared.db, &new) => ended.map_err(store_failed)?,
            // The caller cancelled the call: the approval lapses (the wait's guard sees to it).
            () = context.ct.cancelled() => return Err(ProxyError::Cancelled),
        };
        match ended {
            Approval::Approved(by) => {
                call.set_confirmation(confirm::record(&new.id, Confirm::Approver, "wait", Some(&by)));
                Ok(Gate::Go)
            }
            Approval::Rejected(by, reason) => {
                call.set_confirmation(confirm::record(&new.id, Confirm::Approver, "wait", Some(&by)));
                Err(rejected(reason))
            }
            Approval::Lapsed => {
                call.set_confirmation(confirm::record(&new.id, Confirm::Approver, "wait", None));
                Err(lapsed())
            }
        }
    }
}

/// What the caller is told of a confirmation refused by `class`.
fn refusal_text(class: &str) -> &'static str {
    match class {
        "confirmation_declined" => "the person declined it",
        "confirmation_cancelled" => "the person cancelled it",
        "confirmation_timeout" => "the person did not answer in time",
        _ => "the confirmation could not be asked",
    }
}

impl GatewayServer {
    /// Writes `call` as waiting for an approver (`via`, lapsing after `wait`) and audits the
    /// question. Unrecorded, it must not be decided: it lapses at once and the call fails.
    async fn pending_approval(
        &self,
        ctx: &McpCallContext,
        call: &CallAudit,
        request: &CallToolRequestParams,
        needed: &Needed,
        via: Waiting,
        wait: std::time::Duration,
    ) -> Result<NewApproval, ProxyError> {
        let new = NewApproval {
            id: uuid::Uuid::new_v4().to_string(),
            tenant: ctx.tenant_id(),
            user: ctx.user_id(),
            subject: ctx.subject().to_owned(),
            server: needed.server.clone(),
            tool: needed.tool.clone(),
            title: needed.title.clone(),
            arguments: digest::canonical_arguments(request.arguments.as_ref().unwrap_or(&Default::default())),
            args_digest: call.args_digest.clone(),
            via,
            expires_at: now_millis() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2),
        };
        self.shared.db.create_approval(&new).await.map_err(store_failed)?;
        let asked = json!({ "id": new.id, "by": "approver", "via": via.as_str() });
        if let Err(e) = self.confirmation_event(call, "confirm.request", ctx.user_id(), Outcome::Ok, None, &asked).await
        {
            let _ = self.shared.db.lapse_approval(new.tenant, &new.id).await;
            return Err(e);
        }
        Ok(new)
    }

    /// A call a second person approves, of a 2026-07-28 caller that declared the tasks
    /// extension: written as waiting for an approver (until the task's expiry), audited, and
    /// answered at once with a task whose first step waits for the decision (see
    /// [`after_approval`]).
    pub(super) async fn approval_for_task(
        &self,
        ctx: &McpCallContext,
        call: &CallAudit,
        request: &CallToolRequestParams,
        needed: &Needed,
    ) -> Result<NewApproval, ProxyError> {
        let new = self.pending_approval(ctx, call, request, needed, Waiting::Task, self.shared.task_ttl).await?;
        call.set_confirmation(confirm::record(&new.id, Confirm::Approver, "task", None));
        Ok(new)
    }
}

/// `call` made to wait, on its first run, for approval `new`: it runs only once approved; a
/// rejection or a lapse fails the task with the reason. Later runs (the rounds of the same
/// call's questions) go straight on.
pub(super) fn after_approval(db: crate::store::Db, new: NewApproval, call: task_run::Call) -> task_run::Call {
    let pending = Arc::new(std::sync::Mutex::new(Some(new)));
    Arc::new(move |exchange| {
        let first = pending.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (db, call) = (db.clone(), Arc::clone(&call));
        Box::pin(async move {
            if let Some(new) = first {
                let ended = tokio::select! {
                    ended = confirm::wait_for_approval(&db, &new) => ended.map_err(store_failed)?,
                    // The task was cancelled: the approval lapses (the wait's guard sees to it).
                    () = exchange.cancelled.cancelled() => return Err(ProxyError::Cancelled),
                };
                match ended {
                    Approval::Approved(_) => {}
                    Approval::Rejected(_, reason) => return Err(rejected(reason)),
                    Approval::Lapsed => return Err(lapsed()),
                }
            }
            call(exchange).await
        })
    })
}

fn rejected(reason: Option<String>) -> ProxyError {
    let why = match reason {
        Some(reason) => format!("an approver rejected it ({})", crate::audit::refusal::safe_text(&reason)),
        None => "an approver rejected it".to_owned(),
    };
    ProxyError::Unconfirmed(Refusal::declined("approval_rejected", &why))
}

fn lapsed() -> ProxyError {
    ProxyError::Unconfirmed(Refusal::declined("approval_lapsed", "no approver decided in time"))
}
