//! The call pipeline: one place builds a call's audit record, turns how the call ended into its
//! answer and audit outcome (a typed [`Verdict`], never an error message read back), and
//! concludes it: metrics, the trace's tool, and the audit event written before the answer,
//! failing closed. Every `tools/call` ends here, whichever leg served it: a native tool or a
//! proxied one on the rmcp path (`server/call.rs`), or a proxied one on the lean relay
//! (`lean.rs`).

use rmcp::ErrorData;
use rmcp::model::{CallToolResponse, CallToolResult, ErrorCode};
use serde_json::{Map, Value};

use super::shared::{Shared, unknown_tool};
use crate::audit::writer::withheld;
use crate::audit::{CallAudit, Outcome, Record, Withheld, digest};
use crate::context::McpCallContext;
use crate::proxy::{LeanResult, ProxyError};
use crate::telemetry::{metrics, trace};

/// The digest of a call's arguments, and their canonical text when the gateway records it
/// (`audit.record_raw_arguments`). The canonical form is built once and hashed when recorded;
/// otherwise it streams into the hasher, unbuffered.
pub(super) fn argument_digests(arguments: Option<&Map<String, Value>>, record_raw: bool) -> (String, Option<String>) {
    let raw = if record_raw { arguments.map(digest::canonical_arguments) } else { None };
    let digest = match &raw {
        Some(raw) => digest::sha256_hex(raw.as_bytes()),
        None => digest::arguments_digest(arguments),
    };
    (digest, raw)
}

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

/// An answer to a `tools/call` as a leg produces it, and the audit class of how it ended.
pub(super) trait Answer: Sized {
    fn classify(result: &Result<Self, ErrorData>) -> (Outcome, Option<String>);

    /// The SHA-256 of the canonical JSON of the answer as a result (what the caller is given).
    fn digest(&self) -> Option<String>;

    /// A tool error result as this leg's answer.
    fn tool_error(result: CallToolResult) -> Result<Self, ErrorData>;
}

impl Answer for CallToolResponse {
    fn classify(result: &Result<Self, ErrorData>) -> (Outcome, Option<String>) {
        match result {
            Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true) => {
                // A tool error carries its class in `_meta`, never in structured content (which
                // must match the tool's output schema).
                (Outcome::Failed, Some(crate::tools::error_class(r.meta.as_ref())))
            }
            Ok(_) => (Outcome::Ok, None),
            Err(e) => error_class(e),
        }
    }

    fn digest(&self) -> Option<String> {
        match self {
            CallToolResponse::Complete(result) => digest::result_digest(result),
            CallToolResponse::InputRequired(input) => digest::result_digest(input),
            CallToolResponse::Task(task) => digest::result_digest(task),
            _ => None,
        }
    }

    fn tool_error(result: CallToolResult) -> Result<Self, ErrorData> {
        Ok(CallToolResponse::Complete(result))
    }
}

impl Answer for LeanResult {
    fn classify(result: &Result<Self, ErrorData>) -> (Outcome, Option<String>) {
        match result {
            Ok(LeanResult { error_class: Some(class), .. }) => (Outcome::Failed, Some(class.clone())),
            Ok(_) => (Outcome::Ok, None),
            Err(e) => error_class(e),
        }
    }

    fn digest(&self) -> Option<String> {
        digest::result_digest(&self.result)
    }

    fn tool_error(result: CallToolResult) -> Result<Self, ErrorData> {
        let result = serde_json::value::to_raw_value(&result)
            .map_err(|e| ErrorData::internal_error(format!("a result that does not serialize: {e}"), None))?;
        Ok(LeanResult { result, error_class: None, input: None, typed: false })
    }
}

/// The audit class of a call answered with a JSON-RPC error.
fn error_class(e: &ErrorData) -> (Outcome, Option<String>) {
    if e.code == ErrorCode::INVALID_PARAMS {
        (Outcome::Failed, Some("invalid_params".to_owned()))
    } else {
        (Outcome::Failed, Some("internal".to_owned()))
    }
}

/// How a `tools/call` ended, decided where it ended: the answer, its audit outcome and class
/// come from this.
pub(super) enum Verdict<A> {
    /// No tool of that name for this caller: answered as one that does not exist. `listed`:
    /// a native tool the caller's roles do not list (the metrics name it).
    Unknown { listed: bool },
    /// The native handler or the upstream answered (a result, a tool error or an error).
    Answered(Result<A, ErrorData>),
    /// The native handler ran past `mcp.call_timeout_secs`.
    TimedOut,
    /// A proxied call failed on the way to or from its upstream.
    ProxyFailed(ProxyError),
    /// Refused for a reason the audit keeps (`class`), answered exactly as an unknown tool:
    /// the tenant's policies refused it (`policy_*`, `arguments_invalid`, with the deciding
    /// policies), or its server is not served because a path of its declaration lies outside
    /// its executor's root and the caller holds a grant on it (`outside_root`).
    Refused { class: &'static str },
    /// It needed a person's confirmation and did not get it: audited as refused (`class`),
    /// answered as the refusal says (see `mcp::confirm`).
    Unconfirmed(crate::relay::Refusal),
}

impl<A> From<Result<A, ProxyError>> for Verdict<A> {
    /// A proxied call's end: nothing of that name for this caller is answered as an unknown
    /// tool, the same whether it does not exist or is not granted.
    fn from(result: Result<A, ProxyError>) -> Self {
        match result {
            Ok(answer) => Verdict::Answered(Ok(answer)),
            Err(ProxyError::NotFound) => Verdict::Unknown { listed: false },
            Err(e @ (ProxyError::OutsideRoot(_) | ProxyError::Refused(_))) => Verdict::Refused { class: e.class() },
            Err(ProxyError::Unconfirmed(refusal)) => Verdict::Unconfirmed(refusal),
            Err(e) => Verdict::ProxyFailed(e),
        }
    }
}

impl<A: Answer> Verdict<A> {
    /// Whether the tool exists for the metrics (a proxied tool that answered or failed, or a
    /// native one).
    fn known(&self) -> bool {
        !matches!(self, Verdict::Unknown { listed: false } | Verdict::Refused { .. })
    }

    /// The answer, and what the audit records of it.
    fn settle(self) -> (Result<A, ErrorData>, Outcome, Option<String>) {
        match self {
            Verdict::Unknown { listed } => {
                metrics::denial(if listed { "tool_not_allowed" } else { "unknown_tool" });
                (Err(unknown_tool()), Outcome::Denied, Some("unknown_tool".to_owned()))
            }
            Verdict::Answered(result) => {
                let (outcome, class) = A::classify(&result);
                (result, outcome, class)
            }
            Verdict::Refused { class } => {
                metrics::denial(class);
                (Err(unknown_tool()), Outcome::Denied, Some(class.to_owned()))
            }
            Verdict::Unconfirmed(refusal) => {
                metrics::denial(refusal.class);
                let class = refusal.class.to_owned();
                let answer = refusal.into_result().and_then(A::tool_error);
                (answer, Outcome::Denied, Some(class))
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

/// Concludes a call of `tool` by the caller of `ctx`: its metrics and trace, and its audit,
/// before the answer. A call that was forwarded ([`CallAudit::start`]) is answered once its
/// record committed (the commit ran while the upstream worked); its outcome is then appended
/// without waiting. Any other call's one event (unless the tool wrote it itself) is written
/// before the answer. Fail closed: when the record or the event can't be written, the answer is
/// withheld and the caller told the call was not recorded. `proxied`: the call went to an
/// upstream.
pub(super) async fn conclude<A: Answer>(
    shared: &Shared,
    ctx: &McpCallContext,
    call: &CallAudit,
    tool: &str,
    proxied: bool,
    verdict: Verdict<A>,
) -> Result<A, ErrorData> {
    let known = verdict.known();
    let (result, outcome, class) = verdict.settle();
    let tenant_label = if shared.label_tenant { ctx.tenant_slug() } else { "" };
    metrics::tool_call(if known { tool } else { "(unknown)" }, outcome.as_str(), tenant_label, call.started.elapsed());
    trace::record_tool(known.then_some(tool), proxied);
    let pending = match call.take_record() {
        Record::None => {
            if !call.is_recorded() {
                shared.audit.record_or_withhold(call.event(outcome, class.as_deref()), tool).await?;
            }
            return result;
        }
        // Logged and counted where it failed.
        Record::Failed => return Err(Withheld.into()),
        // A unit of work wrote the outcome with its write.
        Record::Committed(_) if call.is_recorded() => return result,
        Record::Committed(id) => Err(id),
        Record::Pending(begun) => Ok(begun),
    };
    // The result's digest is taken while the record may still be committing.
    let digest = result.as_ref().ok().and_then(A::digest);
    let id = match pending {
        Err(id) => id,
        Ok(begun) => {
            use tracing::Instrument;
            let span = trace::audit_span(Outcome::Started.as_str());
            begun.committed().instrument(span).await.map_err(|e| withheld(&e, tool))?
        }
    };
    shared.audit.follow(call.outcome_event(id, outcome, class.as_deref(), digest));
    result
}
