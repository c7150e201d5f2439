//! Configuration: layering (defaults, file, environment), and refusals that name the key. Unit
//! tests, not in the integration binary: figment::Jail changes the process's working directory
//! and environment while it runs, which the integration tests' gateways and child processes
//! would see.
// figment::Jail's closures return figment::Error, which is large; that is its API.
#![allow(clippy::result_large_err)]

use super::{Config, SHIPPED_DEV_SECRET};
use figment::Jail;

fn load_err(jail: &mut Jail, file: Option<(&str, &str)>) -> String {
    let path = file.map(|(name, text)| {
        jail.create_file(name, text).unwrap();
        jail.directory().join(name)
    });
    match Config::load(path.as_deref()) {
        Ok(_) => panic!("configuration should be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_then_file_then_environment() {
    Jail::expect_with(|jail| {
        jail.create_file("gw.toml", "[server]\nbody_limit_bytes = 1000\n[auth]\nleeway_secs = 5\n")?;
        jail.set_env("SCOPEGATE_AUTH__LEEWAY_SECS", "7");
        jail.set_env("SCOPEGATE_DATABASE__URL", "postgres://u@db:5432/sg");
        let config = Config::load(Some(&jail.directory().join("gw.toml"))).expect("loads");
        assert_eq!(config.server.body_limit_bytes, 1000, "the file overrides the defaults");
        assert_eq!(config.auth.leeway_secs, 7, "the environment overrides the file");
        assert_eq!(config.database.url.expose(), "postgres://u@db:5432/sg");
        assert_eq!(config.auth.tenant_claim, "tid", "untouched defaults stay");
        assert_eq!(config.telemetry.otlp_endpoint, "", "traces are off unless an endpoint is set");
        Ok(())
    });
}

#[test]
fn unknown_keys_and_wrong_types_name_the_key() {
    Jail::expect_with(|jail| {
        let err = load_err(jail, Some(("a.toml", "[server]\nlisten_addr = \"x\"\n")));
        assert!(err.contains("listen_addr"), "{err}");
        let err = load_err(jail, Some(("b.toml", "[server]\nbody_limit_bytes = \"lots\"\n")));
        assert!(err.contains("body_limit_bytes"), "{err}");
        let err = load_err(jail, Some(("c.toml", "[nonsense]\nx = 1\n")));
        assert!(err.contains("nonsense"), "{err}");
        let err = load_err(jail, Some(("d.toml", "[database]\nsqlite_synchronous = \"off\"\n")));
        assert!(err.contains("database.sqlite_synchronous") && err.contains("`normal`"), "{err}");
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("SCOPEGATE_AUTH__LEWAY_SECS", "5");
        let err = load_err(jail, None);
        assert!(err.contains("leway_secs"), "a misspelt variable is refused: {err}");
        Ok(())
    });
}

/// Which file is read: `--config`, else `SCOPEGATE_CONFIG` when not empty, else the system
/// file when it exists, else none. A named file is taken even when missing (it is refused then).
#[test]
fn the_configuration_file_is_chosen_in_order() {
    use std::ffi::OsStr;
    use std::path::{Path, PathBuf};

    use super::{SYSTEM_CONFIG_FILE, config_file};
    let system = Some(PathBuf::from(SYSTEM_CONFIG_FILE));
    let flag = Some(Path::new("flag.toml"));
    let env = Some(OsStr::new("env.toml"));
    let cases = [
        (flag, env, true, Some(PathBuf::from("flag.toml")), "the flag first"),
        (flag, None, false, Some(PathBuf::from("flag.toml")), "the flag even without a system file"),
        (None, env, true, Some(PathBuf::from("env.toml")), "then the variable"),
        (None, Some(OsStr::new("")), true, system.clone(), "an empty variable names nothing"),
        (None, Some(OsStr::new("")), false, None, "an empty variable, no system file"),
        (None, None, true, system, "then the system file, if it exists"),
        (None, None, false, None, "else none"),
    ];
    for (flag, env, exists, want, why) in cases {
        let asked = std::cell::Cell::new(false);
        let chosen = config_file(flag, env, |path| {
            asked.set(true);
            assert_eq!(path, Path::new(SYSTEM_CONFIG_FILE));
            exists
        });
        assert_eq!(chosen, want, "{why}");
        assert_eq!(
            asked.get(),
            flag.is_none() && env.is_none_or(OsStr::is_empty),
            "{why}: the system file is looked for last"
        );
    }
}

/// `SCOPEGATE_CONFIG` names the file; it is not a setting, so the environment's settings
/// (`SCOPEGATE_*`) neither refuse it as an unknown key nor read it as one.
#[test]
fn scopegate_config_is_not_a_setting() {
    Jail::expect_with(|jail| {
        jail.set_env("SCOPEGATE_CONFIG", "/nowhere/scopegate.toml");
        Config::load(None).expect("SCOPEGATE_CONFIG is no key of the configuration");
        Ok(())
    });
}

#[test]
fn a_missing_verification_key_stops_start_up() {
    Jail::expect_with(|jail| {
        jail.set_env("SCOPEGATE_AUTH__HS256_SECRET", "");
        let err = load_err(jail, None);
        assert!(err.contains("auth.hs256_secret") && err.contains("jwks"), "{err}");
        jail.set_env("SCOPEGATE_AUTH__HS256_SECRET", "short");
        let err = load_err(jail, None);
        assert!(err.contains("auth.hs256_secret") && err.contains("32"), "{err}");
        Ok(())
    });
}

/// The shipped (public) development secret verifies tokens only on a gateway that nobody but its
/// operator reaches: loopback listen address, public URL and allowed hosts, and no JWKS. Each
/// way out (a reverse proxy in front of a loopback listener among them) stops start-up, and an
/// operator's own secret is taken in every case.
#[test]
fn the_shipped_dev_secret_is_refused_wherever_others_reach_the_gateway() {
    const IDP_NAMED: (&str, &str) = ("SCOPEGATE_AUTH__AUTHORIZATION_SERVERS", "[\"https://idp.example.com/\"]");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("SCOPEGATE_SERVER__LISTEN", "0.0.0.0:8080")], "server.listen"),
        (&[("SCOPEGATE_SERVER__LISTEN", "[::]:8080")], "server.listen"),
        (&[("SCOPEGATE_SERVER__PUBLIC_URL", "https://mcp.example.com")], "server.public_url"),
        (&[("SCOPEGATE_SERVER__PUBLIC_URL", "http://10.0.0.5:8080")], "server.public_url"),
        (&[("SCOPEGATE_SERVER__ALLOWED_HOSTS", "[\"localhost\", \"mcp.example.com\"]")], "server.allowed_hosts"),
        (&[("SCOPEGATE_SERVER__ALLOWED_HOSTS", "[]")], "server.allowed_hosts"),
        (&[("SCOPEGATE_AUTH__JWKS_URL", "https://idp.example.com/jwks.json"), IDP_NAMED], "jwks"),
        (&[("SCOPEGATE_AUTH__JWKS_FILE", "config/jwks.json"), IDP_NAMED], "jwks"),
        (&[("SCOPEGATE_AUTH__ISSUER", "https://idp.example.com/")], "discovered"),
    ];
    for (env, named) in cases {
        Jail::expect_with(|jail| {
            for (key, value) in *env {
                jail.set_env(key, value);
            }
            let err = load_err(jail, None);
            assert!(err.contains("auth.hs256_secret") && err.contains(named), "{env:?}: {err}");
            jail.set_env("SCOPEGATE_AUTH__HS256_SECRET", "a-private-secret-of-more-than-32-bytes!");
            Config::load(None).unwrap_or_else(|e| panic!("{env:?}: an operator's own secret is taken: {e}"));
            Ok(())
        });
    }
    // Loopback everywhere, in every spelling, keeps the shipped secret for development.
    Jail::expect_with(|jail| {
        jail.set_env("SCOPEGATE_SERVER__PUBLIC_URL", "http://localhost:8080");
        jail.set_env("SCOPEGATE_SERVER__ALLOWED_HOSTS", "[\"127.0.0.1:8080\", \"[::1]\", \"app.localhost\"]");
        Config::load(None).expect("a loopback-only gateway may use the shipped secret");
        Ok(())
    });
}

#[test]
fn other_refusals_name_their_key() {
    let cases = [
        ("SCOPEGATE_DATABASE__URL", "mysql://x", "database.url"),
        ("SCOPEGATE_SERVER__PUBLIC_URL", "https://mcp.example.com/", "server.public_url"),
        ("SCOPEGATE_AUTH__JWKS_URL", "ftp://idp/jwks", "auth.jwks_url"),
        ("SCOPEGATE_AUTH__ISSUER", "", "auth.issuer"),
        ("SCOPEGATE_DATABASE__MAX_CONNECTIONS", "0", "database.max_connections"),
        // Only `full` and `normal`: `off` would lose commits even when only the process dies.
        ("SCOPEGATE_DATABASE__SQLITE_SYNCHRONOUS", "off", "database.sqlite_synchronous"),
        ("SCOPEGATE_DATABASE__SQLITE_SYNCHRONOUS", "extra", "database.sqlite_synchronous"),
        ("SCOPEGATE_LIMITS__REPLICAS", "0", "limits.replicas"),
        // 400 tenant requests of burst over 500 replicas: under one each, every request refused.
        ("SCOPEGATE_LIMITS__REPLICAS", "500", "limits.tenant_burst"),
        // Traces: an endpoint that is no http(s) base URL, no service name, a ratio out of range.
        ("SCOPEGATE_TELEMETRY__OTLP_ENDPOINT", "localhost:4318", "telemetry.otlp_endpoint"),
        ("SCOPEGATE_TELEMETRY__OTLP_ENDPOINT", "grpc://localhost:4317", "telemetry.otlp_endpoint"),
        ("SCOPEGATE_TELEMETRY__OTLP_ENDPOINT", "http://", "telemetry.otlp_endpoint"),
        ("SCOPEGATE_TELEMETRY__SERVICE_NAME", " ", "telemetry.service_name"),
        ("SCOPEGATE_TELEMETRY__SAMPLE_RATIO", "1.5", "telemetry.sample_ratio"),
        ("SCOPEGATE_TELEMETRY__SAMPLE_RATIO", "-0.1", "telemetry.sample_ratio"),
    ];
    for (var, value, key) in cases {
        Jail::expect_with(|jail| {
            jail.set_env(var, value);
            // Keys read from the environment are reported in its upper case.
            let err = load_err(jail, None).to_lowercase();
            assert!(err.contains(key), "{var}={value}: {err}");
            Ok(())
        });
    }
}

#[test]
fn secrets_are_never_printed() {
    Jail::expect_with(|jail| {
        jail.set_env("SCOPEGATE_DATABASE__URL", "postgres://admin:hunter2@db/sg");
        let config = Config::load(None).unwrap();
        let debug = format!("{config:?}");
        let json = serde_json::to_string(&config).unwrap();
        for text in [&debug, &json] {
            assert!(!text.contains(SHIPPED_DEV_SECRET), "the HS256 secret leaked: {text}");
            assert!(!text.contains("hunter2"), "the database password leaked: {text}");
        }
        Ok(())
    });
}

/// The identity provider's settings are checked at start, each refusal naming its key: no
/// authorization server to tell clients of, a required scope nobody would ask for, a scope
/// that is not one, an empty claim path, a refetch floor of zero, an unknown tenant match.
#[test]
fn identity_provider_settings_are_checked() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("SCOPEGATE_AUTH__JWKS_URL", "https://idp.example.com/jwks.json")], "auth.authorization_servers"),
        (
            &[
                ("SCOPEGATE_AUTH__SCOPES_SUPPORTED", "[\"mcp:read\"]"),
                ("SCOPEGATE_AUTH__REQUIRED_SCOPES", "[\"mcp:write\"]"),
            ],
            "auth.required_scopes",
        ),
        (&[("SCOPEGATE_AUTH__SCOPES_SUPPORTED", "[\"mcp read\"]")], "auth.scopes_supported"),
        (&[("SCOPEGATE_AUTH__REQUIRED_SCOPES", "[\"a\\\"b\"]")], "auth.required_scopes"),
        (&[("SCOPEGATE_AUTH__TENANT_CLAIM", "/")], "auth.tenant_claim"),
        (&[("SCOPEGATE_AUTH__SUBJECT_CLAIM", "")], "auth.subject_claim"),
        (&[("SCOPEGATE_AUTH__JWKS_REFETCH_MIN_INTERVAL_SECS", "0")], "auth.jwks_refetch_min_interval_secs"),
        (&[("SCOPEGATE_AUTH__JWKS_REFETCH_PER_MINUTE", "0")], "auth.jwks_refetch_per_minute"),
        (&[("SCOPEGATE_AUTH__TENANT_MATCH", "name")], "TENANT_MATCH"),
        (&[("SCOPEGATE_AUTH__AUTHORIZATION_SERVERS", "[\"idp.example.com\"]")], "auth.authorization_servers"),
        (&[("SCOPEGATE_AUTH__RESOURCE_NAME", " ")], "auth.resource_name"),
    ];
    for (env, named) in cases {
        Jail::expect_with(|jail| {
            jail.set_env("SCOPEGATE_AUTH__HS256_SECRET", "a-private-secret-of-more-than-32-bytes!");
            for (key, value) in *env {
                jail.set_env(key, value);
            }
            let err = load_err(jail, None);
            assert!(err.contains(named), "{env:?}: {err}");
            Ok(())
        });
    }
    // The issuer's https URL alone: keys discovered, the issuer is the authorization server,
    // the required scopes are the supported ones.
    Jail::expect_with(|jail| {
        jail.set_env("SCOPEGATE_AUTH__HS256_SECRET", "");
        jail.set_env("SCOPEGATE_AUTH__ISSUER", "https://idp.example.com/");
        jail.set_env("SCOPEGATE_AUTH__REQUIRED_SCOPES", "[\"mcp\"]");
        jail.set_env("SCOPEGATE_SERVER__PUBLIC_URL", "https://mcp.example.com");
        let config = Config::load(None).expect("the issuer alone is enough");
        assert_eq!(config.authorization_servers(), ["https://idp.example.com/"]);
        assert_eq!(config.scopes_supported(), ["mcp"]);
        assert_eq!(config.challenge_scope().as_deref(), Some("mcp"));
        // Discovery switched off leaves no key: refused.
        jail.set_env("SCOPEGATE_AUTH__DISCOVERY", "false");
        let err = load_err(jail, None);
        assert!(err.contains("auth.hs256_secret") && err.contains("no token verification key"), "{err}");
        Ok(())
    });
}

/// `[console]`: sign-in through the identity provider needs a client id and an issuer that is
/// the provider's URL; a secret without a client id, and scopes that are none, are refused by
/// name. The scopes asked for are the console's and the gateway's, each once.
#[test]
fn console_sign_in_settings() {
    let cases = [
        ("[console]\noidc_client_secret = \"s3cret\"\n", "console.oidc_client_secret"),
        ("[console]\noidc_client_id = \"console\"\n", "console.oidc_client_id"),
        ("[console]\noidc_client_id = \" console\"\n", "console.oidc_client_id"),
        ("[console]\noidc_scopes = [\"openid\", \"two words\"]\n", "console.oidc_scopes"),
    ];
    for (text, key) in cases {
        Jail::expect_with(|jail| {
            let err = load_err(jail, Some(("c.toml", text)));
            assert!(err.contains(key), "{text}: {err}");
            Ok(())
        });
    }
    Jail::expect_with(|jail| {
        jail.create_file(
            "ok.toml",
            "[auth]\nissuer = \"https://idp.example.com\"\nhs256_secret = \"\"\n\
             scopes_supported = [\"mcp:read\", \"mcp:write\"]\nrequired_scopes = [\"mcp:read\"]\n\
             [console]\noidc_client_id = \"console\"\noidc_scopes = [\"openid\", \"mcp:read\"]\n",
        )?;
        let config = Config::load(Some(&jail.directory().join("ok.toml"))).expect("loads");
        assert_eq!(config.console_scopes(), ["openid", "mcp:read", "mcp:write"]);
        assert_eq!(format!("{:?}", config.console.oidc_client_secret), "\"\"");
        Ok(())
    });
}
