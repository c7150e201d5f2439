//! The MCP surface beyond tools, through the gateway: the upstreams' prompts, resources,
//! resource templates and completions (aggregated, renamed, granted by kind, audited), the
//! requests an upstream makes of its caller (sampling, elicitation, roots) relayed to the one
//! session whose call it serves, per-session log levels, list changes and resource
//! subscriptions. The upstream is the fixture's `everything` mode (the conformance suite's
//! reference behaviour), a real child process over stdio; rmcp's client over real HTTP; on
//! SQLite and PostgreSQL.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
#[allow(deprecated)]
use rmcp::model::{
    ClientCapabilities, ClientConfig, CompleteRequestParams, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, GetPromptRequestParams, ListRootsResult, LoggingLevel,
    LoggingMessageNotificationParam, PaginatedRequestParams, ReadResourceRequestParams, Reference,
    ResourceUpdatedNotificationParam, Root, SamplingMessage, SetLevelRequestParams, SubscribeRequestParams,
    UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient, RunningService, ServiceError};
use rmcp::{ClientHandler, ErrorData};
use scopegate::model::Role;
use scopegate::store::entities::{self, GrantKind};
use serde_json::{Value, json};

use crate::support::*;

/// How long to listen for a notification that must not come: one that did come went from
/// the upstream to the gateway and on to the session's stream as it arrived, in the
/// milliseconds the notifications waited for above took, and the client's handler task runs
/// right after. A notification that was on its way arrives well within this.
const UNSENT_NOTIFICATION: Duration = Duration::from_millis(300);

/// A gateway with the demo data and the local executor.
struct Surface {
    live: Live,
    _root: tempfile::TempDir,
}

impl Surface {
    async fn start(backend: Backend, mode: Mode) -> Self {
        let root = tempfile::tempdir().unwrap();
        let root_uri = format!("file://{}", root.path().canonicalize().unwrap().display());
        let overrides = [("upstream.local_root", json!(root_uri)), ("upstream.connect_timeout_secs", json!(10))];
        let live = Live::start(backend, mode, &overrides).await;
        let mut tx = live.db.begin().await.unwrap();
        entities::create_executor(&mut tx, "local", "gw-host", "gateway", "local", &[]).await.unwrap();
        tx.commit().await.unwrap();
        Self { live, _root: root }
    }

    /// Declares the reference upstream as `server` of `tenant` and binds it (with or without
    /// the `server__` prefix).
    async fn declare(&self, tenant: &str, server: &str, prefixed: bool, env: Value) {
        let declaration = json!({"command": FIXTURE, "args": ["everything", "stdio"], "env": env});
        let mut tx = self.live.db.begin().await.unwrap();
        entities::create_entity(&mut tx, tenant, &format!("defaults/mcp-servers/{server}"), &declaration)
            .await
            .unwrap();
        entities::bind_server_with_prefix(&mut tx, tenant, server, "local", unprefixed_beside(prefixed)).await.unwrap();
        tx.commit().await.unwrap();
    }

    async fn grant(&self, tenant: &str, server: &str, role: Role, kind: GrantKind, name: &str) {
        let mut tx = self.live.db.begin().await.unwrap();
        entities::grant(&mut tx, tenant, server, role, kind, name).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// `ref` (prefixed): the owner may use everything; the worker one prompt and one resource.
    async fn with_ref(backend: Backend, mode: Mode) -> Self {
        let surface = Self::start(backend, mode).await;
        surface.declare("acme", "ref", true, json!({})).await;
        for kind in [GrantKind::Tool, GrantKind::Prompt, GrantKind::Resource] {
            surface.grant("acme", "ref", Role::Owner, kind, "*").await;
        }
        surface.grant("acme", "ref", Role::Worker, GrantKind::Prompt, "test_simple_prompt").await;
        surface.grant("acme", "ref", Role::Worker, GrantKind::Resource, "test://static-text").await;
        surface.grant("acme", "ref", Role::Worker, GrantKind::Tool, "test_sampling").await;
        surface
    }

    /// rmcp's client with `handler` (its capabilities and its answers) for `subject`.
    async fn client<H: ClientHandler>(&self, subject: &str, handler: H) -> RunningService<RoleClient, H> {
        self.live.client_with(subject, handler).await
    }

    /// Audit rows of `tenant` whose tool starts with `prefix`: (tool, outcome, error class).
    async fn audited(&self, prefix: &str) -> Vec<(String, String, Option<String>)> {
        self.live.settle_audit().await;
        eventually(format!("audit events of {prefix}"), || async {
            let mut tx = self.live.db.begin().await.unwrap();
            let sql =
                format!("SELECT tool, outcome, error_class FROM {AUDITED_CALLS} e WHERE tool LIKE $1 ORDER BY seq");
            let rows: Vec<(String, String, Option<String>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(sql)).bind(format!("{prefix}%")).fetch_all(&mut *tx).await.unwrap();
            (!rows.is_empty()).then_some(rows)
        })
        .await
    }
}

fn error_of<T: std::fmt::Debug>(result: Result<T, ServiceError>) -> ErrorData {
    match result {
        Err(ServiceError::McpError(e)) => e,
        other => panic!("expected an MCP error, got {other:?}"),
    }
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect()
}

async fn prompt_names(client: &rmcp::Peer<RoleClient>) -> Vec<String> {
    client.list_all_prompts().await.unwrap().into_iter().map(|p| p.name).collect()
}

async fn resource_uris(client: &rmcp::Peer<RoleClient>) -> Vec<String> {
    client.list_all_resources().await.unwrap().into_iter().map(|r| r.uri).collect()
}

/// Prompts, resources, templates and completions of a prefixed server, for a caller with
/// every grant and for one with two narrow grants: what is not granted is not listed and
/// answers exactly like what does not exist. Every request is audited.
async fn prompts_and_resources(backend: Backend, mode: Mode) {
    let surface = Surface::with_ref(backend, mode).await;
    let olivia = surface.client("olivia@acme.test", ()).await;

    let prompts = prompt_names(&olivia).await;
    for expected in ["ref__test_simple_prompt", "ref__test_prompt_with_arguments"] {
        assert!(prompts.iter().any(|p| p == expected), "{expected} in {prompts:?}");
    }
    let mut params = GetPromptRequestParams::new("ref__test_prompt_with_arguments");
    params.arguments = json!({"arg1": "first-value", "arg2": "second-value"}).as_object().cloned();
    let rendered = serde_json::to_string(&olivia.get_prompt(params).await.unwrap()).unwrap();
    assert!(rendered.contains("first-value") && rendered.contains("second-value"), "{rendered}");

    let uris = resource_uris(&olivia).await;
    assert!(uris.iter().any(|u| u == "scopegate://ref/test://static-text"), "{uris:?}");
    assert!(uris.iter().all(|u| u.starts_with("scopegate://ref/")), "every URI is minted: {uris:?}");
    let read =
        olivia.read_resource(ReadResourceRequestParams::new("scopegate://ref/test://static-text")).await.unwrap();
    let read = serde_json::to_value(&read).unwrap();
    assert_eq!(
        read["contents"][0]["uri"], "scopegate://ref/test://static-text",
        "contents come back under the exposed URI"
    );
    assert!(read["contents"][0]["text"].as_str().is_some_and(|t| !t.is_empty()), "{read}");

    let templates = olivia.list_all_resource_templates().await.unwrap();
    let template = templates.iter().map(|t| t.uri_template.as_str()).find(|t| t.contains("template/{id}"));
    assert_eq!(template, Some("scopegate://ref/test://template/{id}/data"), "{templates:?}");
    let read = olivia.read_resource(ReadResourceRequestParams::new("scopegate://ref/test://template/123/data")).await;
    let read = serde_json::to_value(read.unwrap()).unwrap();
    assert!(read["contents"][0]["text"].as_str().is_some_and(|t| t.contains("123")), "{read}");

    let completion = olivia
        .complete(CompleteRequestParams::new(
            Reference::for_prompt("ref__test_prompt_with_arguments"),
            rmcp::model::ArgumentInfo::new("arg1", ""),
        ))
        .await
        .unwrap();
    let _ = completion; // the reference server may complete nothing; the request reached it (audited below)

    // Not granted and not existing answer alike.
    let wanda = surface.client("wanda@acme.test", ()).await;
    assert_eq!(prompt_names(&wanda).await, ["ref__test_simple_prompt"]);
    assert_eq!(resource_uris(&wanda).await, ["scopegate://ref/test://static-text"]);
    let ungranted = error_of(wanda.get_prompt(GetPromptRequestParams::new("ref__test_prompt_with_arguments")).await);
    let missing = error_of(wanda.get_prompt(GetPromptRequestParams::new("ref__no_such_prompt")).await);
    assert_eq!((ungranted.code, &ungranted.message), (missing.code, &missing.message));
    let ungranted =
        error_of(wanda.read_resource(ReadResourceRequestParams::new("scopegate://ref/test://static-binary")).await);
    // Missing at the upstream (asked by the owner, whose grant covers it) answers the same.
    let missing =
        error_of(olivia.read_resource(ReadResourceRequestParams::new("scopegate://ref/test://nothing-here")).await);
    let foreign = error_of(
        wanda.read_resource(ReadResourceRequestParams::new("scopegate://globex-srv/test://static-text")).await,
    );
    assert_eq!(ungranted.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND);
    for other in [&missing, &foreign] {
        assert_eq!((other.code, &other.message), (ungranted.code, &ungranted.message));
    }
    // Walt (a worker of acme with no narrower grant... the same role) and an auditor with none.
    let audrey = surface.client("audrey@acme.test", ()).await;
    assert!(prompt_names(&audrey).await.is_empty());
    assert!(resource_uris(&audrey).await.is_empty());

    let rows = surface.audited("prompts/get").await;
    assert!(rows.iter().any(|(t, o, _)| t == "prompts/get ref__test_prompt_with_arguments" && o == "ok"), "{rows:?}");
    assert!(rows.iter().any(|(_, o, c)| o == "denied" && c.as_deref() == Some("not_found")), "{rows:?}");
    let rows = surface.audited("resources/read").await;
    assert!(rows.iter().filter(|(_, o, _)| o == "ok").count() >= 2, "{rows:?}");
    assert!(rows.iter().any(|(_, o, _)| o == "denied"), "{rows:?}");
    assert!(!surface.audited("completion/complete").await.is_empty());
    for client in [olivia.cancel().await, wanda.cancel().await, audrey.cancel().await] {
        client.unwrap();
    }
}

all_modes!(surface_prompts_resources_templates_and_completion, prompts_and_resources);

/// Two prefixed servers with the same URIs never collide; the tenant's unprefixed server
/// exposes its names and URIs as they are, and never shadows a native tool.
async fn collisions_and_no_prefix(backend: Backend, mode: Mode) {
    let surface = Surface::start(backend, mode).await;
    for (server, prefixed) in [("one", true), ("two", true), ("bare", false)] {
        surface.declare("acme", server, prefixed, json!({})).await;
        for kind in [GrantKind::Tool, GrantKind::Prompt, GrantKind::Resource] {
            surface.grant("acme", server, Role::Owner, kind, "*").await;
        }
    }
    let olivia = surface.client("olivia@acme.test", ()).await;
    let uris = resource_uris(&olivia).await;
    for expected in ["scopegate://one/test://static-text", "scopegate://two/test://static-text", "test://static-text"] {
        assert_eq!(uris.iter().filter(|u| *u == expected).count(), 1, "{expected} once in {uris:?}");
    }
    let tools: Vec<String> = olivia.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    for expected in ["one__test_simple_text", "two__test_simple_text", "test_simple_text", "whoami"] {
        assert_eq!(tools.iter().filter(|t| *t == expected).count(), 1, "{expected} once in {tools:?}");
    }
    let result = call(&olivia, "test_simple_text", json!({})).await.unwrap();
    assert!(!text_of(&result).is_empty());
    let prompts = prompt_names(&olivia).await;
    assert!(
        prompts.iter().any(|p| p == "test_simple_prompt") && prompts.iter().any(|p| p == "one__test_simple_prompt")
    );
    let read = olivia.read_resource(ReadResourceRequestParams::new("test://static-text")).await.unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap()["contents"][0]["uri"], "test://static-text");
    // The native tool is still the gateway's own.
    let whoami = call(&olivia, "whoami", json!({})).await.unwrap();
    assert_eq!(whoami.structured_content.unwrap()["tenant"], "acme");
    olivia.cancel().await.unwrap();
}

all_modes!(surface_names_and_uris_never_collide, collisions_and_no_prefix);

/// A client that can answer sampling, elicitation and roots, and records what it was asked.
#[derive(Clone, Default)]
struct Answering {
    /// Declares no capability (and still records what it is asked).
    silent: bool,
    asked: Arc<Mutex<Vec<String>>>,
    logs: Arc<Mutex<Vec<String>>>,
    updates: Arc<Mutex<Vec<String>>>,
    list_changes: Arc<Mutex<usize>>,
}

#[allow(deprecated)]
impl ClientHandler for Answering {
    fn get_info(&self) -> ClientConfig {
        let mut caps = ClientCapabilities::default();
        if !self.silent {
            caps.sampling = Some(Default::default());
            caps.elicitation = Some(Default::default());
            caps.roots = Some(Default::default());
        }
        ClientConfig::new(caps, rmcp::model::Implementation::new("answering", "1"))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.asked.lock().unwrap().push(format!("sampling {}", serde_json::to_string(&params.messages).unwrap()));
        // A person takes a moment: concurrent calls overlap while they wait.
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(CreateMessageResult::new(SamplingMessage::assistant_text("a sampled answer"), "test-model".to_owned()))
    }

    async fn create_elicitation(
        &self,
        params: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.asked.lock().unwrap().push(format!("elicitation {}", serde_json::to_string(&params).unwrap()));
        Ok(ElicitResult::new(ElicitationAction::Accept)
            .with_content(json!({"username": "olivia", "email": "olivia@acme.test"})))
    }

    async fn list_roots(&self, _context: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        self.asked.lock().unwrap().push("roots".to_owned());
        Ok(ListRootsResult::new(vec![Root::new("file:///work/project")]))
    }

    async fn on_logging_message(&self, params: LoggingMessageNotificationParam, _: NotificationContext<RoleClient>) {
        self.logs.lock().unwrap().push(format!("{:?}", params.level));
    }

    async fn on_resource_updated(&self, params: ResourceUpdatedNotificationParam, _: NotificationContext<RoleClient>) {
        self.updates.lock().unwrap().push(params.uri);
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        *self.list_changes.lock().unwrap() += 1;
    }
}

/// What [`requests_of_the_client`] and [`requests_of_the_client_over_http`] check, with the
/// reference upstream as `server`.
async fn relays_requests_of_the_client(surface: &Surface, server: &str) {
    let tool = |name: &str| format!("{server}__{name}");
    let answering = Answering::default();
    let olivia = surface.client("olivia@acme.test", answering.clone()).await;
    let silent = Answering { silent: true, ..Answering::default() };
    let plain = surface.client("olivia@acme.test", silent.clone()).await;

    let result = call(&olivia, &tool("test_sampling"), json!({"prompt": "hello from the test"})).await.unwrap();
    assert!(text_of(&result).contains("a sampled answer"), "{result:?}");
    let result = call(&olivia, &tool("test_elicitation"), json!({"message": "who are you?"})).await.unwrap();
    assert!(text_of(&result).contains("olivia"), "{result:?}");
    let result = call(&olivia, &tool("list_client_roots"), json!({})).await.unwrap();
    assert_eq!(text_of(&result), "roots: file:///work/project", "{result:?}");
    let asked = answering.asked.lock().unwrap().clone();
    assert!(asked.iter().any(|a| a.starts_with("sampling") && a.contains("hello from the test")), "{asked:?}");
    assert!(asked.iter().any(|a| a.starts_with("elicitation") && a.contains("who are you?")), "{asked:?}");

    // The client without the capabilities: the upstream is not told it has them, and the
    // answering client (another session) is never asked on its behalf.
    let before = answering.asked.lock().unwrap().len();
    let result = call(&plain, &tool("test_sampling"), json!({"prompt": "not you"})).await.unwrap();
    assert!(!text_of(&result).contains("a sampled answer"), "{result:?}");
    assert_eq!(answering.asked.lock().unwrap().len(), before, "nobody else was asked");
    assert!(silent.asked.lock().unwrap().is_empty(), "a client that declared nothing is asked nothing");

    let rows = surface.audited(&format!("{server}:")).await;
    assert!(rows.iter().any(|(t, o, _)| *t == format!("{server}:sampling/createMessage") && o == "ok"), "{rows:?}");
    assert!(rows.iter().any(|(t, o, _)| *t == format!("{server}:elicitation/create") && o == "ok"), "{rows:?}");
    assert!(rows.iter().any(|(t, o, _)| *t == format!("{server}:roots/list") && o == "ok"), "{rows:?}");
    olivia.cancel().await.unwrap();
    plain.cancel().await.unwrap();
}

/// Sampling and elicitation an upstream asks for while serving a call reach the session that
/// made it (a client that declared them) and the answers go back; a client that did not
/// declare them is never asked. Each relayed request is audited.
async fn requests_of_the_client(backend: Backend) {
    let surface = Surface::with_ref(backend, Mode::Session).await;
    relays_requests_of_the_client(&surface, "ref").await;
}

both_dbs!(surface_relays_requests_of_the_client_to_the_calling_session, requests_of_the_client);

/// The reference upstream over Streamable HTTP as `web` of acme, granted wholly to owners (its
/// process is kept by the caller).
async fn with_web(surface: &Surface) -> tokio::process::Child {
    let (child, addr) = fixture_http(&["everything", "http", "127.0.0.1:0"], &[]).await;
    let declaration = json!({"url": format!("http://{addr}/mcp")});
    let mut tx = surface.live.db.begin().await.unwrap();
    entities::create_entity(&mut tx, "acme", "defaults/mcp-servers/web", &declaration).await.unwrap();
    entities::bind_server(&mut tx, "acme", "web", "local").await.unwrap();
    tx.commit().await.unwrap();
    surface.grant("acme", "web", Role::Owner, GrantKind::Tool, "*").await;
    child
}

/// The same over Streamable HTTP, where the calls of a client that declared sampling,
/// elicitation and roots take the lean relay: the upstream's requests go out on the call's
/// answer and the client's answers come back to the call that asked.
async fn requests_of_the_client_over_http(backend: Backend) {
    let surface = Surface::start(backend, Mode::Session).await;
    let _web = with_web(&surface).await;
    relays_requests_of_the_client(&surface, "web").await;
}

both_dbs!(surface_relays_requests_of_the_client_over_http, requests_of_the_client_over_http);

/// On the lean relay, seen from a raw client: the upstream's sampling request comes as an event
/// of the call's answer, and only the session it went to can answer it. The same principal's
/// other session answering that id is not taken for the answer (rmcp gets it, and it answers
/// nothing); the right session's answer is what the upstream receives.
async fn asked_on_the_answer(backend: Backend) {
    let surface = Surface::start(backend, Mode::Session).await;
    let _web = with_web(&surface).await;
    let live = &surface.live;
    let olivia = live.token_for("olivia@acme.test");
    let session = open_session_declaring(live, &olivia, json!({"sampling": {}})).await;
    let other = open_session(live, &olivia).await.unwrap();
    // Once the session's `initialized` is handled the relay serves its calls (a plain JSON
    // answer shows it; rmcp answers with an event stream).
    eventually("the relay serves the session", || async {
        let reply = post(live, &olivia, Some(&session), &tool_call(9, "web__test_simple_text", json!({})), &[]).await;
        let kind = reply.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        if kind.starts_with("application/json") { Ok(()) } else { Err(kind) }
    })
    .await;

    let answer = |id: &Value, text: &str| {
        json!({"jsonrpc": "2.0", "id": id, "result": {
            "role": "assistant", "model": "raw", "content": {"type": "text", "text": text}}})
        .to_string()
    };
    let call = tool_call(2, "web__test_sampling", json!({"prompt": "raw prompt"}));
    let mut response = send(live, &olivia, Some(&session), call.into_bytes(), &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut text = String::new();
    let mut asked = None;
    let mut result = None;
    while result.is_none() {
        let chunk = tokio::time::timeout(Duration::from_secs(30), response.chunk()).await.unwrap().unwrap();
        let Some(chunk) = chunk else { break };
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = text.find("\n\n") {
            let event: String = text.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data:")) {
                let Ok(message) = serde_json::from_str::<Value>(data.trim()) else { continue };
                if message["method"] == "sampling/createMessage" {
                    assert!(message["params"].to_string().contains("raw prompt"), "{message}");
                    let id = message["id"].clone();
                    // The principal's other session can't answer it.
                    let wrong = post(live, &olivia, Some(&other), &answer(&id, "WRONG"), &[]).await;
                    assert!(wrong.status.is_success() || wrong.status.is_client_error(), "{}", wrong.status);
                    let right = post(live, &olivia, Some(&session), &answer(&id, "RIGHT"), &[]).await;
                    assert!(right.status.is_success(), "{}", right.status);
                    asked = Some(id);
                } else if message["id"] == 2 {
                    result = Some(message);
                }
            }
        }
    }
    assert!(asked.is_some(), "the upstream's request came on the call's answer");
    let result = result.expect("the call's answer");
    let sampled = result["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(sampled.contains("RIGHT") && !sampled.contains("WRONG"), "{result}");
    let rows = surface.audited("web:sampling").await;
    assert!(rows.iter().any(|(_, o, _)| o == "ok"), "{rows:?}");
}

both_dbs!(surface_asks_on_the_answer_and_takes_only_its_sessions_reply, asked_on_the_answer);

/// Each session gets upstream log lines at or above its own `logging/setLevel`.
#[allow(deprecated)]
async fn log_levels(backend: Backend) {
    let surface = Surface::with_ref(backend, Mode::Session).await;
    let quiet = Answering::default();
    let chatty = Answering::default();
    let quiet_client = surface.client("olivia@acme.test", quiet.clone()).await;
    let chatty_client = surface.client("olivia@acme.test", chatty.clone()).await;
    quiet_client.set_level(SetLevelRequestParams::new(LoggingLevel::Error)).await.unwrap();
    chatty_client.set_level(SetLevelRequestParams::new(LoggingLevel::Debug)).await.unwrap();
    call(&quiet_client, "ref__test_tool_with_logging", json!({})).await.unwrap();
    // A log line names no call: within 500 ms of another session's call it is not forwarded.
    tokio::time::sleep(Duration::from_millis(700)).await;
    call(&chatty_client, "ref__test_tool_with_logging", json!({})).await.unwrap();
    assert!(!chatty.logs.lock().unwrap().is_empty(), "the chatty session hears the upstream's log lines");
    assert!(quiet.logs.lock().unwrap().is_empty(), "below the quiet session's level: {:?}", quiet.logs.lock().unwrap());
    quiet_client.cancel().await.unwrap();
    chatty_client.cancel().await.unwrap();
}

both_dbs!(surface_log_levels_are_per_session, log_levels);

/// An update of a resource reaches the sessions subscribed to it and no other; an upstream's
/// list change reaches the sessions that listed through it.
#[allow(deprecated)]
async fn subscriptions_and_list_changes(backend: Backend) {
    let surface = Surface::with_ref(backend, Mode::Session).await;
    let subscribed = Answering::default();
    let other = Answering::default();
    let a = surface.client("olivia@acme.test", subscribed.clone()).await;
    let b = surface.client("olivia@acme.test", other.clone()).await;
    let watched = "scopegate://ref/test://watched-resource";
    a.subscribe(SubscribeRequestParams::new(watched)).await.unwrap();
    let _ = b.list_all_tools().await.unwrap();
    let _ = a.list_all_tools().await.unwrap();
    // The fixture sends an update of the watched resource, and list changes, on request.
    call(&a, "ref__update_watched_resource", json!({})).await.unwrap();
    call(&a, "ref__change_lists", json!({})).await.unwrap();
    eventually("the update and the list change arrive", || async {
        !subscribed.updates.lock().unwrap().is_empty() && *other.list_changes.lock().unwrap() != 0
    })
    .await;
    assert_eq!(subscribed.updates.lock().unwrap().clone(), [watched], "under the URI the session knows");
    assert!(*other.list_changes.lock().unwrap() >= 1, "a session that listed hears of the change");
    tokio::time::sleep(UNSENT_NOTIFICATION).await;
    assert!(other.updates.lock().unwrap().is_empty(), "not subscribed: no update");

    a.unsubscribe(UnsubscribeRequestParams::new(watched)).await.unwrap();
    let not_subscribed = error_of(a.unsubscribe(UnsubscribeRequestParams::new(watched)).await);
    assert_eq!(not_subscribed.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND);
    call(&a, "ref__update_watched_resource", json!({})).await.unwrap();
    tokio::time::sleep(UNSENT_NOTIFICATION).await;
    assert_eq!(subscribed.updates.lock().unwrap().len(), 1, "unsubscribed: no more updates");
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

both_dbs!(surface_subscriptions_and_list_changes_reach_only_their_sessions, subscriptions_and_list_changes);

/// Long lists come in pages whose cursors work for their own session only.
async fn pagination(backend: Backend) {
    let surface = Surface::start(backend, Mode::Session).await;
    surface.declare("acme", "many", true, json!({"FIXTURE_EXTRA_RESOURCES": "230"})).await;
    surface.grant("acme", "many", Role::Owner, GrantKind::Resource, "*").await;
    let a = surface.client("olivia@acme.test", ()).await;
    let b = surface.client("olivia@acme.test", ()).await;
    let first = a.list_resources(None).await.unwrap();
    assert_eq!(first.resources.len(), 100);
    let cursor = first.next_cursor.clone().expect("a second page");
    let all = a.list_all_resources().await.unwrap();
    assert!(all.len() >= 230, "{}", all.len());
    let mut uris: Vec<_> = all.iter().map(|r| r.uri.clone()).collect();
    uris.dedup();
    assert_eq!(uris.len(), all.len(), "no item twice across pages");
    let foreign =
        error_of(b.list_resources(Some(PaginatedRequestParams::default().with_cursor(Some(cursor.clone())))).await);
    assert_eq!(foreign.code, rmcp::model::ErrorCode::INVALID_PARAMS, "another session's cursor");
    let forged = format!("{}x", cursor);
    let forged = error_of(a.list_resources(Some(PaginatedRequestParams::default().with_cursor(Some(forged)))).await);
    assert_eq!(forged.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

both_dbs!(surface_pages_are_sealed_to_their_session, pagination);

/// Replicas on one database share the key that seals the cursors: a stateless caller's next
/// page may come from another replica, which a round-robin balancer does, and it is the same
/// page. (An altered cursor is still refused everywhere: see above.)
async fn pages_across_replicas(backend: Backend) {
    let surface = Surface::start(backend, Mode::Stateless).await;
    surface.declare("acme", "many", true, json!({"FIXTURE_EXTRA_RESOURCES": "230"})).await;
    surface.grant("acme", "many", Role::Owner, GrantKind::Resource, "*").await;
    let second = surface.live.replica().await;
    let second_url = second.url();
    let token = surface.live.token_for("olivia@acme.test");
    let a = modern_at(&surface.live.url(), &token, ()).await;
    let b = modern_at(&second_url, &token, ()).await;
    let first = a.list_resources(None).await.unwrap();
    let cursor = first.next_cursor.clone().expect("a second page");
    let next = || Some(PaginatedRequestParams::default().with_cursor(Some(cursor.clone())));
    let here = a.list_resources(next()).await.unwrap();
    let there = b.list_resources(next()).await.unwrap_or_else(|e| panic!("the other replica refused the cursor: {e}"));
    let uris = |r: &rmcp::model::ListResourcesResult| r.resources.iter().map(|r| r.uri.clone()).collect::<Vec<_>>();
    assert_eq!(uris(&there), uris(&here), "the same second page on either replica");
    assert_eq!(there.resources.len(), 100);
    assert!(!uris(&there).iter().any(|u| uris(&first).contains(u)), "not the first page again");
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

both_dbs!(surface_pages_continue_on_another_replica, pages_across_replicas);

/// A Streamable HTTP upstream sends its requests of the client (and, depending on its SDK, its
/// log lines) on the event stream of the call that caused them: the gateway marks them with
/// that call and routes them exactly, even while two sessions' calls share the connection
/// (over stdio the same would be refused, never guessed). The reference upstream is built on
/// rmcp, which sends log lines on its session's own stream: those keep the conservative rule.
async fn exact_routing_over_http(backend: Backend) {
    let surface = Surface::start(backend, Mode::Session).await;
    let _web = with_web(&surface).await;

    let (first, second) = (Answering::default(), Answering::default());
    let a = surface.client("olivia@acme.test", first.clone()).await;
    let b = surface.client("olivia@acme.test", second.clone()).await;
    let (ra, rb) = tokio::join!(
        call(&a, "web__test_sampling", json!({"prompt": "asked by the first"})),
        call(&b, "web__test_sampling", json!({"prompt": "asked by the second"})),
    );
    assert!(text_of(&ra.unwrap()).contains("a sampled answer"));
    assert!(text_of(&rb.unwrap()).contains("a sampled answer"));
    let (asked_a, asked_b) = (first.asked.lock().unwrap().clone(), second.asked.lock().unwrap().clone());
    assert!(asked_a.len() == 1 && asked_a[0].contains("asked by the first"), "{asked_a:?}");
    assert!(asked_b.len() == 1 && asked_b[0].contains("asked by the second"), "{asked_b:?}");

    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

both_dbs!(surface_routes_an_http_upstreams_traffic_to_its_call, exact_routing_over_http);

/// rmcp's client on protocol 2026-07-28 with `handler`.
async fn modern<H: ClientHandler>(surface: &Surface, subject: &str, handler: H) -> RunningService<RoleClient, H> {
    modern_at(&surface.live.url(), &surface.live.token_for(subject), handler).await
}

/// rmcp's client on protocol 2026-07-28 with `handler`, at `url`.
async fn modern_at<H: ClientHandler>(url: &str, token: &str, handler: H) -> RunningService<RoleClient, H> {
    use rmcp::{ClientLifecycleMode, ClientServiceExt};
    let transport = transport(url, token);
    let subject = "the caller";
    let lifecycle =
        ClientLifecycleMode::Discover { preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28] };
    handler.serve_with_lifecycle(transport, lifecycle).await.unwrap_or_else(|e| panic!("{subject} connects: {e}"))
}

fn params(tool: &str, args: Value) -> rmcp::model::CallToolRequestParams {
    rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(args.as_object().cloned().unwrap())
}

/// A 2026-07-28 caller takes no requests: an upstream's sampling or elicitation in the middle
/// of a call reaches it as an `input_required` answer, and its retry (answers and the echoed
/// `requestState`) goes on with the call. A forged, foreign, mismatched or replayed
/// `requestState` is refused and changes nothing.
async fn multi_round_trip(backend: Backend) {
    use rmcp::model::CallToolResponse;
    let surface = Surface::with_ref(backend, Mode::Session).await;
    let answering = Answering::default();
    let olivia = modern(&surface, "olivia@acme.test", answering.clone()).await;

    // rmcp's client drives the rounds itself through its handler.
    // (`RunningService::call_tool` drives them; the `Peer`'s does not.)
    let result = olivia.call_tool(params("ref__test_sampling", json!({"prompt": "asked by rounds"}))).await.unwrap();
    assert!(text_of(&result).contains("a sampled answer"), "{result:?}");
    let result =
        olivia.call_tool(params("ref__test_elicitation", json!({"message": "rounds, who are you?"}))).await.unwrap();
    assert!(text_of(&result).contains("olivia"), "{result:?}");
    let asked = answering.asked.lock().unwrap().clone();
    assert!(asked.iter().any(|a| a.contains("asked by rounds")), "{asked:?}");

    // One round by hand. The fixture serves 2026-07-28 too, so a 2026-07-28 caller's
    // connection speaks it: the upstream's own question passes through, under its own key.
    let args = json!({"prompt": "by hand"});
    let first = olivia.call_tool_once(params("ref__test_sampling", args.clone())).await.unwrap();
    let CallToolResponse::InputRequired(first) = first else { panic!("input_required expected: {first:?}") };
    let state = first.request_state.clone().expect("a requestState");
    assert_ne!(state, "fixture-sampling-state", "the upstream's own state travels sealed inside the gateway's");
    let requests = serde_json::to_value(first.input_requests.as_ref().unwrap()).unwrap();
    assert_eq!(requests["sample"]["method"], "sampling/createMessage", "{requests}");
    assert!(requests.to_string().contains("by hand"));
    let answer = json!({"role": "assistant", "content": {"type": "text", "text": "answered by hand"}, "model": "m"});
    let retry = |state: &str, args: Value| {
        let mut p = params("ref__test_sampling", args);
        p.request_state = Some(state.to_owned());
        p.input_responses = Some([("sample".to_owned(), answer.clone())].into_iter().collect());
        p
    };
    let refused = |result: Result<CallToolResponse, ServiceError>| {
        let e = error_of(result);
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{e:?}");
        assert!(e.message.contains("requestState"), "{e:?}");
    };
    // Forged (altered), for other arguments, by another user: refused, and the exchange waits on.
    let mut forged = state.clone();
    forged.insert(3, if forged.as_bytes()[3] == b'A' { 'B' } else { 'A' });
    refused(olivia.call_tool_once(retry(&forged, args.clone())).await);
    refused(olivia.call_tool_once(retry(&state, json!({"prompt": "something else"}))).await);
    let wanda = modern(&surface, "wanda@acme.test", Answering::default()).await;
    refused(wanda.call_tool_once(retry(&state, args.clone())).await);
    // The caller's own retry goes on with the call. Nothing waits in the gateway: the same
    // retry again is the same request again, and the upstream answers it again.
    let done = olivia.call_tool_once(retry(&state, args.clone())).await.unwrap();
    let CallToolResponse::Complete(done) = done else { panic!("the call's result expected: {done:?}") };
    assert!(text_of(&done).contains("answered by hand"), "{done:?}");
    let again = olivia.call_tool_once(retry(&state, args)).await.unwrap();
    assert!(matches!(&again, CallToolResponse::Complete(r) if text_of(r).contains("answered by hand")), "{again:?}");

    // prompts/get takes the multi round-trip too (rmcp's client drives it).
    let mut prompt = GetPromptRequestParams::new("ref__sampled_prompt");
    prompt.arguments = json!({"topic": "prompt by rounds"}).as_object().cloned();
    let rendered = serde_json::to_string(&olivia.get_prompt(prompt).await.unwrap()).unwrap();
    assert!(rendered.contains("a sampled answer"), "{rendered}");
    assert!(answering.asked.lock().unwrap().iter().any(|a| a.contains("prompt by rounds")));

    let rows = surface.audited("ref:sampling").await;
    assert!(rows.iter().filter(|(_, o, _)| o == "ok").count() >= 3, "{rows:?}");
    olivia.cancel().await.unwrap();
    wanda.cancel().await.unwrap();
}

both_dbs!(surface_multi_round_trip_for_2026_callers, multi_round_trip);

/// An upstream declared on protocol 2026-07-28 asks by answering `input_required`: the gateway
/// asks the caller (a request to a session's client, or a multi round-trip of its own for a
/// 2026-07-28 caller) and sends the call again with the answer and the upstream's state.
async fn upstream_on_2026(backend: Backend) {
    let surface = Surface::start(backend, Mode::Session).await;
    let declaration = json!({"command": FIXTURE, "args": ["everything", "stdio"], "protocolVersion": "2026-07-28"});
    let mut tx = surface.live.db.begin().await.unwrap();
    entities::create_entity(&mut tx, "acme", "defaults/mcp-servers/new", &declaration).await.unwrap();
    entities::bind_server(&mut tx, "acme", "new", "local").await.unwrap();
    tx.commit().await.unwrap();
    surface.grant("acme", "new", Role::Owner, GrantKind::Tool, "*").await;

    // A session's client is asked with an ordinary request.
    let answering = Answering::default();
    let session = surface.client("olivia@acme.test", answering.clone()).await;
    let result = call(&session, "new__test_sampling", json!({"prompt": "asked of a session"})).await.unwrap();
    assert_eq!(text_of(&result), "LLM response: a sampled answer (by rounds)", "{result:?}");
    assert!(answering.asked.lock().unwrap().iter().any(|a| a.contains("asked of a session")));

    // A 2026-07-28 caller gets the question by multi round-trip (rmcp's client drives it).
    let modern_answering = Answering::default();
    let caller = modern(&surface, "olivia@acme.test", modern_answering.clone()).await;
    let result = caller.call_tool(params("new__test_sampling", json!({"prompt": "asked by rounds"}))).await.unwrap();
    assert_eq!(text_of(&result), "LLM response: a sampled answer (by rounds)", "{result:?}");
    assert!(modern_answering.asked.lock().unwrap().iter().any(|a| a.contains("asked by rounds")));

    // A client that declared nothing is asked nothing: the upstream's question is refused.
    let silent = Answering { silent: true, ..Answering::default() };
    let quiet = surface.client("olivia@acme.test", silent.clone()).await;
    let refused = call(&quiet, "new__test_sampling", json!({"prompt": "nobody"})).await.expect_err("refused");
    assert!(refused.message.contains("does not support"), "{refused:?}");
    assert!(silent.asked.lock().unwrap().is_empty());

    // The session's question was relayed (and audited as such); the 2026-07-28 caller's
    // passed through as its call's answer (each round audited as the call).
    let rows = surface.audited("new:sampling").await;
    assert!(rows.iter().filter(|(_, o, _)| o == "ok").count() >= 1, "{rows:?}");
    for client in [session.cancel().await, quiet.cancel().await] {
        client.unwrap();
    }
    caller.cancel().await.unwrap();
}

both_dbs!(surface_upstream_on_2026_asks_by_rounds, upstream_on_2026);
