//! The admin API (`/admin/v1/`), on both databases: every resource's life, the authorization
//! matrix, idempotent creation under concurrent retries, an audit event for every write in
//! the same transaction, bad input leaving nothing behind, and the OpenAPI description
//! matching the routes.

use reqwest::Method;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::support::*;

pub(crate) const PLATFORM: &str = "ops@platform.test";

async fn admin_gateway(backend: Backend) -> Live {
    TestGateway::new(backend).set("admin.platform_subjects", json!([PLATFORM])).start().await
}

/// The answer of one admin request: status, headers, JSON body (Null when empty).
pub(crate) struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn etag(&self) -> String {
        self.header("etag").expect("an ETag").to_owned()
    }
}

pub(crate) async fn request(
    live: &Live,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Answer {
    let url = if path.starts_with("http") { path.to_owned() } else { format!("{}{path}", live.base_url()) };
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(body);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = req.send().await.expect("admin request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) };
    Answer { status, headers, body }
}

/// A platform administrator's token (no tenant claim).
pub(crate) fn platform(live: &Live) -> String {
    let mut claims = claims(&live.config, "", PLATFORM);
    claims.as_object_mut().unwrap().remove("tid");
    Signer::hs256(live.config.auth.hs256_secret.expose()).sign(&claims)
}

pub(crate) async fn get(live: &Live, path: &str, token: &str) -> Answer {
    request(live, Method::GET, path, Some(token), None, &[]).await
}

pub(crate) async fn send(live: &Live, method: Method, path: &str, token: &str, body: Value) -> Answer {
    request(live, method, path, Some(token), Some(&body), &[]).await
}

pub(crate) async fn delete(live: &Live, path: &str, token: &str) -> Answer {
    request(live, Method::DELETE, path, Some(token), None, &[]).await
}

/// The administrative events of a tenant's chain, oldest first: (action, target, actor).
pub(crate) async fn admin_events(live: &Live, tenant: &str) -> Vec<(String, String, String)> {
    let mut tx = live.db.begin().await.unwrap();
    let rows: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT e.action, e.tool, e.args_raw FROM audit_events e JOIN tenants t ON t.id = e.tenant_id \
          WHERE t.slug = $1 AND e.action LIKE 'admin.%' ORDER BY e.seq",
    )
    .bind(tenant)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(action, tool, raw)| {
            let raw: Value = serde_json::from_str(&raw.unwrap()).unwrap();
            (action, tool.unwrap(), raw["actor"].as_str().unwrap().to_owned())
        })
        .collect()
}

pub(crate) async fn chains_verify(live: &Live) {
    for report in scopegate::audit::verify::verify(&live.db, None).await.unwrap() {
        assert!(report.broken.is_none(), "{}: {:?}", report.tenant, report.broken);
    }
}

async fn every_resource(backend: Backend) {
    let live = admin_gateway(backend).await;
    let ops = platform(&live);
    let p = "/admin/v1";

    // A tenant, made by the platform administrator.
    let created =
        send(&live, Method::POST, &format!("{p}/tenants"), &ops, json!({"slug": "initech", "name": "Initech"})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.header("location"), Some("/admin/v1/tenants/initech"));
    assert_eq!(created.body["status"], "active");
    let tag = created.etag();
    let read = get(&live, "/admin/v1/tenants/initech", &ops).await;
    assert_eq!((read.status, read.etag()), (200, tag.clone()));
    // Its first owner, then the owner's own token does the rest.
    let owner = send(
        &live,
        Method::POST,
        &format!("{p}/tenants/initech/users"),
        &ops,
        json!({"subject": "peter@initech.test", "display_name": "Peter", "roles": ["owner"]}),
    )
    .await;
    assert_eq!(owner.status, 201, "{}", owner.body);
    let peter = live.token("initech", "peter@initech.test");
    let t = format!("{p}/tenants/initech");

    // Users: create, read, page, update under If-Match, roles, delete.
    for n in 0..5 {
        let made = send(
            &live,
            Method::POST,
            &format!("{t}/users"),
            &peter,
            json!({"subject": format!("u{n}@initech.test"), "display_name": format!("U {n}"), "roles": ["worker"]}),
        )
        .await;
        assert_eq!(made.status, 201, "{}", made.body);
    }
    let mut seen = Vec::new();
    let mut next = Some(format!("{t}/users?limit=2"));
    while let Some(url) = next.take() {
        let page = get(&live, &url, &peter).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let items = page.body["items"].as_array().unwrap();
        assert!(items.len() <= 2);
        seen.extend(items.iter().map(|u| u["subject"].as_str().unwrap().to_owned()));
        if let Some(link) = page.header("link") {
            let target = link.trim_start_matches('<').split('>').next().unwrap();
            next = Some(target.to_owned());
        }
    }
    let mut expected: Vec<String> = (0..5).map(|n| format!("u{n}@initech.test")).collect();
    expected.insert(0, "peter@initech.test".into());
    assert_eq!(seen, expected, "every user once, in order");

    let u0 = format!("{t}/users/u0@initech.test");
    let before = get(&live, &u0, &peter).await;
    assert_eq!(before.body["roles"], json!(["worker"]));
    let stale = "\"0000\"";
    let refused =
        request(&live, Method::PATCH, &u0, Some(&peter), Some(&json!({"status": "disabled"})), &[("if-match", stale)])
            .await;
    assert_eq!(refused.status, 412, "{}", refused.body);
    assert_eq!(get(&live, &u0, &peter).await.body["status"], "active", "a refused update changed nothing");
    let patched = request(
        &live,
        Method::PATCH,
        &u0,
        Some(&peter),
        Some(&json!({"status": "disabled", "roles": ["auditor", "worker"]})),
        &[("if-match", &before.etag())],
    )
    .await;
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(patched.body["status"], "disabled");
    assert_eq!(patched.body["roles"], json!(["worker", "auditor"]));
    assert_ne!(patched.etag(), before.etag());
    let role = request(&live, Method::PUT, &format!("{u0}/roles/manager"), Some(&peter), None, &[]).await;
    assert_eq!(role.status, 200, "{}", role.body);
    assert_eq!(role.body["roles"], json!(["manager", "worker", "auditor"]));
    assert_eq!(delete(&live, &format!("{u0}/roles/manager"), &peter).await.status, 200);
    assert_eq!(delete(&live, &u0, &peter).await.status, 204);
    assert_eq!(get(&live, &u0, &peter).await.status, 404);

    // Flocks and assignments.
    let flock = send(
        &live,
        Method::POST,
        &format!("{t}/flocks"),
        &peter,
        json!({"name": "east", "breed": "Silkie", "hen_count": 12}),
    )
    .await;
    assert_eq!(flock.status, 201, "{}", flock.body);
    assert_eq!(get(&live, &format!("{t}/flocks/east"), &peter).await.body["hen_count"], 12);
    let assigned = send(
        &live,
        Method::POST,
        &format!("{t}/assignments"),
        &peter,
        json!({"subject": "u1@initech.test", "flock": "east"}),
    )
    .await;
    assert_eq!(assigned.status, 201, "{}", assigned.body);
    assert_eq!(
        get(&live, &format!("{t}/assignments"), &peter).await.body["items"],
        json!([{"subject": "u1@initech.test", "flock": "east"}])
    );
    assert_eq!(delete(&live, &format!("{t}/assignments/u1@initech.test/east"), &peter).await.status, 204);
    assert_eq!(delete(&live, &format!("{t}/flocks/east"), &peter).await.status, 204);

    // Executors (platform), with a remote one's secret shown once and rotated.
    let local = send(
        &live,
        Method::POST,
        &format!("{p}/executors"),
        &ops,
        json!({"name": "box", "machine": "m1", "run_as": "svc"}),
    )
    .await;
    assert_eq!(local.status, 201, "{}", local.body);
    assert!(local.body.get("secret").is_none());
    let remote = send(
        &live,
        Method::POST,
        &format!("{p}/executors"),
        &ops,
        json!({"name": "far", "machine": "m2", "run_as": "svc", "kind": "remote", "owners": ["initech"]}),
    )
    .await;
    assert_eq!(remote.status, 201, "{}", remote.body);
    let secret = remote.body["secret"].as_str().unwrap().to_owned();
    assert!(secret.len() > 20);
    assert!(get(&live, &format!("{p}/executors/far"), &ops).await.body.get("secret").is_none());
    let rotated = request(&live, Method::POST, &format!("{p}/executors/far/secret"), Some(&ops), None, &[]).await;
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    assert_ne!(rotated.body["secret"].as_str().unwrap(), secret);
    let owned = request(&live, Method::PUT, &format!("{p}/executors/far/owners/acme"), Some(&ops), None, &[]).await;
    assert_eq!(owned.body["owners"], json!(["acme", "initech"]));
    assert_eq!(delete(&live, &format!("{p}/executors/far/owners/acme"), &ops).await.body["owners"], json!(["initech"]));
    let listed = get(&live, &format!("{p}/executors"), &ops).await;
    let names: Vec<&str> =
        listed.body["items"].as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"box") && names.contains(&"far"), "{names:?}");

    // Server declarations (platform), one by one and imported.
    let entity = send(
        &live,
        Method::POST,
        &format!("{t}/entities"),
        &ops,
        json!({"name": "defaults/mcp-servers/notes", "declaration": {"command": "notes-server", "args": ["--stdio"]}}),
    )
    .await;
    assert_eq!(entity.status, 201, "{}", entity.body);
    assert_eq!(entity.header("location"), Some("/admin/v1/tenants/initech/entities/defaults%2Fmcp-servers%2Fnotes"));
    let fetched = get(&live, entity.header("location").unwrap(), &ops).await;
    assert_eq!((fetched.status, fetched.body["server"].clone()), (200, json!("notes")));
    let imported = send(
        &live,
        Method::POST,
        &format!("{t}/entities/import"),
        &ops,
        json!({"under": "users/svc", "file": {"mcpServers": {"wiki": {"url": "https://wiki.example/mcp"}, "broken": {"command": 7}}}}),
    )
    .await;
    assert_eq!(imported.status, 200, "{}", imported.body);
    assert_eq!(imported.body["imported"], json!(["users/svc/mcp-servers/wiki"]));
    assert_eq!(imported.body["skipped"].as_array().unwrap().len(), 1);
    assert_eq!(get(&live, &format!("{t}/entities"), &ops).await.body["items"].as_array().unwrap().len(), 2);

    // Bindings, grants and root allowances (the owner).
    let bound = send(&live, Method::PUT, &format!("{t}/bindings/notes"), &peter, json!({"executor": "box"})).await;
    assert_eq!(bound.status, 201, "{}", bound.body);
    assert_eq!(bound.body, json!({"server": "notes", "executor": "box", "prefixed": true, "pin": "trust_first_use"}));
    let rebound = request(
        &live,
        Method::PUT,
        &format!("{t}/bindings/notes"),
        Some(&peter),
        Some(&json!({"executor": "far", "prefixed": false, "pin": "approve"})),
        &[("if-match", &bound.etag())],
    )
    .await;
    assert_eq!(rebound.status, 200, "{}", rebound.body);
    assert_eq!(rebound.body["pin"], "approve", "{}", rebound.body);
    let bad_pin = send(
        &live,
        Method::PUT,
        &format!("{t}/bindings/notes"),
        &peter,
        json!({"executor": "far", "pin": "sometimes"}),
    )
    .await;
    assert!(bad_pin.status == 400 || bad_pin.status == 422, "{} {}", bad_pin.status, bad_pin.body);
    let kept = get(&live, &format!("{t}/bindings/notes"), &peter).await;
    assert_eq!(
        (kept.body["pin"].as_str(), kept.body["prefixed"].as_bool()),
        (Some("approve"), Some(false)),
        "nothing changed"
    );
    let grant = send(
        &live,
        Method::POST,
        &format!("{t}/grants"),
        &peter,
        json!({"server": "notes", "role": "worker", "name": "read"}),
    )
    .await;
    assert_eq!(grant.status, 201, "{}", grant.body);
    assert_eq!(grant.body["kind"], "tool");
    let grant_url = grant.header("location").unwrap().to_owned();
    assert_eq!(get(&live, &grant_url, &peter).await.body, grant.body);
    assert_eq!(get(&live, &format!("{t}/grants"), &peter).await.body["items"].as_array().unwrap().len(), 1);
    let allowed = send(
        &live,
        Method::POST,
        &format!("{t}/root-allowances"),
        &peter,
        json!({"executor": "far", "base": "file:///srv/plugins", "role": "worker"}),
    )
    .await;
    assert_eq!(allowed.status, 201, "{}", allowed.body);
    let allowance = allowed.header("location").unwrap().to_owned();
    assert_eq!(get(&live, &allowance, &peter).await.body["base"], "file:///srv/plugins");
    assert_eq!(
        get(&live, &format!("{t}/root-allowances?executor=far"), &peter).await.body["items"].as_array().unwrap().len(),
        1
    );
    assert_eq!(delete(&live, &allowance, &peter).await.status, 204);
    assert_eq!(delete(&live, &grant_url, &peter).await.status, 204);
    assert_eq!(delete(&live, &format!("{t}/bindings/notes"), &peter).await.status, 204);
    assert_eq!(delete(&live, &format!("{t}/entities/defaults%2Fmcp-servers%2Fnotes"), &ops).await.status, 204);
    assert_eq!(delete(&live, &format!("{p}/executors/box"), &ops).await.status, 204);

    // A tenant: suspended under If-Match, then its audit trail of administrative events.
    let current = get(&live, &t, &ops).await;
    let suspended = request(
        &live,
        Method::PATCH,
        &t,
        Some(&ops),
        Some(&json!({"status": "suspended"})),
        &[("if-match", &current.etag())],
    )
    .await;
    assert_eq!((suspended.status, suspended.body["status"].clone()), (200, json!("suspended")));

    // Every write left exactly one event in initech's chain (the executor writes named it as
    // an owner), each naming who made it; acme's chain holds the ownership it was given and
    // taken.
    let events = admin_events(&live, "initech").await;
    let actions: Vec<&str> = events.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "admin.tenant.create",
            "admin.user.create",
            "admin.user.create",
            "admin.user.create",
            "admin.user.create",
            "admin.user.create",
            "admin.user.create",
            "admin.user.update",
            "admin.role.add",
            "admin.role.remove",
            "admin.user.delete",
            "admin.flock.create",
            "admin.assignment.create",
            "admin.assignment.delete",
            "admin.flock.delete",
            "admin.executor.create",
            "admin.executor.rotate_secret",
            "admin.executor.owner_add",
            "admin.executor.owner_remove",
            "admin.entity.create",
            "admin.entity.import",
            "admin.binding.set",
            "admin.binding.set",
            "admin.grant.create",
            "admin.root_allowance.create",
            "admin.root_allowance.delete",
            "admin.grant.delete",
            "admin.binding.delete",
            "admin.entity.delete",
            "admin.tenant.update",
        ]
    );
    assert_eq!(events[0], ("admin.tenant.create".into(), "tenants/initech".into(), format!("platform:{PLATFORM}")));
    assert_eq!(events[7].2, "tenant:initech:peter@initech.test");
    let acme: Vec<String> = admin_events(&live, "acme").await.into_iter().map(|(a, _, _)| a).collect();
    assert_eq!(acme, ["admin.executor.owner_add", "admin.executor.owner_remove"]);
    chains_verify(&live).await;

    retire_and_purge(&live, &ops, &peter, events.len()).await;
}
both_dbs!(every_resource_lives_and_is_audited, every_resource);

/// A tenant is retired, never erased: DELETE keeps its chain (and its data until a purge, which
/// keeps the chain too); both acts are events of its chain and of the platform chain, which
/// also records the platform administrators' acts that touch no tenant. Only platform
/// administrators read the platform chain, and nothing else can name it.
async fn retire_and_purge(live: &Live, ops: &str, peter: &str, events: usize) {
    let t = "/admin/v1/tenants/initech";
    let initech_users = "SELECT COUNT(*) FROM users u JOIN tenants t ON t.id = u.tenant_id WHERE t.slug = 'initech'";
    let users = live.count(initech_users).await;
    assert!(users > 0);
    let olivia = live.token_for("olivia@acme.test");
    // An owner can't retire a tenant, not even its own; a tenant that is not retired can't be
    // purged.
    assert_eq!(delete(live, "/admin/v1/tenants/acme", &olivia).await.status, 403);
    assert_eq!(send(live, Method::POST, "/admin/v1/tenants/acme/purge", ops, json!({})).await.status, 409);

    let retired = delete(live, t, ops).await;
    assert_eq!((retired.status, retired.body["status"].clone()), (200, json!("retired")), "{}", retired.body);
    assert!(retired.body["retired_at"].is_i64(), "{}", retired.body);
    assert_eq!(live.count(initech_users).await, users, "retiring keeps the tenant's data");
    // Its users' tokens stop working, and nothing of it changes any more.
    assert_eq!(get(live, &format!("{t}/users"), peter).await.status, 403);
    for (method, path, body) in [
        (Method::PATCH, t.to_owned(), json!({"status": "active"})),
        (
            Method::POST,
            format!("{t}/users"),
            json!({"subject": "z@initech.test", "display_name": "Z", "roles": ["worker"]}),
        ),
        (Method::DELETE, t.to_owned(), Value::Null),
        (
            Method::POST,
            "/admin/v1/executors".to_owned(),
            json!({"name": "late", "machine": "m", "run_as": "u", "kind": "remote", "owners": ["initech"]}),
        ),
    ] {
        let refused = request(live, method.clone(), &path, Some(ops), Some(&body), &[]).await;
        assert_eq!(refused.status, 409, "{method} {path}: {}", refused.body);
    }
    // Its slug stays its own.
    let again =
        send(live, Method::POST, "/admin/v1/tenants", ops, json!({"slug": "initech", "name": "Initech 2"})).await;
    assert_eq!(again.status, 409, "{}", again.body);
    // Its trail still reads and verifies, retirement included.
    let verified = get(live, &format!("{t}/audit/verification"), ops).await;
    assert_eq!((verified.body["verified"].clone(), verified.body["events"].clone()), (json!(true), json!(events + 1)));

    let purged = send(live, Method::POST, &format!("{t}/purge"), ops, json!({})).await;
    assert_eq!((purged.status, purged.body["status"].clone()), (200, json!("retired")), "{}", purged.body);
    assert_eq!(live.count(initech_users).await, 0, "the purge removed the tenant's users");
    let actions: Vec<String> = admin_events(live, "initech").await.into_iter().map(|(a, _, _)| a).collect();
    assert_eq!(actions.len(), events + 2, "the chain stays whole: {actions:?}");
    assert_eq!(actions[events..], ["admin.tenant.retire", "admin.tenant.purge"]);
    chains_verify(live).await;
    let export = request(live, Method::GET, &format!("{t}/audit/export"), Some(ops), None, &[]).await;
    assert_eq!(export.status, 200);

    // The platform chain: every platform administrator's act, those that touch no tenant too.
    let platform: Vec<String> = admin_events(live, "@platform").await.into_iter().map(|(a, _, _)| a).collect();
    for action in [
        "admin.tenant.create",
        "admin.executor.create",
        "admin.executor.delete",
        "admin.tenant.retire",
        "admin.tenant.purge",
    ] {
        assert!(platform.iter().any(|a| a == action), "{action} is not in the platform chain: {platform:?}");
    }
    let chain = "/admin/v1/tenants/@platform";
    let read = get(live, &format!("{chain}/audit/events?limit=500"), ops).await;
    assert_eq!(
        (read.status, read.body["items"].as_array().map(Vec::len)),
        (200, Some(platform.len())),
        "{}",
        read.body
    );
    assert_eq!(get(live, &format!("{chain}/audit/verification"), ops).await.body["verified"], true);
    // Nobody else reads it, and it is no tenant: not listed, not readable, not changeable.
    for token in [olivia.as_str(), &live.token_for("audrey@acme.test")] {
        assert_eq!(get(live, &format!("{chain}/audit/events"), token).await.status, 404);
    }
    assert_eq!(get(live, chain, ops).await.status, 404);
    assert_eq!(send(live, Method::PATCH, chain, ops, json!({"name": "Mine"})).await.status, 404);
    assert_eq!(delete(live, chain, ops).await.status, 404);
    let tenants = get(live, "/admin/v1/tenants?limit=500", ops).await;
    let slugs: Vec<&str> =
        tenants.body["items"].as_array().unwrap().iter().filter_map(|t| t["slug"].as_str()).collect();
    assert!(!slugs.contains(&"@platform") && slugs.contains(&"initech"), "{slugs:?}");
}

/// An event's before and after digests are the ETags a client saw.
async fn digests_are_the_etags(backend: Backend) {
    let live = admin_gateway(backend).await;
    let olivia = live.token_for("olivia@acme.test");
    let made = send(
        &live,
        Method::POST,
        "/admin/v1/tenants/acme/users",
        &olivia,
        json!({"subject": "dora@acme.test", "display_name": "Dora", "roles": ["worker"]}),
    )
    .await;
    let changed = send(
        &live,
        Method::PATCH,
        "/admin/v1/tenants/acme/users/dora@acme.test",
        &olivia,
        json!({"display_name": "Dora B"}),
    )
    .await;
    assert_eq!(changed.status, 200);
    let mut tx = live.db.begin().await.unwrap();
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT e.args_raw, e.user_id, u.id FROM audit_events e JOIN users u ON u.subject = 'olivia@acme.test' \
          WHERE e.action LIKE 'admin.user.%' ORDER BY e.seq",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let raw: Vec<Value> = rows.iter().map(|(r, _, _)| serde_json::from_str(r).unwrap()).collect();
    let bare = |tag: String| tag.trim_matches('"').to_owned();
    assert_eq!(raw[0]["before"], Value::Null);
    assert_eq!(raw[0]["after"], json!(bare(made.etag())));
    assert_eq!(raw[1]["before"], json!(bare(made.etag())));
    assert_eq!(raw[1]["after"], json!(bare(changed.etag())));
    // The owner acted in its own tenant: the event names its user id.
    assert!(rows.iter().all(|(_, event_user, olivia)| event_user == olivia));
}
both_dbs!(audited_digests_are_the_etags, digests_are_the_etags);

/// Who may do what. Each row is a request and the status each principal gets.
async fn matrix(backend: Backend) {
    let live = admin_gateway(backend).await;
    let ops = platform(&live);
    let owner = live.token_for("olivia@acme.test");
    let other_owner = live.token_for("gary@globex.test");
    let worker = live.token_for("wanda@acme.test");
    let auditor = live.token_for("audrey@acme.test");
    let mut expired_claims = claims(&live.config, "acme", "olivia@acme.test");
    expired_claims["exp"] = json!(now() - 3600);
    let expired = Signer::hs256(live.config.auth.hs256_secret.expose()).sign(&expired_claims);
    let forged = Signer::hs256("another-secret-of-at-least-thirty-two-bytes").sign(&claims(
        &live.config,
        "acme",
        "olivia@acme.test",
    ));

    let user = |n: &str| json!({"subject": format!("{n}@acme.test"), "display_name": n, "roles": ["worker"]});
    // (method, path, body, [platform, owner of acme, owner of globex, worker, auditor])
    type Row<'a> = (Method, &'a str, Option<Value>, [u16; 5]);
    let rows: Vec<Row> = vec![
        (Method::GET, "/admin/v1/tenants", None, [200, 403, 403, 403, 403]),
        (Method::POST, "/admin/v1/tenants", Some(json!({"slug": "t1", "name": "T"})), [201, 403, 403, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme", None, [200, 200, 404, 403, 403]),
        (Method::PATCH, "/admin/v1/tenants/acme", Some(json!({"name": "Acme"})), [200, 403, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/users", None, [200, 200, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/globex/users", None, [200, 404, 200, 404, 404]),
        (Method::GET, "/admin/v1/tenants/nowhere/users", None, [404, 404, 404, 404, 404]),
        (Method::GET, "/admin/v1/tenants/acme/users/wanda@acme.test", None, [200, 200, 404, 403, 403]),
        (Method::POST, "/admin/v1/tenants/acme/users", Some(user("x1")), [201, 409, 404, 403, 403]),
        (Method::POST, "/admin/v1/tenants/acme/users", Some(user("x2")), [201, 409, 404, 403, 403]),
        (
            Method::PATCH,
            "/admin/v1/tenants/acme/users/walt@acme.test",
            Some(json!({"display_name": "W"})),
            [200, 200, 404, 403, 403],
        ),
        (Method::GET, "/admin/v1/tenants/acme/flocks", None, [200, 200, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/assignments", None, [200, 200, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/bindings", None, [200, 200, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/grants", None, [200, 200, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/root-allowances", None, [200, 200, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/entities", None, [200, 403, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/globex/entities", None, [200, 404, 403, 404, 404]),
        (Method::GET, "/admin/v1/executors", None, [200, 403, 403, 403, 403]),
        (Method::DELETE, "/admin/v1/tenants/acme/users/walt@acme.test/roles/worker", None, [200, 404, 404, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/audit/events", None, [200, 403, 404, 403, 200]),
        (Method::GET, "/admin/v1/tenants/acme/audit/verification", None, [200, 403, 404, 403, 200]),
        (Method::GET, "/admin/v1/tenants/acme/audit/export", None, [200, 403, 404, 403, 200]),
        (Method::GET, "/admin/v1/tenants/globex/audit/events", None, [200, 404, 403, 404, 404]),
        (Method::GET, "/admin/v1/guards/report?format=json", None, [200, 200, 200, 403, 200]),
        (Method::GET, "/admin/v1/status/executors", None, [200, 403, 403, 403, 403]),
        (Method::GET, "/admin/v1/status/sessions", None, [200, 403, 403, 403, 403]),
        (Method::GET, "/admin/v1/tenants/acme/servers", None, [200, 200, 404, 403, 403]),
    ];
    let principals = [&ops, &owner, &other_owner, &worker, &auditor];
    // The platform administrator goes first in each row, so a creation the others repeat
    // is already there: an owner's retry is a conflict, not a second user.
    for (method, path, body, expected) in &rows {
        for (who, (token, want)) in principals.iter().zip(expected).enumerate() {
            let got = request(&live, method.clone(), path, Some(token), body.as_ref(), &[]).await;
            assert_eq!(got.status, *want, "principal #{who}: {method} {path}: {}", got.body);
            if got.status >= 400 {
                assert_eq!(got.header("content-type"), Some("application/problem+json"));
            }
        }
        // No token, an expired one, a forged one: 401, on every route.
        for token in [None, Some(expired.as_str()), Some(forged.as_str())] {
            let got = request(&live, method.clone(), path, token, body.as_ref(), &[]).await;
            assert_eq!(got.status, 401, "{method} {path} with {token:?}: {}", got.body);
            assert!(got.header("www-authenticate").unwrap().starts_with("Bearer"));
        }
    }
    // A user whose tenant is suspended, or who is disabled, has no authority left.
    live.execute("UPDATE users SET status = 'disabled' WHERE subject = 'olivia@acme.test'").await;
    assert_eq!(get(&live, "/admin/v1/tenants/acme/users", &owner).await.status, 403);
    live.execute("UPDATE tenants SET status = 'suspended' WHERE slug = 'globex'").await;
    assert_eq!(get(&live, "/admin/v1/tenants/globex/users", &other_owner).await.status, 403);
    // A token of a platform subject's name but no platform listing is nobody.
    let stranger = live.token("acme", "ops@elsewhere.test");
    assert_eq!(get(&live, "/admin/v1/tenants", &stranger).await.status, 403);
}
both_dbs!(authorization_matrix, matrix);

/// Eight concurrent retries of one sign-up make one tenant, one audit event, and the same
/// answer for all; the key with another body is refused.
async fn concurrent_retries(backend: Backend) {
    let live = admin_gateway(backend).await;
    let ops = platform(&live);
    let body = json!({"slug": "hooli", "name": "Hooli"});
    let tries = (0..8).map(|_| {
        request(&live, Method::POST, "/admin/v1/tenants", Some(&ops), Some(&body), &[("idempotency-key", "signup-42")])
    });
    let answers = futures_util::future::join_all(tries).await;
    let first = &answers[0];
    for a in &answers {
        assert_eq!(a.status, 201, "{}", a.body);
        assert_eq!((&a.body, a.etag()), (&first.body, first.etag()));
        assert_eq!(a.header("location"), Some("/admin/v1/tenants/hooli"));
    }
    let replayed = answers.iter().filter(|a| a.header("idempotent-replayed") == Some("true")).count();
    assert_eq!(replayed, 7, "one request ran, seven were answered from it");
    assert_eq!(live.count("SELECT COUNT(*) FROM tenants WHERE slug = 'hooli'").await, 1);
    assert_eq!(admin_events(&live, "hooli").await.len(), 1);
    let other = request(
        &live,
        Method::POST,
        "/admin/v1/tenants",
        Some(&ops),
        Some(&json!({"slug": "hooli2", "name": "Hooli"})),
        &[("idempotency-key", "signup-42")],
    )
    .await;
    assert_eq!((other.status, other.body["field"].clone()), (422, json!("Idempotency-Key")));
    assert_eq!(live.count("SELECT COUNT(*) FROM tenants WHERE slug = 'hooli2'").await, 0);
    // Without a key, a retry is a conflict, never a second tenant.
    let again = send(&live, Method::POST, "/admin/v1/tenants", &ops, body).await;
    assert_eq!(again.status, 409);
    // Keys are the principal's own: another principal's same key runs its own request.
    let olivia = live.token_for("olivia@acme.test");
    let mine = request(
        &live,
        Method::POST,
        "/admin/v1/tenants/acme/flocks",
        Some(&olivia),
        Some(&json!({"name": "west", "breed": "Orpington", "hen_count": 3})),
        &[("idempotency-key", "signup-42")],
    )
    .await;
    assert_eq!((mine.status, mine.header("idempotent-replayed")), (201, None));
}
both_dbs!(idempotent_creation_under_concurrent_retries, concurrent_retries);

/// What every table and chain holds, to compare before and after a refused request.
async fn snapshot(live: &Live) -> Vec<i64> {
    let mut out = Vec::new();
    for table in [
        "tenants",
        "users",
        "user_roles",
        "flocks",
        "flock_assignments",
        "executors",
        "executor_owners",
        "mcp_server_entities",
        "mcp_server_bindings",
        "mcp_server_grants",
        "executor_root_allowances",
        "audit_events",
        "admin_idempotency",
    ] {
        out.push(live.count(&format!("SELECT COUNT(*) FROM {table}")).await);
    }
    out
}

async fn bad_input(backend: Backend) {
    // A small body limit: an oversized body then fits in the socket's buffers whole, and the
    // client reads the 413 instead of failing to write the rest.
    let live = TestGateway::new(backend)
        .set("admin.platform_subjects", json!([PLATFORM]))
        .set("server.body_limit_bytes", json!(16384))
        .start()
        .await;
    let ops = platform(&live);
    let olivia = live.token_for("olivia@acme.test");
    let at = live.base_url();
    let before = snapshot(&live).await;
    let raw = |path: &str, body: &str, content_type: &str| {
        let client = reqwest::Client::new();
        client
            .post(format!("{at}{path}"))
            .bearer_auth(&ops)
            .header("content-type", content_type.to_owned())
            .header("idempotency-key", "k-bad")
            .body(body.to_owned())
            .send()
    };
    // (request, status, field)
    let cases: Vec<(reqwest::Response, u16, Option<&str>)> = vec![
        (raw("/admin/v1/tenants", "{\"slug\": ", "application/json").await.unwrap(), 422, Some("body")),
        (raw("/admin/v1/tenants", "{\"slug\":\"a\"}", "text/plain").await.unwrap(), 415, Some("Content-Type")),
        (raw("/admin/v1/tenants", "{\"slug\":\"a\",\"name\":\"A\",\"x\":1}", "application/json").await.unwrap(), 422, Some("x")),
        (raw("/admin/v1/tenants", "{\"slug\":3,\"name\":\"A\"}", "application/json").await.unwrap(), 422, Some("slug")),
        (raw("/admin/v1/tenants", "{\"slug\":\"Not A Slug\",\"name\":\"A\"}", "application/json").await.unwrap(), 422, Some("slug")),
        (raw("/admin/v1/tenants", "{\"slug\":\"ok\",\"name\":\"\"}", "application/json").await.unwrap(), 422, Some("name")),
        (raw("/admin/v1/tenants/acme/users", "{\"subject\":\"z@acme.test\",\"display_name\":\"Z\",\"roles\":[]}", "application/json").await.unwrap(), 422, Some("roles")),
        (raw("/admin/v1/tenants/acme/users", "{\"subject\":\"z@acme.test\",\"display_name\":\"Z\",\"roles\":[\"king\"]}", "application/json").await.unwrap(), 422, Some("roles[0]")),
        (raw("/admin/v1/tenants/acme/flocks", "{\"name\":\"f\",\"breed\":\"b\",\"hen_count\":-1}", "application/json").await.unwrap(), 422, Some("hen_count")),
        (raw("/admin/v1/tenants/acme/entities", "{\"name\":\"defaults/mcp-servers/s\",\"declaration\":{\"command\":7}}", "application/json").await.unwrap(), 422, Some("declaration")),
        (raw("/admin/v1/tenants/acme/entities", "{\"name\":\"nowhere/s\",\"declaration\":{\"command\":\"x\"}}", "application/json").await.unwrap(), 422, Some("name")),
        (raw("/admin/v1/tenants/acme/grants", "{\"server\":\"unbound\",\"role\":\"worker\",\"name\":\"t\"}", "application/json").await.unwrap(), 404, None),
        // Checked in order: the first owner exists, the second does not; the executor row
        // that was inserted goes with the refusal.
        (raw("/admin/v1/executors", "{\"name\":\"r\",\"machine\":\"m\",\"run_as\":\"u\",\"kind\":\"remote\",\"owners\":[\"acme\",\"nope\"]}", "application/json").await.unwrap(), 404, None),
    ];
    for (i, (response, status, field)) in cases.into_iter().enumerate() {
        let got = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(got, status, "case {i}: {body}");
        if status >= 400 {
            assert_eq!(body["field"].as_str(), field, "case {i}: {body}");
        }
    }
    assert_eq!(snapshot(&live).await, before, "no refused request left anything behind");

    // An import whose second server collides with a stored one fails whole.
    send(
        &live,
        Method::POST,
        "/admin/v1/tenants/acme/entities",
        &ops,
        json!({"name": "defaults/mcp-servers/b", "declaration": {"command": "y"}}),
    )
    .await;
    let mid = snapshot(&live).await;
    let collided = send(
        &live,
        Method::POST,
        "/admin/v1/tenants/acme/entities/import",
        &ops,
        json!({"under": "defaults", "file": {"a": {"command": "x"}, "b": {"command": "y"}}}),
    )
    .await;
    assert_eq!(collided.status, 409, "{}", collided.body);
    assert_eq!(snapshot(&live).await, mid, "the first server of a refused import is not kept");

    // An oversized body: 413 before anything is read.
    let limit = live.config.server.body_limit_bytes;
    let big = json!({"slug": "big", "name": "x".repeat(limit)});
    let refused = send(&live, Method::POST, "/admin/v1/tenants", &ops, big).await;
    assert_eq!((refused.status, refused.body["field"].clone()), (413, json!("body")), "{}", refused.body);
    assert_eq!(refused.header("content-type"), Some("application/problem+json"));
    // A path that is no resource, a bad page cursor, a bad limit, query parameters that do not
    // parse: each a problem body naming the parameter.
    assert_eq!(get(&live, "/admin/v1/nothing", &ops).await.status, 404);
    let cursor = get(&live, "/admin/v1/tenants/acme/users?after=!!", &olivia).await;
    assert_eq!((cursor.status, cursor.body["field"].clone()), (422, json!("after")));
    let limit = get(&live, "/admin/v1/tenants/acme/users?limit=0", &olivia).await;
    assert_eq!((limit.status, limit.body["field"].clone()), (422, json!("limit")));
    for (path, field) in [
        ("/admin/v1/tenants/acme/users?limit=-1", "limit"),
        ("/admin/v1/tenants?limit=many", "limit"),
        ("/admin/v1/tenants/acme/audit/events?since=yesterday", "since"),
    ] {
        let refused = get(&live, path, &ops).await;
        assert_eq!((refused.status, refused.body["field"].clone()), (400, json!(field)), "{path}: {}", refused.body);
        assert_eq!(refused.header("content-type"), Some("application/problem+json"), "{path}");
    }
    // Names that hide or reorder characters (U+200B, U+202E, a BOM, a tag character): refused
    // as subjects, display names and tenant names.
    for (path, body, field) in [
        (
            "/admin/v1/tenants/acme/users",
            json!({"subject": "olivia\u{200B}@acme.test", "display_name": "O", "roles": ["worker"]}),
            "subject",
        ),
        (
            "/admin/v1/tenants/acme/users",
            json!({"subject": "admin\u{202E}gnp.exe@acme.test", "display_name": "A", "roles": ["worker"]}),
            "subject",
        ),
        (
            "/admin/v1/tenants/acme/users",
            json!({"subject": "z@acme.test", "display_name": "\u{FEFF}Zed", "roles": ["worker"]}),
            "display_name",
        ),
        ("/admin/v1/tenants", json!({"slug": "hidden", "name": "Acme\u{E0041}"}), "name"),
    ] {
        let refused = send(&live, Method::POST, path, &ops, body).await;
        assert_eq!((refused.status, refused.body["field"].clone()), (422, json!(field)), "{}", refused.body);
    }
    let renamed = send(
        &live,
        Method::PATCH,
        "/admin/v1/tenants/acme/users/wanda@acme.test",
        &ops,
        json!({"display_name": "Wanda\u{200D}"}),
    )
    .await;
    assert_eq!((renamed.status, renamed.body["field"].clone()), (422, json!("display_name")), "{}", renamed.body);
    assert_eq!(snapshot(&live).await, mid);

    // A role named twice is one role, never a database error.
    let twice = send(
        &live,
        Method::POST,
        "/admin/v1/tenants/acme/users",
        &ops,
        json!({"subject": "twice@acme.test", "display_name": "Twice", "roles": ["worker", "worker"]}),
    )
    .await;
    assert_eq!((twice.status, twice.body["roles"].clone()), (201, json!(["worker"])), "{}", twice.body);
}
both_dbs!(bad_input_leaves_nothing_behind, bad_input);

/// The OpenAPI description is 3.1 and names exactly the routes the gateway serves: every
/// documented operation exists (401 without a token, never 404 or 405), and a method it does
/// not document for a path is not served (405).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_matches_the_routes() {
    // Every documented path is tried with every method, a few hundred requests at once: the
    // rate limits (a property of their own tests) are off here.
    let live = TestGateway::new(Backend::Sqlite)
        .set("admin.platform_subjects", json!([PLATFORM]))
        .set("limits.user_per_sec", json!(0.0))
        .set("limits.tenant_per_sec", json!(0.0))
        .start()
        .await;
    let doc = reqwest::get(format!("{}/admin/v1/openapi.json", live.base_url())).await.unwrap();
    assert_eq!(doc.status(), 200);
    let doc: Value = doc.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{}", doc["openapi"]);
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 20, "{} paths", paths.len());
    let all = ["get", "post", "put", "patch", "delete"];
    let mut operations = 0;
    for (path, item) in paths {
        // A concrete path: each `{param}` filled in.
        let concrete: String =
            path.split('/').map(|seg| if seg.starts_with('{') { "x" } else { seg }).collect::<Vec<_>>().join("/");
        for method in all {
            let documented = item.get(method).is_some();
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            // Authentication comes before the method is dispatched: an undocumented method is
            // tried with a platform administrator's token.
            let token = (!documented).then(|| platform(&live));
            let got = request(&live, m, &concrete, token.as_deref(), None, &[]).await;
            if documented {
                operations += 1;
                assert_eq!(got.status, 401, "{method} {path} is documented and must be served behind a token");
                let op = &item[method];
                assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path}");
            } else {
                assert_eq!(got.status, 405, "{method} {path} is not documented and must not be served");
            }
        }
    }
    assert!(operations >= 40, "{operations} operations");
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());

    // The admin API's body limit is the gateway's (4 MiB by default), not axum's 2 MiB: a
    // 2.5 MiB body is read, and refused for what it says.
    let body = json!({"slug": "wordy", "name": "x".repeat(5 << 19)});
    let wordy = send(&live, Method::POST, "/admin/v1/tenants", &platform(&live), body).await;
    assert_eq!((wordy.status, wordy.body["field"].clone()), (422, json!("name")), "{}", wordy.body);
}

/// The auditor's view: a call made through `/mcp` is in the events as one row, its record and
/// its outcome folded (filtered by user, tool, outcome), the chain verifies, the export checks
/// itself, and one altered row is reported.
async fn audit_trail(backend: Backend) {
    let live = admin_gateway(backend).await;
    let audrey = live.token_for("audrey@acme.test");
    let client = live.client("wanda@acme.test").await;
    ok(client.peer(), "list_flocks", json!({})).await;
    client.cancel().await.unwrap();
    // The call's outcome is appended after its answer: committed before the change below, the
    // chain is the call's record (seq 1), its outcome (seq 2), the change (seq 3).
    live.settle_audit().await;
    let olivia = live.token_for("olivia@acme.test");
    send(
        &live,
        Method::POST,
        "/admin/v1/tenants/acme/flocks",
        &olivia,
        json!({"name": "hill", "breed": "Silkie", "hen_count": 4}),
    )
    .await;

    let all = get(&live, "/admin/v1/tenants/acme/audit/events", &audrey).await;
    assert_eq!(all.status, 200, "{}", all.body);
    let items = all.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "the call and the change, one row each: {}", all.body);
    assert_eq!(items[0]["action"], "admin.flock.create", "newest first");
    assert_eq!(items[0]["actor"], "tenant:acme:olivia@acme.test");
    assert_eq!(items[0]["user"], "olivia@acme.test");
    let mine =
        get(&live, "/admin/v1/tenants/acme/audit/events?user=wanda@acme.test&tool=list_flocks&outcome=ok", &audrey)
            .await;
    let calls = mine.body["items"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{}", mine.body);
    assert_eq!((calls[0]["action"].as_str(), calls[0]["user"].as_str()), (Some("tools/call"), Some("wanda@acme.test")));
    assert_eq!((&calls[0]["seq"], &calls[0]["outcome_seq"]), (&json!(1), &json!(2)), "{}", mine.body);
    let none = get(&live, "/admin/v1/tenants/acme/audit/events?user=wanda@acme.test&outcome=denied", &audrey).await;
    assert_eq!(none.body["items"], json!([]));
    let paged = get(&live, "/admin/v1/tenants/acme/audit/events?limit=1", &audrey).await;
    assert!(paged.body["next"].is_string());
    let bad = get(&live, "/admin/v1/tenants/acme/audit/events?outcome=maybe", &audrey).await;
    assert_eq!((bad.status, bad.body["field"].clone()), (422, json!("outcome")));

    // Three events: the call's record and outcome, the change.
    let status = get(&live, "/admin/v1/tenants/acme/audit/verification", &audrey).await;
    assert_eq!(status.body["verified"], true, "{}", status.body);
    assert_eq!(status.body["events"], 3);

    let export = request(&live, Method::GET, "/admin/v1/tenants/acme/audit/export", Some(&audrey), None, &[]).await;
    assert_eq!(export.header("content-type"), Some("application/x-ndjson"));
    let text = match &export.body {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let checked = scopegate::audit::export::verify_export(&mut text.as_bytes(), &Default::default()).unwrap();
    assert_eq!(checked.events, 3);
    let csv =
        request(&live, Method::GET, "/admin/v1/tenants/acme/audit/export?format=csv", Some(&audrey), None, &[]).await;
    let csv = csv.body.as_str().unwrap().to_owned();
    assert_eq!(scopegate::audit::export::verify_export(&mut csv.as_bytes(), &Default::default()).unwrap().events, 3);

    // One altered row, the call's outcome made a denial: the verification names it.
    live.execute("UPDATE audit_events SET outcome = 'denied' WHERE seq = 2 AND call_id IS NOT NULL").await;
    let status = get(&live, "/admin/v1/tenants/acme/audit/verification", &audrey).await;
    assert_eq!(status.body["verified"], false, "{}", status.body);
    assert_eq!(status.body["broken"]["seq"], 2);
}
both_dbs!(auditors_read_verify_and_export_the_trail, audit_trail);

/// The operators' view of what runs: a connected upstream's negotiated revision and tools, a
/// failed one's last error, live sessions per tenant, executors.
async fn runtime_status(backend: Backend) {
    // acme's `fx`, the fixture upstream over stdio, on the local executor; and a server that
    // can't start, added through the API.
    let proxy =
        Proxy::with_fx_over(backend, Mode::Session, &[("admin.platform_subjects", json!([PLATFORM]))], Over::Stdio)
            .await;
    let live = &proxy.live;
    let ops = platform(live);
    let olivia = live.token_for("olivia@acme.test");
    let p = "/admin/v1";
    let made = send(
        live,
        Method::POST,
        &format!("{p}/tenants/acme/entities"),
        &ops,
        json!({"name": "defaults/mcp-servers/gone", "declaration": {"command": "/nonexistent/server"}}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    // And a Streamable HTTP server nobody listens for (a port just closed).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let made = send(
        live,
        Method::POST,
        &format!("{p}/tenants/acme/entities"),
        &ops,
        json!({"name": "defaults/mcp-servers/down", "declaration": {"url": format!("http://{closed}/mcp")}}),
    )
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    for server in ["gone", "down"] {
        assert_eq!(
            send(
                live,
                Method::PUT,
                &format!("{p}/tenants/acme/bindings/{server}"),
                &olivia,
                json!({"executor": "local"})
            )
            .await
            .status,
            201
        );
        assert_eq!(
            send(
                live,
                Method::POST,
                &format!("{p}/tenants/acme/grants"),
                &olivia,
                json!({"server": server, "role": "owner", "name": "*"})
            )
            .await
            .status,
            201
        );
    }
    let client = live.client("olivia@acme.test").await;
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name.starts_with("fx__")));

    let servers = get(live, &format!("{p}/tenants/acme/servers"), &olivia).await;
    assert_eq!(servers.status, 200, "{}", servers.body);
    let by_name = |name: &str| servers.body.as_array().unwrap().iter().find(|s| s["server"] == name).unwrap().clone();
    let fx = by_name("fx");
    let connection = &fx["connections"][0];
    assert!(connection["revision"].as_str().is_some_and(|r| r.starts_with("20")), "{fx}");
    assert!(connection["tools"].as_u64().is_some_and(|n| n > 0), "{fx}");
    assert!(connection["last_error"].is_null(), "{fx}");
    let gone = by_name("gone");
    assert!(gone["connections"][0]["last_error"].as_str().is_some_and(|e| e.contains("/nonexistent/server")), "{gone}");
    assert_eq!(gone["connections"][0]["last_error_class"], "launch_failed", "{gone}");
    // An owner reads what failed in the gateway's words, never the SDK's Rust type names.
    let down = by_name("down");
    assert_eq!(down["connections"][0]["last_error_class"], "connect_failed", "{down}");
    let message = down["connections"][0]["last_error"].as_str().unwrap_or_default();
    assert!(message.starts_with("connecting:") && !message.contains("::"), "{down}");

    let sessions = get(live, &format!("{p}/status/sessions"), &ops).await;
    let acme = sessions.body.as_array().unwrap().iter().find(|c| c["tenant"] == "acme").unwrap().clone();
    assert_eq!(acme["sessions"], 1, "{}", sessions.body);
    client.cancel().await.unwrap();

    let executors = get(live, &format!("{p}/status/executors"), &ops).await;
    let find = |name: &str| executors.body.as_array().unwrap().iter().find(|x| x["name"] == name).unwrap().clone();
    let local = find("local");
    assert_eq!((local["kind"].as_str(), local["connected"].as_bool()), (Some("local"), Some(true)));
    // A remote executor whose agent never connected.
    let remote = find("build-01");
    assert_eq!((remote["connected"].as_bool(), remote["reconnects"].as_u64()), (Some(false), Some(0)), "{remote}");
}
both_dbs!(operators_see_what_runs, runtime_status);

/// A remote executor's agent as the operators see it: connected here, when last heard, and a
/// reconnect counted after it was killed and started again.
async fn agent_status(backend: Backend) {
    let site = Site::start(backend, &[("admin.platform_subjects", json!([PLATFORM]))]).await;
    let live = &site.live;
    let ops = platform(live);
    let secret = site.remote_executor("edge-1", "edge-host", "svc", &["acme"]).await;
    let status = |x: &Answer| x.body.as_array().unwrap().iter().find(|e| e["name"] == "edge-1").unwrap().clone();

    let before = status(&get(live, "/admin/v1/status/executors", &ops).await);
    assert_eq!((before["connected"].as_bool(), before["here"].as_bool()), (Some(false), Some(false)), "{before}");
    let mut agent = site.agent("edge-1", &secret);
    site.wait_connected("edge-1", true).await;
    let now = status(&get(live, "/admin/v1/status/executors", &ops).await);
    assert_eq!((now["connected"].as_bool(), now["here"].as_bool()), (Some(true), Some(true)), "{now}");
    assert!(now["replica"].as_str().is_some_and(|r| r.starts_with("http")), "{now}");
    assert!(now["last_heartbeat"].as_i64().is_some_and(|at| at > 0), "{now}");
    assert_eq!(now["reconnects"], 0);

    agent.kill();
    site.wait_connected("edge-1", false).await;
    let _agent = site.agent("edge-1", &secret);
    site.wait_connected("edge-1", true).await;
    let again = status(&get(live, "/admin/v1/status/executors", &ops).await);
    assert_eq!((again["connected"].as_bool(), again["reconnects"].as_u64()), (Some(true), Some(1)), "{again}");
}
both_dbs!(operators_see_executor_agents, agent_status);

/// Users made on first sight: off by default; once the owner opts in, a token of an unknown
/// subject becomes a user with exactly the roles its groups map to (never a group's name
/// taken for a role), audited; a token whose groups map to nothing makes nobody.
async fn first_sight(backend: Backend) {
    let live = admin_gateway(backend).await;
    let olivia = live.token_for("olivia@acme.test");
    let token = |subject: &str, groups: Value| {
        let mut claims = claims(&live.config, "acme", subject);
        claims["groups"] = groups;
        claims["name"] = json!("Newbie");
        Signer::hs256(live.config.auth.hs256_secret.expose()).sign(&claims)
    };
    let reaches = |token: String| {
        let url = live.url();
        async move {
            let client = connect(&url, &token, ()).await;
            let me = ok(client.peer(), "whoami", json!({})).await;
            client.cancel().await.unwrap();
            me
        }
    };
    let refused = |token: String| {
        let url = live.url();
        async move {
            let answer = reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#)
                .send()
                .await
                .unwrap();
            answer.status().as_u16()
        }
    };
    // Off: an unknown subject is refused, and nothing is made.
    assert_eq!(refused(token("newbie@acme.test", json!(["farmhands"]))).await, 403);
    assert_eq!(get(&live, "/admin/v1/tenants/acme/provisioning", &olivia).await.status, 404);
    let set = send(
        &live,
        Method::PUT,
        "/admin/v1/tenants/acme/provisioning",
        &olivia,
        json!({"role_claim": "groups", "roles": {"farmhands": ["worker"], "bosses": ["manager", "auditor"]}}),
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(set.body["roles"]["bosses"], json!(["manager", "auditor"]));
    // Another tenant's owner and a worker can't see or change it.
    assert_eq!(
        get(&live, "/admin/v1/tenants/acme/provisioning", &live.token_for("gary@globex.test")).await.status,
        404
    );
    assert_eq!(get(&live, "/admin/v1/tenants/acme/provisioning", &live.token_for("wanda@acme.test")).await.status, 403);

    // Groups that map to nothing: refused, nobody made.
    assert_eq!(refused(token("stranger@acme.test", json!(["owner", "admins"]))).await, 403);
    assert_eq!(refused(token("stranger@acme.test", json!("owner"))).await, 403);
    assert_eq!(live.count("SELECT COUNT(*) FROM users WHERE subject = 'stranger@acme.test'").await, 0);
    // A mapped group, but a subject that hides a character (a look-alike of a user's): refused,
    // nobody made. A display name that does is not taken (the subject stands in).
    assert_eq!(refused(token("olivia\u{200B}@acme.test", json!(["farmhands"]))).await, 403);
    assert_eq!(refused(token("\u{202E}olivia@acme.test", json!(["farmhands"]))).await, 403);
    assert_eq!(live.count("SELECT COUNT(*) FROM users WHERE subject LIKE '%olivia%'").await, 1);
    // A mapped group: the user is made with that role only (an unmapped `owner` group ignored).
    let me = reaches(token("newbie@acme.test", json!(["farmhands", "owner"]))).await;
    assert_eq!((me["user"].as_str(), me["roles"].clone()), (Some("newbie@acme.test"), json!(["worker"])), "{me}");
    let made = get(&live, "/admin/v1/tenants/acme/users/newbie@acme.test", &olivia).await;
    assert_eq!((made.body["roles"].clone(), made.body["display_name"].clone()), (json!(["worker"]), json!("Newbie")));
    // A string claim works as a one-group list.
    let boss = reaches(token("boss@acme.test", json!("bosses"))).await;
    assert_eq!(boss["roles"], json!(["manager", "auditor"]));
    // A provisioned user is a user: the next token, with other groups, changes nothing.
    let again = reaches(token("newbie@acme.test", json!(["bosses"]))).await;
    assert_eq!(again["roles"], json!(["worker"]));
    let events = admin_events(&live, "acme").await;
    let provisioned: Vec<&(String, String, String)> =
        events.iter().filter(|(a, _, _)| a == "admin.user.provision").collect();
    assert_eq!(provisioned.len(), 2, "{events:?}");
    assert_eq!(provisioned[0].2, "provisioning:groups");
    chains_verify(&live).await;

    // Off again: the next unknown subject is refused.
    assert_eq!(delete(&live, "/admin/v1/tenants/acme/provisioning", &olivia).await.status, 204);
    assert_eq!(refused(token("late@acme.test", json!(["farmhands"]))).await, 403);
    assert_eq!(live.count("SELECT COUNT(*) FROM users WHERE subject = 'late@acme.test'").await, 0);
    // Bad input: a group mapped to no role, an unknown role.
    let empty = send(
        &live,
        Method::PUT,
        "/admin/v1/tenants/acme/provisioning",
        &olivia,
        json!({"role_claim": "groups", "roles": {"x": []}}),
    )
    .await;
    assert_eq!((empty.status, empty.body["field"].clone()), (422, json!("roles")));
    let unknown = send(
        &live,
        Method::PUT,
        "/admin/v1/tenants/acme/provisioning",
        &olivia,
        json!({"role_claim": "groups", "roles": {"x": ["root"]}}),
    )
    .await;
    assert_eq!(unknown.status, 422);
    assert_eq!(live.count("SELECT COUNT(*) FROM tenant_provisioning").await, 0);
}
both_dbs!(users_made_on_first_sight, first_sight);

/// The admin API spends the `/mcp` budgets: past a member's burst, 429 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_requests_are_rate_limited() {
    let live = TestGateway::new(Backend::Sqlite)
        .set("limits.user_per_sec", json!(0.5))
        .set("limits.user_burst", json!(2.0))
        .start()
        .await;
    let olivia = live.token_for("olivia@acme.test");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let answer = get(&live, "/admin/v1/tenants/acme/users", &olivia).await;
        if answer.status == 429 {
            assert!(answer.header("retry-after").is_some());
            assert_eq!(answer.body["type"], "urn:scopegate:problem:rate_limited");
        }
        statuses.push(answer.status);
    }
    assert_eq!(&statuses[..2], [200, 200], "{statuses:?}");
    assert!(statuses[2..].iter().all(|s| *s == 429), "{statuses:?}");
}
