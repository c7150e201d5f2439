//! docker-compose.yml can't run here (no Docker engine), so its wiring is checked instead:
//! the gateway is built from the Dockerfile, PostgreSQL 16 has a healthcheck, the gateway
//! waits for it to be healthy, the database has a volume, and every SCOPEGATE_* variable
//! it sets is a real configuration key; every variable an operator sets is in .env.example,
//! with the default the file gives it, the required one refused when missing, and the
//! configuration the file makes from the defaults loads; the gateway's healthcheck is
//! `scopegate health` in the image and in the file, and metrics are never published.

use std::collections::BTreeMap;

use serde_json::Value;

fn read(file: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

fn compose() -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&read("docker-compose.yml")).expect("docker-compose.yml parses")
}

/// The variables the compose file interpolates: name to (the default it gives, whether it
/// refuses to start without one), from `${NAME}`, `${NAME:-default}` and `${NAME:?message}`.
fn interpolated(text: &str) -> BTreeMap<String, (Option<String>, bool)> {
    let mut found = BTreeMap::new();
    for (at, _) in text.match_indices("${") {
        let rest = &text[at + 2..];
        // A default may hold brackets of its own: the closing brace is the first one.
        let inner = &rest[..rest.find('}').expect("a closed ${...}")];
        let name: String = inner.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let tail = &inner[name.len()..];
        let entry = if let Some(default) = tail.strip_prefix(":-") {
            (Some(default.to_owned()), false)
        } else {
            (None, tail.starts_with(":?"))
        };
        let seen = found.entry(name.clone()).or_insert_with(|| entry.clone());
        assert_eq!(*seen, entry, "{name} is interpolated alike everywhere");
    }
    found
}

/// .env.example's variables: name to value, commented (`#NAME=value`, the default kept) or not.
fn env_example() -> BTreeMap<String, String> {
    read(".env.example")
        .lines()
        .filter_map(|line| {
            let line = line.strip_prefix('#').unwrap_or(line);
            let (name, value) = line.split_once('=')?;
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .then(|| (name.to_owned(), value.to_owned()))
        })
        .collect()
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

    // What an operator must choose is a variable of the file.
    for key in [
        "SCOPEGATE_ADMIN__PLATFORM_SUBJECTS",
        "SCOPEGATE_SERVER__ALLOWED_HOSTS",
        "SCOPEGATE_SERVER__PUBLIC_URL",
        "SCOPEGATE_AUTH__ISSUER",
        "SCOPEGATE_AUTH__JWKS_URL",
        "SCOPEGATE_AUTH__HS256_SECRET",
        "SCOPEGATE_LIMITS__REPLICAS",
    ] {
        let value = env.get(key).and_then(|v| v.as_str()).unwrap_or_else(|| panic!("{key} is set"));
        assert!(value.starts_with("${"), "{key} comes from a variable: {value}");
    }

    // The healthcheck: `scopegate health` (no curl in the image), in the file and the image.
    let test = gateway["healthcheck"]["test"].as_sequence().expect("the gateway has a healthcheck");
    let test: Vec<&str> = test.iter().filter_map(|v| v.as_str()).collect();
    assert_eq!(test, ["CMD", "scopegate", "health"]);
    let dockerfile = read("Dockerfile");
    let healthcheck = dockerfile.lines().find(|l| l.starts_with("HEALTHCHECK ")).expect("the image has a healthcheck");
    assert!(healthcheck.ends_with(r#"CMD ["scopegate", "health"]"#), "{healthcheck}");
    // Dependencies are cached between builds, and nothing but crates is fetched in the build.
    assert!(dockerfile.contains("--mount=type=cache,target=/src/target"), "the target directory is cached");
    assert!(dockerfile.contains("--mount=type=cache,target=/usr/local/cargo/registry"), "crates are cached");
    assert!(!dockerfile.contains("COPY rust-toolchain.toml") && !dockerfile.contains(" rust-toolchain.toml ./"));

    // Metrics on their own port, published nowhere.
    let metrics = env.get("SCOPEGATE_METRICS__LISTEN").and_then(|v| v.as_str()).expect("metrics.listen is set");
    let metrics_port = metrics.rsplit(':').next().unwrap();
    let ports: Vec<&str> = gateway["ports"].as_sequence().unwrap().iter().filter_map(|p| p.as_str()).collect();
    assert!(ports.iter().all(|p| !p.ends_with(&format!(":{metrics_port}"))), "{ports:?}");
}

/// Every variable the file reads is in .env.example, with the file's own default; the
/// database password has none and stops the file; the defaults make a configuration that
/// loads (with a password and a token source, what an operator must add), and where a default
/// stands for a shipped setting, it is that setting.
#[test]
fn compose_variables_are_documented_and_load() {
    let text = read("docker-compose.yml");
    let variables = interpolated(&text);
    let example = env_example();
    for (name, (default, required)) in &variables {
        let documented = example.get(name).unwrap_or_else(|| panic!("{name} is not in .env.example"));
        if let Some(default) = default
            && !documented.is_empty()
        {
            assert_eq!(documented, default, "{name}: .env.example and the file agree on its default");
        }
        assert!(!required || name == "POSTGRES_PASSWORD", "only the password is required: {name}");
    }
    assert_eq!(variables["POSTGRES_PASSWORD"], (None, true), "the password has no default: it is required");
    let unused: Vec<&String> = example.keys().filter(|k| !variables.contains_key(*k)).collect();
    assert!(unused.is_empty(), ".env.example names variables the file does not read: {unused:?}");

    // The gateway's environment with every default (and a password, a development secret).
    let doc = compose();
    let env = doc["services"]["gateway"]["environment"].as_mapping().unwrap();
    let mut figment = scopegate::config::Config::figment(None);
    let mut shipped = Vec::new();
    for (name, value) in env {
        let (name, value) = (name.as_str().unwrap(), value.as_str().unwrap_or_default());
        let key = name.strip_prefix("SCOPEGATE_").unwrap().to_lowercase().replace("__", ".");
        let mut value = value.to_owned();
        for (var, (default, _)) in &variables {
            let written = text_of_variable(&text, var);
            let replacement = match (var.as_str(), default) {
                ("POSTGRES_PASSWORD", _) => "secret".to_owned(),
                ("SCOPEGATE_HS256_SECRET", _) => "a-private-development-secret-of-32-bytes-or-more".to_owned(),
                (_, Some(default)) => default.clone(),
                (_, None) => String::new(),
            };
            value = value.replace(&written, &replacement);
        }
        let parsed: figment::value::Value = value.parse().unwrap();
        figment = figment.merge(figment::providers::Serialized::default(&key, parsed.clone()));
        shipped.push((key, parsed));
    }
    let config = scopegate::config::Config::from_figment(figment).expect("the file's defaults make a configuration");
    let shipped_defaults = serde_json::to_value(crate::support::config_with("sqlite://unused.db", &[])).unwrap();
    for key in [
        "auth.tenant_claim",
        "auth.tenant_match",
        "auth.subject_claim",
        "auth.scopes_supported",
        "auth.required_scopes",
        "auth.authorization_servers",
        "limits.replicas",
    ] {
        let (section, field) = key.split_once('.').unwrap();
        let loaded = &serde_json::to_value(&config).unwrap()[section][field];
        assert_eq!(loaded, &shipped_defaults[section][field], "{key}: the file's default is the shipped one");
    }
    assert!(shipped.iter().any(|(k, _)| k == "admin.platform_subjects"));
}

/// The whole `${...}` the file writes for `var` (the first one).
fn text_of_variable(text: &str, var: &str) -> String {
    let at = text.find(&format!("${{{var}")).unwrap();
    let end = text[at..].find('}').unwrap();
    text[at..=at + end].to_owned()
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
    let copies = replica["deploy"]["replicas"].as_str().expect("deploy.replicas");
    let copies: u64 = copies
        .strip_prefix("${SCOPEGATE_EXTRA_REPLICAS:-")
        .and_then(|c| c.strip_suffix('}'))
        .expect("the replicas' count is a variable")
        .parse()
        .unwrap();
    assert!(copies >= 1);
    let env = gateway["environment"].as_mapping().unwrap();
    assert!(env.contains_key("SCOPEGATE_LIMITS__REPLICAS"), "the rate limits' share is configurable");

    assert!(haproxy["image"].as_str().is_some_and(|i| i.starts_with("haproxy:")));
    for service in ["gateway", "replica"] {
        let condition = haproxy["depends_on"][service]["condition"].as_str();
        assert_eq!(condition, Some("service_healthy"), "HAProxy waits for the {service}s to be ready");
    }
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
        templates
            .iter()
            .any(|w| w[2].parse::<u64>().is_ok_and(|slots| slots >= copies) && w[3] == format!("replica:{port}")),
        "a slot for every replica: {templates:?}"
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
