//! The call pipeline of the rmcp path: one place builds a call's audit record, decides the
//! call (native or proxied), times it, classifies it into a typed verdict and writes its audit
//! event, failing closed, before the answer.

use super::*;

/// The audit record of one call by the caller of `ctx`: its tenant, user, session and request
/// id, the client, the item called and the digest (and, when recorded, the canonical text) of
/// its arguments.
pub(super) fn call_audit(
    ctx: &McpCallContext,
    client: Option<(String, String)>,
    item: String,
    args_digest: String,
    args_raw: Option<String>,
) -> CallAudit {
    CallAudit::new(
        ctx.tenant_id(),
        ctx.user_id(),
        ctx.session_id().map(str::to_owned),
        Some(crate::jsonrpc::id_text(ctx.request_id())),
        client,
        item,
        args_digest,
        args_raw,
    )
}

/// How a `tools/call` ended, decided where it ended: the answer, its audit outcome and class
/// come from this, never from reading an error message back.
pub(super) enum Verdict {
    /// No tool of that name for this caller: answered as one that does not exist. `listed`:
    /// a native tool the caller's roles do not list (the metrics name it).
    Unknown { listed: bool },
    /// The native handler or the upstream answered (a result, a tool error or an error).
    Answered(Result<CallToolResponse, ErrorData>),
    /// The native handler ran past `mcp.call_timeout_secs`.
    TimedOut,
    /// A proxied call failed on the way to or from its upstream.
    ProxyFailed(ProxyError),
}

impl Verdict {
    /// Whether the tool exists for the metrics (a proxied tool that answered or failed, or a
    /// native one).
    pub(super) fn known(&self) -> bool {
        !matches!(self, Verdict::Unknown { listed: false })
    }

    /// The answer, and what the audit records of it.
    pub(super) fn settle(self) -> (Result<CallToolResponse, ErrorData>, Outcome, Option<String>) {
        match self {
            Verdict::Unknown { listed } => {
                metrics::denial(if listed { "tool_not_allowed" } else { "unknown_tool" });
                (Err(unknown_tool()), Outcome::Denied, Some("unknown_tool".to_owned()))
            }
            Verdict::Answered(result) => {
                let (outcome, class) = classify(&result);
                (result, outcome, class)
            }
            Verdict::TimedOut => (
                Err(ErrorData::new(ErrorCode::INTERNAL_ERROR, "tool call timed out", None)),
                Outcome::Failed,
                Some("timeout".to_owned()),
            ),
            Verdict::ProxyFailed(e) => {
                let class = e.class().to_owned();
                (Err(e.into_error_data()), Outcome::Failed, Some(class))
            }
        }
    }
}

/// The audit class of a finished call.
pub(super) fn classify(result: &Result<CallToolResponse, ErrorData>) -> (Outcome, Option<String>) {
    match result {
        Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
            // A tool error carries its class in `_meta`, never in structured content (which
            // must match the tool's output schema).
            (Outcome::Failed, Some(crate::tools::error_class(r.meta.as_ref())))
        }
        Ok(_) => (Outcome::Ok, None),
        Err(e) if e.code == ErrorCode::INVALID_PARAMS => (Outcome::Failed, Some("invalid_params".to_owned())),
        Err(_) => (Outcome::Failed, Some("internal".to_owned())),
    }
}

impl GatewayServer {
    /// A `tools/call`, native or proxied: the caller's context (fail closed), the decision,
    /// the call, and its audit event before the answer.
    pub(super) async fn serve_call(
        &self,
        request: CallToolRequestParams,
        mut context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let shared = &self.shared;
        let ctx = context_for(&context, &shared.sessions).map_err(|e| refused(&e))?;
        let tool = request.name.to_string();
        let client = client_of(&context, ctx.session_id());
        // The arguments are read where they lie (never cloned): recorded raw, their canonical
        // form is built once and hashed; otherwise it streams into the hasher, unbuffered.
        let args_raw = if shared.record_raw_arguments {
            request.arguments.as_ref().map(digest::canonical_arguments)
        } else {
            None
        };
        let args_digest = match &args_raw {
            Some(raw) => digest::sha256_hex(raw.as_bytes()),
            None => digest::arguments_digest(request.arguments.as_ref()),
        };
        let call = Arc::new(call_audit(&ctx, client, tool.clone(), args_digest, args_raw));
        let tenant_label = if shared.label_tenant { ctx.tenant_slug().to_owned() } else { String::new() };

        let native = shared.tools.has(&tool);
        let verdict = if !native {
            match self.call_upstream(&ctx, request, &context).await {
                Ok(result) => Verdict::Answered(Ok(result)),
                Err(ProxyError::NotFound) => Verdict::Unknown { listed: false },
                Err(e) => Verdict::ProxyFailed(e),
            }
        } else if !tool_allowed(&shared.tools, &tool, ctx.roles()) {
            // Not listed for this caller: answered exactly as a tool that does not exist.
            Verdict::Unknown { listed: true }
        } else if let Some(Err(invalid)) = shared
            .tools
            .spec(&tool)
            .map(|spec| (spec.validate)(request.arguments.as_ref().unwrap_or(&Default::default())))
        {
            Verdict::Answered(invalid.into_call_tool_result())
        } else {
            context.extensions.insert(Arc::new(CallEnv {
                db: shared.db.clone(),
                audit: shared.audit.clone(),
                sessions: Arc::clone(&shared.sessions),
                call: Arc::clone(&call),
            }));
            match tokio::time::timeout(shared.call_timeout, shared.tools.call(request, context)).await {
                Ok(result) => Verdict::Answered(result),
                Err(_) => {
                    tracing::warn!(%tool, "tool call timed out");
                    Verdict::TimedOut
                }
            }
        };
        let known = verdict.known();
        let (result, outcome, class) = verdict.settle();
        metrics::tool_call(
            if known { &tool } else { "(unknown)" },
            outcome.as_str(),
            &tenant_label,
            call.started.elapsed(),
        );

        trace::record_tool(known.then_some(tool.as_str()), !shared.tools.has(&tool));
        // Fail closed: without its audit event the call's answer is withheld.
        if !call.is_recorded() {
            shared.audit.record_or_withhold(call.event(outcome, class.as_deref()), &tool).await?;
        }
        result
    }
}

impl GatewayServer {
    /// Audits a proxied request that is not a tool call (`prompts/get`, `resources/read`,
    /// `completion/complete`) like one: the caller, `item`, the digest of its arguments and its
    /// outcome. `Err(ProxyError::NotFound)` (nothing of that name for this caller) is answered by `not_found`,
    /// the same whether it does not exist or is not granted. Fails closed.
    pub(super) async fn audited<T>(
        &self,
        ctx: &McpCallContext,
        context: &RequestContext<RoleServer>,
        item: String,
        arguments: Option<&serde_json::Map<String, serde_json::Value>>,
        result: Result<T, ProxyError>,
        not_found: impl FnOnce() -> ErrorData,
    ) -> Result<T, ErrorData> {
        let call = call_audit(
            ctx,
            client_of(context, ctx.session_id()),
            crate::audit::refusal::safe_text(&item),
            digest::arguments_digest(arguments),
            None,
        );
        let (event, answer) = match result {
            Ok(value) => (call.event(Outcome::Ok, None), Ok(value)),
            Err(ProxyError::NotFound) => {
                metrics::denial("unknown_item");
                (call.event(Outcome::Denied, Some("not_found")), Err(not_found()))
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
