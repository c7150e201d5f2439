//! The proxied side of the dispatcher: a `server__tool` call, prompt, resource or completion
//! routed to the connection that serves it for this caller, and the marks every relayed
//! result gets.

use super::*;
use crate::decl::declaration::{TaskSupport, TaskTool};
use crate::store::entities::GrantKind;

impl GatewayServer {
    /// A `server__tool` call. `Err(ProxyError::NotFound)`: not a tool this caller has (answered exactly as an
    /// unknown tool); any other error: the proxied call failed.
    pub(super) async fn call_upstream(
        &self,
        ctx: &McpCallContext,
        mut request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        call: &crate::audit::CallAudit,
        ask: &crate::proxy::Ask,
    ) -> Result<CallToolResponse, ProxyError> {
        let upstreams = &self.shared.upstreams;
        let (connection, _held, tool);
        // What allows the call without policies: a grant (tenants with policies ask them too).
        let mut decide: Option<Option<String>> = None;
        // A task may come back only where the gateway can route its polls: a tenant's server
        // (not a selected root's, whose selection a later request does not carry).
        let mut tasks = false;
        // Who must confirm the call before it is forwarded (the grants' and policies' strictest).
        let mut confirm: Option<crate::model::Confirm> = None;
        if let Some((server, name)) = split_tool_name(&request.name).filter(|(s, _)| selection::is_selected_server(s)) {
            // A selected root's server: the session's own (the allowance is the grant).
            let selection = self.selection_for(ctx, context).await.map_err(ProxyError::Upstream)?;
            let runtime = selection.as_ref().ok_or(ProxyError::NotFound)?.runtime();
            connection = Arc::clone(runtime.connection(server).ok_or(ProxyError::NotFound)?);
            _held = selection;
            tool = name.to_owned();
        } else {
            let snapshot = self.snapshot(ctx, context).await.map_err(ProxyError::Upstream)?;
            if let Some(server) = snapshot.outside_root(&request.name, ctx.roles()) {
                return Err(ProxyError::OutsideRoot(server.to_owned()));
            }
            let (server, name) = surface::route_name(&*snapshot, &request.name).ok_or(ProxyError::NotFound)?;
            connection = Arc::clone(snapshot.connection(server).ok_or(ProxyError::NotFound)?);
            if !ask.grants_only() {
                decide = Some(snapshot.granting(server, GrantKind::Tool, name, ctx.roles()));
            } else if !snapshot.allowed(server, name, ctx.roles()) {
                // The tool listed for a server that needs a login (any grant on the server lists
                // it); it never reaches the upstream.
                if name == LOGIN_TOOL && snapshot.any_grant(server, ctx.roles()) {
                    return Err(upstreams
                        .upstream_with(&connection, name, ctx)
                        .await
                        .err()
                        .unwrap_or(ProxyError::NotFound));
                }
                return Err(ProxyError::NotFound);
            }
            _held = None;
            tool = name.to_owned();
            tasks = declares_tasks(context);
            confirm = snapshot.confirm_of(server, name, ctx.roles());
        }
        let tool = tool.as_str();
        let connection = &connection;
        let upstream = match upstreams.upstream_with(connection, tool, ctx).await {
            // A client that takes URL-mode elicitation is asked to log in there and then, and
            // the call goes on once it says the login is done.
            Err(ProxyError::LoginNeeded { server, link: Some(link) }) => {
                if !login_by_elicitation(&context.peer, &server, &link).await {
                    return Err(ProxyError::LoginNeeded { server, link: Some(link) });
                }
                let upstream = upstreams.upstream_with(connection, tool, ctx).await?;
                if upstream.is_none() && tool == LOGIN_TOOL {
                    let text = format!("Logged in to `{server}`: its tools are listed from now on.");
                    return Ok(CallToolResponse::Complete(CallToolResult::success(vec![ContentBlock::text(text)])));
                }
                upstream
            }
            other => other?,
        }
        .ok_or(ProxyError::NotFound)?;
        // The approved definition's title, once the tool's facts are read (shown to a person).
        let mut title = None;
        if let Some(grant) = decide {
            // The tool exists (the upstream lists it): the policies decide with its definition.
            let facts = upstreams.connection_facts(ctx.tenant_id(), connection).await?;
            let facts = facts.get(tool).ok_or(ProxyError::NotFound)?;
            title = Some(facts.title.clone());
            let outcome = ask.call(facts, grant.as_deref(), request.arguments.as_ref());
            let by_policy = outcome.decision.confirm;
            if let Some(class) = super::call::decided(outcome, call) {
                return Err(ProxyError::Refused(class));
            }
            confirm = crate::mcp::confirm::strictest(confirm, by_policy);
        }
        // A call an approver decides, of a caller that declared the tasks extension: a task
        // whose first step waits for the decision.
        let mut approval = None;
        if let Some(mode) = confirm {
            // What the person is shown: the approved definition's title, the exact arguments.
            let title = match title {
                Some(title) => title,
                None => upstreams
                    .connection_facts(ctx.tenant_id(), connection)
                    .await?
                    .get(tool)
                    .ok_or(ProxyError::NotFound)?
                    .title
                    .clone(),
            };
            let server = connection.server().as_str().to_owned();
            let needed = crate::mcp::confirm::Needed { mode, server, tool: request.name.to_string(), title };
            if mode == crate::model::Confirm::Approver && tasks {
                approval = Some(self.approval_for_task(ctx, call, &request, &needed).await?);
            } else if let super::confirm::Gate::Answer(question) =
                self.confirm_call(ctx, context, call, &mut request, needed).await?
            {
                return Ok(*question);
            }
        }
        let binding =
            by_rounds(context).then(|| self.binding(ctx, request.name.to_string(), request.arguments.as_ref()));
        let (state, responses) = (request.request_state.clone(), request.input_responses.clone());
        let (upstreams, connection, call_ctx) = (Arc::clone(upstreams), Arc::clone(connection), ctx.clone());
        let origin = || TaskOrigin {
            server: connection.server().as_str().to_owned(),
            tool: request.name.to_string(),
            caps: RelayCaps::of(context, ctx.session_id().is_some()),
            args_digest: digest::arguments_digest(request.arguments.as_ref()),
            pinned: connection.in_process(),
        };
        // A server without the tasks extension: the gateway runs the tools its declaration
        // names under `tasks` as tasks of its own (see `task_run`), for a caller that declared
        // the extension; a `required` one is refused to a caller that did not.
        let by_gateway = (_held.is_none() && !upstream.offers_tasks()).then(|| connection.task_support(tool)).flatten();
        let run_by_gateway = approval.is_some()
            || match by_gateway {
                Some(_) if tasks => true,
                Some(TaskTool { support: TaskSupport::Required, .. }) => {
                    return Err(ProxyError::Upstream(tasks_required()));
                }
                _ => false,
            };
        connection.calls.rmcp.increment(1);
        let task_origin = (tasks && connection.speaks_modern() && !run_by_gateway).then(origin);
        let modern = connection.speaks_modern();
        if run_by_gateway {
            let origin = origin();
            let binding = binding.ok_or_else(other_kind)?;
            let upstream_state = match state.as_deref() {
                Some(s) => rounds::open_passed(&self.shared.cursors, &binding, s)?,
                None => None,
            };
            let (tool, arguments) = (tool.to_owned(), request.arguments);
            let leg: task_run::Call = Arc::new(move |exchange: Exchange| {
                let (upstreams, connection, call_ctx, upstream) =
                    (Arc::clone(&upstreams), Arc::clone(&connection), call_ctx.clone(), upstream.clone());
                let (tool, arguments) = (tool.clone(), arguments.clone());
                Box::pin(async move {
                    let Exchange { downstream, timeout, cancelled, passed } = exchange;
                    let call = UpstreamCall { tool: &tool, arguments, downstream, timeout, cancelled, passed };
                    upstreams.call(&connection, upstream, &call_ctx, call).await
                })
            });
            let first = PassedInput { responses, state: upstream_state, tasks: false };
            let input_first = by_gateway.is_some_and(|t| t.input_before_task) && approval.is_none();
            let leg = match approval {
                Some(new) => super::confirm::after_approval(self.shared.db.clone(), new, leg),
                None => leg,
            };
            let start = task_run::Start { origin, binding, modern_upstream: modern, input_first, first, call: leg };
            // The call's record commits while the task's first leg runs (or first, under
            // write-ahead); its outcome is the task handed to the caller (or the first question),
            // and the task's end is audited when it comes.
            call.start(&self.shared.audit, ctx.audit_write_ahead())
                .await
                .map_err(|w| ProxyError::Upstream(w.into()))?;
            return self.run_as_task(ctx, context, start).await;
        }
        // The call's record commits while the upstream works (or first, under write-ahead).
        call.start(&self.shared.audit, ctx.audit_write_ahead()).await.map_err(|w| ProxyError::Upstream(w.into()))?;
        let (tool, arguments) = (tool.to_owned(), request.arguments);
        let start = move |exchange: Exchange| async move {
            let Exchange { downstream, timeout, cancelled, passed } = exchange;
            let call = UpstreamCall { tool: &tool, arguments, downstream, timeout, cancelled, passed };
            upstreams.call(&connection, upstream, &call_ctx, call).await
        };
        let tasks = task_origin.is_some();
        match self.proxied(ctx, context, binding, modern, tasks, state.as_deref(), responses.as_ref(), start).await? {
            rounds::Next::Input(input) => Ok(CallToolResponse::InputRequired(input)),
            rounds::Next::Done(done) => match (*done, task_origin) {
                (ServerResult::CallToolResult(result), _) => Ok(CallToolResponse::Complete(result)),
                (ServerResult::CreateTaskResult(task), Some(origin)) => {
                    self.adopt_task(ctx, context, origin, task).await.map(CallToolResponse::Task)
                }
                _ => Err(other_kind()),
            },
        }
    }

    /// What binds a multi round-trip's `requestState`: the caller, the request's item and
    /// the digest of its arguments.
    pub(super) fn binding(
        &self,
        ctx: &McpCallContext,
        item: String,
        arguments: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> rounds::Binding {
        rounds::Binding {
            tenant: ctx.tenant_id().to_string(),
            user: ctx.user_id().to_string(),
            tool: item,
            arguments: digest::arguments_digest(arguments),
        }
    }

    /// Runs a proxied request: `start` with this request's exchange; or, for a 2026-07-28
    /// caller (`binding` is what binds its `requestState`) of a 2026-07-28 upstream
    /// (`modern_upstream`), with the multi round-trip passed through (see `rounds`); or, for a
    /// 2026-07-28 caller of an older upstream, in a task of its own (it outlives this request
    /// when the upstream asks the caller something; it ends when its exchange is dropped), or,
    /// with a `requestState`, resumes the exchange it names. Returns what happens next.
    /// `Err(ProxyError::NotFound)`: nothing of that name for this caller.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn proxied<F>(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        binding: Option<rounds::Binding>,
        modern_upstream: bool,
        tasks: bool,
        state: Option<&str>,
        responses: Option<&rmcp::model::InputResponses>,
        start: impl FnOnce(Exchange) -> F,
    ) -> Result<rounds::Next, ProxyError>
    where
        F: Future<Output = Result<ServerResult, ProxyError>> + Send + 'static,
    {
        if let Some(binding) = binding.as_ref().filter(|_| modern_upstream) {
            let key = &self.shared.cursors;
            let upstream_state = state.map(|s| rounds::open_passed(key, binding, s)).transpose()?.flatten();
            let mut exchange = self.exchange(ctx, context);
            exchange.passed = Some(PassedInput { responses: responses.cloned(), state: upstream_state, tasks });
            return match start(exchange).await? {
                ServerResult::InputRequiredResult(mut input) => {
                    let upstream = input.request_state.take();
                    let sealed = rounds::seal_passed(key, binding, upstream, self.shared.call_timeout);
                    input.request_state = Some(sealed);
                    Ok(rounds::Next::Input(input))
                }
                mut done => {
                    completed(&mut done);
                    Ok(rounds::Next::Done(Box::new(done)))
                }
            };
        }
        let Some(binding) = binding else {
            return start(self.exchange(ctx, context)).await.map(|mut done| {
                completed(&mut done);
                rounds::Next::Done(Box::new(done))
            });
        };
        let key = &self.shared.rounds_key;
        let running = match state {
            Some(state) => self.shared.rounds.resume(key, &binding, state, responses)?,
            None => {
                let (sender, receiver) = tokio::sync::mpsc::channel(2);
                let cancel = tokio_util::sync::CancellationToken::new();
                let downstream = Downstream { rounds: Some(sender.clone()), ..self.downstream(ctx, context) };
                let exchange =
                    Exchange { downstream, timeout: self.shared.call_timeout, cancelled: cancel.clone(), passed: None };
                let work = start(exchange);
                tokio::spawn(
                    async move {
                        let result = work.await;
                        let _ = sender.send(Round::Done(result)).await;
                    }
                    .in_current_span(),
                );
                rounds::Running { rounds: receiver, call: cancel.drop_guard() }
            }
        };
        match self.shared.rounds.next(key, &self.shared.replica, binding, running, self.shared.call_timeout).await {
            Ok(rounds::Next::Done(mut done)) => {
                completed(&mut done);
                Ok(rounds::Next::Done(done))
            }
            other => other,
        }
    }
}

/// The refusal of a tool that runs only as a task to a caller that did not declare the tasks
/// extension (-32021, naming it).
fn tasks_required() -> ErrorData {
    ErrorData::missing_required_client_capability(rmcp::model::ClientCapabilities::builder().enable_tasks().build())
}

/// Marks an upstream's final result `resultType: "complete"` where it left it out: a
/// 2026-07-28 caller must find it on every result (rmcp takes it off again for a caller on an
/// older revision); and a cacheable one `cacheScope: "private"`.
pub(super) fn completed(result: &mut ServerResult) {
    // What the gateway answers depends on who asks (grants, tenant): a shared cache must never
    // keep it, whatever the upstream said of its own answer.
    if let ServerResult::ReadResourceResult(r) = result {
        r.cache_scope = Some(rmcp::model::CacheScope::Private);
    }
    let result_type = match result {
        ServerResult::CallToolResult(r) => &mut r.result_type,
        ServerResult::GetPromptResult(r) => &mut r.result_type,
        ServerResult::ReadResourceResult(r) => &mut r.result_type,
        ServerResult::CompleteResult(r) => &mut r.result_type,
        _ => return,
    };
    result_type.get_or_insert(rmcp::model::ResultType::COMPLETE);
}
