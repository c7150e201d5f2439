//! How the gateway names an upstream's tools for its clients: `server__tool`.

/// Separates the server from the tool in an upstream tool's name: `server__tool`.
pub const NAME_SEPARATOR: &str = "__";

/// Splits `server__tool` at the first separator (server names can't contain it).
pub fn split_tool_name(name: &str) -> Option<(&str, &str)> {
    name.split_once(NAME_SEPARATOR).filter(|(s, t)| !s.is_empty() && !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_tool_names_split_at_the_first_separator() {
        assert_eq!(split_tool_name("fx__whoami"), Some(("fx", "whoami")));
        assert_eq!(split_tool_name("fx__a__b"), Some(("fx", "a__b")), "the tool keeps its own `__`");
        assert_eq!(split_tool_name("whoami"), None);
        assert_eq!(split_tool_name("__x"), None);
        assert_eq!(split_tool_name("fx__"), None);
    }
}
