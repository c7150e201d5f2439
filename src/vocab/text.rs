//! Text that callers and upstreams choose, as the gateway stores and reports it.

use rmcp::model::MetaObject;

/// Characters kept of one caller-supplied text (a client name, a tool name, a request id).
pub const TEXT_LIMIT: usize = 256;

/// Caller-supplied text as it is stored: U+0000 (which PostgreSQL's text can't hold, and
/// which would make the two databases answer differently) becomes U+FFFD, and text longer
/// than [`TEXT_LIMIT`] characters is cut there and marked with a trailing `…`.
pub fn safe_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(TEXT_LIMIT * 4));
    for (i, c) in text.chars().enumerate() {
        if i == TEXT_LIMIT {
            out.push('…');
            break;
        }
        out.push(if c == '\0' { '\u{FFFD}' } else { c });
    }
    out
}

/// The `_meta` key of a tool error result that holds its error class (`invalid_argument`,
/// `not_found`), which the audit records.
pub const ERROR_CLASS_META: &str = "io.scopegate/error";

/// The audit class of a tool error result: its `_meta` class (from an upstream, caller-chosen
/// text, so made safe), else `tool_error`.
pub fn error_class(meta: Option<&MetaObject>) -> String {
    let class = meta.and_then(|m| m.get(ERROR_CLASS_META)).and_then(|v| v.as_str());
    safe_text(class.unwrap_or("tool_error"))
}
