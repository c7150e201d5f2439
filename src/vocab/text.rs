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

/// The first character of a caller-chosen name that the gateway refuses to store, if any:
/// control characters, and format characters (Unicode category Cf: zero-width spaces and
/// joiners, bidirectional overrides and isolates, the byte order mark, tag characters), which
/// render as nothing or reorder what follows, so two names that read alike could name two
/// principals, and a name could display as something it is not.
pub fn hidden_char(text: &str) -> Option<char> {
    use unicode_general_category::{GeneralCategory, get_general_category};
    text.chars().find(|&c| c.is_control() || get_general_category(c) == GeneralCategory::Format)
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

#[cfg(test)]
mod tests {
    use super::hidden_char;

    #[test]
    fn names_that_hide_or_reorder_characters_are_refused() {
        for (text, hidden) in [
            ("olivia\u{200B}@acme.test", '\u{200B}'),
            ("admin\u{202E}gnp.exe@acme.test", '\u{202E}'),
            ("\u{FEFF}olivia@acme.test", '\u{FEFF}'),
            ("olivia\u{E0041}@acme.test", '\u{E0041}'),
            ("a\u{2066}b\u{2069}", '\u{2066}'),
            ("soft\u{00AD}hyphen", '\u{00AD}'),
            ("line\nbreak", '\n'),
            ("nul\u{0}", '\u{0}'),
        ] {
            assert_eq!(hidden_char(text), Some(hidden), "{text:?}");
        }
        for text in ["olivia@acme.test", "Zoë Ångström", "山田 太郎", "O'Brien-Smith (ops)", "🐔 farm"] {
            assert_eq!(hidden_char(text), None, "{text:?}");
        }
    }
}
