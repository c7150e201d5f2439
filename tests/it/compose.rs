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

/// `docker compose --profile scaled up`: two more replicas of the gateway (the same build and
/// configuration, merged from it, no published port) and HAProxy running the shipped
/// `deploy/haproxy.cfg`, whose servers are those services on the gateway's port, with affinity
/// on `Mcp-Session-Id` and health checks on `/readyz`. The replicas test runs the same file.
#[test]
fn compose_scaled_profile_wiring() {
    let mut doc = compose();
    doc.apply_merge().expect("merge keys resolve");
    let services = &doc["services"];
    let gateway = &services["gateway"];
    let replica = &services["replica"];
    let haproxy = &services["haproxy"];
    let profiles = |s: &serde_yaml_ng::Value| {
        s["profiles"].as_sequence().map(|p| p.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect::<Vec<_>>())
    };
    assert_eq!(profiles(gateway), None, "the single gateway runs without a profile");
    assert_eq!(profiles(replica), Some(vec!["scaled".to_owned()]));
    assert_eq!(profiles(haproxy), Some(vec!["scaled".to_owned()]));

    assert_eq!(replica["build"], gateway["build"], "replicas are the same build");
    assert_eq!(replica["environment"], gateway["environment"], "replicas are configured as the gateway is");
    assert_eq!(replica["depends_on"], gateway["depends_on"], "replicas wait for PostgreSQL too");
    assert!(replica["ports"].as_sequence().is_some_and(|p| p.is_empty()), "replicas publish no port");
    let copies = replica["deploy"]["replicas"].as_u64().expect("deploy.replicas");
    assert!(copies >= 1);
    let env = gateway["environment"].as_mapping().unwrap();
    assert!(env.contains_key("SCOPEGATE_LIMITS__REPLICAS"), "the rate limits' share is configurable");

    assert!(haproxy["image"].as_str().is_some_and(|i| i.starts_with("haproxy:")));
    let deps: Vec<&str> = haproxy["depends_on"].as_sequence().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(deps.contains(&"gateway") && deps.contains(&"replica"), "{deps:?}");
    let mount = haproxy["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .find(|v| v.ends_with(":/usr/local/etc/haproxy/haproxy.cfg:ro"))
        .expect("the configuration is mounted where the image reads it");
    let file = mount.split(':').next().unwrap();
    let cfg = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let port = env["SCOPEGATE_SERVER__LISTEN"].as_str().unwrap().rsplit(':').next().unwrap().to_owned();
    let published = haproxy["ports"].as_sequence().unwrap()[0].as_str().unwrap().to_owned();
    let lines: Vec<Vec<&str>> =
        cfg.lines().map(|l| l.split_whitespace().collect()).filter(|w: &Vec<&str>| !w.is_empty()).collect();
    assert!(lines.iter().any(|w| w[0] == "bind" && w[1] == format!(":{}", published.rsplit(':').next().unwrap())));
    let servers: Vec<&Vec<&str>> = lines.iter().filter(|w| w[0] == "server").collect();
    let templates: Vec<&Vec<&str>> = lines.iter().filter(|w| w[0] == "server-template").collect();
    assert!(servers.iter().any(|w| w[2] == format!("gateway:{port}")), "{servers:?}");
    assert!(
        templates.iter().any(|w| w[2] == copies.to_string() && w[3] == format!("replica:{port}")),
        "one slot per replica: {templates:?}"
    );
    for expected in [
        &["stick", "on", "req.hdr(mcp-session-id)"][..],
        &["stick", "store-response", "res.hdr(mcp-session-id)"],
        &["http-check", "send", "meth", "GET", "uri", "/readyz"],
        &["http-check", "expect", "status", "200"],
        &["option", "redispatch"],
    ] {
        assert!(lines.iter().any(|w| w.starts_with(expected)), "deploy/haproxy.cfg lacks `{}`", expected.join(" "));
    }
    assert!(lines.iter().any(|w| w[0] == "default-server" && w.contains(&"check")), "servers are health-checked");
}
