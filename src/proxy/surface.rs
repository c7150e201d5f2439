//! How an upstream's tools, prompts and resources are named to the gateway's clients, and how a
//! name or URI a client sends finds its way back to exactly one server of its snapshot.
//!
//! Names (tools and prompts): a server bound with a prefix exposes `name` as `server__name`;
//! the one server a tenant may bind without a prefix exposes `name` itself. A name a client
//! sends belongs to the prefixed server its `server__` part names, if that server is in the
//! session's snapshot; otherwise to the unprefixed server. An unprefixed server's name that
//! would read as another server's (`other__x` where `other` is bound) is not served.
//!
//! URIs (resources and resource templates): a prefixed server's `U` is exposed as
//! `scopegate://server/U` (a valid URI whatever `U` is, and a template stays a template: the
//! prefix is literal text); the unprefixed server's `U` is `U` itself, unless it begins with
//! `scopegate://`, which only the gateway mints (then it is not served). Two servers can't
//! collide: prefixed ones differ in `server`, and the unprefixed one can't mint the prefix.
//! A URI naming a server that is not in the snapshot resolves to nothing, exactly like one
//! that does not exist.

use crate::vocab::names::{NAME_SEPARATOR, split_tool_name};

/// The scheme of the URIs the gateway mints for prefixed servers' resources.
pub const URI_SCHEME: &str = "scopegate://";

/// The name a client sees for `name` of `server`.
pub fn exposed_name(server: &str, prefixed: bool, name: &str) -> String {
    if prefixed { format!("{server}{NAME_SEPARATOR}{name}") } else { name.to_owned() }
}

/// The URI a client sees for `uri` of `server`; `None`: an unprefixed server's URI that would
/// read as one the gateway mints (not served).
pub fn exposed_uri(server: &str, prefixed: bool, uri: &str) -> Option<String> {
    if prefixed {
        Some(format!("{URI_SCHEME}{server}/{uri}"))
    } else if uri.starts_with(URI_SCHEME) {
        None
    } else {
        Some(uri.to_owned())
    }
}

/// Where names go: the snapshot's servers (with their prefix flag) and the native tools.
pub trait NameSpace {
    /// Whether `server` is in the snapshot, and bound with a prefix.
    fn prefixed(&self, server: &str) -> Option<bool>;
    /// The snapshot's unprefixed server, if it has exactly one.
    fn unprefixed(&self) -> Option<&str>;
}

/// The server and upstream name an exposed tool or prompt name stands for.
pub fn route_name<'a>(space: &'a impl NameSpace, exposed: &'a str) -> Option<(&'a str, &'a str)> {
    if let Some((server, name)) = split_tool_name(exposed)
        && space.prefixed(server) == Some(true)
    {
        return Some((server, name));
    }
    space.unprefixed().map(|server| (server, exposed))
}

/// The server and upstream URI an exposed URI stands for.
pub fn route_uri<'a>(space: &'a impl NameSpace, exposed: &'a str) -> Option<(&'a str, &'a str)> {
    if let Some(rest) = exposed.strip_prefix(URI_SCHEME) {
        let (server, uri) = rest.split_once('/')?;
        return (space.prefixed(server) == Some(true) && !uri.is_empty()).then_some((server, uri));
    }
    space.unprefixed().map(|server| (server, exposed))
}

/// Whether an unprefixed server's `name` may be served: it must not read as a prefixed
/// server's name, nor be a native tool's (`native`).
pub fn unprefixed_name_free(space: &impl NameSpace, name: &str, native: impl Fn(&str) -> bool) -> bool {
    if native(name) {
        return false;
    }
    match split_tool_name(name) {
        Some((server, _)) => space.prefixed(server) != Some(true),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Space(Vec<(&'static str, bool)>);

    impl NameSpace for Space {
        fn prefixed(&self, server: &str) -> Option<bool> {
            self.0.iter().find(|(s, _)| *s == server).map(|(_, p)| *p)
        }
        fn unprefixed(&self) -> Option<&str> {
            let mut bare = self.0.iter().filter(|(_, p)| !p);
            match (bare.next(), bare.next()) {
                (Some((s, _)), None) => Some(s),
                _ => None,
            }
        }
    }

    #[test]
    fn names_route_to_the_prefixed_server_they_name_else_to_the_unprefixed_one() {
        let space = Space(vec![("fx", true), ("ref", false)]);
        assert_eq!(route_name(&space, "fx__echo"), Some(("fx", "echo")));
        assert_eq!(route_name(&space, "test_simple_text"), Some(("ref", "test_simple_text")));
        assert_eq!(route_name(&space, "ref__x"), Some(("ref", "ref__x")), "the unprefixed server has no prefix");
        assert_eq!(route_name(&space, "other__x"), Some(("ref", "other__x")));
        let prefixed_only = Space(vec![("fx", true)]);
        assert_eq!(route_name(&prefixed_only, "echo"), None);
        assert_eq!(route_name(&prefixed_only, "gone__echo"), None, "a server not in the snapshot");
        assert_eq!(exposed_name("fx", true, "echo"), "fx__echo");
        assert_eq!(exposed_name("ref", false, "echo"), "echo");
    }

    #[test]
    fn uris_are_minted_per_prefixed_server_and_never_collide() {
        let space = Space(vec![("fx", true), ("fy", true), ("ref", false)]);
        let a = exposed_uri("fx", true, "test://static-text").unwrap();
        let b = exposed_uri("fy", true, "test://static-text").unwrap();
        assert_eq!(a, "scopegate://fx/test://static-text");
        assert_ne!(a, b, "the same upstream URI of two servers");
        assert_eq!(route_uri(&space, &a), Some(("fx", "test://static-text")));
        assert_eq!(route_uri(&space, &b), Some(("fy", "test://static-text")));
        assert_eq!(exposed_uri("ref", false, "test://static-text").as_deref(), Some("test://static-text"));
        assert_eq!(route_uri(&space, "test://static-text"), Some(("ref", "test://static-text")));
        assert_eq!(exposed_uri("ref", false, "scopegate://fx/test://x"), None, "only the gateway mints its scheme");
        assert_eq!(route_uri(&space, "scopegate://ref/test://x"), None, "the unprefixed server has no minted URIs");
        assert_eq!(route_uri(&space, "scopegate://gone/test://x"), None, "a server not in the snapshot");
        assert_eq!(route_uri(&space, "scopegate://fx/"), None);
        assert_eq!(route_uri(&space, "scopegate://fx"), None);
        let template = exposed_uri("fx", true, "test://template/{id}/data").unwrap();
        let expanded = template.replace("{id}", "123");
        assert_eq!(route_uri(&space, &expanded), Some(("fx", "test://template/123/data")), "templates expand in place");
    }

    #[test]
    fn an_unprefixed_name_never_shadows_a_native_tool_or_a_prefixed_server() {
        let space = Space(vec![("fx", true), ("ref", false)]);
        let native = |n: &str| n == "whoami";
        assert!(unprefixed_name_free(&space, "echo", native));
        assert!(!unprefixed_name_free(&space, "whoami", native));
        assert!(!unprefixed_name_free(&space, "fx__echo", native));
        assert!(unprefixed_name_free(&space, "other__echo", native));
    }
}
