//! Digests: SHA-256 of canonical JSON (object keys sorted, no insignificant white space), for
//! tool arguments, stored secrets and the audit chain (the chain itself is `audit::digest`).

use std::io::Write;

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// JSON with object keys sorted at every depth, so equal values digest equally.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(64);
    write_canonical(&mut out, value);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// The canonical JSON of a tool call's arguments, straight from the borrowed map (for
/// `audit.record_raw_arguments`: the caller need not wrap a copy of the map in a `Value`).
pub fn canonical_arguments(arguments: &Map<String, Value>) -> String {
    let mut out = Vec::with_capacity(64);
    write_object(&mut out, arguments);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// Writes `value` canonically, straight from the borrowed value (no sorted copy is built).
/// `out` is a `Vec` or the SHA-256 hasher itself: neither can fail.
pub(crate) fn write_canonical<W: Write>(out: &mut W, value: &Value) {
    match value {
        Value::Object(map) => write_object(out, map),
        Value::Array(items) => {
            put(out, b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    put(out, b",");
                }
                write_canonical(out, item);
            }
            put(out, b"]");
        }
        // Scalars and keys are written by serde_json itself, so escaping and number
        // formatting are exactly those of `Value::to_string`.
        scalar => write_json(out, scalar),
    }
}

fn write_object<W: Write>(out: &mut W, map: &Map<String, Value>) {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    put(out, b"{");
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            put(out, b",");
        }
        write_json(out, key.as_str());
        put(out, b":");
        write_canonical(out, value);
    }
    put(out, b"}");
}

pub(crate) fn put<W: Write>(out: &mut W, bytes: &[u8]) {
    out.write_all(bytes).expect("writing to a Vec or a hasher can't fail");
}

pub(crate) fn write_json<W: Write, T: Serialize + ?Sized>(out: &mut W, value: &T) {
    // The writer can't fail, and these values (strings, numbers, flat structs of them)
    // always serialize.
    serde_json::to_writer(out, value).expect("a JSON scalar serializes");
}

pub(crate) fn hex(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * digest.len());
    for &b in digest {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 0x0f)] as char);
    }
    out
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// An upstream definition (a tool, prompt or resource template as the gateway parsed it): its
/// canonical JSON and that text's digest, `sha256:` and lowercase hex. Two definitions that
/// differ in anything a client may read (a description, a schema, an annotation, an icon,
/// `_meta`) differ here.
pub fn definition_digest<T: Serialize>(definition: &T) -> (String, String) {
    let canonical = match serde_json::to_value(definition) {
        Ok(value) => canonical_json(&value),
        // rmcp's model types always serialize; should one ever not, it digests as nothing
        // else does and is held, never served.
        Err(e) => format!("unserializable: {e}"),
    };
    let digest = format!("sha256:{}", sha256_hex(canonical.as_bytes()));
    (canonical, digest)
}

/// SHA-256 of the canonical JSON of `value` (a call's result as its caller is given it),
/// without its `resultType` member (which protocol 2026-07-28 adds to every result to name its
/// kind, and older revisions do not send): the same result digests alike whichever revision
/// carried it. Written into the hasher as it is produced. `None` when it does not serialize.
pub fn result_digest<T: Serialize + ?Sized>(value: &T) -> Option<String> {
    let mut value = serde_json::to_value(value).ok()?;
    if let Value::Object(map) = &mut value {
        map.remove("resultType");
    }
    let mut hasher = Sha256::new();
    write_canonical(&mut hasher, &value);
    Some(hex(&hasher.finalize()))
}

/// SHA-256 of the canonical JSON of a tool call's arguments (absent arguments = `{}`).
/// The canonical form is written into the hasher as it is produced: a large argument (a body
/// near the size limit) is not copied into a buffer first.
pub fn arguments_digest(arguments: Option<&Map<String, Value>>) -> String {
    let mut hasher = Sha256::new();
    match arguments {
        Some(map) => write_object(&mut hasher, map),
        None => put(&mut hasher, b"{}"),
    }
    hex(&hasher.finalize())
}
