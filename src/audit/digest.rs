//! Digests: SHA-256 of canonical JSON (object keys sorted, no insignificant white space),
//! for tool arguments and for the audit chain.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::AuditEvent;

/// JSON with object keys sorted at every depth, so equal values digest equally.
pub fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), sorted(v))).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// SHA-256 of the canonical JSON of a tool call's arguments (absent arguments = `{}`).
pub fn arguments_digest(arguments: Option<&serde_json::Map<String, Value>>) -> String {
    let value = arguments.map(|m| Value::Object(m.clone())).unwrap_or_else(|| Value::Object(Default::default()));
    sha256_hex(canonical_json(&value).as_bytes())
}

/// The hash of one chain link: over the predecessor's hash, the sequence number and
/// every stored field of the event.
pub fn chain_hash(prev_hash: &str, seq: i64, event: &AuditEvent) -> String {
    let body = serde_json::json!({
        "prev_hash": prev_hash,
        "seq": seq,
        "id": event.id,
        "tenant_id": event.tenant,
        "occurred_at": event.occurred_at,
        "user_id": event.user,
        "session_id": event.session_id,
        "request_id": event.request_id,
        "client_name": event.client_name,
        "client_version": event.client_version,
        "action": event.action,
        "tool": event.tool,
        "args_digest": event.args_digest,
        "args_raw": event.args_raw,
        "outcome": event.outcome.as_str(),
        "error_class": event.error_class,
        "duration_us": event.duration_us,
    });
    sha256_hex(canonical_json(&body).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"d":2,"c":3}],"x":null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#);
    }

    #[test]
    fn sha256_matches_a_known_vector() {
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
