//! Where a token's subject, tenant and scopes are: a claim by name or a JSON pointer into the
//! claims (RFC 6901), and the shapes identity providers give them.

use serde_json::{Map, Value};

use super::AuthError;

/// A claim by name (`tid`), or a JSON pointer into the claims (`/org/id`, `/orgs/0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimPath {
    Name(String),
    Pointer(String),
}

impl ClaimPath {
    pub fn parse(text: &str) -> Self {
        if text.starts_with('/') { Self::Pointer(text.to_owned()) } else { Self::Name(text.to_owned()) }
    }

    pub fn find<'a>(&self, claims: &'a Map<String, Value>) -> Option<&'a Value> {
        match self {
            Self::Name(name) => claims.get(name),
            Self::Pointer(pointer) => {
                // `Value::pointer` wants a value: split off the first segment, read the rest
                // below it.
                let rest = &pointer[1..];
                let (first, below) = rest.split_once('/').map_or((rest, ""), |(f, b)| (f, b));
                let first = first.replace("~1", "/").replace("~0", "~");
                let value = claims.get(&first)?;
                if below.is_empty() { Some(value) } else { value.pointer(&format!("/{below}")) }
            }
        }
    }
}

/// A string, or an integer written as text (some providers number their organizations).
fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// The tenant a claim value names: a string; the one element of an array; the one key of an
/// object (Keycloak's organization claim with attributes: `{"acme": {"id": ...}}`). Several
/// elements or keys name no one tenant: refused, never the first.
pub fn tenant_of(value: Option<&Value>) -> Result<Option<String>, AuthError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Ok(None),
            [one] => text(one).map(Some).ok_or(AuthError::Claims),
            _ => Err(AuthError::AmbiguousTenant),
        },
        Some(Value::Object(keys)) => match keys.len() {
            0 => Ok(None),
            1 => Ok(keys.keys().next().filter(|k| !k.is_empty()).cloned()),
            _ => Err(AuthError::AmbiguousTenant),
        },
        Some(other) => text(other).map(Some).ok_or(AuthError::Claims),
    }
}

/// The subject: a non-empty string (or integer) at the configured place.
pub fn subject_of(value: Option<&Value>) -> Option<String> {
    value.and_then(text)
}

/// The token's scopes: `scope` (RFC 9068, space-separated) and `scp` (an array, or a
/// space-separated string, as some providers write it), together.
pub fn scopes_of(claims: &Map<String, Value>) -> Vec<String> {
    let mut scopes = Vec::new();
    for name in ["scope", "scp"] {
        match claims.get(name) {
            Some(Value::String(s)) => scopes.extend(s.split(' ').filter(|s| !s.is_empty()).map(str::to_owned)),
            Some(Value::Array(items)) => scopes.extend(items.iter().filter_map(Value::as_str).map(str::to_owned)),
            _ => {}
        }
    }
    scopes.sort();
    scopes.dedup();
    scopes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn paths_find_names_and_pointers() {
        let c = claims(json!({"tid": "acme", "org": {"id": "org_1"}, "a/b": {"x": 1}, "orgs": ["x", "y"]}));
        assert_eq!(ClaimPath::parse("tid").find(&c), Some(&json!("acme")));
        assert_eq!(ClaimPath::parse("/org/id").find(&c), Some(&json!("org_1")));
        assert_eq!(ClaimPath::parse("/a~1b/x").find(&c), Some(&json!(1)));
        assert_eq!(ClaimPath::parse("/orgs/1").find(&c), Some(&json!("y")));
        assert_eq!(ClaimPath::parse("/org/none").find(&c), None);
        // A claim name is never read as a path.
        assert_eq!(ClaimPath::parse("org/id").find(&c), None);
    }

    #[test]
    fn tenant_shapes() {
        assert_eq!(tenant_of(Some(&json!("acme"))), Ok(Some("acme".into())));
        assert_eq!(tenant_of(Some(&json!(["acme"]))), Ok(Some("acme".into())));
        assert_eq!(tenant_of(Some(&json!({"acme": {"id": "42"}}))), Ok(Some("acme".into())));
        assert_eq!(tenant_of(Some(&json!(4711))), Ok(Some("4711".into())));
        assert_eq!(tenant_of(Some(&json!(["acme", "globex"]))), Err(AuthError::AmbiguousTenant));
        assert_eq!(tenant_of(Some(&json!({"acme": {}, "globex": {}}))), Err(AuthError::AmbiguousTenant));
        assert_eq!(tenant_of(Some(&json!(""))), Ok(None));
        assert_eq!(tenant_of(Some(&json!([""]))), Err(AuthError::Claims));
        assert_eq!(tenant_of(Some(&json!(true))), Err(AuthError::Claims));
        assert_eq!(tenant_of(None), Ok(None));
        assert_eq!(tenant_of(Some(&json!([]))), Ok(None));
    }

    #[test]
    fn scopes_from_scope_and_scp() {
        let c = claims(json!({"scope": "mcp:read  openid", "scp": ["mcp:write", "mcp:read"]}));
        assert_eq!(scopes_of(&c), ["mcp:read", "mcp:write", "openid"]);
        assert_eq!(scopes_of(&claims(json!({"scp": "a b"}))), ["a", "b"]);
        assert!(scopes_of(&claims(json!({}))).is_empty());
    }
}
