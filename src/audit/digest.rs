//! The audit chain's digests: each link hashes its predecessor's hash, its sequence number and
//! every stored field of the event. The canonical JSON and SHA-256 helpers are the floor's
//! (`vocab::digest`), re-exported here.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::AuditEvent;
use crate::store::{AuditEventId, TenantId, UserId};
pub use crate::vocab::digest::{arguments_digest, canonical_arguments, canonical_json, result_digest, sha256_hex};
use crate::vocab::digest::{hex, put, write_json};

/// What a chain link hashes, with its members declared in sorted key order: serialized as
/// is, it is the canonical JSON of the event (the form `audit verify` recomputes).
#[derive(Serialize)]
struct ChainBody<'a> {
    action: &'a str,
    args_digest: &'a Option<String>,
    args_raw: &'a Option<String>,
    // Absent except on an outcome (so every event written before the member existed hashes as
    // it did).
    #[serde(skip_serializing_if = "Option::is_none")]
    call_id: Option<AuditEventId>,
    // Absent when 1, so the events written before the member existed hash as they did.
    #[serde(skip_serializing_if = "is_one")]
    calls: i64,
    client_name: &'a Option<String>,
    client_version: &'a Option<String>,
    duration_us: i64,
    error_class: &'a Option<String>,
    id: AuditEventId,
    occurred_at: i64,
    outcome: &'a str,
    // Absent when grants alone decided, so the events written before the member existed hash
    // as they did.
    #[serde(skip_serializing_if = "is_absent")]
    policy: &'a Option<String>,
    prev_hash: &'a str,
    request_id: &'a Option<String>,
    // Absent except on an outcome that gave a result.
    #[serde(skip_serializing_if = "is_absent")]
    result_digest: &'a Option<String>,
    seq: i64,
    session_id: &'a Option<String>,
    tenant_id: TenantId,
    tool: &'a Option<String>,
    user_id: UserId,
}

fn is_one(n: &i64) -> bool {
    *n == 1
}

fn is_absent(text: &&Option<String>) -> bool {
    text.is_none()
}

/// The hash of one chain link: over the predecessor's hash, the sequence number and
/// every stored field of the event.
pub fn chain_hash(prev_hash: &str, seq: i64, event: &AuditEvent) -> String {
    // Written straight into the hasher: with raw arguments recorded, the body can be as large
    // as a request.
    let mut hasher = Sha256::new();
    write_json(&mut hasher, &chain_body(prev_hash, seq, event));
    hex(&hasher.finalize())
}

/// One chain link as a line of JSON for `audit export`: `{"hash":H,` and then the members
/// of the canonical body that `H` is the SHA-256 of. So a line checks itself with any JSON
/// library: drop `hash`, write the rest with sorted keys and no spaces, hash it.
pub fn chain_line(prev_hash: &str, seq: i64, event: &AuditEvent, hash: &str) -> String {
    let mut out = Vec::with_capacity(256);
    put(&mut out, b"{\"hash\":");
    write_json(&mut out, hash);
    put(&mut out, b",");
    let at = out.len();
    write_json(&mut out, &chain_body(prev_hash, seq, event));
    // The body is an object with members: drop its opening brace.
    out.remove(at);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

fn chain_body<'a>(prev_hash: &'a str, seq: i64, event: &'a AuditEvent) -> ChainBody<'a> {
    ChainBody {
        action: &event.action,
        args_digest: &event.args_digest,
        args_raw: &event.args_raw,
        call_id: event.call_id,
        calls: event.calls,
        client_name: &event.client_name,
        client_version: &event.client_version,
        duration_us: event.duration_us,
        error_class: &event.error_class,
        id: event.id,
        occurred_at: event.occurred_at,
        outcome: event.outcome.as_str(),
        policy: &event.policy,
        prev_hash,
        request_id: &event.request_id,
        result_digest: &event.result_digest,
        seq,
        session_id: &event.session_id,
        tenant_id: event.tenant,
        tool: &event.tool,
        user_id: event.user,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::*;
    use crate::audit::Outcome;

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

    // The digests are stored (argument digests, chain hashes), so the way they are computed
    // must never change their value. The reference is the plain definition: build the JSON
    // value, sort every object's keys, print it.

    fn reference_canonical(value: &Value) -> String {
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

    fn reference_chain_hash(prev_hash: &str, seq: i64, event: &AuditEvent) -> String {
        let mut body = serde_json::json!({
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
        if event.calls != 1 {
            body["calls"] = event.calls.into();
        }
        if let Some(policy) = &event.policy {
            body["policy"] = policy.clone().into();
        }
        if let Some(call) = event.call_id {
            body["call_id"] = call.to_string().into();
        }
        if let Some(result) = &event.result_digest {
            body["result_digest"] = result.clone().into();
        }
        let digest = Sha256::digest(reference_canonical(&body).as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..6)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    fn text() -> impl Strategy<Value = Option<String>> {
        prop::option::of(any::<String>())
    }

    proptest! {
        #[test]
        fn canonical_json_is_the_sorted_value_printed(value in json_value()) {
            prop_assert_eq!(canonical_json(&value), reference_canonical(&value));
            if let Value::Object(map) = &value {
                prop_assert_eq!(canonical_arguments(map), reference_canonical(&value));
                let expected = sha256_hex(reference_canonical(&value).as_bytes());
                prop_assert_eq!(arguments_digest(Some(map)), expected);
            }
        }

        #[test]
        fn chain_hash_is_the_hash_of_the_canonical_event(
            prev in "[0-9a-f]{64}",
            seq in any::<i64>(),
            times in (any::<i64>(), any::<i64>()),
            outcome in prop_oneof![
                Just(Outcome::Ok), Just(Outcome::Denied), Just(Outcome::Failed), Just(Outcome::Started)
            ],
            action in any::<String>(),
            texts in (text(), text(), text(), text(), text(), text(), text(), text()),
            calls in prop_oneof![Just(1i64), any::<i64>()],
            policy in proptest::option::of(".*"),
            follows in (any::<bool>(), text()),
        ) {
            let (session_id, request_id, client_name, client_version, tool, args_digest, args_raw, error_class) = texts;
            let event = AuditEvent {
                id: AuditEventId::generate(),
                tenant: TenantId::generate(),
                occurred_at: times.0,
                user: UserId::generate(),
                session_id,
                request_id,
                client_name,
                client_version,
                action,
                tool,
                args_digest,
                args_raw,
                outcome,
                error_class,
                duration_us: times.1,
                calls,
                policy,
                call_id: follows.0.then(AuditEventId::generate),
                result_digest: follows.1,
            };
            prop_assert_eq!(chain_hash(&prev, seq, &event), reference_chain_hash(&prev, seq, &event));
        }
    }

    /// Arguments far larger than the hasher's block, with escapes and non-ASCII text, digest
    /// as the hash of their sorted printed form (the digest streams into the hasher in pieces).
    #[test]
    fn a_large_argument_digests_as_its_printed_form() {
        let big: String = "a\"b\\c\n\u{1}é🐔".repeat(100_000);
        let value = serde_json::json!({"z": big, "a": [1, 2.5, {"y": null, "b": true}], "m": "x"});
        let Value::Object(map) = &value else { unreachable!() };
        let printed = reference_canonical(&value);
        assert!(printed.len() > 1_000_000);
        assert_eq!(canonical_arguments(map), printed);
        assert_eq!(arguments_digest(Some(map)), sha256_hex(printed.as_bytes()));
    }

    /// A stored value, pinned: the argument digest of a fixed object.
    #[test]
    fn an_argument_digest_is_pinned() {
        let value = serde_json::json!({"flock": "north-barn", "day": "2026-11-30", "eggs": 42});
        let Value::Object(map) = &value else { unreachable!() };
        assert_eq!(canonical_arguments(map), r#"{"day":"2026-11-30","eggs":42,"flock":"north-barn"}"#);
        assert_eq!(arguments_digest(Some(map)), "8e9b183f92f0899843148b1e14caf6fb3b9711c6868888368ff4f28bdad2072c");
    }

    #[test]
    fn absent_arguments_digest_as_an_empty_object() {
        assert_eq!(arguments_digest(None), sha256_hex(b"{}"));
        assert_eq!(arguments_digest(Some(&Map::new())), sha256_hex(b"{}"));
    }
}
