//! Calls a person confirms (issue 49), against a server written with the official Python SDK
//! whose tool `refund` writes every call it gets to a ledger file on its side
//! (tests/fixtures/python/ledger_server.py): a grant with `confirm: caller` asks the caller
//! (rmcp's client and the Python SDK's client, in a session and on 2026-07-28), a client that
//! can't be asked is refused, a retry's consent is single use and bound to the arguments; a
//! policy's `@confirm` does the same, a bad one is refused when saved; with `confirm: approver`
//! the call waits for a second person of the tenant (approved, rejected, lapsed; never the
//! caller's own approval, never without the role), all audited and linked by the
//! confirmation's id. The ledger is the proof of what was forwarded. On SQLite and PostgreSQL.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ElicitRequestParams, ElicitResult, ElicitationAction,
};
use rmcp::service::{RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData};
use scopegate::model::Role;
use scopegate::store::{admin, entities};
use serde_json::{Value, json};

use crate::support::installs::{fixture_file, python};
use crate::support::*;

/// A client that answers every elicitation with `action` and records each message.
#[derive(Clone)]
struct Person {
    action: Option<ElicitationAction>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Person {
    fn answering(action: Option<ElicitationAction>) -> Self {
        Self { action, asked: Arc::default() }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl ClientHandler for Person {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut caps = ClientCapabilities::default();
        if self.action.is_some() {
            caps.elicitation = Some(Default::default());
        }
        rmcp::model::ClientConfig::new(caps, rmcp::model::Implementation::new("person", "1"))
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams { message, .. } = params else {
            return Err(ErrorData::invalid_params("form mode only", None));
        };
        self.asked.lock().unwrap().push(message);
        let action = self.action.clone().unwrap_or(ElicitationAction::Decline);
        Ok(match action {
            ElicitationAction::Accept => ElicitResult::new(action).with_content(json!({})),
            other => ElicitResult::new(other),
        })
    }
}

/// A gateway with a tenant of the test's own: its owner, a worker, an approver, one who is both
/// worker and approver, a manager and an auditor; the ledger server bound as `pay`.
struct Site {
    live: Live,
    slug: String,
    ledger: PathBuf,
    _root: tempfile::TempDir,
}

impl Site {
    async fn start(backend: Backend) -> Self {
        let root = tempfile::tempdir().unwrap();
        let root_uri = format!("file://{}", root.path().canonicalize().unwrap().display());
        // The console's forms are posted from the gateway's own origin, the one the browser sees.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let overrides = [
            ("upstream.local_root", json!(root_uri)),
            ("upstream.connect_timeout_secs", json!(30)),
            ("mcp.approval_wait_secs", json!(15)),
            ("server.listen", json!(format!("127.0.0.1:{port}"))),
            ("server.allowed_origins", json!([format!("http://127.0.0.1:{port}")])),
        ];
        let live = Live::start(backend, Mode::Session, &overrides).await;
        let slug = match backend {
            Backend::Sqlite => "confirmlite".to_owned(),
            Backend::Postgres => "confirmpg".to_owned(),
        };
        let mut tx = live.db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
        admin::create_tenant(&mut tx, &slug, "Confirmations").await.unwrap();
        for (who, roles) in [
            ("owner", &[Role::Owner][..]),
            ("walt", &[Role::Worker]),
            ("ann", &[Role::Approver]),
            ("wendy", &[Role::Worker, Role::Approver]),
            ("mike", &[Role::Manager]),
            ("audrey", &[Role::Auditor]),
        ] {
            admin::create_user(&mut tx, &slug, &format!("{who}@{slug}.test"), who, roles).await.unwrap();
        }
        tx.commit().await.unwrap();
        let ledger = root.path().join("ledger.jsonl");
        let site = Self { live, slug, ledger, _root: root };
        let python = python().await;
        let declaration = json!({
            "command": python.display().to_string(),
            "args": [fixture_file("python/ledger_server.py").display().to_string()],
            "env": {"LEDGER": site.ledger.display().to_string()},
        });
        let mut tx = site.live.db.begin().await.unwrap();
        entities::create_entity(&mut tx, &site.slug, "defaults/mcp-servers/pay", &declaration).await.unwrap();
        tx.commit().await.unwrap();
        let (status, view) = site.api("owner", "PUT", "bindings/pay", Some(json!({"executor": "local"}))).await;
        assert_eq!(status, 201, "{view}");
        site
    }

    fn subject(&self, who: &str) -> String {
        format!("{who}@{}.test", self.slug)
    }

    fn token(&self, who: &str) -> String {
        self.live.token(&self.slug, &self.subject(who))
    }

    /// An admin API request of `who` below `/admin/v1/tenants/{slug}/`.
    async fn api(&self, who: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.api_at(&self.live.base_url(), who, method, path, body).await
    }

    /// The same, of the gateway (a replica) at `base`.
    async fn api_at(&self, base: &str, who: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{base}/admin/v1/tenants/{}/{path}", self.slug);
        let mut request = reqwest::Client::new()
            .request(method.parse().unwrap(), url)
            .bearer_auth(self.token(who))
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// What the upstream saw: one line per call it got.
    fn ledger(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.ledger).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    async fn client(&self, who: &str, person: &Person) -> rmcp::service::RunningService<RoleClient, Person> {
        connect(&self.live.url(), &self.token(who), person.clone()).await
    }

    /// The Python SDK's client calling `refund` with `arguments` in `mode`, answering `answer`.
    async fn python_call(&self, who: &str, mode: &str, answer: &str, arguments: Value) -> Value {
        let calls = json!([{"tool": "pay__refund", "arguments": arguments}]);
        let out = tokio::process::Command::new(python().await)
            .arg(fixture_file("python/confirm_client.py"))
            .args([self.live.url(), self.token(who), mode.to_owned(), answer.to_owned(), calls.to_string()])
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "the Python client: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The tenant's approvals in `state`, as `who` reads them.
    async fn approvals(&self, who: &str, state: &str) -> Vec<Value> {
        let (status, page) = self.api(who, "GET", &format!("approvals?state={state}"), None).await;
        assert_eq!(status, 200, "{page}");
        page["items"].as_array().unwrap().clone()
    }

    /// The audit events of `action` in the tenant's chain: (user's subject, outcome, class, policy).
    async fn events(&self, action: &str) -> Vec<(String, String, Option<String>, Option<String>)> {
        self.live.settle_audit().await;
        let sql = format!(
            "SELECT COALESCE(u.subject, ''), e.outcome, e.error_class, e.policy FROM {AUDITED_CALLS} e \
             JOIN tenants t ON t.id = e.tenant_id LEFT JOIN users u ON u.id = e.user_id \
             WHERE t.slug = $1 AND e.action = $2 ORDER BY e.seq"
        );
        let mut tx = self.live.db.begin().await.unwrap();
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(&self.slug).bind(action).fetch_all(&mut *tx).await.unwrap()
    }
}

fn refund(amount: i64, customer: &str) -> Value {
    json!({"amount": amount, "customer": customer})
}

/// The text of a tool error result.
fn error_text(result: &rmcp::model::CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "a tool error expected: {result:?}");
    serde_json::to_string(&result.content).unwrap()
}

async fn confirmations(backend: Backend) {
    let site = Site::start(backend).await;
    let (status, grant) = site
        .api(
            "owner",
            "POST",
            "grants",
            Some(json!({"server": "pay", "role": "worker", "name": "refund", "confirm": "caller"})),
        )
        .await;
    assert_eq!(status, 201, "{grant}");
    assert_eq!(grant["confirm"], "caller", "{grant}");
    assert!(grant["cedar"].as_str().unwrap().starts_with("@confirm(\"caller\")\n"), "{grant}");
    let (status, refused) = site
        .api(
            "owner",
            "POST",
            "grants",
            Some(json!({"server": "pay", "role": "worker", "kind": "prompt", "name": "x", "confirm": "caller"})),
        )
        .await;
    assert_eq!((status, refused["field"].as_str()), (422, Some("confirm")), "tool grants only: {refused}");

    caller_in_a_session(&site).await;
    caller_on_2026_07_28(&site).await;
    caller_with_the_python_sdk(&site).await;
    policy_confirmations(&site).await;
    approvers(&site).await;
}

/// rmcp's client in a session: asked by elicitation before anything is forwarded.
async fn caller_in_a_session(site: &Site) {
    let accepts = Person::answering(Some(ElicitationAction::Accept));
    let walt = site.client("walt", &accepts).await;
    let done = call(&walt, "pay__refund", refund(500, "acme")).await.unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(site.ledger(), vec![refund(500, "acme")], "forwarded once, with the arguments shown");
    let asked = accepts.asked();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains("Server: pay\n"), "{}", asked[0]);
    assert!(asked[0].contains("Tool: Refund a payment (pay__refund)\n"), "{}", asked[0]);
    assert!(asked[0].contains("{\"amount\":500,\"customer\":\"acme\"}"), "{}", asked[0]);
    walt.cancel().await.unwrap();

    let declines = Person::answering(Some(ElicitationAction::Decline));
    let walt = site.client("walt", &declines).await;
    let refused = call(&walt, "pay__refund", refund(600, "acme")).await.unwrap();
    assert!(error_text(&refused).contains("declined"), "{refused:?}");
    assert_eq!(site.ledger().len(), 1, "a declined call is never forwarded");
    walt.cancel().await.unwrap();

    let mute = Person::answering(None);
    let walt = site.client("walt", &mute).await;
    let refused = call(&walt, "pay__refund", refund(700, "acme")).await.unwrap_err();
    assert_eq!(refused.code.0, -32021, "{refused:?}");
    assert!(refused.message.contains("cannot give"), "{refused:?}");
    assert_eq!(site.ledger().len(), 1, "nothing forwarded without a way to ask");
    walt.cancel().await.unwrap();

    let answers = site.events("confirm.answer").await;
    assert!(answers.iter().any(|(_, o, c, _)| o == "ok" && c.is_none()), "{answers:?}");
    assert!(answers.iter().any(|(_, o, c, _)| o == "denied" && c.as_deref() == Some("confirmation_declined")));
    let calls = site.events("tools/call").await;
    let confirmed = calls.iter().find(|(_, o, _, p)| o == "ok" && p.as_deref().is_some_and(|p| p.contains("confirm")));
    let policy: Value = serde_json::from_str(confirmed.unwrap().3.as_deref().unwrap()).unwrap();
    assert_eq!(policy["confirm"]["answered_by"], site.subject("walt"), "{policy}");
    let id = policy["confirm"]["id"].as_str().unwrap();
    let requests = site.events("confirm.request").await;
    assert!(requests.iter().any(|(_, _, _, p)| p.as_deref().is_some_and(|p| p.contains(id))), "linked by its id");
    assert!(calls.iter().any(|(_, o, c, _)| o == "denied" && c.as_deref() == Some("confirmation_unavailable")));
}

/// A 2026-07-28 caller: `input_required` with the elicitation; the retry's consent is bound to
/// the arguments and used once.
async fn caller_on_2026_07_28(site: &Site) {
    let walt = modern_client(&site.live.url(), &site.token("walt"), false).await;
    let ask = |args: Value, state: Option<String>, action: &str| {
        let mut p = CallToolRequestParams::new("pay__refund").with_arguments(args.as_object().cloned().unwrap());
        if let Some(state) = state {
            p.request_state = Some(state);
            p.input_responses = Some([("confirm".to_owned(), json!({"action": action, "content": {}}))].into());
        }
        p
    };
    let before = site.ledger().len();
    let asked = walt.call_tool_once(ask(refund(42, "globex"), None, "")).await.unwrap();
    let CallToolResponse::InputRequired(asked) = asked else { panic!("input_required expected: {asked:?}") };
    let requests = serde_json::to_value(asked.input_requests.as_ref().unwrap()).unwrap();
    assert_eq!(requests["confirm"]["method"], "elicitation/create", "{requests}");
    assert!(requests.to_string().contains("Refund a payment"), "{requests}");
    let state = asked.request_state.expect("a requestState");
    assert_eq!(site.ledger().len(), before, "nothing forwarded before the answer");

    let invalid = |r: Result<CallToolResponse, rmcp::ServiceError>| match r {
        Err(rmcp::ServiceError::McpError(e)) => e.message.contains("invalid confirmation"),
        _ => false,
    };
    let swapped = walt.call_tool_once(ask(refund(4200, "globex"), Some(state.clone()), "accept")).await;
    assert!(invalid(swapped), "a consent for other arguments");
    let mike = modern_client(&site.live.url(), &site.token("mike"), false).await;
    let stolen = mike.call_tool_once(ask(refund(42, "globex"), Some(state.clone()), "accept")).await;
    assert!(!matches!(stolen, Ok(CallToolResponse::Complete(ref r)) if r.is_error != Some(true)), "{stolen:?}");
    assert_eq!(site.ledger().len(), before, "neither forwarded");

    // The retry carrying the consent reaches another replica: nothing waited on the first.
    let replica = site.live.replica().await;
    let other = modern_client(&format!("http://{}/mcp", replica.addr), &site.token("walt"), false).await;
    let done = other.call_tool_once(ask(refund(42, "globex"), Some(state.clone()), "accept")).await.unwrap();
    other.cancel().await.unwrap();
    let CallToolResponse::Complete(done) = done else { panic!("the result expected: {done:?}") };
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(site.ledger().last(), Some(&refund(42, "globex")));
    let replayed = walt.call_tool_once(ask(refund(42, "globex"), Some(state), "accept")).await;
    assert!(invalid(replayed), "a consent is used once");
    assert_eq!(site.ledger().len(), before + 1, "forwarded exactly once");

    let asked = walt.call_tool_once(ask(refund(43, "globex"), None, "")).await.unwrap();
    let CallToolResponse::InputRequired(asked) = asked else { panic!("input_required expected") };
    let declined = walt.call_tool_once(ask(refund(43, "globex"), asked.request_state, "decline")).await.unwrap();
    let CallToolResponse::Complete(declined) = declined else { panic!("a tool error expected") };
    assert!(error_text(&declined).contains("declined"));
    assert_eq!(site.ledger().len(), before + 1, "a decline forwards nothing");
    let invalid_answers = site.events("confirm.answer").await;
    assert!(
        invalid_answers.iter().filter(|(_, _, c, _)| c.as_deref() == Some("confirmation_invalid")).count() >= 2,
        "swapped arguments and the replay are audited: {invalid_answers:?}"
    );
    mike.cancel().await.unwrap();

    // A 2026-07-28 upstream that asks its own question once the call is confirmed: the question
    // passes through, and the retry that answers it goes on once (a replay is a new call
    // upstream, so it is refused).
    let (mut child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &[]).await;
    let everything = json!({"type": "http", "url": format!("http://{addr}/mcp")});
    let mut tx = site.live.db.begin().await.unwrap();
    entities::create_entity(&mut tx, &site.slug, "defaults/mcp-servers/ev", &everything).await.unwrap();
    entities::bind_server(&mut tx, &site.slug, "ev", "local").await.unwrap();
    let kind = entities::GrantKind::Tool;
    let caller = Some(scopegate::model::Confirm::Caller);
    entities::grant_confirmed(&mut tx, &site.slug, "ev", Role::Worker, kind, "test_elicitation", caller).await.unwrap();
    tx.commit().await.unwrap();
    let elicit = |state: Option<String>, key: &str, answer: Value| {
        let mut p = CallToolRequestParams::new("ev__test_elicitation")
            .with_arguments(json!({"message": "who passes through?"}).as_object().cloned().unwrap());
        if let Some(state) = state {
            p.request_state = Some(state);
            p.input_responses = Some([(key.to_owned(), answer)].into());
        }
        p
    };
    let confirm = eventually("the new server's grant is seen", || async {
        match walt.call_tool_once(elicit(None, "", Value::Null)).await {
            Ok(CallToolResponse::InputRequired(asked)) => Some(asked),
            _ => None,
        }
    })
    .await;
    assert!(confirm.input_requests.as_ref().unwrap().contains_key("confirm"), "{confirm:?}");
    let accept = json!({"action": "accept", "content": {}});
    let asked = walt.call_tool_once(elicit(confirm.request_state, "confirm", accept)).await.unwrap();
    let CallToolResponse::InputRequired(asked) = asked else { panic!("the upstream's question expected: {asked:?}") };
    assert!(asked.input_requests.as_ref().unwrap().contains_key("contact"), "{asked:?}");
    let gary = json!({"action": "accept", "content": {"username": "gary", "email": "gary@globex.test"}});
    let state = asked.request_state;
    let done = walt.call_tool_once(elicit(state.clone(), "contact", gary.clone())).await.unwrap();
    let CallToolResponse::Complete(done) = done else { panic!("the result expected: {done:?}") };
    assert!(serde_json::to_string(&done).unwrap().contains("gary"), "{done:?}");
    let replayed = walt.call_tool_once(elicit(state, "contact", gary)).await;
    assert!(invalid(replayed), "the upstream's round goes on once");
    walt.cancel().await.unwrap();
    child.kill().await.ok();
}

/// The official Python SDK's client: its elicitation callback in a session and through the
/// multi round-trip on 2026-07-28; without one, the clear refusal.
async fn caller_with_the_python_sdk(site: &Site) {
    let before = site.ledger().len();
    for (mode, amount) in [("legacy", 71), ("2026-07-28", 72)] {
        let report = site.python_call("walt", mode, "accept", refund(amount, "initech")).await;
        assert_eq!(report["calls"][0]["ok"], true, "{mode}: {report}");
        assert!(report["asked"][0].as_str().unwrap().contains("Refund a payment (pay__refund)"), "{report}");
        let declined = site.python_call("walt", mode, "decline", refund(amount + 100, "initech")).await;
        assert_eq!(declined["calls"][0]["ok"], false, "{mode}: {declined}");
        let mute = site.python_call("walt", mode, "none", refund(amount + 200, "initech")).await;
        assert!(mute["calls"][0]["error"].as_str().is_some_and(|e| e.contains("cannot give")), "{mode}: {mute}");
    }
    let ledger = site.ledger();
    assert_eq!(ledger[before..], [refund(71, "initech"), refund(72, "initech")], "only the accepted calls");
}

/// A permit policy's `@confirm`: a bad one is refused when saved; a good one asks the caller.
async fn policy_confirmations(site: &Site) {
    let bad =
        "@confirm(\"sometimes\")\npermit (principal in Role::\"manager\", action, resource == Tool::\"pay__refund\");";
    let (status, refused) = site.api("owner", "PUT", "policies/managers", Some(json!({"text": bad}))).await;
    assert_eq!(status, 422, "{refused}");
    assert!(refused.to_string().contains("@confirm"), "{refused}");
    let on_forbid = "@confirm(\"caller\")\nforbid (principal, action, resource == Tool::\"pay__refund\");";
    let (status, _) = site.api("owner", "PUT", "policies/managers", Some(json!({"text": on_forbid}))).await;
    assert_eq!(status, 422, "a forbid confirms nothing");
    let good = "@confirm(\"caller\")\npermit (principal in Role::\"manager\", action == Action::\"pay__refund\", resource) \
                when { context.arguments.amount < 1000 };";
    let (status, saved) = site.api("owner", "PUT", "policies/managers", Some(json!({"text": good}))).await;
    assert_eq!(status, 201, "{saved}");
    let before = site.ledger().len();
    let mute = Person::answering(None);
    let mike = site.client("mike", &mute).await;
    // Every replica loads the tenant's policies within one read of the change counter.
    let refused = eventually("the policy is loaded", || async {
        let refused = call(&mike, "pay__refund", refund(10, "hooli")).await.unwrap_err();
        (refused.code.0 != -32602).then_some(refused)
    })
    .await;
    assert_eq!(refused.code.0, -32021, "a permit with @confirm asks: {refused:?}");
    mike.cancel().await.unwrap();
    let accepts = Person::answering(Some(ElicitationAction::Accept));
    let mike = site.client("mike", &accepts).await;
    call(&mike, "pay__refund", refund(10, "hooli")).await.unwrap();
    assert_eq!(accepts.asked().len(), 1);
    assert_eq!(site.ledger()[before..], [refund(10, "hooli")]);
    mike.cancel().await.unwrap();
    // A native tool too: the gateway's own `whoami` behind a permit asking its caller.
    let native =
        "@confirm(\"caller\")\npermit (principal in Role::\"manager\", action == Action::\"whoami\", resource);";
    let (status, saved) = site.api("owner", "PUT", "policies/native", Some(json!({"text": native}))).await;
    assert_eq!(status, 201, "{saved}");
    let mike = site.client("mike", &mute).await;
    let refused = eventually("the native policy is loaded", || async {
        let answer = call(&mike, "whoami", json!({})).await;
        answer.err().filter(|e| e.code.0 == -32021)
    })
    .await;
    assert!(refused.message.contains("cannot give"), "{refused:?}");
    mike.cancel().await.unwrap();
    let mike = site.client("mike", &accepts).await;
    let me = call(&mike, "whoami", json!({})).await.unwrap();
    assert_ne!(me.is_error, Some(true), "{me:?}");
    assert!(accepts.asked().last().unwrap().contains("Server: scopegate\nTool: whoami\n"), "{:?}", accepts.asked());
    mike.cancel().await.unwrap();
    for id in ["managers", "native"] {
        let (status, _) = site.api("owner", "DELETE", &format!("policies/{id}"), None).await;
        assert_eq!(status, 204);
    }
}

/// `approver`: the call waits for a second person of the tenant, who decides in the console (in
/// headless Chromium) or through the admin API.
async fn approvers(site: &Site) {
    let (status, grants) = site.api("owner", "GET", "grants", None).await;
    assert_eq!(status, 200, "{grants}");
    let caller_grant =
        grants["items"].as_array().unwrap().iter().find(|g| g["confirm"] == "caller" && g["name"] == "refund").unwrap();
    let path = format!("grants/{}", caller_grant["id"].as_str().unwrap());
    let (status, _) = site.api("owner", "DELETE", &path, None).await;
    assert_eq!(status, 204, "the caller grant revoked");
    let body = json!({"server": "pay", "role": "worker", "name": "refund", "confirm": "approver"});
    let (status, view) = site.api("owner", "POST", "grants", Some(body)).await;
    assert_eq!(status, 201, "{view}");
    let before = site.ledger().len();
    // Approved by a second person: forwarded once, with the arguments shown.
    let mute = Person::answering(None);
    let walt = site.client("walt", &mute).await;
    let waiting = tokio::spawn({
        let walt = walt.peer().clone();
        async move { call(&walt, "pay__refund", refund(900, "umbrella")).await }
    });
    let pending = eventually("walt's call waits for an approver", || async {
        let items = site.approvals("ann", "pending").await;
        items.into_iter().next()
    })
    .await;
    assert_eq!(pending["arguments"], refund(900, "umbrella"), "{pending}");
    assert_eq!(pending["caller"], site.subject("walt"), "{pending}");
    assert_eq!(pending["title"], "Refund a payment", "{pending}");
    assert_eq!(site.ledger().len(), before, "nothing forwarded while it waits");
    let id = pending["id"].as_str().unwrap().to_owned();
    let (status, _) = site.api("audrey", "POST", &format!("approvals/{id}/approve"), None).await;
    assert_eq!(status, 403, "an auditor sees, never decides");
    assert_eq!(site.approvals("audrey", "pending").await.len(), 1, "auditors read the list");
    let (status, _) = site.api("walt", "GET", "approvals", None).await;
    assert_eq!(status, 403, "a worker does not read it");
    // The approver signs in to the console, lands on the waiting calls, reads the exact
    // arguments, and approves.
    let browser = Browser::start().await;
    let db = if site.slug.ends_with("lite") { "sqlite" } else { "postgres" };
    browser.goto(&format!("{}/console", site.live.base_url())).await;
    browser.type_into("#token", &site.token("ann")).await;
    browser.click("#sign-in").await;
    browser.wait_for_url(&format!("/console/tenants/{}/approvals", site.slug)).await;
    let card = format!("#approvals .approval[data-id='{id}']");
    let heading = browser.text(&format!("{card} h3")).await;
    assert!(heading.contains("Refund a payment") && heading.contains("pay__refund"), "{heading}");
    assert_eq!(browser.text(&format!("{card} .caller")).await, site.subject("walt"));
    let shown = browser.text(&format!("{card} pre.arguments")).await;
    assert!(shown.contains("\"amount\": 900") && shown.contains("umbrella"), "{shown}");
    assert_eq!(browser.text(&format!("{card} .digest")).await, pending["args_digest"].as_str().unwrap());
    let shot = browser.screenshot(&format!("console-{db}-approvals")).await;
    browser.click(&format!("{card} button.approve")).await;
    browser.wait_for_url(&format!("/console/tenants/{}/approvals?done=1", site.slug)).await;
    assert!(browser.text("#decided").await.contains("approved"), "listed as decided");
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000, "{} holds a picture", shot.display());
    let done = waiting.await.unwrap().unwrap();
    assert_ne!(done.is_error, Some(true), "{done:?}");
    assert_eq!(site.ledger()[before..], [refund(900, "umbrella")]);
    let (status, _) = site.api("ann", "POST", &format!("approvals/{id}/approve"), None).await;
    assert_eq!(status, 409, "decided once");

    // Rejected, with a reason the caller is told.
    let waiting = tokio::spawn({
        let walt = walt.peer().clone();
        async move { call(&walt, "pay__refund", refund(901, "umbrella")).await }
    });
    let pending =
        eventually("the second call waits", || async { site.approvals("ann", "pending").await.into_iter().next() })
            .await;
    let id = pending["id"].as_str().unwrap().to_owned();
    // Decided through another replica: the waiting call reads its approval from the database.
    let replica = site.live.replica().await;
    let reason = json!({"reason": "not this customer"});
    let path = format!("approvals/{id}/reject");
    let (status, _) = site.api_at(&format!("http://{}", replica.addr), "ann", "POST", &path, Some(reason)).await;
    assert_eq!(status, 200);
    let refused = waiting.await.unwrap().unwrap();
    assert!(error_text(&refused).contains("not this customer"), "{refused:?}");
    walt.cancel().await.unwrap();

    // The caller's own approval is refused even with the role; nobody deciding lapses it.
    let wendy_grant = json!({"server": "pay", "role": "approver", "name": "refund", "confirm": "approver"});
    let (status, _) = site.api("owner", "POST", "grants", Some(wendy_grant)).await;
    assert_eq!(status, 201);
    let wendy = site.client("wendy", &mute).await;
    let waiting = tokio::spawn({
        let wendy = wendy.peer().clone();
        async move { call(&wendy, "pay__refund", refund(902, "umbrella")).await }
    });
    let pending =
        eventually("wendy's call waits", || async { site.approvals("ann", "pending").await.into_iter().next() }).await;
    let id = pending["id"].as_str().unwrap().to_owned();
    let (status, own) = site.api("wendy", "POST", &format!("approvals/{id}/approve"), None).await;
    assert_eq!(status, 403, "never one's own call: {own}");
    // In the console, wendy sees her own call without a form; an auditor reads, with none.
    browser.click("header form button").await;
    browser.wait_for_url("/console?signed_out=1").await;
    for (who, landing) in [("wendy", "approvals"), ("audrey", "audit")] {
        browser.goto(&format!("{}/console", site.live.base_url())).await;
        browser.type_into("#token", &site.token(who)).await;
        browser.click("#sign-in").await;
        browser.wait_for_url(&format!("/console/tenants/{}/{landing}", site.slug)).await;
        browser.goto(&format!("{}/console/tenants/{}/approvals", site.live.base_url(), site.slug)).await;
        let card = format!("#approvals .approval[data-id='{id}']");
        assert!(browser.text(&format!("{card} h3")).await.contains("pay__refund"), "{who} sees the call");
        let forms = browser.execute(&format!("return document.querySelectorAll(\"{card} form\").length")).await;
        assert_eq!(forms, 0, "{who} gets no form");
        browser.click("header form button").await;
        browser.wait_for_url("/console?signed_out=1").await;
    }
    assert!(!browser.text("body").await.is_empty());
    browser.quit().await;
    let refused = waiting.await.unwrap().unwrap();
    assert!(error_text(&refused).contains("no approver decided in time"), "{refused:?}");
    let (status, late) = site.api("ann", "POST", &format!("approvals/{id}/approve"), None).await;
    assert_eq!(status, 409, "a lapsed call can't be approved: {late}");
    assert_eq!(site.ledger().len(), before + 1, "only the approved call was forwarded");
    wendy.cancel().await.unwrap();

    // A 2026-07-28 caller that declared the tasks extension gets a task at once; it runs the
    // call once approved, and fails with the reason when rejected.
    let tasks = modern_client(&site.live.url(), &site.token("walt"), true).await;
    let tasks_ledger = site.ledger().len();
    for (amount, decision) in [(903, "approve"), (904, "reject")] {
        let p = CallToolRequestParams::new("pay__refund")
            .with_arguments(refund(amount, "tyrell").as_object().cloned().unwrap());
        let id = match tasks_call(&tasks, p).await {
            CallToolResponse::Task(task) => task.task.task_id,
            other => panic!("a task expected: {other:?}"),
        };
        let pending = eventually("the task's call waits", || async {
            site.approvals("ann", "pending").await.into_iter().find(|a| a["arguments"]["amount"] == amount)
        })
        .await;
        assert_eq!(pending["via"], "task", "{pending}");
        let forwarded = |amount: i64| site.ledger().contains(&refund(amount, "tyrell"));
        assert!(!forwarded(amount), "nothing forwarded before the decision");
        let path = format!("approvals/{}/{decision}", pending["id"].as_str().unwrap());
        let (status, _) = site.api("ann", "POST", &path, Some(json!({"reason": "tasks too"}))).await;
        assert_eq!(status, 200);
        let ended = eventually("the task ends", || async {
            let got = tasks.get_task(rmcp::model::GetTaskParams::new(id.clone())).await.unwrap();
            got.task.task.status.is_terminal().then_some(got)
        })
        .await;
        let ended = serde_json::to_value(&ended).unwrap();
        match decision {
            "approve" => assert_eq!(ended["status"], "completed", "{ended}"),
            _ => assert!(ended["status"] == "failed" && ended.to_string().contains("tasks too"), "{ended}"),
        }
    }
    assert_eq!(site.ledger()[tasks_ledger..], [refund(903, "tyrell")], "only the approved task's call");
    tasks.cancel().await.unwrap();

    // The operator's CLI lists and shows them, and decides none.
    let cli = async |args: &[&str]| {
        let out = tokio::process::Command::new(SCOPEGATE)
            .env("RUST_LOG", "warn")
            .env("SCOPEGATE_DATABASE__URL", site.live.config.database.url.expose())
            .args(args)
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed: Value = serde_json::from_str(
        &cli(&["admin", "--json", "approval", "list", "--tenant", &site.slug, "--state", "all"]).await,
    )
    .unwrap();
    let states: Vec<&str> = listed.as_array().unwrap().iter().map(|a| a["state"].as_str().unwrap()).collect();
    for state in ["approved", "rejected", "lapsed"] {
        assert!(states.contains(&state), "{state} in {listed}");
    }
    let shown: Value =
        serde_json::from_str(&cli(&["admin", "--json", "approval", "show", "--tenant", &site.slug, &id]).await)
            .unwrap();
    assert_eq!(shown["arguments"], refund(902, "umbrella"), "{shown}");

    let decisions = site.events("admin.approval.approve").await;
    let classes: Vec<Option<&str>> = decisions.iter().map(|(_, _, c, _)| c.as_deref()).collect();
    for class in [None, Some("not_approver"), Some("settled"), Some("own_call")] {
        assert!(classes.contains(&class), "{class:?} in {classes:?}");
    }
    let calls = site.events("tools/call").await;
    for class in ["approval_rejected", "approval_lapsed"] {
        assert!(calls.iter().any(|(_, o, c, _)| o == "denied" && c.as_deref() == Some(class)), "{class}: {calls:?}");
    }
    // Every question, answer, decision and refusal sits in the one chain, which holds.
    let (status, chain) = site.api("audrey", "GET", "audit/verification", None).await;
    assert_eq!((status, &chain["verified"]), (200, &json!(true)), "{chain}");
    let approved_call =
        calls.iter().find(|(_, _, _, p)| p.as_deref().is_some_and(|p| p.contains("\"by\":\"approver\"")));
    assert!(approved_call.unwrap().3.as_deref().unwrap().contains(&site.subject("ann")), "the approver is named");
}

/// One `tools/call` of `client`, answered as it comes (a task, a result).
async fn tasks_call(
    client: &rmcp::service::RunningService<RoleClient, rmcp::model::ClientConfig>,
    params: CallToolRequestParams,
) -> CallToolResponse {
    client.call_tool_once(params).await.unwrap_or_else(|e| panic!("tools/call: {e}"))
}

both_dbs!(confirmed_calls, confirmations);
