//! A tool call's arguments as Cedar sees them: the Cedar type of each argument, read from the
//! tool's JSON Schema `inputSchema`, and the call's JSON arguments turned into a value of that
//! type. Never guesses: a value that does not have its declared type makes the whole record
//! refused, so a policy never reads an argument the upstream would read differently.

use std::collections::{BTreeMap, HashMap};

use cedar_policy::RestrictedExpression;
use serde_json::{Map, Value, json};

/// How deep nested objects and arrays are followed; deeper ones are left out of the type.
const MAX_DEPTH: usize = 8;

/// Cedar's `decimal`: four digits after the point, in the range of an i64 scaled by 10^4.
const DECIMAL_DIGITS: usize = 4;

/// The Cedar type of one argument. JSON Schema types without a Cedar counterpart (`null`,
/// unions, `$ref`, objects without `properties`) have none: such an argument is not in the
/// record, and a policy that names it does not validate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgType {
    /// `string` (any format).
    String,
    /// `integer`: Cedar's `Long` (arithmetic and `<`).
    Long,
    /// `number`: Cedar's `decimal` (`lessThan`, `greaterThan`, ...).
    Decimal,
    /// `boolean`.
    Bool,
    /// `array` with typed `items`: a Cedar set.
    Set(Box<ArgType>),
    /// `object` with `properties`: a record; `required` names the attributes that must be there.
    Record(Fields),
}

/// A record's attributes: name -> (type, required).
pub type Fields = BTreeMap<String, (ArgType, bool)>;

/// The arguments record of a tool with `input_schema`: its typed properties (none when the
/// schema declares none).
pub fn arguments_type(input_schema: &Map<String, Value>) -> Fields {
    match object_type(input_schema, 0) {
        Some(ArgType::Record(fields)) => fields,
        _ => Fields::new(),
    }
}

fn object_type(schema: &Map<String, Value>, depth: usize) -> Option<ArgType> {
    let properties = schema.get("properties")?.as_object()?;
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let fields = properties
        .iter()
        .filter_map(|(name, property)| {
            let ty = arg_type(property.as_object()?, depth + 1)?;
            Some((name.clone(), (ty, required.contains(&name.as_str()))))
        })
        .collect();
    Some(ArgType::Record(fields))
}

fn arg_type(schema: &Map<String, Value>, depth: usize) -> Option<ArgType> {
    if depth > MAX_DEPTH {
        return None;
    }
    let declared = match schema.get("type") {
        Some(Value::String(one)) => Some(one.as_str()),
        // `["string", "null"]`: the one type that is not null (a null value is then absent).
        Some(Value::Array(types)) => {
            let mut named = types.iter().filter_map(Value::as_str).filter(|t| *t != "null");
            let one = named.next()?;
            if named.next().is_some() {
                return None;
            }
            Some(one)
        }
        Some(_) => return None,
        None => None,
    };
    let declared = match declared {
        Some(declared) => declared,
        // Untyped: an object by its properties, or a string by an enum of strings.
        None if schema.contains_key("properties") => "object",
        None => match schema.get("enum").and_then(Value::as_array) {
            Some(values) if !values.is_empty() && values.iter().all(Value::is_string) => "string",
            _ => return None,
        },
    };
    match declared {
        "string" => Some(ArgType::String),
        "integer" => Some(ArgType::Long),
        "number" => Some(ArgType::Decimal),
        "boolean" => Some(ArgType::Bool),
        "array" => {
            let items = schema.get("items")?.as_object()?;
            Some(ArgType::Set(Box::new(arg_type(items, depth + 1)?)))
        }
        "object" => object_type(schema, depth),
        _ => None,
    }
}

/// The Cedar schema (JSON form) of `ty`.
pub fn schema_of(ty: &ArgType) -> Value {
    match ty {
        ArgType::String => json!({"type": "String"}),
        ArgType::Long => json!({"type": "Long"}),
        ArgType::Decimal => json!({"type": "Extension", "name": "decimal"}),
        ArgType::Bool => json!({"type": "Boolean"}),
        ArgType::Set(element) => json!({"type": "Set", "element": schema_of(element)}),
        ArgType::Record(fields) => record_schema(fields),
    }
}

/// The Cedar schema (JSON form) of a record with `fields`.
pub fn record_schema(fields: &Fields) -> Value {
    let attributes: Map<String, Value> = fields
        .iter()
        .map(|(name, (ty, required))| {
            let mut attribute = schema_of(ty);
            if !required && let Some(object) = attribute.as_object_mut() {
                object.insert("required".into(), Value::Bool(false));
            }
            (name.clone(), attribute)
        })
        .collect();
    json!({"type": "Record", "attributes": attributes})
}

/// Why a call's arguments are not a value of their declared type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("argument `{path}` {problem}")]
pub struct Mismatch {
    /// Where, as `a.b[2]`.
    pub path: String,
    pub problem: &'static str,
}

/// A Cedar extension type whose values a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Extension {
    Decimal,
    Datetime,
}

/// The value of `kind` written `text` (not checked here: Cedar checks it when the request is
/// built). Building one parses its constructor's name (cedar-policy 4.14) at a cost of several
/// microseconds, so the values of the last texts seen are kept, a few thousand at most.
pub fn extension_value(kind: Extension, text: String) -> RestrictedExpression {
    type Held = HashMap<(Extension, String), RestrictedExpression>;
    static HELD: std::sync::LazyLock<std::sync::Mutex<Held>> = std::sync::LazyLock::new(Default::default);
    let key = (kind, text);
    if let Some(value) = HELD.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return value.clone();
    }
    let value = match kind {
        Extension::Decimal => RestrictedExpression::new_decimal(&key.1),
        Extension::Datetime => RestrictedExpression::new_datetime(&key.1),
    };
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    if held.len() >= 4096 {
        held.clear();
    }
    held.insert(key, value.clone());
    value
}

/// Which of a call's arguments some policy reads: all of them, or only the named top-level ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgumentReads {
    All,
    Only(std::collections::BTreeSet<String>),
}

impl ArgumentReads {
    fn reads(&self, name: &str) -> bool {
        match self {
            ArgumentReads::All => true,
            ArgumentReads::Only(names) => names.contains(name),
        }
    }
}

/// The call's `arguments` as a Cedar record of `fields`. Properties the schema does not type
/// are left out; a property of the wrong type, a missing required one, or a number Cedar's
/// `decimal` can't hold exactly is a [`Mismatch`]. Every argument is checked; only those
/// `reads` names are in the record (no policy can tell the others are missing).
pub fn arguments_value(
    fields: &Fields,
    arguments: Option<&Map<String, Value>>,
    reads: &ArgumentReads,
) -> Result<RestrictedExpression, Mismatch> {
    let empty = Map::new();
    record_value(fields, arguments.unwrap_or(&empty), "", Some(reads))
}

/// `object` as a record of `fields`; `reads`: the members to build (`None`: only checked).
fn record_value(
    fields: &Fields,
    object: &Map<String, Value>,
    at: &str,
    reads: Option<&ArgumentReads>,
) -> Result<RestrictedExpression, Mismatch> {
    let mut pairs = Vec::with_capacity(fields.len());
    for (name, (ty, required)) in fields {
        let path = if at.is_empty() { name.clone() } else { format!("{at}.{name}") };
        match object.get(name) {
            None | Some(Value::Null) if *required => {
                return Err(Mismatch { path, problem: "is required" });
            }
            None | Some(Value::Null) => {}
            Some(value) => {
                let build = reads.is_some_and(|r| r.reads(name));
                let value = value_of(ty, value, &path, build)?;
                if build {
                    pairs.push((name.clone(), value));
                }
            }
        }
    }
    if reads.is_none() {
        return Ok(RestrictedExpression::new_bool(true));
    }
    RestrictedExpression::new_record(pairs).map_err(|_| Mismatch { path: at.to_owned(), problem: "repeats a name" })
}

/// `value` as a Cedar value of `ty`; when not `build`, only checked (a placeholder comes back).
fn value_of(ty: &ArgType, value: &Value, path: &str, build: bool) -> Result<RestrictedExpression, Mismatch> {
    let wrong = |problem| Mismatch { path: path.to_owned(), problem };
    let all = ArgumentReads::All;
    match (ty, value) {
        (ArgType::String, Value::String(s)) => {
            Ok(RestrictedExpression::new_string(if build { s.clone() } else { String::new() }))
        }
        (ArgType::Long, Value::Number(n)) => {
            let long = n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).and_then(exact_i64));
            long.map(RestrictedExpression::new_long).ok_or_else(|| wrong("is not a 64-bit integer"))
        }
        (ArgType::Decimal, Value::Number(n)) => {
            let text = decimal_text(n).ok_or_else(|| wrong("does not fit Cedar's decimal"))?;
            // Building a `decimal` costs a parse of its constructor's name: only when read.
            Ok(if build { extension_value(Extension::Decimal, text) } else { RestrictedExpression::new_bool(true) })
        }
        (ArgType::Bool, Value::Bool(b)) => Ok(RestrictedExpression::new_bool(*b)),
        (ArgType::Set(element), Value::Array(items)) => {
            let values = items
                .iter()
                .enumerate()
                .map(|(i, item)| value_of(element, item, &format!("{path}[{i}]"), build))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(RestrictedExpression::new_set(if build { values } else { Vec::new() }))
        }
        (ArgType::Record(fields), Value::Object(object)) => record_value(fields, object, path, build.then_some(&all)),
        (ArgType::String, _) => Err(wrong("is not a string")),
        (ArgType::Long, _) => Err(wrong("is not an integer")),
        (ArgType::Decimal, _) => Err(wrong("is not a number")),
        (ArgType::Bool, _) => Err(wrong("is not a boolean")),
        (ArgType::Set(_), _) => Err(wrong("is not an array")),
        (ArgType::Record(_), _) => Err(wrong("is not an object")),
    }
}

fn exact_i64(f: f64) -> Option<i64> {
    // i64::MAX is not a float; 2^63 is the first float past the range.
    (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f).then_some(f as i64)
}

/// A JSON number as Cedar `decimal` text (`12.5000`), when it has at most four digits after
/// the point and fits the range; `None` otherwise (never rounded).
pub fn decimal_text(n: &serde_json::Number) -> Option<String> {
    if let Some(i) = n.as_i64() {
        i.checked_mul(10_000)?;
        return Some(format!("{i}.0"));
    }
    let f = n.as_f64()?;
    if !f.is_finite() {
        return None;
    }
    // Rust prints a float in the shortest form that reads back the same, without exponent.
    let text = f.to_string();
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, "0"));
    if fraction.len() > DECIMAL_DIGITS {
        return None;
    }
    // In range when the value scaled by 10^4 is an i64.
    format!("{whole}{fraction:0<DECIMAL_DIGITS$}").parse::<i64>().ok()?;
    Some(format!("{whole}.{fraction}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(schema: Value) -> Fields {
        arguments_type(schema.as_object().unwrap())
    }

    #[test]
    fn json_schema_types_map_to_cedar_types() {
        let typed = fields(json!({
            "type": "object",
            "properties": {
                "s": {"type": "string", "format": "uri"},
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "b": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "nested": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                "maybe": {"type": ["string", "null"]},
                "choice": {"enum": ["a", "b"]},
                "union": {"type": ["string", "integer"]},
                "anything": {},
                "ref": {"$ref": "#/defs/x"},
                "open": {"type": "object"},
            },
            "required": ["s", "nested"],
        }));
        let names: Vec<&str> = typed.keys().map(String::as_str).collect();
        assert_eq!(names, ["b", "choice", "i", "maybe", "n", "nested", "s", "tags"], "untyped properties are left out");
        assert_eq!(typed["s"], (ArgType::String, true));
        assert_eq!(typed["i"], (ArgType::Long, false));
        assert_eq!(typed["n"], (ArgType::Decimal, false));
        assert_eq!(typed["tags"].0, ArgType::Set(Box::new(ArgType::String)));
        let ArgType::Record(nested) = &typed["nested"].0 else { panic!("nested is a record") };
        assert_eq!(nested["x"], (ArgType::Long, true));
        assert_eq!(typed["maybe"], (ArgType::String, false));
    }

    #[test]
    fn values_of_the_wrong_type_are_refused_never_coerced() {
        let typed = fields(json!({
            "type": "object",
            "properties": {"amount": {"type": "integer"}, "note": {"type": "string"}, "rate": {"type": "number"}},
            "required": ["amount"],
        }));
        let ok = |v: Value| arguments_value(&typed, v.as_object(), &ArgumentReads::All);
        assert!(ok(json!({"amount": 5, "note": "x", "rate": 1.25})).is_ok());
        assert!(ok(json!({"amount": 5.0})).is_ok(), "an integral float is an integer");
        assert!(ok(json!({"amount": 5, "extra": [1, 2]})).is_ok(), "undeclared properties are left out");
        let cases = [
            (json!({"amount": "5"}), "amount", "is not an integer"),
            (json!({"amount": 5.5}), "amount", "is not a 64-bit integer"),
            (json!({}), "amount", "is required"),
            (json!({"amount": null}), "amount", "is required"),
            (json!({"amount": 1, "note": 7}), "note", "is not a string"),
            (json!({"amount": 1, "rate": 0.12345}), "rate", "does not fit Cedar's decimal"),
            (json!({"amount": 1, "rate": 1e300}), "rate", "does not fit Cedar's decimal"),
        ];
        for (arguments, path, problem) in cases {
            let err = ok(arguments.clone()).expect_err(&arguments.to_string());
            assert_eq!((err.path.as_str(), err.problem), (path, problem), "{arguments}");
        }
    }

    #[test]
    fn decimals_are_exact_or_refused() {
        let text = |v: Value| decimal_text(v.as_number().unwrap());
        assert_eq!(text(json!(12)).as_deref(), Some("12.0"));
        assert_eq!(text(json!(-0.5)).as_deref(), Some("-0.5"));
        assert_eq!(text(json!(99.9999)).as_deref(), Some("99.9999"));
        assert_eq!(text(json!(0.00001)), None);
        assert_eq!(text(json!(i64::MAX)), None, "past decimal's range");
        assert_eq!(text(json!(1e20)), None, "past decimal's range");
    }
}
