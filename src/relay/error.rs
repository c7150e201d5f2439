//! Why a proxied request failed: the error every leg of the proxy (and the multi round-trip that
//! carries a call's result across requests) answers with.

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode};
use serde_json::json;

/// Why a proxied call failed (the call's audit class is [`ProxyError::class`]).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("upstream server unavailable: {0}")]
    Unavailable(String),
    #[error("tool call timed out")]
    Timeout,
    #[error("cancelled by the client")]
    Cancelled,
    #[error("upstream error: {}", .0.message)]
    Upstream(ErrorData),
    #[error("signing the identity assertion failed")]
    Assertion,
    /// The server needs an OAuth login; `link` starts one when the caller may log in.
    #[error("server `{server}` needs a login")]
    LoginNeeded { server: String, link: Option<String> },
    /// Nothing of that name for this caller (carried across a multi round-trip's task; the
    /// caller is answered exactly as for a name that does not exist).
    #[error("not found")]
    NotFound,
    /// The server is not served because a path of its declaration lies outside its executor's
    /// root (refused when placed, or when opened after the agent came back with another root).
    /// Its tools are never listed, so a call is answered as an unknown tool, but audited as
    /// `outside_root`; the log names the path.
    #[error("server `{0}`: a path of its declaration lies outside its executor's root")]
    OutsideRoot(String),
    /// The tenant's policies refused the call (the class names why: `policy_forbid`,
    /// `policy_no_permit`, `policy_error`, `arguments_invalid`). Answered exactly as an unknown
    /// tool; the audit records the deciding policies.
    #[error("refused by policy ({0})")]
    Refused(&'static str),
    /// The call needed a person's confirmation and did not get it (see `mcp::confirm`): audited
    /// as refused, answered as the refusal says.
    #[error("not confirmed ({})", .0.class)]
    Unconfirmed(Refusal),
}

/// Why a call that needed a confirmation is not forwarded: its audit class, and the answer.
#[derive(Debug)]
pub struct Refusal {
    pub class: &'static str,
    pub answer: RefusalAnswer,
}

/// How the caller is told.
#[derive(Debug)]
pub enum RefusalAnswer {
    /// The person said no, or nobody said yes in time: a tool error the model reads.
    ToolError(String),
    /// The request itself can't be served: a JSON-RPC error.
    Error(ErrorData),
}

impl Refusal {
    fn tool_error(class: &'static str, text: String) -> Self {
        Self { class, answer: RefusalAnswer::ToolError(text) }
    }

    /// The caller declined (or cancelled, or did not answer in time).
    pub fn declined(class: &'static str, what: &str) -> Self {
        Self::tool_error(class, format!("The call was not made: {what}."))
    }

    /// This client can't be asked to confirm a call that needs its caller's confirmation.
    pub fn unavailable() -> Self {
        let message = "This call needs the confirmation of the person making it, which this client cannot give. \
                       Use a client that supports elicitation (form mode: declared at initialize in a session, or \
                       in the request's client capabilities on protocol 2026-07-28), or ask the tenant's owners \
                       to have such calls approved by an approver instead.";
        let capabilities = rmcp::model::ClientCapabilities::builder().enable_elicitation().build();
        let mut error = ErrorData::missing_required_client_capability(capabilities);
        error.message = message.into();
        Self { class: "confirmation_unavailable", answer: RefusalAnswer::Error(error) }
    }

    /// A confirmation answer that does not hold: refused as invalid params.
    pub fn invalid(why: &str) -> Self {
        Self {
            class: "confirmation_invalid",
            answer: RefusalAnswer::Error(ErrorData::new(
                ErrorCode::INVALID_PARAMS,
                format!("invalid confirmation: {why}; call again without requestState to be asked again"),
                None,
            )),
        }
    }

    /// The tool error, or the JSON-RPC error, the caller is answered with.
    pub fn into_result(self) -> Result<CallToolResult, ErrorData> {
        match self.answer {
            RefusalAnswer::ToolError(text) => {
                let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
                let class = (crate::vocab::text::ERROR_CLASS_META.to_owned(), json!(self.class));
                result.meta = Some(rmcp::model::MetaObject(rmcp::model::JsonObject::from_iter([class])));
                Ok(result)
            }
            RefusalAnswer::Error(error) => Err(error),
        }
    }
}

/// An upstream's error without the `MCP error <code>: ` its SDK wrote into the message (the
/// TypeScript SDK renders its errors so, then sends that rendering as the message): a client
/// adds the same prefix when it shows the error, and would show it twice.
fn without_echoed_code(mut error: ErrorData) -> ErrorData {
    let prefix = format!("MCP error {}: ", error.code.0);
    if error.message.starts_with(&prefix) {
        let mut message: &str = &error.message;
        while let Some(rest) = message.strip_prefix(&prefix) {
            message = rest;
        }
        error.message = message.to_owned().into();
    }
    error
}

impl ProxyError {
    pub fn class(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "upstream_unavailable",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Upstream(_) => "upstream_error",
            Self::Assertion => "internal",
            Self::LoginNeeded { .. } => "login_needed",
            Self::NotFound => "not_found",
            Self::OutsideRoot(_) => "outside_root",
            Self::Refused(class) => class,
            Self::Unconfirmed(refusal) => refusal.class,
        }
    }

    /// What the client is told: the upstream's own JSON-RPC error, or a generic one that
    /// names no process, path or address of the gateway host.
    pub fn into_error_data(self) -> ErrorData {
        match self {
            Self::Upstream(e) => without_echoed_code(e),
            Self::Timeout => ErrorData::internal_error("tool call timed out", None),
            Self::Cancelled => ErrorData::internal_error("tool call cancelled", None),
            Self::Unavailable(_) => ErrorData::internal_error("upstream server unavailable", None),
            Self::Assertion | Self::NotFound | Self::OutsideRoot(_) | Self::Refused(_) => {
                ErrorData::internal_error("internal error", None)
            }
            Self::Unconfirmed(refusal) => match refusal.answer {
                RefusalAnswer::Error(error) => error,
                RefusalAnswer::ToolError(text) => ErrorData::invalid_request(text, None),
            },
            Self::LoginNeeded { server, link: Some(link) } => ErrorData::internal_error(
                format!("server `{server}` needs a login: open {link} in a browser to log in, then call again"),
                Some(json!({ "loginUrl": link, "server": server })),
            ),
            Self::LoginNeeded { server, link: None } => ErrorData::internal_error(
                format!(
                    "server `{server}` needs a login: an owner or manager of the tenant can log in \
                     (or run `scopegate admin oauth login`)"
                ),
                Some(json!({ "server": server })),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echoed_code_is_shown_once() {
        let e = ProxyError::Upstream(ErrorData::invalid_params("MCP error -32602: MCP error -32602: bad `x`", None));
        assert_eq!(e.into_error_data().message, "bad `x`");
        // Another code's prefix is the upstream's text, kept.
        let e = ProxyError::Upstream(ErrorData::invalid_params("MCP error -32603: boom", None));
        assert_eq!(e.into_error_data().message, "MCP error -32603: boom");
    }
}
