//! docker-compose.yml can't run here (no Docker engine), so its wiring is checked instead:
//! the gateway is built from the Dockerfile, PostgreSQL 16 has a healthcheck, the gateway
//! waits for it to be healthy, the database has a volume, and every SCOPEGATE_* variable
//! it sets is a real configuration key.

use serde_json::Value;

fn compose() -> serde_yaml_ng::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docker-compose.yml");
    serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).expect("docker-compose.yml parses")
}

/// Dotted keys of the configuration (every section and key, optional ones included).
fn config_keys() -> Vec<String> {
    let config = crate::support::config_with("sqlite://unused.db", &[]);
    let mut keys = Vec::new();
    if let Value::Object(sections) = serde_json::to_value(&config).unwrap() {
        for (section, fields) in sections {
            if let Value::Object(fields) = fields {
                keys.extend(fields.keys().map(|k| format!("{section}.{k}")));
            }
        }
    }
    keys
}

#[test]
fn compose_wiring() {
    let doc = compose();
    let services = &doc["services"];
    let gateway = &services["gateway"];
    let postgres = &services["postgres"];

    assert!(gateway["build"].is_mapping() || gateway["build"].is_string(), "the gateway is built");
    let dockerfile = gateway["build"]["dockerfile"].as_str().unwrap_or("Dockerfile");
    let dockerfile = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dockerfile))
        .expect("the Dockerfile exists");
    assert!(dockerfile.matches("FROM ").count() >= 2, "a multi-stage Dockerfile");

    let image = postgres["image"].as_str().expect("postgres image");
    assert!(image.starts_with("postgres:16"), "{image}");
    assert!(postgres["healthcheck"]["test"].is_sequence() || postgres["healthcheck"]["test"].is_string());
    assert_eq!(gateway["depends_on"]["postgres"]["condition"].as_str(), Some("service_healthy"));
    let volumes = postgres["volumes"].as_sequence().expect("postgres volumes");
    assert!(volumes.iter().any(|v| { v.as_str().is_some_and(|v| v.contains("/var/lib/postgresql/data")) }));
    assert!(doc["volumes"].is_mapping(), "a named volume holds the database");

    let keys = config_keys();
    let env = gateway["environment"].as_mapping().expect("the gateway is configured by environment");
    let mut seen = 0;
    for (name, _) in env {
        let name = name.as_str().unwrap();
        let Some(rest) = name.strip_prefix("SCOPEGATE_") else {
            continue;
        };
        let (section, key) = rest.split_once("__").unwrap_or_else(|| panic!("{name}: no __ separator"));
        let dotted = format!("{}.{}", section.to_lowercase(), key.to_lowercase());
        assert!(keys.contains(&dotted), "{name} is not a configuration key ({dotted})");
        seen += 1;
    }
    assert!(seen >= 3, "the database URL, listen address and auth come from the environment");
    let url = env.get("SCOPEGATE_DATABASE__URL").and_then(|v| v.as_str()).unwrap_or("");
    assert!(url.starts_with("postgres://") && url.contains("@postgres:5432"), "{url}");
}
