//! Cedar policies over the caller, the tool and its arguments, end to end on SQLite and
//! PostgreSQL: written through the admin API (validated, refused with line and column, audited),
//! deciding rmcp's client's calls of the fixture upstream's tools by their arguments, listing
//! what some call could be permitted for, a forbid beating a grant, a platform forbid beating a
//! tenant's permit, a native tool narrowed, log-only policies deciding nothing, and the explain
//! endpoint naming the policies the audit of the real call names.

use std::time::{Duration, Instant};

use reqwest::Method;
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};

use crate::admin_api::{PLATFORM, chains_verify, delete, get, platform, send};
use crate::support::*;

async fn tool_names(client: &RunningService<RoleClient, impl ClientHandler>) -> Vec<String> {
    client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect()
}

/// Waits (bounded) until `client`'s listing has `tool` or not, as `present` says: a policy
/// written applies within the change counter's read interval.
async fn until_listed(client: &RunningService<RoleClient, ()>, tool: &str, present: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names = tool_names(client).await;
        if names.iter().any(|n| n == tool) == present {
            return;
        }
        assert!(Instant::now() < deadline, "`{tool}` listed: {present} expected, got {names:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lists `client`'s tools until the gateway has recorded fx's (a listing records a list it has
/// not recorded yet, and tries again after a failed write).
async fn recorded(live: &Live, client: &RunningService<RoleClient, ()>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(tool_names(client).await.iter().any(|n| n == "fx__echo"));
        if live.count("SELECT COUNT(*) FROM tool_catalogue WHERE server = 'fx'").await > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "fx's tools are recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The newest audited calls of `tool`: (outcome, error class, policy JSON).
async fn audited(live: &Live, tool: &str, n: i64) -> Vec<(String, Option<String>, Option<Value>)> {
    live.settle_audit().await;
    let mut tx = live.db.begin().await.unwrap();
    let sql = format!(
        "SELECT outcome, error_class, policy FROM {AUDITED_CALLS} e WHERE tool = $1 AND action = 'tools/call' \
         ORDER BY occurred_at DESC, seq DESC LIMIT $2"
    );
    let rows: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(tool).bind(n).fetch_all(&mut *tx).await.unwrap();
    rows.into_iter().map(|(o, c, p)| (o, c, p.map(|p| serde_json::from_str(&p).unwrap()))).collect()
}

fn echo_text(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_value(&result.content).unwrap()[0]["text"].as_str().unwrap().to_owned()
}

async fn refused(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) {
    let err = call(client, tool, args.clone()).await.expect_err(&format!("{tool} {args}"));
    assert_eq!(err.message, "tool not found", "a refused call answers as an unknown tool: {tool} {args}");
}

const CLEAN_ECHO: &str = "permit (principal in Role::\"worker\", action == Action::\"fx__echo\", resource)\nunless { context.arguments.text like \"*secret*\" };";

async fn decide_by_arguments(backend: Backend) {
    let proxy = Proxy::with_fx(backend, Mode::Session, &[("admin.platform_subjects", json!([PLATFORM]))]).await;
    let live = &proxy.live;
    let p = "/admin/v1/tenants/acme/policies";
    let owner = live.token_for("olivia@acme.test");
    let olivia = live.client("olivia@acme.test").await;
    // The gateway records the tools it lists: the tenant's schema then has fx's tools.
    recorded(live, &olivia).await;

    // Walt, a worker, holds no grant for echo: not listed, not callable.
    let walt = live.client("walt@acme.test").await;
    assert!(!tool_names(&walt).await.iter().any(|n| n == "fx__echo"));
    refused(&walt, "fx__echo", json!({"text": "hello"})).await;

    // Bad policies: each refused with its line and column, nothing written, nothing audited.
    let events = live.count("SELECT COUNT(*) FROM audit_events WHERE action LIKE 'admin.policy%'").await;
    let bad = [
        ("syntax", "permit (principal, action, resource)\nwhen { context.arguments.text == };", Some(2)),
        (
            "unknown-attribute",
            "permit (principal, action == Action::\"fx__echo\", resource)\nwhen { context.arguments.txt == \"a\" };",
            Some(2),
        ),
        (
            "type-error",
            "permit (principal, action == Action::\"fx__echo\", resource) when { context.arguments.text < 5 };",
            Some(1),
        ),
        ("no-such-action", "permit (principal, action == Action::\"fx__delete\", resource);", Some(1)),
        ("other-server", "permit (principal, action, resource in Server::\"wiki\");", Some(1)),
        ("other-tenant", "permit (principal in Tenant::\"globex\", action, resource);", Some(1)),
    ];
    for (id, text, line) in bad {
        let answer = send(live, Method::PUT, &format!("{p}/{id}"), &owner, json!({"text": text})).await;
        assert_eq!(answer.status, 422, "{id}: {:?}", answer.body);
        let first = &answer.body["errors"][0];
        assert_eq!(first["line"].as_u64().map(|l| l as usize), line, "{id}: {:?}", answer.body);
        assert!(first["column"].as_u64().is_some(), "{id}: a column: {:?}", answer.body);
    }
    let bad_id = send(live, Method::PUT, &format!("{p}/bad%20id"), &owner, json!({"text": CLEAN_ECHO})).await;
    assert_eq!(bad_id.status, 422, "{:?}", bad_id.body);
    assert_eq!(live.count("SELECT COUNT(*) FROM policies").await, 0, "nothing was written");
    assert_eq!(live.count("SELECT COUNT(*) FROM audit_events WHERE action LIKE 'admin.policy%'").await, events);
    let worker = send(
        live,
        Method::PUT,
        &format!("{p}/clean-echo"),
        &live.token_for("walt@acme.test"),
        json!({"text": CLEAN_ECHO}),
    )
    .await;
    assert_eq!(worker.status, 403, "a worker writes no policy");

    // Workers may echo any text but one holding "secret": listed, and decided by the text.
    let written = send(live, Method::PUT, &format!("{p}/clean-echo"), &owner, json!({"text": CLEAN_ECHO})).await;
    assert_eq!(written.status, 201, "{:?}", written.body);
    assert_eq!(written.body["valid"], true);
    assert_eq!(live.count("SELECT COUNT(*) FROM audit_events WHERE action = 'admin.policy.put'").await, 1);
    until_listed(&walt, "fx__echo", true).await;
    let echoed = call(&walt, "fx__echo", json!({"text": "hello"})).await.unwrap();
    assert_eq!(echo_text(&echoed), "hello");
    refused(&walt, "fx__echo", json!({"text": "my secret"})).await;
    refused(&walt, "fx__echo", json!({"text": 7})).await;
    let rows = audited(live, "fx__echo", 3).await;
    assert_eq!(rows[2].0, "ok");
    assert_eq!(rows[2].2.as_ref().unwrap()["policies"], json!(["clean-echo"]));
    assert_eq!(
        (rows[1].1.as_deref(), &rows[1].2.as_ref().unwrap()["reason"]),
        (Some("policy_no_permit"), &json!("no_permit"))
    );
    assert_eq!(rows[0].1.as_deref(), Some("arguments_invalid"), "a number is no string: refused, never coerced");

    // The explain endpoint names what the audit of the real call names; an auditor may ask.
    let check = |text: &str| json!({"user": "walt@acme.test", "tool": "fx__echo", "arguments": {"text": text}});
    let audrey = live.token_for("audrey@acme.test");
    let allowed = send(live, Method::POST, &format!("{p}/check"), &audrey, check("hello")).await;
    assert_eq!(
        (allowed.status, &allowed.body["decision"], &allowed.body["policies"]),
        (200, &json!("allow"), &json!(["clean-echo"]))
    );
    let denied = send(live, Method::POST, &format!("{p}/check"), &audrey, check("a secret")).await;
    assert_eq!((&denied.body["decision"], &denied.body["policies"]), (&json!("deny"), &json!([])));

    // Who may call this tool, what may this user call: what the listings show them.
    let callable = get(live, &format!("{p}/callable?user=walt%40acme.test"), &audrey).await;
    let tools = callable.body["tools"].as_array().unwrap();
    assert!(tools.contains(&json!("fx__echo")) && tools.contains(&json!("fx__whoami_upstream")), "{:?}", callable.body);
    assert!(!tools.contains(&json!("fx__crash")), "{:?}", callable.body);
    let callers = get(live, &format!("{p}/callers?tool=fx__echo"), &audrey).await;
    assert_eq!(
        callers.body["users"],
        json!(["olivia@acme.test", "walt@acme.test", "wanda@acme.test"]),
        "{:?}",
        callers.body
    );
    let reserved = send(live, Method::PUT, &format!("{p}/check"), &owner, json!({"text": CLEAN_ECHO})).await;
    assert_eq!(reserved.status, 405, "`check` is a route, never a policy's id");

    // A forbid wins over the owner's grant `*`: not listed, not callable, audited with its id.
    let no_crash = "forbid (principal, action == Action::\"fx__crash\", resource);";
    assert_eq!(send(live, Method::PUT, &format!("{p}/no-crash"), &owner, json!({"text": no_crash})).await.status, 201);
    until_listed(&olivia, "fx__crash", false).await;
    refused(&olivia, "fx__crash", json!({})).await;
    let rows = audited(live, "fx__crash", 1).await;
    assert_eq!(
        (rows[0].1.as_deref(), &rows[0].2.as_ref().unwrap()["policies"]),
        (Some("policy_forbid"), &json!(["no-crash"]))
    );

    // A native tool's roles are a ceiling the tenant's policies narrow.
    let no_audit_reads =
        "forbid (principal in Role::\"auditor\", action == Action::\"recent_audit_events\", resource);";
    assert_eq!(
        send(live, Method::PUT, &format!("{p}/no-audit-reads"), &owner, json!({"text": no_audit_reads})).await.status,
        201
    );
    let audrey_client = live.client("audrey@acme.test").await;
    until_listed(&audrey_client, "recent_audit_events", false).await;
    refused(&audrey_client, "recent_audit_events", json!({})).await;

    // A platform forbid beats the tenant's permit.
    let ops = platform(live);
    let blocked = "forbid (principal, action in Action::\"call_tool\", resource) when { resource.name == \"echo\" && context has client && context.client == \"blocked-client\" };";
    let answer =
        send(live, Method::PUT, "/admin/v1/platform/policies/blocked-client", &ops, json!({"text": blocked})).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    let tenant_write = send(live, Method::PUT, "/admin/v1/platform/policies/x", &owner, json!({"text": blocked})).await;
    assert_eq!(tenant_write.status, 403, "a tenant's owner writes no platform policy");
    let check_blocked =
        json!({"user": "walt@acme.test", "tool": "fx__echo", "arguments": {"text": "hi"}, "client": "blocked-client"});
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = send(live, Method::POST, &format!("{p}/check"), &audrey, check_blocked.clone()).await;
        if answer.body["decision"] == "deny" {
            assert_eq!(answer.body["policies"], json!(["platform/blocked-client"]));
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", answer.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Log-only: the tenant's policies decide nothing (walt has no grant), the audit keeps what
    // they would have decided.
    let mode = send(live, Method::PUT, "/admin/v1/tenants/acme/policy-mode", &owner, json!({"mode": "log_only"})).await;
    assert_eq!(mode.status, 200, "{:?}", mode.body);
    until_listed(&walt, "fx__echo", false).await;
    refused(&walt, "fx__echo", json!({"text": "hello"})).await;
    let rows = audited(live, "fx__echo", 1).await;
    let policy = rows[0].2.as_ref().unwrap();
    assert_eq!((&policy["decision"], &policy["log_only"]["decision"]), (&json!("deny"), &json!("allow")), "{policy}");
    assert_eq!(policy["log_only"]["policies"], json!(["clean-echo"]));

    // Listed for auditors with the rest; deleted, gone.
    let listing = get(live, p, &audrey).await;
    let ids: Vec<&str> = listing.body["items"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["clean-echo", "no-audit-reads", "no-crash"]);
    assert_eq!(delete(live, &format!("{p}/no-crash"), &owner).await.status, 204);
    assert_eq!(get(live, &format!("{p}/no-crash"), &owner).await.status, 404);
    chains_verify(live).await;
}
both_dbs!(policies_decide_calls_by_their_arguments, decide_by_arguments);

fn content_type(reply: &Reply) -> &str {
    reply.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// The lean relay (a session's calls to a Streamable HTTP upstream) serves what the tenant's
/// policies allow, with the deciding policies in the audit, and leaves a refused call to the
/// rmcp path, which refuses it as an unknown tool.
async fn lean_relay_decides(backend: Backend) {
    let proxy = Proxy::with_fx_over(backend, Mode::Session, &[], Over::Http).await;
    let live = &proxy.live;
    let owner = live.token_for("olivia@acme.test");
    let olivia = live.client("olivia@acme.test").await;
    recorded(live, &olivia).await;
    let p = "/admin/v1/tenants/acme/policies/clean-echo";
    assert_eq!(send(live, Method::PUT, p, &owner, json!({"text": CLEAN_ECHO})).await.status, 201);

    let walt = live.token_for("walt@acme.test");
    let session = open_session(live, &walt).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let served = loop {
        let reply = post(live, &walt, Some(&session), &tool_call(2, "fx__echo", json!({"text": "hello"})), &[]).await;
        if content_type(&reply).starts_with("application/json") && reply.message["result"].is_object() {
            break reply;
        }
        assert!(Instant::now() < deadline, "the relay serves the permitted call: {:?}", reply.message);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(served.message["result"]["content"][0]["text"], "hello");
    let rows = audited(live, "fx__echo", 1).await;
    assert_eq!(rows[0].2.as_ref().map(|p| p["policies"].clone()), Some(json!(["clean-echo"])), "{rows:?}");

    let refused = post(live, &walt, Some(&session), &tool_call(3, "fx__echo", json!({"text": "a secret"})), &[]).await;
    assert!(content_type(&refused).starts_with("text/event-stream"), "the rmcp path answers: {:?}", refused.headers);
    assert_eq!(refused.message["error"]["message"], "tool not found", "{:?}", refused.message);
    let rows = audited(live, "fx__echo", 1).await;
    assert_eq!(rows[0].1.as_deref(), Some("policy_no_permit"), "{rows:?}");
}
both_dbs!(policies_decide_lean_relayed_calls, lean_relay_decides);

/// Token claims named in `auth.policy_claims` are the principal's `claims`: a permit that
/// reads the caller's region, from the tokens of one user carrying different regions.
async fn token_claims(backend: Backend) {
    let proxy = Proxy::with_fx(backend, Mode::Session, &[("auth.policy_claims", json!(["region"]))]).await;
    let live = &proxy.live;
    let olivia = live.client("olivia@acme.test").await;
    recorded(live, &olivia).await;
    let eu_only = "permit (principal in Role::\"worker\", action == Action::\"fx__echo\", resource)\nwhen { principal.claims has region && principal.claims.region == \"eu\" };";
    let owner = live.token_for("olivia@acme.test");
    let written =
        send(live, Method::PUT, "/admin/v1/tenants/acme/policies/eu-only", &owner, json!({"text": eu_only})).await;
    assert_eq!(written.status, 201, "{:?}", written.body);
    let unknown = "permit (principal, action, resource) when { principal.claims.department == \"x\" };";
    let refused_text =
        send(live, Method::PUT, "/admin/v1/tenants/acme/policies/dept", &owner, json!({"text": unknown})).await;
    assert_eq!(refused_text.status, 422, "a claim the configuration does not name: {:?}", refused_text.body);

    let walt_with = |region: Option<&str>| {
        let mut claims = claims(&live.config, "acme", "walt@acme.test");
        if let Some(region) = region {
            claims["region"] = json!(region);
        }
        Signer::hs256(live.config.auth.hs256_secret.expose()).sign(&claims)
    };
    let eu = ().serve(transport(&live.url(), &walt_with(Some("eu")))).await.unwrap();
    until_listed(&eu, "fx__echo", true).await;
    assert_eq!(echo_text(&call(&eu, "fx__echo", json!({"text": "hi"})).await.unwrap()), "hi");
    for region in [Some("us"), None] {
        let other = ().serve(transport(&live.url(), &walt_with(region))).await.unwrap();
        assert!(!tool_names(&other).await.iter().any(|n| n == "fx__echo"), "{region:?}");
        refused(&other, "fx__echo", json!({"text": "hi"})).await;
    }
}
both_dbs!(policies_read_token_claims, token_claims);
