//! Why a proxied request failed: the error every leg of the proxy (and the multi round-trip that
//! carries a call's result across requests) answers with.

use rmcp::ErrorData;
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
