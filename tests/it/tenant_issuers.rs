//! The identity providers a tenant trusts, through the admin API on both databases: an owner
//! or a platform administrator trusts and distrusts one, each act one audit event of the
//! tenant's chain; auditors read them, workers and other tenants' owners get nothing; bad
//! input (an issuer that is not public https, a key set URL with a query, an empty subject
//! claim, the gateway's own issuer) is refused naming the field with nothing written.

use reqwest::Method;
use serde_json::{Value, json};

use crate::admin_api::{PLATFORM, admin_events, chains_verify, delete, get, platform, send};
use crate::support::*;

/// The gateway's own issuer in these tests: an https URL, so that a tenant naming it would
/// pass every shape check. Its tokens are still the tests' HS256 ones (no discovery).
const OWN: &str = "https://id.gateway.example/";

async fn issuer_gateway(backend: Backend, insecure: bool) -> Live {
    TestGateway::new(backend)
        .set("admin.platform_subjects", json!([PLATFORM]))
        .set("auth.issuer", json!(OWN))
        .set("auth.discovery", json!(false))
        .set("auth.tenant_issuers_insecure", json!(insecure))
        .start()
        .await
}

const ACME: &str = "/admin/v1/tenants/acme/issuers";
const OKTA: &str = "https://acme.okta.example/oauth2/default";
/// OKTA's resource: the issuer percent-encoded as one path segment.
const OKTA_AT: &str = "/admin/v1/tenants/acme/issuers/https%3A%2F%2Facme.okta.example%2Foauth2%2Fdefault";

/// (action, actor) of the administrative events of a tenant's chain after the first `skip`.
async fn acts(live: &Live, tenant: &str, skip: usize) -> Vec<(String, String)> {
    admin_events(live, tenant).await.into_iter().skip(skip).map(|(action, _, actor)| (action, actor)).collect()
}

async fn lifecycle(backend: Backend) {
    let live = issuer_gateway(backend, false).await;
    let ops = platform(&live);
    let olivia = live.token_for("olivia@acme.test");
    let audrey = live.token_for("audrey@acme.test");
    let wanda = live.token_for("wanda@acme.test");
    let gary = live.token_for("gary@globex.test");
    let acme_events = admin_events(&live, "acme").await.len();
    let rows = "SELECT COUNT(*) FROM tenant_issuers";

    // The owner trusts one: 201, where it lives, the defaults filled in.
    let body = json!({"issuer": OKTA, "jwks_url": format!("{OKTA}/v1/keys"), "tenant_claim": "/org/slug"});
    let made = send(&live, Method::POST, ACME, &olivia, body).await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.header("location"), Some(OKTA_AT));
    let expected = json!({
        "issuer": OKTA,
        "jwks_url": format!("{OKTA}/v1/keys"),
        "audience": null,
        "subject_claim": "sub",
        "tenant_claim": "/org/slug",
        "console_client_id": null,
        "console_scopes": null,
        "console_signin": null,
        "created_at": made.body["created_at"],
    });
    assert_eq!(made.body, expected);
    assert!(made.body["created_at"].is_i64());
    let read = get(&live, OKTA_AT, &olivia).await;
    assert_eq!((read.status, &read.body, read.etag()), (200, &expected, made.etag()));
    let listed = get(&live, ACME, &olivia).await;
    assert_eq!((listed.status, &listed.body["items"]), (200, &json!([expected])), "{}", listed.body);
    assert_eq!(
        acts(&live, "acme", acme_events).await,
        [("admin.issuer.trust".into(), "tenant:acme:olivia@acme.test".into())]
    );

    // The auditor reads them; the worker and the other tenant's owner do not.
    for (token, want) in [(&audrey, 200), (&wanda, 403), (&gary, 404)] {
        assert_eq!(get(&live, ACME, token).await.status, want);
        assert_eq!(get(&live, OKTA_AT, token).await.status, want);
    }
    // Nor may they change them: nothing written, nothing audited.
    for (token, want) in [(&audrey, 403), (&wanda, 403), (&gary, 404)] {
        let other = json!({"issuer": "https://elsewhere.example/"});
        let refused = send(&live, Method::POST, ACME, token, other).await;
        assert_eq!(refused.status, want, "{}", refused.body);
        assert_eq!(delete(&live, OKTA_AT, token).await.status, want);
    }
    assert_eq!(live.count(rows).await, 1);
    assert_eq!(admin_events(&live, "acme").await.len(), acme_events + 1);

    // Trusted twice: a conflict. Distrusted: gone; distrusted again: not found.
    let twice = send(&live, Method::POST, ACME, &olivia, json!({"issuer": OKTA})).await;
    assert_eq!(twice.status, 409, "{}", twice.body);
    assert_eq!(delete(&live, OKTA_AT, &olivia).await.status, 204);
    assert_eq!(get(&live, OKTA_AT, &olivia).await.status, 404);
    assert_eq!(delete(&live, OKTA_AT, &olivia).await.status, 404);
    assert_eq!(get(&live, ACME, &audrey).await.body["items"], json!([]));
    let olivias = "tenant:acme:olivia@acme.test".to_owned();
    assert_eq!(
        acts(&live, "acme", acme_events).await,
        [("admin.issuer.trust".into(), olivias.clone()), ("admin.issuer.distrust".into(), olivias)],
        "one event per change, none for a refusal"
    );

    // A platform administrator may too: each act in acme's chain and in the platform chain.
    let acme_events = admin_events(&live, "acme").await.len();
    let platform_events = admin_events(&live, "@platform").await.len();
    let made = send(&live, Method::POST, ACME, &ops, json!({"issuer": OKTA})).await;
    assert_eq!((made.status, &made.body["subject_claim"], &made.body["jwks_url"]), (201, &json!("sub"), &Value::Null));
    assert_eq!(delete(&live, OKTA_AT, &ops).await.status, 204);
    let by_ops = format!("platform:{PLATFORM}");
    let both = [("admin.issuer.trust".to_owned(), by_ops.clone()), ("admin.issuer.distrust".to_owned(), by_ops)];
    assert_eq!(acts(&live, "acme", acme_events).await, both);
    assert_eq!(acts(&live, "@platform", platform_events).await, both);

    // No such tenant, and the platform chain, which is no tenant: not found.
    for path in ["/admin/v1/tenants/nowhere/issuers", "/admin/v1/tenants/@platform/issuers"] {
        assert_eq!(send(&live, Method::POST, path, &ops, json!({"issuer": OKTA})).await.status, 404, "{path}");
    }

    // A retired tenant changes no more: neither trusts nor distrusts.
    let globex = "/admin/v1/tenants/globex/issuers";
    let mine = send(&live, Method::POST, globex, &gary, json!({"issuer": "https://globex.example/"})).await;
    assert_eq!(mine.status, 201, "{}", mine.body);
    let globex_at = mine.header("location").unwrap().to_owned();
    assert_eq!(delete(&live, "/admin/v1/tenants/globex", &ops).await.status, 200);
    let globex_events = admin_events(&live, "globex").await.len();
    let late = send(&live, Method::POST, globex, &ops, json!({"issuer": "https://late.example/"})).await;
    assert_eq!(late.status, 409, "{}", late.body);
    assert_eq!(delete(&live, &globex_at, &ops).await.status, 409);
    assert_eq!(live.count(rows).await, 1, "globex's trust stays as it was");
    assert_eq!(admin_events(&live, "globex").await.len(), globex_events);
    chains_verify(&live).await;
}
both_dbs!(owners_and_platform_administrators_trust_and_distrust, lifecycle);

/// What a refused request must leave as it was.
async fn snapshot(live: &Live) -> [i64; 3] {
    let mut out = [0; 3];
    for (n, table) in ["tenant_issuers", "audit_events", "admin_idempotency"].iter().enumerate() {
        out[n] = live.count(&format!("SELECT COUNT(*) FROM {table}")).await;
    }
    out
}

async fn bad_input(backend: Backend) {
    let live = issuer_gateway(backend, false).await;
    let ops = platform(&live);
    let olivia = live.token_for("olivia@acme.test");
    let fine = "https://login.example.com/acme";
    let before = snapshot(&live).await;
    // (body, the field named)
    let cases: Vec<(Value, &str)> = vec![
        (json!({"issuer": "http://login.example.com/acme"}), "issuer"),
        (json!({"issuer": "https://10.1.2.3/acme"}), "issuer"),
        (json!({"issuer": "https://169.254.169.254/latest"}), "issuer"),
        (json!({"issuer": "https://[::1]/"}), "issuer"),
        (json!({"issuer": "https://localhost/"}), "issuer"),
        (json!({"issuer": "login.example.com"}), "issuer"),
        (json!({"issuer": fine, "jwks_url": "https://login.example.com/keys?tenant=acme"}), "jwks_url"),
        (json!({"issuer": fine, "jwks_url": "https://192.168.1.10/keys"}), "jwks_url"),
        (json!({"issuer": fine, "jwks_url": ""}), "jwks_url"),
        (json!({"issuer": fine, "subject_claim": ""}), "subject_claim"),
        (json!({"issuer": fine, "tenant_claim": "/"}), "tenant_claim"),
        (json!({"issuer": fine, "audience": ""}), "audience"),
        (json!({"issuer": fine, "scopes": ["openid"]}), "scopes"),
        (json!({"issuer": fine, "console_client_id": "two words"}), "console_client_id"),
        (json!({"issuer": fine, "console_client_id": ""}), "console_client_id"),
        (json!({"issuer": fine, "console_scopes": "openid"}), "console_scopes"),
        (json!({"issuer": fine, "console_client_id": "c", "console_scopes": "openid  email"}), "console_scopes"),
        (json!({"issuer": fine, "console_client_id": "c", "console_scopes": "open\"id"}), "console_scopes"),
        // The gateway's own issuer, as configured and without its trailing slash.
        (json!({"issuer": OWN}), "issuer"),
        (json!({"issuer": OWN.trim_end_matches('/')}), "issuer"),
    ];
    for (body, field) in &cases {
        for token in [&olivia, &ops] {
            let refused = send(&live, Method::POST, ACME, token, body.clone()).await;
            assert_eq!(
                (refused.status, refused.body["field"].as_str()),
                (422, Some(*field)),
                "{body}: {}",
                refused.body
            );
            assert_eq!(refused.header("content-type"), Some("application/problem+json"));
        }
    }
    assert_eq!(snapshot(&live).await, before, "no refused request left anything behind");
    // The same issuer well formed is admitted: each refusal above was for its field.
    let made = send(&live, Method::POST, ACME, &olivia, json!({"issuer": fine, "subject_claim": "/user/id"})).await;
    assert_eq!((made.status, &made.body["subject_claim"]), (201, &json!("/user/id")), "{}", made.body);
}
both_dbs!(bad_issuers_are_refused_naming_the_field, bad_input);

/// `auth.tenant_issuers_insecure` (tests and development) admits an issuer on a loopback host
/// over http; the gateway's own issuer and other schemes stay refused.
async fn insecure(backend: Backend) {
    let live = issuer_gateway(backend, true).await;
    let olivia = live.token_for("olivia@acme.test");
    let local = json!({"issuer": "http://127.0.0.1:8080/realms/acme", "jwks_url": "http://127.0.0.1:8080/certs"});
    let made = send(&live, Method::POST, ACME, &olivia, local).await;
    assert_eq!(made.status, 201, "{}", made.body);
    for issuer in [OWN, "ftp://127.0.0.1/"] {
        let refused = send(&live, Method::POST, ACME, &olivia, json!({"issuer": issuer})).await;
        assert_eq!((refused.status, refused.body["field"].as_str()), (422, Some("issuer")), "{issuer}");
    }
    assert_eq!(live.count("SELECT COUNT(*) FROM tenant_issuers").await, 1);
}
both_dbs!(insecure_issuers_only_when_configured, insecure);
