//! Every native tool's results satisfy what the tool declares, the rule that schema-checking
//! clients (the TypeScript SDK's `Client`) apply: structured content present => it validates
//! against the tool's output schema; an error result (`isError: true`) carries none, and tells
//! the error in text. Each tool's error paths are called, and each of its successes.

use rmcp::model::Tool;
use serde_json::{Value, json};

use crate::support::*;

fn yesterday() -> String {
    (time::OffsetDateTime::now_utc().date() - time::Duration::days(1)).to_string()
}

fn days_ago(n: i64) -> String {
    (time::OffsetDateTime::now_utc().date() - time::Duration::days(n)).to_string()
}

/// Checks `value` against `schema` for the JSON Schema vocabulary schemars emits for the
/// tools' output types (`type`, `properties`, `required`, `additionalProperties`, `items`,
/// `$ref` into `$defs`, `anyOf`/`oneOf`/`allOf`, `enum`, `const`). A keyword outside that set
/// fails the check, so a schema change can't slip past it unchecked.
fn validate(root: &Value, schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let Some(schema) = schema.as_object() else {
        return match schema {
            Value::Bool(true) => Ok(()),
            _ => Err(format!("{path}: schema {schema} refuses everything")),
        };
    };
    for (keyword, rule) in schema {
        match keyword.as_str() {
            "$schema" | "title" | "description" | "$defs" | "definitions" | "format" | "default" | "examples" => {}
            "$ref" => {
                let name = rule.as_str().and_then(|r| r.strip_prefix("#/$defs/").or(r.strip_prefix("#/definitions/")));
                let target = name
                    .and_then(|n| root.get("$defs").or(root.get("definitions")).and_then(|d| d.get(n)))
                    .ok_or_else(|| format!("{path}: unresolvable $ref {rule}"))?;
                validate(root, target, value, path)?;
            }
            "type" => {
                let types: Vec<&str> = match rule {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => return Err(format!("{path}: odd type {rule}")),
                };
                let fits = |t: &str| match t {
                    "object" => value.is_object(),
                    "array" => value.is_array(),
                    "string" => value.is_string(),
                    "integer" => value.is_i64() || value.is_u64(),
                    "number" => value.is_number(),
                    "boolean" => value.is_boolean(),
                    "null" => value.is_null(),
                    _ => false,
                };
                if !types.iter().any(|t| fits(t)) {
                    return Err(format!("{path}: {value} is not of type {rule}"));
                }
            }
            "properties" => {
                if let (Some(props), Some(obj)) = (rule.as_object(), value.as_object()) {
                    for (name, sub) in props {
                        if let Some(v) = obj.get(name) {
                            validate(root, sub, v, &format!("{path}.{name}"))?;
                        }
                    }
                }
            }
            "required" => {
                if let Some(obj) = value.as_object() {
                    for name in rule.as_array().into_iter().flatten().filter_map(Value::as_str) {
                        if !obj.contains_key(name) {
                            return Err(format!("{path}: required `{name}` missing"));
                        }
                    }
                }
            }
            "additionalProperties" => {
                if let Some(obj) = value.as_object() {
                    let known = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
                    for (name, v) in obj.iter().filter(|(n, _)| !known.contains_key(*n)) {
                        validate(root, rule, v, &format!("{path}.{name}"))?;
                    }
                }
            }
            "items" => {
                for (i, v) in value.as_array().into_iter().flatten().enumerate() {
                    validate(root, rule, v, &format!("{path}[{i}]"))?;
                }
            }
            "anyOf" | "oneOf" => {
                let fitting =
                    rule.as_array().into_iter().flatten().filter(|s| validate(root, s, value, path).is_ok()).count();
                let ok = if keyword == "oneOf" { fitting == 1 } else { fitting >= 1 };
                if !ok {
                    return Err(format!("{path}: {value} fits {fitting} of {keyword} {rule}"));
                }
            }
            "allOf" => {
                for s in rule.as_array().into_iter().flatten() {
                    validate(root, s, value, path)?;
                }
            }
            "enum" => {
                if !rule.as_array().is_some_and(|options| options.contains(value)) {
                    return Err(format!("{path}: {value} not in {rule}"));
                }
            }
            "const" => {
                if rule != value {
                    return Err(format!("{path}: {value} is not {rule}"));
                }
            }
            "minimum" | "maximum" if value.is_number() => {
                let (n, bound) = (value.as_f64().unwrap_or(0.0), rule.as_f64().unwrap_or(0.0));
                if (keyword == "minimum" && n < bound) || (keyword == "maximum" && n > bound) {
                    return Err(format!("{path}: {value} outside {keyword} {rule}"));
                }
            }
            "minimum" | "maximum" => {}
            other => return Err(format!("{path}: schema keyword `{other}` is not checked here; extend `validate`")),
        }
    }
    Ok(())
}

#[test]
fn the_validator_refuses_what_the_schema_refuses() {
    let schema = json!({
        "type": "object", "required": ["flocks"],
        "properties": {"flocks": {"type": "array", "items": {"$ref": "#/$defs/Flock"}}},
        "$defs": {"Flock": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}
    });
    let check = |v: Value| validate(&schema, &schema, &v, "$");
    assert!(check(json!({"flocks": [{"name": "north-barn"}]})).is_ok());
    for bad in [
        json!({"error": "not_found", "message": "flock not found"}),
        json!({"flocks": [{"name": 3}]}),
        json!({"flocks": "none"}),
        json!({"flocks": [{}]}),
    ] {
        assert!(check(bad.clone()).is_err(), "{bad} must be refused");
    }
}

/// What a schema-validating client does with one result: `Ok` when it would accept it.
fn client_accepts(tool: &Tool, result: &rmcp::model::CallToolResult) -> Result<(), String> {
    let schema = Value::Object(
        tool.output_schema.as_ref().ok_or_else(|| format!("{} declares no output schema", tool.name))?.as_ref().clone(),
    );
    match (&result.structured_content, result.is_error == Some(true)) {
        (None, false) => Err("an output schema but no structured content".to_owned()),
        (Some(content), _) => validate(&schema, &schema, content, "$"),
        (None, true) => Ok(()),
    }
}

async fn every_result_satisfies_its_tool(backend: Backend) {
    let live = Live::start(backend, Mode::Session, &[]).await;
    let olivia = live.client("olivia@acme.test").await;
    let wanda = live.client("wanda@acme.test").await;
    let audrey = live.client("audrey@acme.test").await;
    let tools = olivia.list_all_tools().await.unwrap();
    let tool = |name: &str| tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} listed")).clone();
    let north = live.flock_id("north-barn").await;

    // (caller, tool, arguments, expected error class); every native tool has an
    // argument check, and each of its own refusals is here.
    let errors = [
        (&olivia, "whoami", json!({"extra": 1}), "invalid_argument"),
        (&olivia, "list_flocks", json!({"extra": 1}), "invalid_argument"),
        (&olivia, "get_flock", json!({"flock": "no-such-barn"}), "not_found"),
        (&wanda, "get_flock", json!({"flock": "south-barn"}), "not_found"),
        (&olivia, "get_flock", json!({"flock": "hilltop"}), "not_found"),
        (&olivia, "get_flock", json!({}), "invalid_argument"),
        (&olivia, "get_flock", json!({"flock": 7}), "invalid_argument"),
        (&olivia, "query_egg_counts", json!({"from": "someday", "to": yesterday()}), "invalid_argument"),
        (&olivia, "query_egg_counts", json!({"from": days_ago(3), "to": "2026-13-01"}), "invalid_argument"),
        (&olivia, "query_egg_counts", json!({"from": yesterday(), "to": days_ago(3)}), "invalid_argument"),
        (&olivia, "query_egg_counts", json!({"from": days_ago(400), "to": yesterday()}), "invalid_argument"),
        (
            &wanda,
            "query_egg_counts",
            json!({"from": days_ago(3), "to": yesterday(), "flock": "south-barn"}),
            "not_found",
        ),
        (&olivia, "query_egg_counts", json!({"to": yesterday()}), "invalid_argument"),
        (
            &olivia,
            "record_egg_count",
            json!({"flock": "north-barn", "day": "2999-01-01", "eggs": 3}),
            "invalid_argument",
        ),
        (
            &olivia,
            "record_egg_count",
            json!({"flock": "north-barn", "day": days_ago(400), "eggs": 3}),
            "invalid_argument",
        ),
        (&olivia, "record_egg_count", json!({"flock": "north-barn", "day": "soon", "eggs": 3}), "invalid_argument"),
        (
            &olivia,
            "record_egg_count",
            json!({"flock": "north-barn", "day": yesterday(), "eggs": -1}),
            "invalid_argument",
        ),
        (
            &olivia,
            "record_egg_count",
            json!({"flock": "north-barn", "day": yesterday(), "eggs": "many"}),
            "invalid_argument",
        ),
        (&wanda, "record_egg_count", json!({"flock": "south-barn", "day": yesterday(), "eggs": 3}), "not_found"),
        (&olivia, "record_egg_count", json!({"flock": "no-such-barn", "day": yesterday(), "eggs": 3}), "not_found"),
        (&olivia, "recent_audit_events", json!({"limit": 0}), "invalid_argument"),
        (&olivia, "recent_audit_events", json!({"limit": 201}), "invalid_argument"),
        (&audrey, "recent_audit_events", json!({"limit": "x"}), "invalid_argument"),
    ];
    for (client, name, args, class) in &errors {
        let result = call(client, name, args.clone()).await.unwrap_or_else(|e| panic!("{name} {args}: {e:?}"));
        let error = error_of(name, args, &result);
        assert_eq!(error["error"], *class, "{name} {args}: {error}");
        client_accepts(&tool(name), &result).unwrap_or_else(|e| panic!("{name} {args}: a client refuses it: {e}"));
    }
    let tools_with_errors: std::collections::BTreeSet<&str> = errors.iter().map(|(_, name, _, _)| *name).collect();
    let native: std::collections::BTreeSet<&str> = scopegate::tools::TOOLS.iter().map(|t| t.name).collect();
    assert_eq!(tools_with_errors, native, "every native tool's error paths are called");

    let successes = [
        (&olivia, "whoami", json!({})),
        (&wanda, "whoami", json!({})),
        (&olivia, "list_flocks", json!({})),
        (&olivia, "get_flock", json!({"flock": "north-barn"})),
        (&olivia, "get_flock", json!({"flock": north})),
        (&olivia, "query_egg_counts", json!({"from": days_ago(5), "to": yesterday()})),
        (&wanda, "query_egg_counts", json!({"from": days_ago(5), "to": yesterday(), "flock": "north-barn"})),
        (&olivia, "record_egg_count", json!({"flock": "north-barn", "day": yesterday(), "eggs": 12})),
        (&olivia, "recent_audit_events", json!({})),
        (&audrey, "recent_audit_events", json!({"limit": 5})),
    ];
    for (client, name, args) in &successes {
        let result = call(client, name, args.clone()).await.unwrap_or_else(|e| panic!("{name} {args}: {e:?}"));
        assert_ne!(result.is_error, Some(true), "{name} {args}: {result:?}");
        assert!(result.structured_content.is_some(), "{name} {args}: structured output");
        client_accepts(&tool(name), &result).unwrap_or_else(|e| panic!("{name} {args}: a client refuses it: {e}"));
    }

    // The audit still classes each failure, although the result carries no structured error.
    for class in ["invalid_argument", "not_found"] {
        let expected = errors.iter().filter(|(_, _, _, c)| *c == class).count() as i64;
        let sql = format!("SELECT COUNT(*) FROM audit_events WHERE outcome = 'failed' AND error_class = '{class}'");
        assert_eq!(live.count(&sql).await, expected, "audited as {class}");
    }
}
both_dbs!(tool_results_satisfy_the_declared_output_schema, every_result_satisfies_its_tool);
