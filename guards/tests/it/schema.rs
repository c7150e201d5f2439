//! A small JSON Schema (draft 2020-12) validator for the subset `report.schema.json` uses:
//! `type`, `properties`, `required`, `additionalProperties: false`, `items`, `enum`, `const`,
//! `minimum`, `minItems` and local `$ref`s into `$defs`. Any other keyword fails loudly, so
//! the schema cannot silently grow past what is checked.

use guards::compiled_report::{CompiledReport, IrRead};
use serde_json::Value;

const KNOWN: &[&str] = &[
    "$schema",
    "$id",
    "$defs",
    "$ref",
    "title",
    "description",
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "minItems",
];

/// Every violation, as `json-pointer: message`.
pub fn validate(root: &Value, instance: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    check(root, root, instance, "", &mut errors);
    errors
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        other => panic!("unsupported type {other}"),
    }
}

fn check(root: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let s = schema.as_object().expect("schema must be an object");
    for k in s.keys() {
        assert!(KNOWN.contains(&k.as_str()), "unsupported schema keyword {k}");
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/$defs/").expect("only local $defs refs");
        let target = &root["$defs"][name];
        assert!(!target.is_null(), "dangling $ref {r}");
        check(root, target, v, at, errors);
    }
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_ok(t.as_str().unwrap_or(""), v)),
            _ => panic!("bad type keyword"),
        };
        if !ok {
            errors.push(format!("{at}: expected type {t}, got {v}"));
            return;
        }
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        errors.push(format!("{at}: expected {c}, got {v}"));
    }
    if let Some(Value::Array(options)) = s.get("enum")
        && !options.contains(v)
    {
        errors.push(format!("{at}: {v} not in {options:?}"));
    }
    if let Some(min) = s.get("minimum").and_then(Value::as_f64)
        && v.as_f64().is_some_and(|n| n < min)
    {
        errors.push(format!("{at}: {v} < {min}"));
    }
    if let Value::Object(map) = v {
        let props = s.get("properties").and_then(Value::as_object);
        for req in s.get("required").and_then(Value::as_array).into_iter().flatten() {
            let key = req.as_str().unwrap_or_default();
            if !map.contains_key(key) {
                errors.push(format!("{at}: missing required `{key}`"));
            }
        }
        for (k, child) in map {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(root, ps, child, &format!("{at}/{k}"), errors),
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    errors.push(format!("{at}: unexpected property `{k}`"))
                }
                None => {}
            }
        }
    }
    if let Value::Array(items) = v {
        if let Some(min) = s.get("minItems").and_then(Value::as_u64)
            && (items.len() as u64) < min
        {
            errors.push(format!("{at}: fewer than {min} items"));
        }
        if let Some(is) = s.get("items") {
            for (i, item) in items.iter().enumerate() {
                check(root, is, item, &format!("{at}/{i}"), errors);
            }
        }
    }
}

fn schema() -> Value {
    serde_json::from_str(include_str!("../../report.schema.json")).expect("schema is JSON")
}

/// The report of a compiled fixture with a finding (a tool reaching the pool) and one without.
fn reports() -> Vec<(&'static str, Value)> {
    let rules = guards::Rules::parse(guards::DEFAULT_RULES, "rules.toml").unwrap();
    let ir = IrRead { bytes: 1, units: 1, functions: 1, seconds: 0.0 };
    let leaking = crate::compiled::walk(
        &format!(
            "pub fn tool(c: &McpCallContext, _a: &str) -> u32 {{ c.db().pool.query() }}\n{}",
            crate::compiled::served(&["tool"])
        ),
        &[],
    );
    assert!(!leaking.findings.is_empty());
    let clean = crate::compiled::walk(&crate::compiled::served(&[]), &[]);
    [
        ("a finding", CompiledReport::new("fixture", &rules, &leaking, ir.clone())),
        ("clean", CompiledReport::new("fixture", &rules, &clean, ir)),
        ("not run", CompiledReport::not_run("fixture", "no wrapper")),
    ]
    .into_iter()
    .map(|(name, r)| (name, serde_json::from_str(&r.to_json()).unwrap()))
    .collect()
}

#[test]
fn json_reports_match_the_schema() {
    let schema = schema();
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    for (name, json) in reports() {
        let errors = validate(&schema, &json);
        assert!(errors.is_empty(), "{name}:\n{}", errors.join("\n"));
    }
}

#[test]
fn the_validator_rejects_what_the_schema_forbids() {
    let schema = schema();
    let good = reports().remove(0).1;
    assert!(good["findings"][0]["path"][0]["at"]["line"].is_u64(), "{good:#}");
    type Mutation = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "missing key",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("residue");
            }),
        ),
        ("extra key", Box::new(|v| v["surprise"] = Value::Bool(true))),
        ("bad enum", Box::new(|v| v["roots"][0]["why"] = "maybe".into())),
        ("bad walk", Box::new(|v| v["walk"] = "source".into())),
        ("bad type", Box::new(|v| v["findings"][0]["path"][0]["at"]["line"] = "9".into())),
        ("line zero", Box::new(|v| v["findings"][0]["path"][0]["at"]["line"] = 0.into())),
        ("empty path", Box::new(|v| v["findings"][0]["path"] = Value::Array(vec![]))),
        ("bad nested row", Box::new(|v| v["guard_rows"][0]["enforced_by"][0] = "hope".into())),
    ];
    assert!(validate(&schema, &good).is_empty());
    for (what, mutate) in cases {
        let mut bad = good.clone();
        mutate(&mut bad);
        assert!(!validate(&schema, &bad).is_empty(), "validator accepted: {what}");
    }
}
