//! JWT negative cases through the whole router: each with its documented status, the
//! WWW-Authenticate challenge, and no handler reached. Positive cases for every algorithm.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::StatusCode;
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use crate::support::*;

struct Case {
    name: &'static str,
    token: Option<String>,
    status: StatusCode,
    /// `error="invalid_token"` expected in the challenge.
    invalid_token: bool,
}

fn unsigned(header: Value, claims: &Value) -> String {
    format!("{}.{}.", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()))
}

async fn run_cases(probe: &Probe, cases: Vec<Case>) {
    let metadata = format!("{}/.well-known/oauth-protected-resource", probe.gateway.state().config.public_url());
    for case in cases {
        let before = probe.reached();
        let (status, headers, _) = probe.call(case.token.as_deref()).await;
        assert_eq!(status, case.status, "{}: status", case.name);
        assert_eq!(probe.reached(), before, "{}: the handler must not be reached", case.name);
        if status == StatusCode::UNAUTHORIZED {
            let challenge = headers
                .get("www-authenticate")
                .unwrap_or_else(|| panic!("{}: WWW-Authenticate missing", case.name))
                .to_str()
                .unwrap();
            assert!(challenge.starts_with("Bearer "), "{}: {challenge}", case.name);
            assert!(challenge.contains(&format!("resource_metadata=\"{metadata}\"")), "{}: {challenge}", case.name);
            assert_eq!(challenge.contains("error=\"invalid_token\""), case.invalid_token, "{}: {challenge}", case.name);
        }
    }
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

fn without(mut claims: Value, key: &str) -> Value {
    claims.as_object_mut().unwrap().remove(key);
    claims
}

async fn jwt_negative_cases(backend: Backend) {
    let rsa = Signer::from_pem(Algorithm::RS256, "rsa.pem", "rsa-1");
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, jwks_json(&[&rsa])).unwrap();
    let prepared = TestGateway::new(backend)
        .set("auth.jwks_file", json!(jwks))
        .set("auth.authorization_servers", json!([IDP]))
        .prepare()
        .await;
    let (config, seed_db) = (prepared.config.clone(), &prepared.db);
    admin_tx!(seed_db, |tx| admin_fns::set_tenant_status(&mut tx, "globex", scopegate::model::TenantStatus::Suspended))
        .unwrap();
    admin_tx!(seed_db, |tx| admin_fns::set_user_status(
        &mut tx,
        "acme",
        "walt@acme.test",
        scopegate::model::UserStatus::Disabled
    ))
    .unwrap();
    let probe = prepared.probe().await;
    let dev = Signer::dev();
    let good = claims(&config, "acme", "olivia@acme.test");

    // Sanity: the good token passes with both keys, so every refusal below is the case's own.
    for signer in [&dev, &rsa] {
        let before = probe.reached();
        let (status, _, body) = probe.call(Some(&signer.sign(&good))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(probe.reached(), before + 1);
    }

    // HS256 signed with the RSA public key: the classic algorithm-confusion token.
    let public_pem = std::fs::read(key_path("rsa.pub.pem")).unwrap();
    let confusion = Signer {
        alg: Algorithm::HS256,
        kid: Some("rsa-1".into()),
        key: jsonwebtoken::EncodingKey::from_secret(&public_pem).unwrap(),
    };
    let other_rsa = Signer::from_pem(Algorithm::RS256, "rsa-other.pem", "rsa-1");
    let unknown_kid = Signer::from_pem(Algorithm::RS256, "rsa.pem", "no-such-kid");
    let wrong_secret = Signer::hs256("another-secret-that-is-long-enough-for-hs256");
    let bearer = |s: &Signer, c: &Value| Some(s.sign(c));
    let t = |n: i64| now() + n;

    let cases = vec![
        Case { name: "no token", token: None, status: StatusCode::UNAUTHORIZED, invalid_token: false },
        Case { name: "garbage", token: Some("garbage".into()), status: StatusCode::UNAUTHORIZED, invalid_token: true },
        Case {
            name: "three garbage segments",
            token: Some("a.b.c".into()),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "bad signature (other RSA key, same kid)",
            token: bearer(&other_rsa, &good),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "bad signature (wrong HS256 secret)",
            token: bearer(&wrong_secret, &good),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "expired",
            token: bearer(&dev, &with(good.clone(), "exp", json!(t(-3600)))),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "not yet valid",
            token: bearer(&dev, &with(good.clone(), "nbf", json!(t(3600)))),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "wrong iss",
            token: bearer(&dev, &with(good.clone(), "iss", json!("https://evil.example"))),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "missing iss",
            token: bearer(&dev, &without(good.clone(), "iss")),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "wrong aud",
            token: bearer(&dev, &with(good.clone(), "aud", json!("https://other.example/mcp"))),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "missing aud",
            token: bearer(&dev, &without(good.clone(), "aud")),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "missing exp",
            token: bearer(&dev, &without(good.clone(), "exp")),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "alg none",
            token: Some(unsigned(json!({"alg": "none", "typ": "JWT"}), &good)),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "alg none with the RSA kid",
            token: Some(unsigned(json!({"alg": "none", "kid": "rsa-1"}), &good)),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "HS256 signed with the RSA public key (algorithm confusion)",
            token: bearer(&confusion, &good),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "unknown kid",
            token: bearer(&unknown_kid, &good),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "missing tenant claim",
            token: bearer(&dev, &without(good.clone(), "tid")),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "empty tenant claim",
            token: bearer(&dev, &with(good.clone(), "tid", json!(""))),
            status: StatusCode::UNAUTHORIZED,
            invalid_token: true,
        },
        Case {
            name: "unknown tenant",
            token: bearer(&dev, &claims(&config, "initech", "olivia@acme.test")),
            status: StatusCode::FORBIDDEN,
            invalid_token: false,
        },
        Case {
            name: "suspended tenant",
            token: bearer(&dev, &claims(&config, "globex", "gary@globex.test")),
            status: StatusCode::FORBIDDEN,
            invalid_token: false,
        },
        Case {
            name: "unknown user",
            token: bearer(&dev, &claims(&config, "acme", "mallory@acme.test")),
            status: StatusCode::FORBIDDEN,
            invalid_token: false,
        },
        Case {
            name: "disabled user",
            token: bearer(&dev, &claims(&config, "acme", "walt@acme.test")),
            status: StatusCode::FORBIDDEN,
            invalid_token: false,
        },
        Case {
            name: "a user of another tenant",
            token: bearer(&rsa, &claims(&config, "acme", "gary@globex.test")),
            status: StatusCode::FORBIDDEN,
            invalid_token: false,
        },
    ];
    run_cases(&probe, cases).await;

    // The 403s all say the same thing: nothing tells which part failed.
    let (_, _, unknown_tenant) = probe.call(Some(&dev.sign(&claims(&config, "initech", "x@y")))).await;
    let (_, _, other_tenant) = probe.call(Some(&dev.sign(&claims(&config, "acme", "gary@globex.test")))).await;
    assert_eq!(unknown_tenant, other_tenant);
}
both_dbs!(jwt_and_identity_negative_cases, jwt_negative_cases);

/// With HS256 disabled (no development secret), HS256 tokens are refused outright,
/// including one made with the RSA public key as the HMAC secret.
/// The authorization server the tests' identity provider gateways name.
const IDP: &str = "https://idp.test";

#[tokio::test]
async fn without_a_dev_secret_hs256_is_refused() {
    let rsa = Signer::from_pem(Algorithm::RS256, "rsa.pem", "rsa-1");
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, jwks_json(&[&rsa])).unwrap();
    let prepared = TestGateway::new(Backend::Sqlite)
        .set("auth.jwks_file", json!(jwks))
        .set("auth.authorization_servers", json!([IDP]))
        .set("auth.hs256_secret", json!(""))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    let good = claims(&prepared.config, "acme", "olivia@acme.test");
    let public_pem = std::fs::read(key_path("rsa.pub.pem")).unwrap();
    let confusion = Signer {
        alg: Algorithm::HS256,
        kid: Some("rsa-1".into()),
        key: jsonwebtoken::EncodingKey::from_secret(&public_pem).unwrap(),
    };
    for (name, token) in [("dev secret", Signer::dev().sign(&good)), ("confusion", confusion.sign(&good))] {
        let (status, _, _) = probe.call(Some(&token)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{name}");
    }
    assert_eq!(probe.reached(), 0);
    let (status, _, _) = probe.call(Some(&rsa.sign(&good))).await;
    assert_eq!(status, StatusCode::OK);
}

/// RS256, ES256 and EdDSA keys from a JWKS file each verify their own tokens, and a key
/// never verifies a token whose header names another algorithm.
#[tokio::test]
async fn every_asymmetric_algorithm_verifies_from_a_jwks_file() {
    let rsa = Signer::from_pem(Algorithm::RS256, "rsa.pem", "rsa-1");
    let ec = Signer::from_pem(Algorithm::ES256, "ec.pem", "ec-1");
    let ed = Signer::from_pem(Algorithm::EdDSA, "ed25519.pem", "ed-1");
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, jwks_json(&[&rsa, &ec, &ed])).unwrap();
    let prepared = TestGateway::new(Backend::Sqlite)
        .set("auth.jwks_file", json!(jwks))
        .set("auth.authorization_servers", json!([IDP]))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    let good = claims(&prepared.config, "acme", "wanda@acme.test");
    for signer in [&rsa, &ec, &ed] {
        let (status, _, body) = probe.call(Some(&signer.sign(&good))).await;
        assert_eq!(status, StatusCode::OK, "{:?}: {body}", signer.alg);
        assert_eq!(body["user"], "wanda@acme.test");
    }
    // The EC key's kid on an RS256 token: the key decides the algorithm, so it is refused.
    let rs_with_ec_kid = Signer::from_pem(Algorithm::RS256, "rsa.pem", "ec-1");
    let (status, _, _) = probe.call(Some(&rs_with_ec_kid.sign(&good))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// A JWKS URL: fetched at start-up; a rotated-in key is accepted on its first use (one fetch
/// at once, no refusal window); misses that arrive together share one fetch; fetches provoked
/// by unknown `kid`s keep a floor between them and a budget per minute.
#[tokio::test]
async fn jwks_url_takes_a_rotation_at_once_and_bounds_refetches() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::RwLock;

    let old = Signer::from_pem(Algorithm::RS256, "rsa.pem", "old");
    let new = Signer::from_pem(Algorithm::ES256, "ec.pem", "new");
    let body = Arc::new(RwLock::new(jwks_json(&[&old])));
    let hits = Arc::new(AtomicUsize::new(0));
    let app = {
        let body = Arc::clone(&body);
        let hits = Arc::clone(&hits);
        axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let body = Arc::clone(&body);
                let hits = Arc::clone(&hits);
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    body.read().await.clone()
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let prepared = TestGateway::new(Backend::Sqlite)
        .set("auth.jwks_url", json!(url))
        .set("auth.authorization_servers", json!([IDP]))
        .set("auth.jwks_refetch_min_interval_secs", json!(1))
        .set("auth.jwks_refetch_per_minute", json!(3))
        .prepare()
        .await;
    let probe = prepared.probe().await;
    assert_eq!(hits.load(Ordering::SeqCst), 1, "fetched once at start-up");
    let good = claims(&prepared.config, "acme", "olivia@acme.test");

    let (status, _, _) = probe.call(Some(&old.sign(&good))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(hits.load(Ordering::SeqCst), 1, "a known kid needs no fetch");

    // The IdP rotates a new key in: its first token is accepted, after one fetch.
    *body.write().await = jwks_json(&[&old, &new]);
    let (status, _, _) = probe.call(Some(&new.sign(&good))).await;
    assert_eq!(status, StatusCode::OK, "a rotated-in key is accepted on first use");
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    // Eight tokens of a kid nobody published, at once: inside the floor they wait for its end,
    // then share one fetch, and are refused.
    let stranger = Signer::from_pem(Algorithm::RS256, "rsa-other.pem", "stranger");
    let token = stranger.sign(&good);
    let started = std::time::Instant::now();
    let answers = futures_util::future::join_all((0..8).map(|_| probe.call(Some(&token)))).await;
    assert!(answers.iter().all(|(status, _, _)| *status == StatusCode::UNAUTHORIZED));
    assert_eq!(hits.load(Ordering::SeqCst), 3, "one fetch for every miss that waited on it");
    assert!(started.elapsed() >= std::time::Duration::from_millis(900), "the floor holds between fetches");

    // The third fetch of the minute spends the budget; after it, a miss is refused at once.
    let (status, _, _) = probe.call(Some(&token)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(hits.load(Ordering::SeqCst), 4);
    let started = std::time::Instant::now();
    let (status, _, _) = probe.call(Some(&token)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(hits.load(Ordering::SeqCst), 4, "no fetch beyond the minute's budget");
    assert!(started.elapsed() < std::time::Duration::from_millis(500), "refused at once, not held");
    // Known keys still verify.
    let (status, _, _) = probe.call(Some(&new.sign(&good))).await;
    assert_eq!(status, StatusCode::OK);
}

/// A malformed Authorization header gets the challenge too, and a non-Bearer scheme is
/// treated as no token.
#[tokio::test]
async fn authorization_header_shapes() {
    let prepared = TestGateway::new(Backend::Sqlite).prepare().await;
    let probe = prepared.probe().await;
    let token = Signer::dev().sign(&claims(&prepared.config, "acme", "olivia@acme.test"));
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    for (value, invalid) in
        [(format!("Basic {token}"), false), ("Bearer".to_string(), true), ("Bearer    ".to_string(), true)]
    {
        let (status, headers, _) = probe.request(None, body.clone(), &[("authorization", &value)]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{value}");
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert_eq!(challenge.contains("invalid_token"), invalid, "{value}: {challenge}");
    }
    let lower = format!("bearer {token}");
    let (status, _, _) = probe.request(None, body, &[("authorization", &lower)]).await;
    assert_eq!(status, StatusCode::OK, "the scheme is case-insensitive");
    assert_eq!(probe.reached(), 1);
}
