//! The rmcp path's calls: a `tools/call` decided (native or proxied) and timed into a typed
//! verdict that the call pipeline (`mcp::pipeline`) concludes, and the proxied requests that
//! are not tool calls (`prompts/get`, `resources/read`, `completion/complete`) and malformed
//! calls audited like calls, failing closed.

use super::*;
use crate::mcp::pipeline::{Verdict, argument_digests, call_audit, conclude};

impl GatewayServer {
    /// A `tools/call`, native or proxied: the caller's context (fail closed), the decision,
    /// the call, and its audit event before the answer.
    pub(super) async fn serve_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let shared = &self.shared;
        let ctx = context_for(&context, &shared.sessions).map_err(|e| refused(&e))?;
        let tool = request.name.to_string();
        let client = client_of(&context, ctx.session_id());
        // The arguments are read where they lie (never cloned).
        let (args_digest, args_raw) = argument_digests(request.arguments.as_ref(), shared.record_raw_arguments);
        let call = Arc::new(call_audit(&ctx, client, tool.clone(), args_digest, args_raw));

        let native = shared.tools.has(&tool);
        let ask = ask_for(shared, &ctx, &context).await;
        // Each leg's future is boxed: a proxied call's is large, and polled in place it would
        // take that much more of the worker's stack (debug builds overflowed it).
        let verdict = if !native {
            Verdict::from(Box::pin(self.call_upstream(&ctx, request, &context, &call, &ask)).await)
        } else if !tool_allowed(&shared.tools, &tool, ctx.roles()) {
            // Not listed for this caller: answered exactly as a tool that does not exist.
            Verdict::Unknown { listed: true }
        } else {
            match native_decided(shared, &ask, &tool, request.arguments.as_ref(), &call) {
                Err(class) => Verdict::Refused { class },
                Ok(confirm) => Box::pin(self.call_native(&ctx, request, context, &call, confirm)).await,
            }
        };
        Box::pin(conclude(shared, &ctx, &call, &tool, !native, verdict)).await
    }
}

impl GatewayServer {
    /// A native tool's call its roles and the policies allow: its arguments checked, the
    /// confirmation it needs (`confirm`) asked for, then run within `mcp.call_timeout_secs`.
    async fn call_native(
        &self,
        ctx: &McpCallContext,
        mut request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
        call: &Arc<crate::audit::CallAudit>,
        confirm: Option<crate::model::Confirm>,
    ) -> Verdict<CallToolResponse> {
        let shared = &self.shared;
        let tool = request.name.to_string();
        let empty = Default::default();
        if let Some(Err(invalid)) =
            shared.tools.spec(&tool).map(|spec| (spec.validate)(request.arguments.as_ref().unwrap_or(&empty)))
        {
            return Verdict::Answered(invalid.into_call_tool_result());
        }
        if let Some(mode) = confirm {
            let server = crate::mcp::confirm::NATIVE_SERVER.to_owned();
            let needed = crate::mcp::confirm::Needed { mode, server, tool: tool.clone(), title: None };
            match self.confirm_call(ctx, &context, call, &mut request, needed).await {
                Ok(super::confirm::Gate::Go) => {}
                Ok(super::confirm::Gate::Answer(question)) => return Verdict::Answered(Ok(*question)),
                Err(e) => return Verdict::from(Err::<CallToolResponse, _>(e)),
            }
        }
        // The call's record commits while the tool runs (or first, under write-ahead); a write
        // of the tool waits for it, and commits the call's outcome with the write.
        if call.start(&shared.audit, ctx.audit_write_ahead()).await.is_err() {
            return Verdict::ProxyFailed(ProxyError::Unavailable("the call was not recorded".to_owned()));
        }
        context.extensions.insert(Arc::new(CallEnv {
            db: shared.db.clone(),
            audit: shared.audit.clone(),
            sessions: Arc::clone(&shared.sessions),
            call: Arc::clone(call),
        }));
        match tokio::time::timeout(shared.call_timeout, shared.tools.call(request, context)).await {
            Ok(result) => Verdict::Answered(result),
            Err(_) => {
                tracing::warn!(%tool, "tool call timed out");
                Verdict::TimedOut
            }
        }
    }
}

/// What the tenant's policies decide of a call of native `tool` (its roles allow the caller):
/// `Err`: refused, the refusal's audit class; `Ok`: allowed, with the confirmation a permit asks
/// for. Records what the policies decided on `call`.
fn native_decided(
    shared: &Shared,
    ask: &crate::proxy::Ask,
    tool: &str,
    arguments: Option<&serde_json::Map<String, serde_json::Value>>,
    call: &crate::audit::CallAudit,
) -> Result<Option<crate::model::Confirm>, &'static str> {
    if ask.grants_only() {
        return Ok(None);
    }
    let Some(facts) = shared.upstreams.policies().native_facts(tool) else {
        return Err("policy_error");
    };
    let outcome = ask.call(facts, Some(crate::policy::NATIVE_ROLES), arguments);
    let confirm = outcome.decision.confirm;
    match decided(outcome, call) {
        Some(class) => Err(class),
        None => Ok(confirm),
    }
}

/// Records `outcome` on `call` when policies took part; the refusal's audit class if refused.
pub(super) fn decided(outcome: crate::policy::Outcome, call: &crate::audit::CallAudit) -> Option<&'static str> {
    if outcome.consulted {
        call.set_policy(crate::policy::audit_text(&outcome));
    }
    (!outcome.decision.allow).then(|| outcome.decision.reason.refusal_class())
}

/// A proxied request that is not a tool call, as its audit names it.
pub(super) struct Asked<'a> {
    /// `prompts/get <name>`, `resources/read`, `completion/complete [<prompt>]`.
    pub item: String,
    pub arguments: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// What the tenant's policies decided of it, when they took part.
    pub policy: Option<String>,
}

impl GatewayServer {
    /// Audits a proxied request that is not a tool call (`prompts/get`, `resources/read`,
    /// `completion/complete`) like one: the caller, the item, the digest of its arguments, what
    /// the policies decided, and its outcome. `Err(ProxyError::NotFound)` (nothing of that name
    /// for this caller) is answered by `not_found`, the same whether it does not exist, is not
    /// granted or is refused by a policy. Fails closed.
    pub(super) async fn audited<T>(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        asked: Asked<'_>,
        result: Result<T, ProxyError>,
        not_found: impl FnOnce() -> ErrorData,
    ) -> Result<T, ErrorData> {
        let Asked { item, arguments, policy } = asked;
        let call = call_audit(
            ctx,
            client_of(context, ctx.session_id()),
            crate::audit::refusal::safe_text(&item),
            digest::arguments_digest(arguments),
            None,
        );
        if let Some(policy) = policy {
            call.set_policy(policy);
        }
        let (event, answer) = match result {
            Ok(value) => (call.event(Outcome::Ok, None), Ok(value)),
            Err(ProxyError::NotFound) => {
                metrics::denial("unknown_item");
                (call.event(Outcome::Denied, Some("not_found")), Err(not_found()))
            }
            // Refused by the tenant's policies: answered as a name that does not exist.
            Err(ProxyError::Refused(class)) => {
                metrics::denial(class);
                (call.event(Outcome::Denied, Some(class)), Err(not_found()))
            }
            Err(e) => (call.event(Outcome::Failed, Some(e.class())), Err(e.into_error_data())),
        };
        self.shared.audit.record_or_withhold(event, &item).await?;
        answer
    }

    /// Audits a `tools/call` whose params were malformed (it never reached `call_tool`), as a
    /// failed call of `tool`. Fails closed like every audited call.
    pub(super) async fn audit_malformed_call(
        &self,
        context: &RequestContext<RoleServer>,
        tool: &str,
    ) -> Result<(), ErrorData> {
        let ctx = context_for(context, &self.shared.sessions).map_err(|e| refused(&e))?;
        let call = call_audit(
            &ctx,
            client_of(context, ctx.session_id()),
            tool.to_owned(),
            digest::arguments_digest(None),
            None,
        );
        Ok(self.shared.audit.record_or_withhold(call.event(Outcome::Failed, Some("invalid_params")), tool).await?)
    }
}

/// The client's name and version for the audit. In a session: from its `initialize`. Outside
/// one: only what the request itself carries in `_meta` (2026-07-28 clients may send
/// `io.modelcontextprotocol/clientInfo` with every request). A stateless request had no
/// `initialize`, and rmcp then fills the peer info with its own crate's name and version, which
/// must not be recorded as the client's.
pub(super) fn client_of(context: &RequestContext<RoleServer>, session: Option<&str>) -> Option<(String, String)> {
    let from_session = session
        .and_then(|_| context.peer.peer_info())
        .map(|p| (p.client_info.name.clone(), p.client_info.version.clone()));
    from_session.or_else(|| context.meta.client_info().map(|c| (c.name, c.version)))
}
